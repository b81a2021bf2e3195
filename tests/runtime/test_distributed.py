"""Distributed extraction and training: two CPU processes under torchrun with gloo.

The torchrun tests launch ``python -m torch.distributed.run --nproc-per-node 2``
on ``-m dab_pipeline.cli`` (what users run) or on this very file, whose
``__main__`` block holds small rank-side helpers (a rank that dies mid-run, the
loss and gradients of one fixed global batch). Store-level pieces (shares,
multi-writer zarr, part merging) are tested in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dab_pipeline.runs.checkpoint import load_checkpoint

from ..helpers.runner import invoke

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
TIMEOUT_S = 240  # per torchrun launch; a normal one takes 10-20 s on 2 busy cores

EXTRACT = [
    "extract",
    "--dataset",
    "folder",
    "--model",
    "dab-tiny",
    "--workers",
    "0",
    "--store-dtype",
    "float32",
    "--quiet",
]
TRAIN_SETS = ["model.drift_hidden=16", "model.time_embed_dim=8", "model.steps=2", "batch_size=8", "lr=3e-3"]


# --------------------------------------------------------------------------- launching


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(target: list[str], cwd: Path, nproc: int = WORLD, env: dict | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc <target...>``; target is ``["-m", module, ...]`` or ``[script, ...]``."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("WORLD_SIZE", None)  # never inherit an outer job's rank variables
    full_env.pop("RANK", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "--monitor-interval",
        "0.2",
        *target,
    ]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _dab(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return _torchrun(["-m", "dab_pipeline.cli", *args], cwd, **kw)


def _helper(mode: str, args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return _torchrun(
        ["-m", "tests.runtime.test_distributed", mode, *args], cwd, **kw
    )  # a module: it imports its package


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"torchrun failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    return res.stdout


# --------------------------------------------------------------------------- comparing stores


def _assert_same_store(a: Path, b: Path) -> None:
    """Every array equal (float features within float32 rounding, the rest bit for bit); layouts equal up to
    share_rows; manifests up to created / world_size / out / batch size."""
    from dab_pipeline.store import array_specs, open_store

    with open_store(a) as sa, open_store(b) as sb:
        la = {k: v for k, v in sa.layout.items() if k != "share_rows"}
        lb = {k: v for k, v in sb.layout.items() if k != "share_rows"}
        assert la == lb
        for spec in array_specs(sa.layout):
            if spec.dtype is None:
                x, y = sa.raw_backend.read_strings(spec.name), sb.raw_backend.read_strings(spec.name)
            else:
                x, y = sa.raw_backend.read_all(spec.name), sb.raw_backend.read_all(spec.name)
            assert x.dtype == y.dtype, spec.name
            if x.dtype.kind == "f":
                # features: the ranks batch other videos together, on one thread each, and products of other
                # shapes or thread counts may round differently on some CPUs (bit for bit on Zen 3)
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5, err_msg=spec.name)
            else:
                assert np.array_equal(x, y), spec.name
        ma, mb = dict(sa.manifest), dict(sb.manifest)
        for m in (ma, mb):
            m.pop("created"), m.pop("world_size")
            m["config"].pop("out"), m["config"].pop("batch_size")  # not compatibility keys either
        assert ma == mb


def _extract_args(captions: Path, out: Path, *extra: str) -> list[str]:
    return [
        *EXTRACT,
        "--annotations",
        str(captions),
        "--videos",
        str(captions.parent / "videos"),
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def single_stores(tiny_folder_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One-process reference stores (h5 and zarr) of the tiny dataset."""

    root = tmp_path_factory.mktemp("single")
    out = {}
    for kind in ("h5", "zarr"):
        out[kind] = root / f"store.{kind}"
        res = invoke(_extract_args(tiny_folder_dataset, out[kind], "--batch-size", "2"), catch_exceptions=False)
        assert res.exit_code == 0, res.output
    return out


# --------------------------------------------------------------------------- store pieces (in-process)


def test_shares_are_disjoint_deterministic_and_unit_aligned() -> None:
    from dab_pipeline.store import default_share_rows, video_share

    for n, world in [(6, 2), (1000, 3), (35_000, 8), (5, 8), (0, 2)]:
        u = default_share_rows(n, world)
        assert u >= 1 and u & (u - 1) == 0  # a power of two
        shares = [video_share(n, u, r, world) for r in range(world)]
        allrows = np.concatenate(shares)
        assert np.array_equal(np.sort(allrows), np.arange(n))  # disjoint and complete
        for r, s in enumerate(shares):
            assert np.array_equal(s, video_share(n, u, r, world)) and np.all(np.diff(s) > 0)
            assert np.all((s // u) % world == r)  # whole units, dealt round robin
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= u
    assert default_share_rows(35_000, 8) == 256 and default_share_rows(6, 2) == 1


def _tiny_store(path: Path, n: int = 10, share_rows: int | None = None):
    from dab_pipeline.testing import empty_store

    return empty_store(path, n, caption_id="c{q}", num_frames=3, dim=4, share_rows=share_rows)


def test_zarr_multi_writer_chunks_never_straddle_shares(tmp_path: Path) -> None:
    import zarr

    from dab_pipeline.core.errors import StoreError
    from dab_pipeline.store import open_store, video_share

    _tiny_store(tmp_path / "s.zarr", share_rows=4).close()
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    for name in ("videos/status", "videos/frames", "videos/frame_mask", "videos/error", "videos/num_video_frames"):
        assert 4 % g[name].chunks[0] == 0, name  # a chunk lies inside one unit
    w0 = open_store(tmp_path / "s.zarr", "a", writer=(0, 2))
    w1 = open_store(tmp_path / "s.zarr", "a", writer=(1, 2))  # both writers at once
    with pytest.raises(StoreError, match="locked"):
        open_store(tmp_path / "s.zarr", "a")  # a single writer is kept out
    with pytest.raises(StoreError, match="writer 1 of 2"):
        open_store(tmp_path / "s.zarr", "a", writer=(1, 2))
    s0, s1 = video_share(10, 4, 0, 2), video_share(10, 4, 1, 2)
    assert s0.tolist() == [0, 1, 2, 3, 8, 9] and s1.tolist() == [4, 5, 6, 7]
    for w, s in ((w0, s0), (w1, s1)):
        w.write_videos(s, np.full((len(s), 3, 4), float(s[0])), np.ones((len(s), 3), bool), np.full(len(s), 7))
    with pytest.raises(ValueError, match="outside its share"):
        w1.mark_failed(0, "not mine")
    with pytest.raises(ValueError, match="writer 0 only"):
        w1.write_captions([0], np.zeros((1, 4)))
    w0.write_captions(np.arange(10), np.ones((10, 4)))
    w0.close(), w1.close()
    with open_store(tmp_path / "s.zarr") as st:
        assert st.is_complete
        frames, _ = st.read_videos(np.arange(10))
        np.testing.assert_array_equal(frames[:, 0, 0], [0, 0, 0, 0, 4, 4, 4, 4, 0, 0])
    _tiny_store(tmp_path / "single.zarr").close()
    with pytest.raises(StoreError, match="single writer"):
        open_store(tmp_path / "single.zarr", "a", writer=(0, 2))
    _tiny_store(tmp_path / "s.h5").close()
    with pytest.raises(StoreError, match="part file"):
        open_store(tmp_path / "s.h5", "a", writer=(0, 2))


def test_merge_parts_is_atomic_and_exact(tmp_path: Path) -> None:
    from dab_pipeline.core.errors import StoreError
    from dab_pipeline.store import merge_parts, open_store, video_share

    shares = [video_share(10, 2, r, 2) for r in range(2)]
    parts = []
    for r in range(2):
        st = _tiny_store(tmp_path / f"p{r}.h5")
        s = shares[r]
        st.write_videos(
            s[1:], np.full((len(s) - 1, 3, 4), r + 1.0), np.ones((len(s) - 1, 3), bool), np.full(len(s) - 1, 5)
        )
        st.mark_failed(int(s[0]), f"broken on rank {r}")
        if r == 0:
            st.write_captions(np.arange(10), np.arange(40, dtype=np.float32).reshape(10, 4))
        parts.append(st.path)
        st.close()
    # part 1 unfinished: refused, and nothing appears under the real name
    with open_store(parts[1], "a") as st:
        st.set_status(np.array([shares[1][-1]]), 0)
    with pytest.raises(StoreError, match="pending"):
        merge_parts(tmp_path / "m.h5", parts, shares)
    assert not (tmp_path / "m.h5").exists() and not list(tmp_path.glob(".m.h5.*"))
    with open_store(parts[1], "a") as st:
        st.set_status(np.array([shares[1][-1]]), 1)
    merge_parts(tmp_path / "m.h5", parts, shares)
    with open_store(tmp_path / "m.h5") as m:
        assert m.is_complete and m.manifest == {"m": 1}
        assert dict(m.failures()) == {"v0": "broken on rank 0", "v2": "broken on rank 1"}
        ok = np.flatnonzero(m.status() == 1)
        frames, _ = m.read_videos(ok)
        np.testing.assert_array_equal(frames[:, 0, 0], np.where(np.isin(ok, shares[0]), 1.0, 2.0))
        np.testing.assert_array_equal(m.load_split("train").text, np.arange(40).reshape(10, 4)[ok])


def test_part_files_of_another_world_size_are_refused(tmp_path: Path) -> None:
    from dab_pipeline.core.errors import StoreMismatchError
    from dab_pipeline.runtime.distributed import part_files, part_path
    from dab_pipeline.stages.extract import check_part_files

    out = tmp_path / "store.h5"
    for r in range(4):
        part_path(out, r, 4).write_bytes(b"")
    assert part_path(out, 1, 4).name == "store.part-00001-of-00004.h5"
    assert [(r, w) for _, r, w in part_files(out)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    with pytest.raises(StoreMismatchError, match=r"4-process run .* this run has 2 processes"):
        check_part_files(out, 2, overwrite=False)
    check_part_files(out, 4, overwrite=False)  # same world size: resumable
    check_part_files(out, 2, overwrite=True)
    assert part_files(out) == []


def test_distributed_flag_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    from dab_pipeline.core.errors import ConfigError
    from dab_pipeline.runtime.distributed import TORCHRUN_ENV, want_distributed

    for k in TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    assert want_distributed(None) is False
    with pytest.raises(ConfigError, match="torchrun"):
        want_distributed(True)
    for k, v in zip(TORCHRUN_ENV, ("0", "2", "0", "127.0.0.1", "29500")):
        monkeypatch.setenv(k, v)
    assert want_distributed(None) is True
    with pytest.raises(ConfigError, match="independent copies"):
        want_distributed(False)


# --------------------------------------------------------------------------- extract under torchrun


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["h5", "zarr"])
def test_distributed_extract_equals_single_process(
    kind: str, tiny_folder_dataset: Path, single_stores: dict, tmp_path: Path
) -> None:
    from dab_pipeline.store import open_store

    out = tmp_path / f"store.{kind}"
    stdout = _ok(_dab(_extract_args(tiny_folder_dataset, out, "--batch-size", "2"), tmp_path))
    assert "6 videos encoded, 0 already done, 0 failed, 0 missing; 12 captions" in stdout
    assert stdout.count("videos encoded") == 1  # rank 0 reports, once
    _assert_same_store(single_stores[kind], out)
    with open_store(out) as st:
        assert st.manifest["world_size"] == WORLD
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no part files left behind
    if kind == "h5":
        return

    # Lose rank 1's share (its status rows back to pending) and rerun: only that share is redone.
    import zarr

    with open_store(out) as st:
        share1 = st.video_share(1, WORLD)
    status = zarr.open_group(str(out), mode="r+")["videos/status"]
    status[share1] = 0
    frames_dir = out / "videos" / "frames" / "c"
    before = {p: p.stat().st_mtime_ns for p in frames_dir.rglob("*") if p.is_file()}
    time.sleep(0.05)
    stdout = _ok(_dab(_extract_args(tiny_folder_dataset, out, "--batch-size", "2"), tmp_path))
    assert f"{len(share1)} videos encoded, {6 - len(share1)} already done" in stdout
    after = {p: p.stat().st_mtime_ns for p in frames_dir.rglob("*") if p.is_file()}
    rewritten = sorted(int(p.relative_to(frames_dir).parts[0]) for p in before if after[p] != before[p])
    with open_store(out) as st:
        rows_per_chunk = zarr.open_group(str(out), mode="r")["videos/frames"].chunks[0]
        assert rewritten == sorted({int(i) // rows_per_chunk for i in share1})  # only rank 1's chunks
    _assert_same_store(single_stores[kind], out)


@pytest.mark.distributed
def test_distributed_h5_extract_resumes_a_lost_rank(
    tiny_folder_dataset: Path, single_stores: dict, tmp_path: Path
) -> None:
    from dab_pipeline.runtime.distributed import part_path
    from dab_pipeline.store import open_store, video_share

    out = tmp_path / "store.h5"
    args = _extract_args(tiny_folder_dataset, out, "--batch-size", "1")
    # Rank 1 dies (os._exit) during its second video, after rank 0 has finished its whole share.
    res = _helper("extract-rank1-dies", [str(tmp_path / "rank0.done"), *args], tmp_path)
    assert res.returncode != 0
    assert not out.exists()
    shares = [video_share(6, 1, r, WORLD) for r in range(WORLD)]
    with open_store(part_path(out, 0, WORLD)) as p0, open_store(part_path(out, 1, WORLD)) as p1:
        assert (p0.status()[shares[0]] != 0).all() and p0.captions_done()
        assert (p1.status()[shares[1]] != 0).sum() == 1  # its first video landed
        kept = p1.read_videos(shares[1][:1])[0]
    stdout = _ok(_dab(args, tmp_path))
    assert "2 videos encoded, 4 already done" in stdout  # rank 1's two unfinished videos, nothing else
    assert not part_path(out, 0, WORLD).exists() and not part_path(out, 1, WORLD).exists()
    _assert_same_store(single_stores["h5"], out)
    with open_store(out) as st:
        np.testing.assert_array_equal(st.read_videos(shares[1][:1])[0], kept)
    # Running it again on the finished store does nothing.
    assert "0 videos encoded, 6 already done" in _ok(_dab(args, tmp_path))


# --------------------------------------------------------------------------- training


def _grad_case(variant: str, with_heads: bool):
    """A model (and heads) with fixed weights and one fixed global batch of 8 pairs (dropout off)."""
    from dab_pipeline.model import DABModel, ModelConfig
    from dab_pipeline.runs.inputs import TrainHeads

    torch.manual_seed(0)
    cfg = ModelConfig(
        embed_dim=32, variant=variant, drift_hidden=16, time_embed_dim=8, steps=2, dropout=0.0, learn_tau=True
    )
    model = DABModel(cfg)
    heads = TrainHeads({"model": "dab-tiny", "pretrained": None}, 1, torch.device("cpu")) if with_heads else None
    g = torch.Generator().manual_seed(1)
    b, f = 8, 4
    mask = torch.ones(b, f, dtype=torch.bool)
    mask[1, 2:] = False
    mask[6, 1:] = False
    if heads is None:
        return model, heads, (torch.randn(b, 32, generator=g), None, torch.randn(b, f, 32, generator=g), mask)
    lengths = torch.randint(3, 9, (b,), generator=g)
    return model, heads, (torch.randn(b, 8, 64, generator=g), lengths, torch.randn(b, f, 17, 64, generator=g), mask)


GRAD_CASES = {"dab": ("dab", False), "xpool": ("xpool", False), "dab_heads": ("dab", True)}


@pytest.mark.distributed
def test_distributed_loss_and_gradients_equal_one_process_with_the_global_batch(tmp_path: Path) -> None:
    from dab_pipeline.model.losses import contrastive_loss, loss_of

    _ok(_helper("train-grads", [str(tmp_path / "grads.pt")], tmp_path))
    got = torch.load(tmp_path / "grads.pt", weights_only=True)
    for name, (variant, with_heads) in GRAD_CASES.items():
        model, heads, (text_in, lengths, video_in, mask) = _grad_case(variant, with_heads)
        text = heads.encode_text(text_in, lengths) if heads is not None else text_in
        frames = heads.encode_frames(video_in) if heads is not None else video_in
        cost = model(text, frames, mask).cost  # one process, batch 8
        loss = contrastive_loss(loss_of(model.cfg.spec), cost, model.temperature())
        loss.backward()
        ref = {f"model.{k}": p.grad for k, p in model.named_parameters() if p.grad is not None}
        if heads is not None:
            ref.update({f"heads.{k}": p.grad for k, p in heads.named_parameters() if p.grad is not None})
        torch.testing.assert_close(got[name]["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
        assert set(got[name]["grads"]) == set(ref), name
        # Float32 summation order differs (per-rank blocks, DDP's all-reduce), so compare against the
        # gradient's overall scale: some gradients are analytically zero (e.g. the pooling key bias, which
        # shifts every logit of a query alike) and are rounding noise (~1e-6) in both computations. A wrong
        # scale (a missing world-size factor) or a lost cross-rank term is an O(1) error and fails either check.
        scale = max(float(gr.abs().max()) for gr in ref.values())
        for k, gr in ref.items():
            torch.testing.assert_close(got[name]["grads"][k], gr, rtol=1e-4, atol=1e-6 * scale, msg=f"{name}: {k}")
        norm = lambda gs: torch.sqrt(sum((g.double() ** 2).sum() for g in gs))  # noqa: E731
        assert abs(norm(got[name]["grads"].values()) / norm(ref.values()) - 1) < 1e-6
        assert any(k.startswith("heads.") for k in ref) == with_heads


@pytest.mark.distributed
def test_distributed_train_run_and_exact_resume(tmp_path: Path) -> None:
    from dab_pipeline.runs.costfile import read_costs
    from dab_pipeline.testing import random_store

    store = random_store(tmp_path / "store.h5")
    sets = [x for s in [*TRAIN_SETS, "epochs=3", "checkpoint_every=1"] for x in ("--set", s)]
    base = ["train", "--features", str(store), "--variant", "dab", "--quiet", *sets]

    stdout = _ok(_dab([*base, "--out", str(tmp_path / "a")], tmp_path))
    assert stdout.count("test t2v: R@1") == 1
    a = tmp_path / "a"
    lines = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3]  # rank 0 alone writes
    assert json.loads((a / "status.json").read_text())["state"] == "complete"
    ck = load_checkpoint(a / "checkpoints" / "last.pt")
    assert ck["world_size"] == WORLD and len(ck["rng_ranks"]) == WORLD
    assert read_costs(a / "costs_test.h5").cost.shape == (10, 5)

    # Rank 0 dies in the 2nd step of epoch 2 (5 steps an epoch); --resume continues from the step checkpoint.
    res = _helper("train-rank0-dies", ["7", *base, "--out", str(tmp_path / "b")], tmp_path)
    assert res.returncode != 0
    assert load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["step_in_epoch"] == 1
    _ok(_dab(["train", "--resume", "--out", str(tmp_path / "b"), "--quiet"], tmp_path))
    sa = load_checkpoint(a / "checkpoints" / "last.pt")
    sb = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    # a resume replays the uninterrupted run's computation from its saved state: bit-equal on any CPU (promised)
    for k in sa["model"]:
        torch.testing.assert_close(sa["model"][k], sb["model"][k], rtol=0, atol=0, msg=k)
    np.testing.assert_array_equal(
        read_costs(a / "costs_test.h5").cost, read_costs(tmp_path / "b" / "costs_test.h5").cost
    )
    lb = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["train_loss"] for x in lines] == [x["train_loss"] for x in lb]  # the resume's losses: bit-equal


# --------------------------------------------------------------------------- rank-side helpers


def _main_extract_rank1_dies(flag: str, args: list[str]) -> None:
    import dab_pipeline.stages.extract as ex
    from dab_pipeline.cli import cli

    rank = int(os.environ["RANK"])
    real_encode, real_collate = ex.encode_videos, ex.collate_items
    batches = {"n": 0}

    def encode_then_flag(*a, **kw):
        res = real_encode(*a, **kw)
        if rank == 0:
            Path(flag).touch()
        return res

    def dying_collate(batch):
        batches["n"] += 1
        if rank == 1 and batches["n"] == 2:
            deadline = time.time() + 120
            while not Path(flag).exists() and time.time() < deadline:
                time.sleep(0.05)
            os._exit(3)  # as if the node went away
        return real_collate(batch)

    ex.run.encode_videos, ex.workers.collate_items = encode_then_flag, dying_collate  # where they are looked up
    cli.main(args, prog_name="dab")


def _main_train_rank0_dies(at_call: int, args: list[str]) -> None:
    import dab_pipeline.stages.train.trainer as loop
    from dab_pipeline.cli import cli

    real = loop.loss_of
    calls = {"n": 0}

    def dying_loss_of(spec):
        def loss(cost, temperature):
            calls["n"] += 1
            if int(os.environ["RANK"]) == 0 and calls["n"] == at_call:
                os._exit(3)
            return real(spec)(cost, temperature)

        return loss

    loop.loss_of = dying_loss_of  # where the trainer looks it up
    cli.main(args, prog_name="dab")


def _main_train_grads(out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from dab_pipeline.runtime.distributed import distributed_session
    from dab_pipeline.stages.train import TrainStep, distributed_batch_loss

    with distributed_session("cpu") as ctx:
        results = {}
        for name, (variant, with_heads) in GRAD_CASES.items():
            model, heads, (text_in, lengths, video_in, mask) = _grad_case(variant, with_heads)
            b = text_in.shape[0] // ctx.world_size
            sl = slice(ctx.rank * b, (ctx.rank + 1) * b)  # this rank's slice of the global batch
            step = DistributedDataParallel(TrainStep(model, heads))
            loss = distributed_batch_loss(
                step, model, text_in[sl], None if lengths is None else lengths[sl], video_in[sl], mask[sl]
            )
            loss.backward()
            grads = {k: p.grad.clone() for k, p in step.module.named_parameters() if p.grad is not None}
            results[name] = {"loss": loss.detach(), "grads": grads}
        if ctx.is_main:
            torch.save(results, out)


if __name__ == "__main__":  # run by torchrun from the tests above
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "extract-rank1-dies":
        _main_extract_rank1_dies(rest[0], rest[1:])
    elif mode == "train-rank0-dies":
        _main_train_rank0_dies(int(rest[0]), rest[1:])
    elif mode == "train-grads":
        _main_train_grads(rest[0])
    else:
        raise SystemExit(f"unknown helper mode {mode!r}")


def test_local_context_offers_every_call_of_a_rank_context() -> None:
    """Code written against a context runs in one process: LocalContext has DistContext's every public call."""
    import inspect

    from dab_pipeline.runtime.distributed import DistContext, LocalContext

    def calls(cls) -> set[str]:
        return {
            n for n, v in inspect.getmembers(cls) if not n.startswith("_") and (callable(v) or isinstance(v, property))
        }

    assert calls(DistContext) <= calls(LocalContext) | {"local_rank", "local_world_size", "backend"}
    ctx = LocalContext(torch.device("cpu"))
    assert ctx.agree(lambda: 3) == ctx.run_on_main(lambda: 3) == ctx.main_first(lambda: 3) == 3
    assert ctx.all_gather_object("x") == ["x"] and ctx.broadcast_object(5) == 5 and ctx.is_main
    with pytest.raises(KeyError):
        ctx.agree(lambda: {}["missing"])  # one process: its error, unchanged


@pytest.mark.parametrize(
    "suffix, world, expected",
    [
        (".h5", 1, "StoreWriter"),
        (".zarr", 1, "StoreWriter"),
        (".zarr", 2, "ZarrSharesWriter"),
        (".h5", 4, "H5PartsWriter"),
    ],
)
def test_extract_picks_the_writer_of_its_backend_and_world_size(
    tmp_path: Path, suffix: str, world: int, expected: str
) -> None:
    """One process writes its store itself; several ranks share a Zarr store or write HDF5 parts."""
    from dataclasses import dataclass

    import dab_pipeline.stages.extract as ex
    from dab_pipeline.core.errors import StoreMismatchError

    @dataclass
    class Rank:  # the calls the writers make of a context, without a process group
        rank: int
        world_size: int
        is_main: bool = True

    job = ex.ExtractJob(
        cfg=None,
        out=tmp_path / f"s{suffix}",
        bundle=None,
        manifest={},
        videos=[None] * 40,
        captions=[],
        ctx=Rank(0, world),
    )
    writer = ex.choose_writer(job)
    assert type(writer).__name__ == expected
    done = ex.ExistingStore(complete=True, world_size=world, share_rows=4, status=np.arange(40))
    share = writer.share(done)
    if world == 1:
        assert share is None  # every row
    else:  # rank 0's units of 4 rows, dealt round robin
        assert list(share[:4]) == [0, 1, 2, 3] and share[4] == 4 * world
    stale = ex.ExistingStore(complete=False, world_size=world + 1, share_rows=4, status=np.zeros(40))
    if world > 1:
        with pytest.raises(StoreMismatchError, match=f"{world + 1}-process run"):
            writer.check(stale, lambda e: None)
