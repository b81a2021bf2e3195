"""The cost-matrix file: written by ``dab train`` at the end, read by ``dab evaluate``.

Same HDF5 / Zarr family as the feature store (backend by suffix), plus plain
``.npz`` (and, read-only, ``.npy``) so another method's output can be scored.
Layouts are documented in ``docs/store-format.md`` ("Cost files").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

import numpy as np

from ..core.choices import COST_KINDS
from ..core.errors import StoreError
from ..core.fsutil import publish, remove_path, temp_sibling
from ..core.overrides import to_dict
from ..core.write_errors import check_free_space, named_write_errors, write_failure
from ..store import HDF5_SUFFIXES, ZARR_SUFFIXES

if TYPE_CHECKING:  # the run's config and arrays import torch; reading a cost file does not
    from .config import TrainConfig
    from .inputs import SplitArrays

__all__ = [
    "CostMatrix",
    "ScoredSplit",
    "run_costs",
    "write_costs",
    "read_costs",
    "COST_SUFFIXES",
    "COST_FORMAT_VERSION",
]

COST_FORMAT_VERSION = 1
KINDS = COST_KINDS  # ("cost", "similarity")
COST_SUFFIXES = HDF5_SUFFIXES + ZARR_SUFFIXES + (".npz", ".npy")
# Names the file itself uses; extras and attrs may not take them.
_ARRAYS = ("cost", "query_ids", "video_ids", "gt", "ranking")
_RESERVED_ATTRS = ("dab_cost_format", "kind", "extras")
RUN_EXTRAS = ("text_var", "bridged_var", "video_var")  # the per-query diagnostics a run's cost file keeps


@dataclass
class CostMatrix:
    """All-pairs scores of Q queries against V videos.

    For ``kind="cost"`` lower is better; for ``kind="similarity"`` higher is
    better. Readers should use :meth:`to_cost` rather than ``cost`` directly.
    """

    cost: np.ndarray  # (Q, V) float32
    query_ids: np.ndarray  # (Q,) str
    video_ids: np.ndarray  # (V,) str
    gt: np.ndarray  # (Q,) int64, index of each query's ground-truth video (-1 unknown)
    kind: str = "cost"
    ranking: np.ndarray | None = None  # (Q, V) int32, each query's videos best first
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (Q,) e.g. text_var
    attrs: dict = field(default_factory=dict)  # JSON-able, e.g. {"config": {...}}

    @property
    def num_queries(self) -> int:
        return int(np.shape(self.cost)[0])

    @property
    def num_videos(self) -> int:
        return int(np.shape(self.cost)[1])

    def to_cost(self) -> np.ndarray:
        """(Q, V) float32 with lower = better, whatever ``kind`` is."""
        c = np.asarray(self.cost, dtype=np.float32)
        return c if self.kind == "cost" else -c

    def compute_ranking(self) -> np.ndarray:
        """(Q, V) int32 videos best first; ties keep video order (stable sort)."""
        return np.argsort(self.to_cost(), axis=1, kind="stable").astype(np.int32)

    def problems(self) -> list[str]:
        """What is inconsistent in this matrix (empty when it is well formed)."""
        out: list[str] = []
        if self.kind not in KINDS:
            out.append(f"kind is {self.kind!r}, expected one of {', '.join(KINDS)}")
        c = np.asarray(self.cost)
        if c.ndim != 2:
            return out + [f"'cost' has shape {c.shape}, expected (Q, V)"]
        q, v = c.shape
        for name, arr, want in (
            ("query_ids", self.query_ids, (q,)),
            ("video_ids", self.video_ids, (v,)),
            ("gt", self.gt, (q,)),
        ):
            if np.shape(arr) != want:
                out.append(f"'{name}' has shape {np.shape(arr)}, expected {want} to match cost {c.shape}")
        gt = np.asarray(self.gt)
        if gt.shape == (q,):
            if gt.dtype.kind not in "iu":
                out.append(f"'gt' has dtype {gt.dtype}, expected integers")
            elif q and (gt.min() < -1 or gt.max() >= v):
                out.append(f"'gt' must lie in [-1, {v}) (video indices, -1 unknown); got {gt.min()}..{gt.max()}")
        if self.ranking is not None and np.shape(self.ranking) != (q, v):
            out.append(f"'ranking' has shape {np.shape(self.ranking)}, expected {(q, v)}")
        for name, arr in self.extras.items():
            if name in _ARRAYS:
                out.append(f"extra {name!r} clashes with a built-in array name")
            elif np.shape(arr) != (q,):
                out.append(f"extra {name!r} has shape {np.shape(arr)}, expected {(q,)}")
        for name in self.attrs:
            if name in _RESERVED_ATTRS:
                out.append(f"attribute {name!r} is reserved")
        return out


class ScoredSplit(Protocol):
    """What :func:`run_costs` reads of a scoring result (:class:`~dab_pipeline.scoring.ScoreResult` is one): the
    costs and the per-query diagnostics the scoring computed (None where it did not)."""

    cost: np.ndarray  # (Q, V), lower is better
    text_var: Optional[np.ndarray]  # (Q,)
    bridged_var: Optional[np.ndarray]  # (Q,)
    video_var: Optional[np.ndarray]  # (Q,)


def run_costs(res: ScoredSplit, test: SplitArrays, cfg: TrainConfig, best_epoch: Optional[int]) -> CostMatrix:
    """The cost file of a run's test pass (what `dab train` and `dab distill` write when they are done): ``res``
    (a scoring result over ``test``, the test split's arrays) scored by the checkpoint of ``best_epoch``, with the
    run's config ``cfg``, its split and store recorded."""
    extras = {k: np.asarray(getattr(res, k)) for k in RUN_EXTRAS if getattr(res, k, None) is not None}
    return CostMatrix(
        cost=np.asarray(res.cost, dtype=np.float32),
        query_ids=np.asarray(test.caption_ids),
        video_ids=np.asarray(test.video_ids),
        gt=test.caption_video.numpy().astype(np.int64),
        kind="cost",
        extras=extras,
        attrs={
            "config": json.dumps(to_dict(cfg), default=str),
            "split": cfg.test_split,
            "best_epoch": best_epoch,
            "variant": cfg.model.variant,
            "store": str(cfg.features),
        },
    )


def _kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    if suffix in ZARR_SUFFIXES:
        return "zarr"
    if suffix in (".npz", ".npy"):
        return suffix[1:]
    raise StoreError(
        f"{path}: cannot tell the cost file format from the suffix {suffix or '(none)'!r}; "
        f"valid suffixes: {', '.join(COST_SUFFIXES)}"
    )


# ----------------------------------------------------------------------------- write


def write_costs(path: str | os.PathLike, cm: CostMatrix) -> Path:
    """Write ``cm`` atomically (temp name, then rename over any old file); returns the path.

    ``.h5`` / ``.hdf5`` / ``.zarr`` / ``.npz``; a bare ``.npy`` would lose the ids.
    """
    p = Path(path)
    kind = _kind_of(p)
    if kind == "npy":
        raise StoreError(f"{p}: a .npy file cannot hold ids and ground truth; write .h5, .zarr or .npz")
    problems = cm.problems()
    if problems:
        raise ValueError(f"cannot write {p}: " + "; ".join(problems))
    try:
        attrs_json = {k: json.loads(json.dumps(v)) for k, v in cm.attrs.items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot write {p}: attrs must be JSON-serialisable ({e})") from None

    arrays: dict[str, np.ndarray] = {
        "cost": np.asarray(cm.cost, dtype=np.float32),  # (Q, V)
        "query_ids": np.asarray(cm.query_ids, dtype=str),  # (Q,)
        "video_ids": np.asarray(cm.video_ids, dtype=str),  # (V,)
        "gt": np.asarray(cm.gt, dtype=np.int64),  # (Q,)
        "ranking": (cm.compute_ranking() if cm.ranking is None else np.asarray(cm.ranking)).astype(np.int32),
    }
    extras = {k: np.asarray(v) for k, v in cm.extras.items()}
    with named_write_errors(p):
        p.parent.mkdir(parents=True, exist_ok=True)
    # asked first: an HDF5 file whose write failed cannot be closed, and HDF5 then crashes at exit
    need = sum(a.nbytes for a in (*arrays.values(), *extras.values())) + COST_FILE_SLACK
    check_free_space(p.parent, need)
    tmp = temp_sibling(p, "writing")
    try:
        if kind == "hdf5":
            _write_h5(tmp, arrays, extras, cm.kind, attrs_json)
        elif kind == "zarr":
            _write_zarr(tmp, arrays, extras, cm.kind, attrs_json)
        else:
            _write_npz(tmp, arrays, extras, cm.kind, attrs_json)
        publish(tmp, p, overwrite=True)
    except BaseException as exc:
        named = write_failure(exc, p) if isinstance(exc, (OSError, RuntimeError)) else None  # before tmp goes
        remove_path(tmp)
        if named is not None:
            raise named from exc
        raise
    return p


COST_FILE_SLACK = 1 << 20  # headers, metadata, string padding


def _write_h5(tmp: Path, arrays: dict, extras: dict, kind: str, attrs: dict) -> None:
    import h5py

    with h5py.File(tmp, "w") as f:
        for name, arr in {**arrays, **extras}.items():
            if arr.dtype.kind == "U":
                f.create_dataset(name, data=arr.astype(object), dtype=h5py.string_dtype())
            else:
                f.create_dataset(name, data=arr)
        f.attrs["dab_cost_format"] = COST_FORMAT_VERSION
        f.attrs["kind"] = kind
        f.attrs["extras"] = json.dumps(sorted(extras))
        for k, v in attrs.items():
            f.attrs[k] = json.dumps(v, sort_keys=True)


def _write_zarr(tmp: Path, arrays: dict, extras: dict, kind: str, attrs: dict) -> None:
    import zarr

    g = zarr.open_group(str(tmp), mode="w-")
    for name, arr in {**arrays, **extras}.items():
        if arr.dtype.kind == "U":
            a = g.create_array(name, shape=arr.shape, dtype=str, chunks=(max(len(arr), 1),))
        else:
            row = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
            rows = max(1, min(max(arr.shape[0], 1), (4 << 20) // max(row, 1)))
            a = g.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=(rows, *arr.shape[1:]), compressors=None)
        if arr.size:
            a[...] = arr
    g.attrs.update({"dab_cost_format": COST_FORMAT_VERSION, "kind": kind, "extras": sorted(extras), **attrs})


def _write_npz(tmp: Path, arrays: dict, extras: dict, kind: str, attrs: dict) -> None:
    data = dict(arrays)
    if kind == "similarity":
        data["similarity"] = data.pop("cost")
    data.update(extras)
    data["attrs"] = np.asarray(json.dumps(attrs, sort_keys=True))  # 0-d str
    # A file object, because np.savez appends ".npz" to names lacking it.
    with open(tmp, "wb") as fh:
        np.savez(fh, **data)


# ------------------------------------------------------------------------------ read


def read_costs(path: str | os.PathLike, *, kind: str | None = None) -> CostMatrix:
    """Read a cost file; anything missing or inconsistent is a StoreError naming the file.

    ``kind`` is only needed (and only allowed to differ from the file) for a bare
    ``.npy`` matrix, which cannot say whether it holds costs or similarities.
    """
    p = Path(path)
    fmt = _kind_of(p)
    if not p.exists():
        raise StoreError(f"cost file {p} does not exist")
    if fmt == "hdf5":
        cm = _read_h5(p)
    elif fmt == "zarr":
        cm = _read_zarr(p)
    elif fmt == "npz":
        cm = _read_npz(p)
    else:
        cm = _read_npy(p, kind)
    if kind is not None and fmt != "npy" and kind != cm.kind:
        raise StoreError(f"{p} holds kind {cm.kind!r}, but {kind!r} was asked for")
    problems = cm.problems()
    if problems:
        raise StoreError(f"cost file {p} is inconsistent: " + "; ".join(problems))
    if cm.ranking is None:
        cm.ranking = cm.compute_ranking()
    return cm


def _need(p: Path, present: Any, name: str, what: str) -> None:
    if name not in present:
        raise StoreError(f"cost file {p} has no {name!r} array (expected {what})")


_EXPECT = {
    "cost": "(Q, V) float32",
    "query_ids": "(Q,) str",
    "video_ids": "(V,) str",
    "gt": "(Q,) int64 ground-truth video index",
}


def _read_h5(p: Path) -> CostMatrix:
    import h5py

    try:
        f = h5py.File(p, "r")
    except OSError as e:
        raise StoreError(f"cost file {p} is not a readable HDF5 file: {e}") from None
    with f:
        if "dab_cost_format" not in f.attrs:
            raise StoreError(f"{p} is not a dab cost file (no dab_cost_format attribute)")
        for name, what in _EXPECT.items():
            _need(p, f, name, what)

        def arr(name: str) -> np.ndarray:
            ds = f[name]
            if h5py.check_string_dtype(ds.dtype) is not None:
                return np.asarray(ds.asstr()[()], dtype=str)
            return ds[()]

        try:
            extra_names = json.loads(f.attrs.get("extras", "[]"))
            attrs = {k: json.loads(v) for k, v in f.attrs.items() if k not in _RESERVED_ATTRS}
            for name in extra_names:
                _need(p, f, name, "(Q,) extra listed in the 'extras' attribute")
            return CostMatrix(
                cost=arr("cost"),
                query_ids=arr("query_ids"),
                video_ids=arr("video_ids"),
                gt=arr("gt"),
                kind=str(f.attrs.get("kind", "cost")),
                ranking=arr("ranking") if "ranking" in f else None,
                extras={n: arr(n) for n in extra_names},
                attrs=attrs,
            )
        except (OSError, ValueError, TypeError) as e:
            raise StoreError(f"cost file {p} is corrupt: {e}") from None


def _read_zarr(p: Path) -> CostMatrix:
    import zarr

    try:
        g = zarr.open_group(str(p), mode="r")
        meta = dict(g.attrs.asdict())
    except Exception as e:  # zarr raises FileNotFoundError / ValueError / JSONDecodeError
        raise StoreError(f"cost file {p} is not a readable zarr group: {type(e).__name__}: {e}") from None
    if "dab_cost_format" not in meta:
        raise StoreError(f"{p} is not a dab cost file (no dab_cost_format attribute)")
    names = set(g.array_keys())
    for name, what in _EXPECT.items():
        _need(p, names, name, what)
    extra_names = list(meta.get("extras", []))
    for name in extra_names:
        _need(p, names, name, "(Q,) extra listed in the 'extras' attribute")

    def arr(name: str) -> np.ndarray:
        a = g[name][...]
        return np.asarray(a.tolist(), dtype=str) if isinstance(a.dtype, np.dtypes.StringDType) else np.asarray(a)

    try:
        return CostMatrix(
            cost=arr("cost"),
            query_ids=arr("query_ids"),
            video_ids=arr("video_ids"),
            gt=arr("gt"),
            kind=str(meta.get("kind", "cost")),
            ranking=arr("ranking") if "ranking" in names else None,
            extras={n: arr(n) for n in extra_names},
            attrs={k: v for k, v in meta.items() if k not in _RESERVED_ATTRS},
        )
    except Exception as e:
        raise StoreError(f"cost file {p} is corrupt: {type(e).__name__}: {e}") from None


def _read_npz(p: Path) -> CostMatrix:
    try:
        with np.load(p, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as e:  # BadZipFile, ValueError (pickled objects), OSError
        raise StoreError(f"cost file {p} is not a readable .npz: {type(e).__name__}: {e}") from None
    has = [k for k in ("cost", "similarity") if k in data]
    if len(has) != 1:
        raise StoreError(
            f"cost file {p} must hold exactly one of 'cost' (lower is better) or 'similarity' "
            f"(higher is better) as a (Q, V) array; found {has or 'neither'}"
        )
    kind = has[0]
    mat = data.pop(kind)
    if mat.ndim != 2:
        raise StoreError(f"cost file {p}: {kind!r} has shape {mat.shape}, expected (Q, V)")
    q, v = mat.shape
    query_ids = data.pop("query_ids", None)
    video_ids = data.pop("video_ids", None)
    gt = data.pop("gt", None)
    if gt is None:
        if q != v:
            raise StoreError(
                f"cost file {p} has no 'gt' array (expected (Q,) int64 ground-truth video index); "
                f"it may only be left out for a square matrix (query i matches video i), got {mat.shape}"
            )
        gt = np.arange(q, dtype=np.int64)
    ranking = data.pop("ranking", None)
    attrs_raw = data.pop("attrs", None)
    try:
        attrs = json.loads(str(attrs_raw)) if attrs_raw is not None else {}
    except ValueError as e:
        raise StoreError(f"cost file {p}: 'attrs' is not a JSON string ({e})") from None
    extras = {}
    for name, a in data.items():
        if a.shape != (q,):
            raise StoreError(f"cost file {p}: unexpected array {name!r} of shape {a.shape}; extras must be (Q,)=({q},)")
        extras[name] = a
    return CostMatrix(
        cost=mat.astype(np.float32),
        query_ids=np.asarray(query_ids, dtype=str) if query_ids is not None else np.arange(q).astype(str),
        video_ids=np.asarray(video_ids, dtype=str) if video_ids is not None else np.arange(v).astype(str),
        gt=np.asarray(gt),
        kind=kind,
        ranking=ranking,
        extras=extras,
        attrs=attrs,
    )


def _read_npy(p: Path, kind: str | None) -> CostMatrix:
    if kind not in KINDS:
        raise StoreError(
            f"{p} is a bare matrix that cannot say whether lower or higher is better; "
            f"pass kind='cost' or kind='similarity'"
        )
    try:
        mat = np.load(p, allow_pickle=False)
    except Exception as e:
        raise StoreError(f"cost file {p} is not a readable .npy: {type(e).__name__}: {e}") from None
    if mat.ndim != 2 or mat.shape[0] != mat.shape[1]:
        raise StoreError(
            f"cost file {p} holds shape {mat.shape}; a bare .npy must be a square (Q, Q) matrix whose "
            f"query i matches video i (use .npz with 'gt' otherwise)"
        )
    q = mat.shape[0]
    return CostMatrix(
        cost=mat.astype(np.float32),
        query_ids=np.arange(q).astype(str),
        video_ids=np.arange(q).astype(str),
        gt=np.arange(q, dtype=np.int64),
        kind=kind,
    )
