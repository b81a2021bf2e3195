"""The model variants (paper Table 5a) as data: what each one is made of.

Torch-free, so the CLI offers the names without loading torch. The model
(:mod:`dab_pipeline.model`), the losses and the budget read a variant's parts
from here instead of comparing names; the fast scorer picks its engine by name
from :data:`dab_pipeline.scoring.ENGINES`. Adding a variant: one entry here,
its math in ``model/`` if the parts below do not cover it, and one engine file.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import Registry


@dataclass(frozen=True)
class VariantSpec:
    """The parts of one variant."""

    name: str
    gaussian: bool  # Gaussian text / video embeddings, a distributional cost and the PAC loss
    bridge: bool  # the text embedding is refined toward the video's by the bridge's T' steps
    summary: str

    @property
    def cost_family(self) -> str:
        """"distribution" (KL / W2 under PAC) or "cosine" (X-Pool's InfoNCE)."""
        return "distribution" if self.gaussian else "cosine"

    @property
    def bridge_states(self) -> int:
        """Blocks of D the bridge carries: [mu, sigma] for a Gaussian bridge, [x] for a point one; 0: none."""
        return 0 if not self.bridge else (2 if self.gaussian else 1)


_SPECS = (  # Table 5a's order
    VariantSpec("xpool", gaussian=False, bridge=False, summary="X-Pool baseline: cosine of pooled video and text"),
    VariantSpec("prob", gaussian=True, bridge=False, summary="probabilistic encoder, no bridge: C = D(Q_v || P_t)"),
    VariantSpec("bridge", gaussian=False, bridge=True, summary="a point bridge on the unit text, cosine cost"),
    VariantSpec("dab", gaussian=True, bridge=True, summary="the full model: Gaussian bridge, C = D(Q_v || P_hat_t)"),
)
VARIANT_SPECS: Registry[VariantSpec] = Registry("model variant")
for _spec in _SPECS:
    VARIANT_SPECS.register(_spec.name, _spec)
VARIANT_NAMES: tuple[str, ...] = tuple(s.name for s in _SPECS)


# ModelConfig fields that only some variants read: a sweep collapses rows that differ in these alone
# (``model.steps`` on xpool trains the same model twice), and says so.
BRIDGE_FIELDS = ("steps", "total_steps", "beta_min", "beta_max", "chi_min", "chi_max", "time_embed_dim",
                 "drift_hidden", "drift_layers", "drift", "drift_init", "drift_inputs", "chi_norm")
GAUSSIAN_FIELDS = ("cost", "logvar_init", "logvar_min", "logvar_max", "tau", "learn_tau", "variance")
COSINE_FIELDS = ("logit_scale_init",)


def unused_model_fields(name: str) -> tuple[str, ...]:
    """The ModelConfig fields variant ``name`` never reads (its config may hold any value there)."""
    spec = VARIANT_SPECS.get(name)
    unused = () if spec.bridge else BRIDGE_FIELDS
    return unused + (COSINE_FIELDS if spec.gaussian else GAUSSIAN_FIELDS)
