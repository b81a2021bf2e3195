"""`dab distill`: a trained bridge in S steps (the paper's open problem of one-step bridges).

A student copies a trained ``dab`` (or ``bridge``) run -- pooling, encoders and the drift --
with ``steps = S`` (1 by default) and trains its bridge alone, the teacher frozen, on the
training split's caption-video pairs: every pair of a batch, since scoring runs on every
pair, not only the matched ones. Two losses:

* **state**: the student's bridged state after S steps against the teacher's after T'
  (mean squared error of mu and of logvar; the point bridge: of x);
* **ranking**: for every row and column of the batch's cost matrix,
  ``KL(softmax(-C_teacher / t) || softmax(-C_student / t))`` with t the teacher's PAC
  temperature (its inverse logit scale for the point bridge), so the student keeps the
  teacher's order where it matters for retrieval.

The result is an ordinary run folder (config.json with ``model.steps = S``; ``distill.json``
names the teacher and its checkpoint's sha256): `dab evaluate`, `dab search`, `dab compare`
and the scoring engine read it unchanged, at the cost its step count implies.

**What the student inherits.** The training values of the teacher's config.json that a
distillation would otherwise pick blindly are the teacher's unless given (a ``None`` in
:class:`DistillConfig`; :data:`INHERITED`): ``batch_size`` (a split the teacher's batch fits
may be smaller than a default batch, and the ranking loss sees every pair of a batch as the
teacher's contrastive loss did), ``lr`` (the teacher's bridge lr: ``bridge_lr`` where it set
one, else ``lr``; the bridge is the only part that trains), ``weight_decay``, ``warmup_ratio``
and ``seed``. What an epoch visits (the teacher's epoch mode) is always the teacher's. Not
inherited: what a distillation defines itself (``student_steps``, ``epochs``, ``state_weight``,
``rank_weight``) and ``device``, which belongs to the machine, not to the run. The stage says in
one ``info`` event what it took ("inherited from the teacher: batch_size=4, lr=0.0001, ...");
distill.json and config.json record the values that ran.

* ``config``: DistillConfig, what the student inherits, DistillResult;
* ``build``: a DistillConfig from typed values (options, ``--set``, ``--resume``);
* ``run``: ``run_distill``, the student and its epochs (its loss is :func:`dab_pipeline.model.losses.distill_loss`).
"""

from .build import build_distill_config  # noqa: F401
from .config import INHERITED, DistillConfig, DistillResult, inherit_from_teacher  # noqa: F401
from .run import build_student, pair_outputs, run_distill  # noqa: F401

__all__ = [
    "DistillConfig",
    "DistillResult",
    "INHERITED",
    "build_distill_config",
    "inherit_from_teacher",
    "run_distill",
]
