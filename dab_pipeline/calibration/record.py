"""calibration.json: what ``dab calibrate`` fitted on a run's validation queries, and for which checkpoint and
gallery (:class:`Calibration`).

Its numbers are plain JSON: the probability maps' parameters, each conformal score's values on the calibration
queries (sorted; the quantile for any coverage is taken from them when a search asks), and the held-out
queries' calibrated confidences and outcomes (the risk threshold for any risk and delta is chosen from them by
Learn-then-Test when a search asks). No pickle: a calibration file never runs code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..core.errors import ConfigError
from ..core.fsutil import atomic_write_text
from .maps import ProbabilityMap
from .schema import SchemaError, validate


def video_ids_digest(video_ids) -> str:
    """sha256 of a gallery's video ids in order: whether a cost file's videos are the gallery calibrated on."""
    return hashlib.sha256("\x00".join(map(str, video_ids)).encode("utf-8")).hexdigest()


__all__ = [
    "CALIBRATION_FILE",
    "CALIBRATION_VERSION",
    "Calibration",
    "finite_or_none",
    "read_calibration",
    "video_ids_digest",
    "write_calibration",
]

CALIBRATION_FILE = "calibration.json"
CALIBRATION_VERSION = 3  # 2: per-query conformal scores and weights, the video as the unit, groups (issue 58)
# 3: a word per meaning (issue 62): k is first_k, the softmax features softmax_first(_k); a version 2 file still reads
_V2_FEATURES = {"p_first": "softmax_first", "p_first_k": "softmax_first_k"}


@dataclass(frozen=True)
class Calibration:
    method: str  # auto (each target's map chosen by cross-validated log loss) or the map kind asked for
    first_k: int  # the k of P(a match in the first k)
    k0: int  # the first costs every feature reads: a shortlist of K >= k0 gives the exhaustive probabilities
    temperature: float  # of the softmax over costs (the run's)
    queries: int  # validation queries in all
    videos: int  # their videos: the unit of the split, of every quantile and of the risk test
    fit_queries: int  # of the queries, those of the fitted half of the videos (maps, band edges)
    check_queries: int  # the others, of the held-out half (held-out figures, risk threshold, per-group quantiles)
    seed: int  # of the split of the videos into the two halves
    maps: dict[str, ProbabilityMap]  # first, first_k (calibrated), margin_sigmoid (the baseline)
    conformal: dict[str, list[float]]  # score -> each query's true-video score, in query order
    weights: list[float]  # each query's weight: one over its video's captions
    held_out: list[int]  # each query: 1 of the held-out half, 0 of the fitted half
    conformal_params: dict[str, float]  # raps's lam and k_reg
    risk: dict[str, Any]  # the held-out queries' confidence (P(first)), correct and video; the test (wsr)
    report: dict[str, Any]  # held-out figures on the check queries (calibration_report per probability)
    groups: Optional[dict[str, Any]] = None  # --groups: spec, signal, edges, each query's band per kind
    unit: str = "video"  # the exchangeable unit (docs/uncertainty.md)
    provenance: dict[str, Any] = field(default_factory=dict)  # run, checkpoint_sha256, split, gallery, libraries
    cache: dict = field(default_factory=dict, compare=False, repr=False)  # quantiles and thresholds asked for

    def scores(self, name: str) -> np.ndarray:
        """Each query's ``name`` conformal score (Q,) float64; +inf where the first stage missed its match (null in
        the file)."""
        return np.array([np.inf if x is None else x for x in self.conformal[name]], np.float64)

    def quantile_rows(self) -> np.ndarray:
        """The queries the marginal quantile is taken over (Q,) bool: every one, or the held-out half alone where
        the fitted half chose the shortlist (``dab calibrate --index --coverage``): a quantile over queries that
        chose it would not be exchangeable with a new one."""
        chosen = (self.provenance.get("index") or {}).get("chosen_for")
        return np.asarray(self.held_out, bool) if chosen else np.ones(self.queries, bool)

    @property
    def checkpoint_sha256(self) -> Optional[str]:
        return self.provenance.get("checkpoint_sha256")

    @property
    def gallery(self) -> dict[str, Any]:
        return dict(self.provenance.get("gallery") or {})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("cache")
        d["maps"] = {name: m.to_dict() for name, m in self.maps.items()}
        return {"version": CALIBRATION_VERSION, **finite_or_none(d)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = CALIBRATION_FILE) -> "Calibration":
        if isinstance(d, dict) and d.get("version") == 2:
            d = _from_v2(d)
        if not isinstance(d, dict) or d.get("version") != CALIBRATION_VERSION:
            found = d.get("version") if isinstance(d, dict) else type(d).__name__
            raise ConfigError(
                f"{source} is not a calibration of version {CALIBRATION_VERSION} (found {found!r}); "
                "make it again with `dab calibrate`"
            )
        try:
            body = validate(d)
            body["maps"] = {name: ProbabilityMap.from_dict(m) for name, m in body["maps"].items()}
            return cls(**body)
        except (SchemaError, TypeError, KeyError, AttributeError, ValueError, ConfigError) as exc:
            raise ConfigError(f"{source} is malformed ({exc}); make it again with `dab calibrate`") from None


def _from_v2(d: dict[str, Any]) -> dict[str, Any]:
    """A version 2 calibration.json's body in version 3's names: its ``k`` is ``first_k``, its maps' features
    ``p_first`` and ``p_first_k`` are ``softmax_first`` and ``softmax_first_k`` (the numbers are the same)."""
    d = {("first_k" if key == "k" else key): value for key, value in d.items()} | {"version": CALIBRATION_VERSION}
    maps = d.get("maps")
    if isinstance(maps, dict):
        d["maps"] = {
            name: {**m, "features": [_V2_FEATURES.get(f, f) for f in m["features"]]}
            if isinstance(m, dict) and isinstance(m.get("features"), list)
            else m
            for name, m in maps.items()
        }
    return d


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (a NaN AUROC of one-class outcomes, say) as None: JSON holds none."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_calibration(path: Path, cal: Calibration) -> Path:
    """Write ``cal`` atomically (a killed write leaves the old file or none); never a NaN or an Infinity."""
    atomic_write_text(Path(path), json.dumps(cal.to_dict(), indent=1, allow_nan=False) + "\n")
    return Path(path)


def _no_constant(name: str) -> Any:
    raise SchemaError(f"it holds {name}, which is not JSON")


def read_calibration(path: Path) -> Calibration:
    """The calibration in ``path``, checked whole against its schema (:func:`validate`); a one-line ConfigError
    for a missing, unreadable or malformed file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a calibration file: make it with `dab calibrate`")
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: make it with `dab calibrate --run {path.parent}`")
    try:
        d = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except SchemaError as exc:
        raise ConfigError(f"{path} is malformed ({exc}); make it again with `dab calibrate`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); make it again with `dab calibrate`") from None
    return Calibration.from_dict(d, str(path))


def read_run_calibration(run_dir: Path, checkpoint_sha256: str) -> tuple[Optional[Calibration], Optional[str]]:
    """The calibration.json of a run (None where it has none), and why it cannot be used where it was made for
    another checkpoint (the run was trained on, or its best.pt replaced, after ``dab calibrate``)."""
    path = Path(run_dir) / CALIBRATION_FILE
    if not path.exists():
        return None, None
    cal = read_calibration(path)
    if cal.checkpoint_sha256 != checkpoint_sha256:
        return None, (
            f"{path} was made for another checkpoint than {Path(run_dir) / 'checkpoints' / 'best.pt'} "
            f"(sha256 {str(cal.checkpoint_sha256)[:12]}..., now {checkpoint_sha256[:12]}...): "
            f"make it again with `dab calibrate --run {run_dir}`"
        )
    return cal, None


def gallery_mismatch(cal: Calibration, split: str, videos: int, fingerprint: str) -> Optional[str]:
    """One line where the gallery searched is not the one calibrated on (what still holds: docs/uncertainty.md);
    None where it is."""
    g = cal.gallery
    if g.get("fingerprint") == fingerprint:
        return None
    return (
        f"the run was calibrated on a gallery of {g.get('videos')} videos (split {g.get('split')!r} of "
        f"{g.get('store')}), not this one of {videos} (split {split!r}): its probabilities, sets and risk "
        "decisions hold there only (docs/uncertainty.md)"
    )
