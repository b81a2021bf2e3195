"""Issue 37: `dab evaluate --zero-shot` scores a store with CLIP alone (mean of the L2-normalised frame features), and
on a store whose manifest names a (dataset, CLIP) pair a paper reports, prints the published figure beside its own
(the numbers here come from a random store: only that the line and the record appear, and only where they should)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.results.published import published_entries, published_zero_shot
from dab_pipeline.runs.costfile import read_costs
from dab_pipeline.stages.evaluate import EvaluateConfig
from dab_pipeline.store import open_store
from dab_pipeline.testing import random_store

from ..helpers.runner import invoke


def _store(path: Path, dataset: str, model: str = "ViT-B-32-quickgelu", pretrained: str = "openai") -> Path:
    manifest = {"model": model, "pretrained": pretrained, "frames": 4, "dataset": dataset, "clip": {"embed_dim": 16}}
    return random_store(path, manifest=manifest)


def _zero_shot(store: Path, out: Path):
    return invoke(["evaluate", "--zero-shot", "--features", store, "--out", out, "--no-plots", "--examples", "0"])


def test_zero_shot_costs_are_the_cosine_with_the_mean_of_normalised_frames(tmp_path: Path) -> None:
    store = _store(tmp_path / "s.h5", "random")
    res = _zero_shot(store, tmp_path / "zs")
    assert res.exit_code == 0, res.output
    cm = read_costs(tmp_path / "zs" / "costs_test.h5")
    with open_store(store) as st:
        test = st.load_split("test")
    f = test.frames / np.linalg.norm(test.frames, axis=-1, keepdims=True)  # (V, F, D)
    m = test.frame_mask[..., None].astype(np.float32)
    v = (f * m).sum(1) / m.sum(1)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    t = test.text / np.linalg.norm(test.text, axis=-1, keepdims=True)
    np.testing.assert_allclose(cm.cost, -(t @ v.T), atol=1e-5)
    assert cm.attrs["variant"] == "zero-shot" and list(cm.gt) == list(test.caption_video)
    assert "published" not in res.output and "published" not in json.loads(
        (tmp_path / "zs" / "metrics.json").read_text()
    )


def test_a_zero_shot_run_on_msrvtt_with_vit_b32_prints_the_published_figure(tmp_path: Path) -> None:
    store = _store(tmp_path / "msrvtt.h5", "msrvtt")
    res = _zero_shot(store, tmp_path / "zs")
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "zs" / "metrics.json").read_text())
    pub = metrics["published"]
    assert pub["t2v"] == {"R@1": 31.2, "R@5": 53.7, "R@10": 64.2, "MdR": 4.0} and "2102.12443" in pub["citation"]
    assert pub["this_run"]["R@1"] == pytest.approx(metrics["t2v"]["R@1"])
    # one line, wrapped between words at 120 columns outside a terminal: its words joined again
    assert len([x for x in res.output.splitlines() if x.startswith("published zero-shot")]) == 1, res.output
    line = " ".join(res.output[res.output.index("published zero-shot") :].split())
    assert "ViT-B-32 on msrvtt (Portillo-Quintero et al. 2021): R@1 31.2, R@5 53.7, R@10 64.2" in line
    assert f"this run: R@1 {metrics['t2v']['R@1']:.1f}" in line
    assert "Published zero-shot figure: CLIP ViT-B-32 on msrvtt" in (tmp_path / "zs" / "report.md").read_text()


def test_unknown_pairs_and_trained_runs_print_nothing(tmp_path: Path) -> None:
    for name, dataset, model in (("didemo", "didemo", "ViT-B-32"), ("tiny", "msrvtt", "dab-tiny")):
        res = _zero_shot(_store(tmp_path / f"{name}.h5", dataset, model), tmp_path / name)
        assert res.exit_code == 0 and "published" not in res.output, res.output
        assert "published" not in json.loads((tmp_path / name / "metrics.json").read_text())
    # the same msrvtt store's costs, not marked zero-shot (a trained run's): no published line
    store = _store(tmp_path / "msrvtt.h5", "msrvtt")
    assert _zero_shot(store, tmp_path / "zs").exit_code == 0
    cm = read_costs(tmp_path / "zs" / "costs_test.h5")
    cm.attrs["variant"] = "dab"
    from dab_pipeline.runs.costfile import write_costs

    write_costs(tmp_path / "trained" / "costs_test.h5", cm)
    res = invoke(["evaluate", "--costs", tmp_path / "trained" / "costs_test.h5", "--no-plots", "--examples", "0"])
    assert res.exit_code == 0 and "published" not in res.output, res.output


def test_other_weights_are_noted_and_every_entry_is_cited() -> None:
    t2v = {"R@1": 30.0, "R@5": 50.0, "R@10": 60.0, "MdR": 5.0}
    pub = published_zero_shot({"dataset": "msvd", "model": "ViT-B-32", "pretrained": "/w/x.pt", "frames": 12}, t2v)
    assert pub["difference"]["R@1"] == pytest.approx(30.0 - 37.0)
    assert any("weights" in n for n in pub["notes"]) and any("12 frames" in n for n in pub["notes"])
    assert published_zero_shot({"dataset": "activitynet", "model": "ViT-B-32"}, t2v) is None
    for e in published_entries():
        assert e["citation"] and e["checked"] and e["protocol"] and set(e["t2v"]) >= {"R@1", "R@5", "R@10"}


def test_zero_shot_needs_a_store_and_nothing_else(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--zero-shot scores a store"):
        EvaluateConfig(zero_shot=True)
    with pytest.raises(ConfigError, match="--zero-shot scores a store"):
        EvaluateConfig(zero_shot=True, features=tmp_path, run=tmp_path)
    res = invoke(["evaluate", "--zero-shot"])
    assert res.exit_code != 0 and "--zero-shot scores a store" in res.output and "Traceback" not in res.output
