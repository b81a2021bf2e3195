"""What a store knows of its own soundness: which chunks it wrote, which are missing, a full read-back, and the
refusal of an incomplete store with the command that completes it (a mixin of :class:`FeatureStore`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.errors import StoreError
from .layout import STATUS_OK, STATUS_PENDING, row_checksums


class StoreIntegrity:
    """The integrity half of :class:`FeatureStore`: written chunks, missing chunks, verification (a mixin)."""

    def written_chunks(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(chunk indices, rows written in each) of a strict array: the chunks the store's status arrays say
        were written (ok videos, done captions; training videos for the views)."""
        raw = self._b.raw_chunks(name)
        if raw is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if name.startswith("captions/"):
            rows = np.flatnonzero(self.caption_done())
        else:
            rows = np.flatnonzero(self.status() == STATUS_OK)
            if name.startswith("videos/view"):  # views are written for training videos only
                rows = rows[self.video_split[rows] == "train"]
        rpc = raw.rows_per_chunk
        if name == "captions/token_states":  # its rows are tokens: every chunk a written caption's tokens touch
            lo, hi = self._token_offsets[rows], self._token_offsets[rows + 1]
            rows = rows[hi > lo]
            first, last = lo[hi > lo] // rpc, (hi[hi > lo] - 1) // rpc
            n_chunks = -(-int(self._token_offsets[-1]) // rpc)
            mark = np.zeros(n_chunks + 1, np.int64)
            np.add.at(mark, first, 1)
            np.add.at(mark, last + 1, -1)
            touched = np.cumsum(mark)[:-1]  # captions touching each chunk
            chunks = np.flatnonzero(touched)
            return chunks, touched[chunks]
        return np.unique(rows // rpc, return_counts=True)

    def missing_chunks(self) -> list[tuple[str, str, int]]:
        """Chunk files that hold rows the store records as written but are not on disk (Zarr; HDF5 has none).

        -> [(array, chunk file, rows or captions it should hold)]. Zarr reads a missing chunk file
        as zeros, so a deleted chunk would otherwise pass for data. One stat per chunk: cheap.
        """
        if not hasattr(self._b, "chunk_files"):
            return []
        out = []
        for name in sorted(self._b.strict):
            chunks, counts = self.written_chunks(name)
            paths = self._b.chunk_files(name, chunks) or []
            for path, n, size in zip(paths, counts, self._b.chunk_sizes(paths)):
                if size is None:
                    out.append((name, path, int(n)))
        return out

    def verify(self) -> list[str]:
        """Read every array the store records as written, end to end; -> one line per problem found (none: []).

        Zarr: every chunk file of written rows must exist and hold a whole chunk; HDF5: every
        array must read back without an I/O error (a truncated or damaged file fails here).
        """
        problems = [
            f"{name}: chunk file {path} is missing ({n} written rows)" for name, path, n in self.missing_chunks()
        ]
        for name, spec in self._specs.items():
            raw = self._b.raw_chunks(name) if hasattr(self._b, "chunk_files") else None
            if raw is not None:
                chunks, _ = self.written_chunks(name)
                want = raw.rows_per_chunk * raw.row_bytes
                paths = self._b.chunk_files(name, chunks) or []
                for path, size in zip(paths, self._b.chunk_sizes(paths)):
                    if size is not None and size != want:
                        problems.append(f"{name}: chunk file {path} holds {size:,} bytes, a chunk is {want:,}")
                continue
            try:  # HDF5, and Zarr arrays read through zarr (strings, compressed thumbnails)
                if spec.dtype is None:
                    self._b.read_strings(name)
                    continue
                n, row = spec.shape[0], int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.itemsize
                step = max(1, (64 << 20) // max(1, row))  # 64 MiB at a time
                for a in range(0, n, step):
                    b = min(n, a + step)
                    self._b.read_range(name, a, b, np.empty((b - a, *spec.shape[1:]), spec.dtype))
            except (OSError, ValueError, RuntimeError, StoreError) as exc:
                problems.append(f"{name}: cannot be read back ({str(exc).splitlines()[0]})")
        if not problems:  # every byte reads back: do they still hold what was written?
            problems += self._checksum_problems()
        return problems

    def _checksum_problems(self) -> list[str]:
        """One line for the videos and one for the captions whose stored features no longer match the CRC-32
        written with them (bytes changed or zeroed since); none for a store made before row checksums."""
        out = []
        for what, rows, arrays in (
            ("videos", np.flatnonzero(self.status() == STATUS_OK), ("videos/frames", "videos/frame_mask")),
            ("captions", np.flatnonzero(self.caption_done()), ("captions/features",)),
        ):
            if f"{what}/checksum" not in self._specs or len(rows) == 0:
                continue
            bad: list[int] = []
            for a in range(0, len(rows), 4096):
                part = rows[a : a + 4096]
                stored = self._read_rows(f"{what}/checksum", part)
                got = row_checksums(*(self._read_rows(name, part) for name in arrays))
                bad += part[stored != got].tolist()
            if bad:
                ids = self.video_ids if what == "videos" else self.caption_ids
                named = ", ".join(str(ids[i]) for i in bad[:3]) + (", ..." if len(bad) > 3 else "")
                out.append(
                    f"{arrays[0]}: {len(bad)} {what}' features no longer match the checksums written with them "
                    f"({named}): changed or zeroed since extraction; re-extract them"
                )
        return out

    def require_complete(self, purpose: str) -> None:
        """Refuse an incomplete store (an extraction stopped, or still running) for ``purpose``, saying what is
        missing and the command that completes it."""
        if self.is_complete:
            return
        missing = self.missing_chunks()
        if missing:
            name, path, n = missing[0]
            raise StoreError(
                f"{self.path} is damaged: {len(missing)} chunk file(s) of rows it records as written "
                f"are missing, the first {path} ({name!r}, {n} rows); {purpose} cannot use it. "
                "`dab inspect --verify` lists them; `dab extract ... --overwrite` rebuilds the store"
            )
        videos = int((self.status() == STATUS_PENDING).sum())
        captions = int((~self.caption_done()).sum())
        raise StoreError(
            f"{self.path} is incomplete: {videos} of {self.num_videos} videos and {captions} of {self.num_captions} "
            f"captions are not extracted yet (was `dab extract` stopped, or is it still running?); {purpose} needs a "
            f"complete store. Finish it with `{extract_command(self.manifest, self.path)}`: it resumes where it "
            "stopped"
        )


# arrays read only at rows the store records as written: a missing Zarr chunk there is damage
WRITTEN_ROWS_ARRAYS = (
    "videos/frames",
    "videos/frame_mask",
    "videos/checksum",
    "videos/states",
    "videos/views",
    "videos/view_states",
    "captions/features",
    "captions/checksum",
    "captions/states",
    "captions/token_states",
)


def extract_command(manifest: dict, path: Path) -> str:
    """The `dab extract` command line that made (and so resumes) a store, from its manifest."""
    cfg = manifest.get("config") or {}
    parts = ["dab extract", f"--dataset {cfg.get('dataset') or manifest.get('dataset', '?')}"]
    for key, flag in (
        ("videos", "--videos"),
        ("annotations", "--annotations"),
        ("model", "--model"),
        ("pretrained", "--pretrained"),
        ("trainable_blocks", "--trainable-blocks"),
        ("train_views", "--train-views"),
    ):
        value = cfg.get(key)
        if value not in (None, "", 0):
            parts.append(f"{flag} {value}")
    parts.append(f"--out {path}")
    return " ".join(parts)
