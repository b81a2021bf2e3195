"""The model variants (paper Table 5a) as data: what each one is made of.

Torch-free, so the CLI offers the names without loading torch. The model
(:mod:`dab_pipeline.model`), the losses and the budget read a variant's parts
from here instead of comparing names; the fast scorer picks its engine by name
from :data:`dab_pipeline.scoring.ENGINES`. Adding a variant: one entry here,
its math in ``model/`` if the parts below do not cover it, and one engine file.

The controls (docs/model.md: ``prob-fixvar``, ``dab-fixvar``, ``dab-const``) are named
here too: a name a user gives to ``dab train --variant`` or a sweep's ``variant=`` that
stands for a variant and the ModelConfig values that make it the control. A config never
holds a control's name: :func:`expand_variant` turns it into those values, so a run made
with ``--variant dab-const`` is the run ``model.variant=dab model.drift=constant`` made
before the names existed (config.json alike, old run folders load as they did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import ConfigError, UnknownNameError
from .registry import Registry


@dataclass(frozen=True)
class VariantSpec:
    """The parts of one variant."""

    name: str
    gaussian: bool  # Gaussian text / video embeddings, a distributional cost and the PAC loss
    bridge: bool  # the text embedding is refined toward the video's by the bridge's T' steps
    summary: str
    # model.covariance kinds it takes (issue 36): every variant "diag"; "lowrank" where its cost is a KL between
    # Gaussians and the model carries U (prob; dab, whose bridge moves (mu, logvar) and carries the text's U
    # unchanged); "mixture" there too (dab bridges each text component); the cosine variants have no covariance.
    covariances: tuple[str, ...] = ("diag",)

    @property
    def cost_family(self) -> str:
        """ "gaussian" (KL / W2 under PAC) or "cosine" (X-Pool's InfoNCE)."""
        return "gaussian" if self.gaussian else "cosine"

    @property
    def bridge_states(self) -> int:
        """Blocks of D the bridge carries: [mu, sigma] for a Gaussian bridge, [x] for a point one; 0: none."""
        return 0 if not self.bridge else (2 if self.gaussian else 1)


_SPECS = (  # Table 5a's order
    VariantSpec("xpool", gaussian=False, bridge=False, summary="X-Pool baseline: cosine of pooled video and text"),
    VariantSpec(
        "prob",
        gaussian=True,
        bridge=False,
        summary="probabilistic encoder, no bridge: C = D(Q_v || P_t)",
        covariances=("diag", "lowrank", "mixture"),
    ),
    VariantSpec("bridge", gaussian=False, bridge=True, summary="a point bridge on the unit text, cosine cost"),
    VariantSpec(
        "dab",
        gaussian=True,
        bridge=True,
        summary="the full model: Gaussian bridge, C = D(Q_v || P_hat_t)",
        covariances=("diag", "lowrank", "mixture"),
    ),
)
VARIANT_SPECS: Registry[VariantSpec] = Registry("model variant")
for _spec in _SPECS:
    VARIANT_SPECS.register(_spec.name, _spec)
VARIANT_NAMES: tuple[str, ...] = tuple(s.name for s in _SPECS)


# ModelConfig fields that only some variants read: a sweep collapses rows that differ in these alone
# (``model.steps`` on xpool trains the same model twice), and says so.
BRIDGE_FIELDS = (
    "steps",
    "total_steps",
    "beta_min",
    "beta_max",
    "chi_min",
    "chi_max",
    "time_embed_dim",
    "drift_hidden",
    "drift_layers",
    "drift",
    "drift_init",
    "drift_inputs",
    "chi_norm",
)
GAUSSIAN_FIELDS = ("cost", "logvar_init", "logvar_min", "logvar_max", "tau", "learn_tau", "variance")
COSINE_FIELDS = ("logit_scale_init",)


def unused_model_fields(name: str) -> tuple[str, ...]:
    """The ModelConfig fields variant ``name`` never reads (its config may hold any value there)."""
    spec = VARIANT_SPECS.get(name)
    unused = () if spec.bridge else BRIDGE_FIELDS
    return unused + (COSINE_FIELDS if spec.gaussian else GAUSSIAN_FIELDS)


@dataclass(frozen=True)
class ControlSpec:
    """A control: a variant with some of its ModelConfig fields set (docs/model.md, "Controls")."""

    name: str
    variant: str  # the variant it is a control of
    values: tuple[tuple[str, str], ...]  # (ModelConfig field, value) it sets on top of the variant
    summary: str

    def model_values(self) -> dict[str, str]:
        """``{"model.variant": "dab", "model.drift": "constant"}``: the dotted TrainConfig values it stands for."""
        return {"model.variant": self.variant, **{f"model.{k}": v for k, v in self.values}}


_CONTROLS = (  # docs/model.md's order
    ControlSpec(
        "prob-fixvar",
        "prob",
        (("variance", "fixed"),),
        summary="prob with every Gaussian's variance fixed at e^logvar_init",
    ),
    ControlSpec(
        "dab-fixvar", "dab", (("variance", "fixed"),), summary="dab with the encoders' variances fixed at e^logvar_init"
    ),
    ControlSpec(
        "dab-const",
        "dab",
        (("drift", "constant"),),
        summary="dab with the drift network replaced by one learned shift for every pair",
    ),
)
CONTROL_SPECS: Registry[ControlSpec] = Registry("control")
for _control in _CONTROLS:
    CONTROL_SPECS.register(_control.name, _control)
CONTROL_NAMES: tuple[str, ...] = tuple(c.name for c in _CONTROLS)
# what `dab train --variant` and a sweep's `variant=` accept: the variants, then the controls
VARIANT_CHOICES: tuple[str, ...] = VARIANT_NAMES + CONTROL_NAMES

# `dab train`'s options that are ModelConfig fields, by their short names: `variant=`, `cost=`, `steps=` in a
# sweep's grid, plan or --set (and `dab train --set`) are the keys `model.variant`, `model.cost`, `model.steps`.
# Unambiguous: TrainConfig has no field of these names (tested).
MODEL_KEY_ALIASES = {"variant": "model.variant", "cost": "model.cost", "steps": "model.steps"}
VARIANT_KEY = "model.variant"


def canonical_key(key: str) -> str:
    """The dotted TrainConfig key ``key`` stands for (``variant`` -> ``model.variant``; others unchanged)."""
    key = str(key).strip()
    return MODEL_KEY_ALIASES.get(key, key)


def canonical_values(*sources: Mapping[str, Any]) -> dict[str, Any]:
    """``sources`` merged into one dict with canonical keys, later sources (and later keys) winning."""
    merged: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            merged[canonical_key(key)] = value
    return merged


def expand_variant(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (canonical keys) with a control's name in ``model.variant`` replaced by what it stands for.

    ``{"model.variant": "dab-const"}`` -> ``{"model.variant": "dab", "model.drift": "constant"}``. A value of
    ``values`` that contradicts the control (``model.drift=mlp``) is refused; an unknown name lists the valid
    ones, the controls included.
    """
    out = dict(values)
    name = out.get(VARIANT_KEY)
    if name is None:
        return out
    name = str(name).strip()
    if name in VARIANT_NAMES:
        out[VARIANT_KEY] = name
        return out
    if name not in CONTROL_SPECS:
        raise UnknownNameError(f"unknown model variant {name!r}; valid: {', '.join(VARIANT_CHOICES)}")
    control = CONTROL_SPECS.get(name)
    for key, value in control.model_values().items():
        if key != VARIANT_KEY and key in out and str(out[key]).strip() != value:
            raise ConfigError(
                f"model.variant={name} is model.variant={control.variant} with {key}={value}; "
                f"{key}={out[key]} contradicts it (drop one, or name the variant "
                f"{control.variant})"
            )
    out.update(control.model_values())
    return out


def expand_overrides(items: Iterable[str]) -> list[str]:
    """``--set KEY=VALUE`` strings with canonical keys and a control's name expanded (``variant=dab-const`` ->
    ``model.variant=dab``, ``model.drift=constant``); strings without ``=`` are kept for the caller to refuse."""
    out: list[str] = []
    for item in items:
        key, sep, raw = str(item).partition("=")
        if not sep:
            out.append(item)
            continue
        expanded = expand_variant({canonical_key(key): raw.strip()})
        out += [f"{k}={v}" for k, v in expanded.items()]
    return out
