"""The variant table (variants.py) against the model and the scoring engines that read it."""

from __future__ import annotations

import re

import pytest
import torch

from dab_pipeline.core.choices import VARIANTS
from dab_pipeline.core.errors import ConfigError, UnknownNameError
from dab_pipeline.core.variants import VARIANT_NAMES, VARIANT_SPECS
from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.scoring import ENGINES, build_engine


def test_every_variant_has_a_spec_and_an_engine_and_the_cli_offers_it() -> None:
    assert VARIANTS == VARIANT_NAMES == ("xpool", "prob", "bridge", "dab")  # Table 5a's order
    assert sorted(VARIANT_SPECS) == sorted(VARIANTS)
    # one engine per variant, and one per bridge variant with a constant drift (the dab-const control)
    bridged = [f"{v}/constant" for v in VARIANTS if VARIANT_SPECS.get(v).bridge]
    assert sorted(ENGINES) == sorted([*VARIANTS, *bridged])


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_the_model_builds_what_the_spec_names(name: str) -> None:
    spec = VARIANT_SPECS.get(name)
    model = DABModel(ModelConfig(embed_dim=16, variant=name, drift_hidden=8, time_embed_dim=4, steps=2))
    assert (model.prob is not None) == (model.token_unc is not None) == spec.gaussian
    assert (model.bridge is not None) == spec.bridge
    if spec.bridge:
        assert model.bridge.n_state == spec.bridge_states == (2 if spec.gaussian else 1)
    assert hasattr(model, "log_tau") == spec.gaussian and hasattr(model, "log_logit_scale") != spec.gaussian
    eng = build_engine(model, torch.device("cpu"), torch.float32)
    assert isinstance(eng, ENGINES.get(name)) and (eng.bridge_runner is not None) == spec.bridge


def test_unknown_variants_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=re.escape("valid: xpool | prob | bridge | dab")):
        ModelConfig(variant="cosine")
    with pytest.raises(UnknownNameError, match="valid: bridge, dab, prob, xpool"):
        VARIANT_SPECS.get("cosine")


def test_each_control_is_a_variant_with_valid_model_values_and_the_cli_offers_it() -> None:
    """prob-fixvar, dab-fixvar, dab-const: names of a variant plus ModelConfig values (docs/model.md)."""
    from dab_pipeline.core.choices import VARIANT_OPTIONS
    from dab_pipeline.core.variants import CONTROL_NAMES, CONTROL_SPECS

    assert CONTROL_NAMES == ("prob-fixvar", "dab-fixvar", "dab-const")
    assert VARIANT_OPTIONS == VARIANTS + CONTROL_NAMES and not set(CONTROL_NAMES) & set(VARIANTS)
    expected = {
        "prob-fixvar": {"model.variant": "prob", "model.variance": "fixed"},
        "dab-fixvar": {"model.variant": "dab", "model.variance": "fixed"},
        "dab-const": {"model.variant": "dab", "model.drift": "constant"},
    }  # docs/model.md's table
    for name in CONTROL_NAMES:
        control = CONTROL_SPECS.get(name)
        assert control.model_values() == expected[name]
        ModelConfig(variant=control.variant, **dict(control.values))  # valid values of real fields


def test_short_keys_are_the_model_fields_and_a_control_expands_to_its_values() -> None:
    import dataclasses

    from dab_pipeline.core.variants import MODEL_KEY_ALIASES, canonical_values, expand_overrides, expand_variant
    from dab_pipeline.runs.config import TrainConfig

    # unambiguous: each short name is a ModelConfig field and no TrainConfig field of its own
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for short, key in MODEL_KEY_ALIASES.items():
        assert key == f"model.{short}" and short in model_fields and short not in train_fields
    assert canonical_values({"model.variant": "xpool"}, {"variant": "dab", "steps": 8, "cost": "w2"}) == {
        "model.variant": "dab",
        "model.steps": 8,
        "model.cost": "w2",
    }
    assert expand_variant({"model.variant": "dab-const", "model.steps": 8}) == {
        "model.variant": "dab",
        "model.steps": 8,
        "model.drift": "constant",
    }
    assert expand_variant({"model.variant": "dab-const", "model.drift": "constant"})["model.drift"] == "constant"
    assert expand_overrides(["variant=prob-fixvar", "steps=4", "lr=1e-3"]) == [
        "model.variant=prob",
        "model.variance=fixed",
        "model.steps=4",
        "lr=1e-3",
    ]
    with pytest.raises(ConfigError, match="model.drift=mlp contradicts it"):
        expand_variant({"model.variant": "dab-const", "model.drift": "mlp"})
    with pytest.raises(UnknownNameError, match="valid: xpool, prob, bridge, dab, prob-fixvar, dab-fixvar, dab-const"):
        expand_variant({"model.variant": "cosine"})
