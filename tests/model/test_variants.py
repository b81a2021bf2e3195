"""The variant table (variants.py) against the model and the scoring engines that read it."""

from __future__ import annotations

import re

import pytest
import torch

from dab_pipeline.core.choices import VARIANTS
from dab_pipeline.core.errors import ConfigError, UnknownNameError
from dab_pipeline.model import DABModel, ModelConfig
from dab_pipeline.scoring import ENGINES, build_engine
from dab_pipeline.core.variants import VARIANT_NAMES, VARIANT_SPECS


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
    assert isinstance(eng, ENGINES.get(name)) and (eng.steps is not None) == spec.bridge


def test_unknown_variants_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=re.escape("valid: xpool | prob | bridge | dab")):
        ModelConfig(variant="cosine")
    with pytest.raises(UnknownNameError, match="valid: bridge, dab, prob, xpool"):
        VARIANT_SPECS.get("cosine")
