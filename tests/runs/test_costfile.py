"""Cost files: HDF5 / Zarr / npz round trips, user-supplied matrices, corrupt files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import StoreError
from dab_pipeline.runs.costfile import CostMatrix, read_costs, write_costs


def sample(kind: str = "cost", q: int = 5, v: int = 4) -> CostMatrix:
    rng = np.random.default_rng(0)
    cost = rng.standard_normal((q, v)).astype(np.float32)  # (Q, V)
    cost[0, 1] = cost[0, 2]  # a tie: the stable ranking keeps video order
    return CostMatrix(
        cost=cost,
        query_ids=np.array([f"vid{i % v}#{i}" for i in range(q)]),
        video_ids=np.array([f"vid{j}" for j in range(v)]),
        gt=np.array([i % v for i in range(q)], dtype=np.int64),
        kind=kind,
        extras={"text_var": rng.random(q).astype(np.float32), "confidence": rng.random(q)},
        attrs={"config": {"cost": "w2", "lr": 1e-4, "blocks": [1, 2]}, "split": "test"},
    )


@pytest.mark.parametrize("suffix", [".h5", ".hdf5", ".zarr", ".npz"])
@pytest.mark.parametrize("kind", ["cost", "similarity"])
def test_round_trip(tmp_path: Path, suffix: str, kind: str) -> None:
    cm = sample(kind)
    path = write_costs(tmp_path / f"costs{suffix}", cm)
    assert path == tmp_path / f"costs{suffix}"
    got = read_costs(path)
    assert got.kind == kind
    np.testing.assert_array_equal(got.cost, cm.cost)
    assert got.cost.dtype == np.float32
    assert got.query_ids.tolist() == cm.query_ids.tolist() and got.query_ids.dtype.kind == "U"
    assert got.video_ids.tolist() == cm.video_ids.tolist()
    np.testing.assert_array_equal(got.gt, cm.gt)
    assert set(got.extras) == {"text_var", "confidence"}
    np.testing.assert_array_equal(got.extras["text_var"], cm.extras["text_var"])
    np.testing.assert_array_equal(got.extras["confidence"], cm.extras["confidence"])
    assert got.attrs == cm.attrs
    # the ranking was computed at write time, best first, ties in video order
    lower_better = cm.cost if kind == "cost" else -cm.cost
    np.testing.assert_array_equal(got.ranking, np.argsort(lower_better, axis=1, kind="stable"))
    assert got.ranking.dtype == np.int32
    a, b = got.ranking[0].tolist().index(1), got.ranking[0].tolist().index(2)
    assert a < b
    # best-ranked video really has the best score
    best = got.ranking[:, 0]
    np.testing.assert_array_equal(got.to_cost()[np.arange(5), best], lower_better.min(axis=1))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_given_ranking_is_kept_and_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "costs.h5"
    write_costs(path, sample(q=3, v=3))
    cm = sample(q=2, v=3)
    cm.ranking = np.array([[2, 1, 0], [0, 2, 1]], dtype=np.int32)
    write_costs(path, cm)  # results are rewritten on re-evaluation
    got = read_costs(path)
    assert got.num_queries == 2
    np.testing.assert_array_equal(got.ranking, cm.ranking)


def test_user_npz_with_similarity_and_defaults(tmp_path: Path) -> None:
    sim = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.1], [0.0, 0.5, 0.7]])
    path = tmp_path / "other_method.npz"
    np.savez(path, similarity=sim)  # square: query i matches video i
    got = read_costs(path)
    assert got.kind == "similarity"
    np.testing.assert_array_equal(got.gt, [0, 1, 2])
    assert got.query_ids.tolist() == ["0", "1", "2"]
    np.testing.assert_array_equal(got.ranking[:, 0], [0, 1, 2])
    np.savez(
        path,
        cost=np.zeros((2, 3)),
        query_ids=np.array(["a", "b"]),
        video_ids=np.array(["x", "y", "z"]),
        gt=np.array([2, -1]),
    )
    got = read_costs(path)
    assert got.kind == "cost" and got.gt.tolist() == [2, -1] and got.video_ids.tolist() == ["x", "y", "z"]


def test_npz_problems(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, cost=np.zeros((2, 2)), similarity=np.zeros((2, 2)))
    with pytest.raises(StoreError, match="bad.npz must hold exactly one of 'cost'.*'similarity'"):
        read_costs(path)
    np.savez(path, cost=np.zeros((2, 3)))
    with pytest.raises(StoreError, match="bad.npz has no 'gt' array.*square"):
        read_costs(path)
    np.savez(path, cost=np.zeros((2, 3)), gt=np.array([0, 1]), query_ids=np.array(["a", "b", "c"]))
    with pytest.raises(StoreError, match=r"bad.npz is inconsistent: 'query_ids' has shape \(3,\), expected \(2,\)"):
        read_costs(path)
    np.savez(path, cost=np.zeros((2, 3)), gt=np.array([0, 3]))
    with pytest.raises(StoreError, match=r"'gt' must lie in \[-1, 3\)"):
        read_costs(path)
    np.savez(path, cost=np.zeros((2, 3)), gt=np.array([0, 1]), junk=np.zeros((4, 4)))
    with pytest.raises(StoreError, match="unexpected array 'junk' of shape"):
        read_costs(path)


def test_npy_needs_a_kind(tmp_path: Path) -> None:
    path = tmp_path / "sim.npy"
    np.save(path, np.array([[1.0, 0.0], [0.2, 0.9]]))
    with pytest.raises(StoreError, match="sim.npy is a bare matrix.*kind='cost' or kind='similarity'"):
        read_costs(path)
    got = read_costs(path, kind="similarity")
    np.testing.assert_array_equal(got.ranking, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(read_costs(path, kind="cost").ranking, [[1, 0], [0, 1]])
    np.save(path, np.zeros((2, 3)))
    with pytest.raises(StoreError, match="square"):
        read_costs(path, kind="cost")
    with pytest.raises(StoreError, match="cannot hold ids"):
        write_costs(tmp_path / "out.npy", sample())


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cost file .*nothere.h5 does not exist"):
        read_costs(tmp_path / "nothere.h5")
    with pytest.raises(StoreError, match=r"costs\.csv.*\.h5, \.hdf5, \.zarr, \.npz, \.npy"):
        read_costs(tmp_path / "costs.csv")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\x00garbage" * 64)
    with pytest.raises(StoreError, match="junk.h5 is not a readable HDF5 file"):
        read_costs(junk)
    (tmp_path / "junk.npz").write_bytes(b"PK not a zip")
    with pytest.raises(StoreError, match="junk.npz is not a readable .npz"):
        read_costs(tmp_path / "junk.npz")
    (tmp_path / "empty.zarr").mkdir()
    with pytest.raises(StoreError, match="empty.zarr is not a readable zarr group"):
        read_costs(tmp_path / "empty.zarr")


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_missing_array_and_shape_mismatch_name_the_file(tmp_path: Path, suffix: str) -> None:
    path = write_costs(tmp_path / f"c{suffix}", sample())
    if suffix == ".h5":
        import h5py

        with h5py.File(path, "a") as f:
            del f["gt"]
    else:
        import shutil

        shutil.rmtree(path / "gt")
    with pytest.raises(StoreError, match=rf"c\{suffix} has no 'gt' array \(expected \(Q,\) int64"):
        read_costs(path)

    path = write_costs(tmp_path / f"d{suffix}", sample())
    if suffix == ".h5":
        import h5py

        with h5py.File(path, "a") as f:
            del f["video_ids"]
            f.create_dataset("video_ids", data=np.array([b"a", b"b"]))
    else:
        import zarr

        g = zarr.open_group(str(path), mode="r+")
        del g["video_ids"]
        g.create_array("video_ids", shape=(2,), dtype=str)[...] = np.array(["a", "b"])
    with pytest.raises(StoreError, match=rf"d\{suffix} is inconsistent: 'video_ids' has shape \(2,\), expected \(4,\)"):
        read_costs(path)


def test_write_refuses_inconsistent_matrix(tmp_path: Path) -> None:
    cm = sample()
    cm.gt = cm.gt[:3]
    with pytest.raises(ValueError, match=r"'gt' has shape \(3,\), expected \(5,\)"):
        write_costs(tmp_path / "c.h5", cm)
    cm = sample()
    cm.extras["ranking"] = np.zeros(5)
    with pytest.raises(ValueError, match="clashes"):
        write_costs(tmp_path / "c.h5", cm)
    assert list(tmp_path.iterdir()) == []
