"""Training recipes as data (dab_pipeline/recipes): loading, per-dataset values, the CLI, and the paper recipe end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dab_pipeline.core.errors import ConfigError, UnknownNameError
from dab_pipeline.core.overrides import apply_overrides
from dab_pipeline.recipes import load_recipe, recipe_names
from dab_pipeline.runs.config import TrainConfig
from dab_pipeline.stages.train import optimizer_groups

from ..helpers.runner import extract_args, invoke


def test_every_recipe_loads_and_resolves_onto_a_train_config() -> None:
    assert set(recipe_names()) >= {"frozen", "paper", "paper-ablation", "xpool", "world"}
    for name in recipe_names():
        r = load_recipe(name)
        assert r.doc and r.source, name
        opts = [o.replace("trainable_blocks=all", "trainable_blocks=12") for o in r.overrides({"dataset": "msvd"})]
        cfg = apply_overrides(TrainConfig(features=Path("s.h5"), out=Path("r")), opts)
        assert isinstance(cfg, TrainConfig)
    paper = load_recipe("paper").resolved()
    assert (paper["lr"], paper["clip_lr"], paper["weight_decay"], paper["epochs"], paper["seed"]) == (
        1e-4,
        1e-6,
        0.02,
        10,
        24,
    )
    assert load_recipe("paper-ablation").resolved()["epochs"] == 5
    assert load_recipe("frozen").resolved() == {}


def test_xpool_learning_rate_follows_the_dataset() -> None:
    r = load_recipe("xpool")
    assert r.resolved({"dataset": "msrvtt", "dataset_options": {"train_split": "9k"}})["lr"] == 3e-5
    assert r.resolved({"dataset": "msrvtt", "dataset_options": {"train_split": "7k"}})["lr"] == 1e-5
    assert r.resolved({"dataset": "msvd"})["lr"] == 1e-5
    v = r.resolved({"dataset": "vatex"})
    assert (v["weight_decay"], v["epochs"], v["logit_scale_group"], v["model.variant"]) == (0.2, 5, "clip", "xpool")


def test_peer_recipes_name_a_source_for_every_value() -> None:
    """Issue 37: the recipes taken from the peers' code for the field's other benchmarks (CLIP4Clip's, HVP-Net's for
    Charades, T-MASS's, X-Pool's for LSMDC) give each value's file and line, and the store each goes with."""
    for name in ("clip4clip", "hvpnet", "tmass"):
        r = load_recipe(name)
        keys = set(r.values) | {f"{ds}: {k}" for m in (r.by_dataset, r.store, r.peer) for ds, v in m.items() for k in v}
        assert keys == set(r.sources), (name, keys ^ set(r.sources))
        assert all(r.sources[k].strip() for k in keys), name
    xpool = load_recipe("xpool")
    assert {f"lsmdc: {k}" for k in [*xpool.by_dataset["lsmdc"], *xpool.store["lsmdc"]]} <= set(xpool.sources)
    c4c = load_recipe("clip4clip")
    for ds, frames, words in (("activitynet", 64, 64), ("didemo", 64, 64), ("lsmdc", 12, 32)):
        assert c4c.store_values({"dataset": ds}) == {"frames": frames} and c4c.peer[ds]["max_words"] == words
        got = c4c.resolved({"dataset": ds})
        assert (got["lr"], got["clip_lr"], got["batch_size"], got["epochs"]) == (1e-4, 1e-7, 128, 5)
    assert load_recipe("hvpnet").store_values({"dataset": "charades"}) == {"frames": 12}
    tmass = load_recipe("tmass")
    assert (
        tmass.resolved({"dataset": "didemo"})["model.dropout"] == 0.4
        and tmass.resolved({"dataset": "didemo"})["lr"] == 1e-5
    )
    assert xpool.resolved({"dataset": "lsmdc"})["lr"] == 1e-5 and c4c.store_values({"dataset": "vatex"}) == {}


def test_unknown_recipe_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="valid: clip4clip, frozen, hvpnet, paper"):
        load_recipe("papr")
    res = invoke(["train", "--features", str(tmp_path), "--recipe", "papr"])
    assert res.exit_code != 0 and "unknown recipe 'papr'" in res.output and "Traceback" not in res.output


def test_logit_scale_in_the_clip_group_without_decay() -> None:
    from dab_pipeline.model import DABModel, ModelConfig

    model = DABModel(ModelConfig(embed_dim=16, variant="xpool"))
    cfg = TrainConfig(features=Path("s.h5"), out=Path("r"), lr=1e-3, clip_lr=1e-6, logit_scale_group="clip")
    groups = {g["name"]: g for g in optimizer_groups(model, None, cfg)}
    assert groups["logit_scale"]["params"] == [model.log_logit_scale]
    assert groups["logit_scale"]["lr"] == 1e-6 and groups["logit_scale"]["weight_decay"] == 0.0
    assert all(p is not model.log_logit_scale for p in groups["new"]["params"])
    default = optimizer_groups(model, None, TrainConfig(features=Path("s.h5"), out=Path("r")))
    assert [g["name"] for g in default] == ["new"]  # today's behaviour: trained with the new modules
    with pytest.raises(ConfigError, match="logit_scale_group"):
        TrainConfig(features=Path("s.h5"), out=Path("r"), logit_scale_group="old")


def _extract(captions: Path, out: Path, *extra: str):
    args = extract_args(captions, "--store-dtype", "float32", "--dtype", "float32", "--quiet", *extra, out=out)
    return invoke(args, catch_exceptions=False)


@pytest.mark.slow
def test_paper_recipe_fine_tunes_every_clip_block(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    from dab_pipeline.runs.checkpoint import load_checkpoint
    from dab_pipeline.runs.inputs import TrainHeads
    from dab_pipeline.store import open_store

    store = tmp_path / "s.h5"
    assert _extract(tiny_folder_dataset, store, "--trainable-blocks", "all").exit_code == 0
    with open_store(store) as st:
        manifest = st.manifest
    assert manifest["trainable_blocks"] == 3  # dab-tiny: 3 blocks in each tower
    run = tmp_path / "run"
    res = invoke(
        [
            "train",
            "--features",
            str(store),
            "--recipe",
            "paper",
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--set",
            "clip_lr=1e-3",
            "--out",
            str(run),
            "--quiet",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["recipe"] == "paper" and cfg["trainable_blocks"] == 3 and cfg["clip_lr"] == 1e-3  # --set wins
    assert cfg["lr"] == 1e-4 and cfg["weight_decay"] == 0.02 and cfg["logit_scale_group"] == "clip"
    torch.manual_seed(0)
    start = TrainHeads(manifest, 3, torch.device("cpu")).state_dict()
    trained = load_checkpoint(run / "checkpoints" / "last.pt")["heads"]
    assert set(start) == set(trained)
    for tower, tail in (("vision", ("ln_post.weight", "proj")), ("text", ("ln_final.weight", "text_projection"))):
        blocks = {k.split(".")[2] for k in start if k.startswith(f"{tower}.blocks.")}
        assert blocks == {"0", "1", "2"}, (tower, blocks)  # all three blocks of the tower are in the heads
        assert all(f"{tower}.{name}" in start for name in tail)
    unchanged = [k for k in start if torch.equal(start[k], trained[k])]
    assert not unchanged, unchanged  # every block, final LayerNorm and projection of both towers trained
    frozen = ("conv1", "positional_embedding", "ln_pre", "token_embedding", "class_embedding")
    assert not [k for k in start if any(f in k for f in frozen)]  # the embeddings stay in the cache, frozen


def test_logit_scale_is_clamped_at_100_during_training(tmp_path: Path) -> None:
    import math

    from dab_pipeline.model import ModelConfig
    from dab_pipeline.runs.checkpoint import load_checkpoint
    from dab_pipeline.stages.train import run_train

    from ..helpers.stores import text_store

    store = text_store(tmp_path / "store.h5")
    # start above the cap with a learning rate too small to move it: only the clamp brings it to 100
    for group, expect in (("clip", math.log(100.0)), ("new", math.log(1000.0))):
        cfg = TrainConfig(
            features=store,
            out=tmp_path / group,
            epochs=1,
            batch_size=2,
            val_split="test",
            lr=1e-9,
            clip_lr=1e-9,
            logit_scale_group=group,
            model=ModelConfig(embed_dim=32, variant="xpool", logit_scale_init=1000.0),
        )
        run_train(cfg)
        scale = load_checkpoint(tmp_path / group / "checkpoints" / "last.pt")["model"]["log_logit_scale"]
        assert float(scale) == pytest.approx(expect, abs=1e-4), group


def test_select_last_keeps_the_last_epoch_and_says_nothing(tmp_path: Path) -> None:
    from dab_pipeline.core.events import Event
    from dab_pipeline.model import ModelConfig
    from dab_pipeline.stages.train import run_train

    from ..helpers.stores import text_store

    store = text_store(tmp_path / "store.h5")  # train + test splits, no val split
    model = ModelConfig(embed_dim=32, variant="xpool")
    events: list[Event] = []
    res = run_train(
        TrainConfig(features=store, out=tmp_path / "last", epochs=3, batch_size=2, select_metric="last", model=model),
        progress=events.append,
    )
    assert res.best_epoch == 3 and not [e for e in events if e.kind == "warning"]
    # with a validation split (here the test split, for the test only) "last" still keeps the last epoch
    res = run_train(
        TrainConfig(
            features=store,
            out=tmp_path / "val",
            epochs=3,
            batch_size=2,
            val_split="test",
            select_metric="last",
            model=model,
        )
    )
    assert res.best_epoch == 3
    lines = (tmp_path / "val" / "metrics.jsonl").read_text().splitlines()
    assert all("val" in json.loads(line) for line in lines)  # still measured each epoch, for the log


def test_options_override_their_recipe_and_seed_is_an_option(tmp_path: Path) -> None:
    """`--recipe xpool` fine-tunes every CLIP block; on a frozen store `--trainable-blocks none` overrides that,
    and `--trainable-blocks 0` (which needs pooled states) says how."""
    from dab_pipeline.stages.train import build_train_config
    from dab_pipeline.testing import random_store

    store = random_store(tmp_path / "s.h5")
    cfg = build_train_config(store, tmp_path / "r", recipe="xpool", options={"trainable_blocks": "none", "seed": 7})
    assert cfg.trainable_blocks is None and cfg.seed == 7 and cfg.model.variant == "xpool" and cfg.recipe == "xpool"
    with pytest.raises(ConfigError, match="--trainable-blocks none"):
        build_train_config(store, tmp_path / "r", recipe="xpool", options={"trainable_blocks": 0})
    res = invoke(
        [
            "train",
            "--features",
            str(store),
            "--recipe",
            "xpool",
            "--trainable-blocks",
            "none",
            "--seed",
            "5",
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "cli"),
            "--quiet",
        ]
    )
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert saved["seed"] == 5 and saved["trainable_blocks"] is None and saved["lr"] == 3e-5


def test_a_recipe_applies_as_typed_values(tmp_path: Path) -> None:
    """Applying a recipe's dict equals applying its values through `--set` strings, value for value."""
    from dab_pipeline.core.overrides import apply_overrides, replace_values, to_dict
    from dab_pipeline.runs.config import TrainConfig

    base = TrainConfig(features=tmp_path / "s.h5", out=tmp_path / "r")
    for name in ("paper", "paper-ablation", "world", "frozen"):
        values = {k: v for k, v in load_recipe(name).resolved({"dataset": "msrvtt"}).items() if str(v) != "all"}
        typed = replace_values(base, values)
        parsed = apply_overrides(base, [f"{k}={v}" for k, v in values.items()])
        assert to_dict(typed) == to_dict(parsed), name
