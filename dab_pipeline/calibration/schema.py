"""calibration.json's schema, checked whole when the file is read: every type, length, range, order and count that
the file's parts must agree on, so that a damaged or hand-edited file is one line ("make it again with dab
calibrate") and never a traceback, a 500 or, worse, sets and answers computed silently from wrong numbers."""

from __future__ import annotations

import math
from typing import Any

from ..core.choices import CALIBRATION_METHODS, CONFORMAL_SCORES, PROBABILITY_MAPS
from ..metrics.risk import RISK_TESTS
from .groups import parse_groups  # the spec's own parser: one definition of what a spec is

__all__ = ["SchemaError", "validate"]

PER_VIDEO_TESTS = tuple(t for t in RISK_TESTS if t != "binomial")  # the video is the unit: never the binomial

MAP_NAMES = ("first", "first_k", "margin_sigmoid")
FIELDS = (
    "method",
    "first_k",
    "k0",
    "temperature",
    "queries",
    "videos",
    "fit_queries",
    "check_queries",
    "seed",
    "maps",
    "conformal",
    "weights",
    "held_out",
    "conformal_params",
    "risk",
    "report",
    "groups",
    "unit",
    "provenance",
)


class SchemaError(ValueError):
    """What is wrong, in a few words naming the field."""


def _int(d: dict, key: str, low: int = 0) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise SchemaError(f"{key} must be a whole number >= {low}, got {v!r}")
    return v


def _number(v: Any, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        raise SchemaError(f"{what} must be a finite number in [{low:g}, {high:g}], got {v!r}")
    return float(v)


def _numbers(v: Any, what: str, n: int | None = None, low: float = -math.inf, high: float = math.inf) -> list:
    if not isinstance(v, list):
        raise SchemaError(f"{what} must be a list of numbers, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise SchemaError(f"{what} holds {len(v)} values, not {n}")
    for x in v:
        _number(x, f"every value of {what}", low, high)
    return v


def _ascending(v: list, what: str) -> None:
    if any(b < a for a, b in zip(v, v[1:])):
        raise SchemaError(f"{what} must be in ascending order")


def _check_map(name: str, m: Any) -> None:
    if not isinstance(m, dict) or not isinstance(m.get("params"), dict) or not isinstance(m.get("features"), list):
        raise SchemaError(f"maps.{name} must hold kind, features and params")
    if m.get("kind") not in PROBABILITY_MAPS:
        raise SchemaError(f"maps.{name}.kind must be one of {', '.join(PROBABILITY_MAPS)}, got {m.get('kind')!r}")
    f = m["features"]
    if not f or not all(isinstance(x, str) for x in f):
        raise SchemaError(f"maps.{name}.features must be a non-empty list of names")
    p = m["params"]
    if m["kind"] == "logistic":
        for key in ("mean", "scale", "coef"):
            _numbers(p.get(key), f"maps.{name}.params.{key}", len(f))
        if any(x <= 0 for x in p["scale"]):
            raise SchemaError(f"maps.{name}.params.scale must be positive")
        _number(p.get("intercept"), f"maps.{name}.params.intercept")
    elif len(f) != 1:
        raise SchemaError(f"maps.{name}: a {m['kind']} map reads one feature, not {len(f)}")
    elif m["kind"] == "temperature":
        _number(p.get("temperature"), f"maps.{name}.params.temperature", 1e-300)
        _int(p, "first", 1)
    if p.get("given_not_first") not in (None, True):
        raise SchemaError(f"maps.{name}.params.given_not_first must be true or absent")
    elif m["kind"] == "isotonic":
        xs = _numbers(p.get("x"), f"maps.{name}.params.x")
        _numbers(p.get("y"), f"maps.{name}.params.y", len(xs), 0.0, 1.0)
        if not xs:
            raise SchemaError(f"maps.{name}.params.x is empty")
        _ascending(xs, f"maps.{name}.params.x")


def _check_groups(g: Any, n: int) -> None:
    if not isinstance(g, dict):
        raise SchemaError("groups must be an object or null")
    try:
        spec = parse_groups(g.get("spec"))
    except Exception as exc:  # a ConfigError naming the bad spec
        raise SchemaError(f"groups.spec: {exc}") from None
    if spec is None:
        raise SchemaError("groups.spec is empty")
    if g.get("signal") not in ("log_text_var", "minus_margin"):
        raise SchemaError(f"groups.signal must be log_text_var or minus_margin, got {g.get('signal')!r}")
    edges, bands = g.get("edges"), g.get("bands")
    if not isinstance(edges, dict) or not isinstance(bands, dict):
        raise SchemaError("groups must hold edges and bands per kind")
    for kind, count in spec.kinds:
        e = _numbers(edges.get(kind), f"groups.edges.{kind}", count - 1)
        _ascending(e, f"groups.edges.{kind}")
        b = bands.get(kind)
        if not isinstance(b, list) or len(b) != n:
            raise SchemaError(f"groups.bands.{kind} must hold one band a query ({n})")
        if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < count for x in b):
            raise SchemaError(f"groups.bands.{kind} must hold whole numbers in [0, {count})")


def _check_outcomes(r: Any, n: int, what: str) -> None:
    """confidence, correct and video of ``n`` queries."""
    if not isinstance(r, dict):
        raise SchemaError(f"{what} must be an object")
    _numbers(r.get("confidence"), f"{what}.confidence", n, 0.0, 1.0)
    correct = r.get("correct")
    if not isinstance(correct, list) or len(correct) != n:
        raise SchemaError(f"{what}.correct must hold one outcome a query ({n})")
    if any(x not in (0, 1) or isinstance(x, float) for x in correct):
        raise SchemaError(f"{what}.correct must hold 0 or 1 (or false / true) only")
    video = r.get("video")
    if not isinstance(video, list) or len(video) != n:
        raise SchemaError(f"{what}.video must hold one video id a query ({n})")
    if not (
        all(isinstance(v, int) and not isinstance(v, bool) for v in video) or all(isinstance(v, str) for v in video)
    ):
        raise SchemaError(f"{what}.video must hold whole numbers only or strings only")


def _check_risk(r: Any, n_check: int, n_fit: int) -> None:
    _check_outcomes(r, n_check, "risk")
    _check_outcomes(r.get("fit"), n_fit, "risk.fit")
    if r.get("test") not in PER_VIDEO_TESTS:
        raise SchemaError(f"risk.test must be one of {', '.join(PER_VIDEO_TESTS)}, got {r.get('test')!r}")


def _check_provenance(prov: Any) -> None:
    """The parts a search reads: the gallery (an object) and the first stage calibrated through (null or an index,
    its digest, shortlist and nprobe)."""
    if not isinstance(prov, dict):
        raise SchemaError("provenance must be an object")
    if not isinstance(prov.get("gallery", {}), dict):
        raise SchemaError("provenance.gallery must be an object")
    index = prov.get("index")
    if index is None:
        return
    if not isinstance(index, dict) or not all(isinstance(index.get(k), str) for k in ("path", "digest")):
        raise SchemaError("provenance.index must be null or hold the index's path and digest")
    for key in ("shortlist", "nprobe"):
        _int(index, key, 1)
    if not isinstance(index.get("chosen_for", {}), dict):
        raise SchemaError("provenance.index.chosen_for must be an object")


def validate(d: dict[str, Any]) -> dict[str, Any]:
    """The file's fields (without its version) where they agree with the schema, else a SchemaError."""
    body = {k: v for k, v in d.items() if k != "version"}
    unknown = sorted(set(body) - set(FIELDS))
    missing = [k for k in FIELDS if k not in body and k not in ("groups", "provenance")]
    if unknown or missing:
        raise SchemaError(
            ", ".join(
                ([f"unknown fields {', '.join(unknown)}"] if unknown else [])
                + ([f"missing fields {', '.join(missing)}"] if missing else [])
            )
        )
    if body["method"] not in CALIBRATION_METHODS:
        raise SchemaError(f"method must be one of {', '.join(CALIBRATION_METHODS)}, got {body['method']!r}")
    k = _int(body, "first_k", 2)
    if _int(body, "k0", 2) < k:
        raise SchemaError(f"k0 {body['k0']} must be at least first_k {k}")
    _number(body["temperature"], "temperature", 1e-300)
    n, videos = _int(body, "queries", 1), _int(body, "videos", 1)
    fit, check = _int(body, "fit_queries", 1), _int(body, "check_queries", 1)
    _int(body, "seed")
    if fit + check != n or videos > n:
        raise SchemaError(f"fit_queries {fit} + check_queries {check} must equal queries {n}, of at most {n} videos")
    if body["unit"] != "video":
        raise SchemaError(f"unit must be 'video', got {body['unit']!r}")
    maps = body["maps"]
    if not isinstance(maps, dict) or sorted(maps) != sorted(MAP_NAMES):
        raise SchemaError(f"maps must hold exactly {', '.join(MAP_NAMES)}")
    for name, m in maps.items():
        _check_map(name, m)
    conf = body["conformal"]
    if not isinstance(conf, dict) or not conf or not set(conf) <= set(CONFORMAL_SCORES):
        raise SchemaError(f"conformal must map scores of {', '.join(CONFORMAL_SCORES)} to their values")
    for name, values in conf.items():  # null: a match the first stage missed (outside every set)
        if not isinstance(values, list) or len(values) != n:
            raise SchemaError(f"conformal.{name} must be a list of {n} values")
        _numbers([v for v in values if v is not None], f"conformal.{name}")
    weights = _numbers(body["weights"], "weights", n, 0.0, 1.0)
    if any(w <= 0 for w in weights) or abs(sum(weights) - videos) > 1e-6 * max(1, videos):
        raise SchemaError(f"weights must be positive and add up to the {videos} videos")
    held = body["held_out"]
    if not isinstance(held, list) or len(held) != n or any(x not in (0, 1) or isinstance(x, float) for x in held):
        raise SchemaError(f"held_out must hold 0 or 1 a query ({n})")
    if sum(held) != check:
        raise SchemaError(f"held_out marks {sum(held)} queries, not check_queries {check}")
    params = body["conformal_params"]
    if not isinstance(params, dict):
        raise SchemaError("conformal_params must be an object")
    _number(params.get("lam"), "conformal_params.lam", 0.0)
    _number(params.get("k_reg"), "conformal_params.k_reg", 0.0)
    _check_risk(body["risk"], check, fit)
    if not isinstance(body["report"], dict):
        raise SchemaError("report must be an object")
    if body.get("groups") is not None:
        _check_groups(body["groups"], n)
    _check_provenance(body.get("provenance", {}))
    return body
