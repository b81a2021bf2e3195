"""What `auto` picks, and what happens to bf16 requests, on CPUs with and without native bf16 (mocked both ways)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dab_pipeline.core.errors import ConfigError
from dab_pipeline.core.events import Event
from dab_pipeline.model import ModelConfig
from dab_pipeline.runtime import capabilities as caps_mod
from dab_pipeline.runtime.capabilities import (
    ALLOW_EMULATED_ENV,
    Capabilities,
    override,
    resolve_amp,
    resolve_clip_dtype,
    resolve_score_dtype,
)
from dab_pipeline.scoring.kernels import cpu as cpu_kernels
from dab_pipeline.store import open_store

from ..helpers.runner import extract_args, invoke

REPO = Path(__file__).resolve().parents[2]
NATIVE = Capabilities(
    "cpu",
    "test CPU with AMX",
    True,
    "AMX-BF16, AVX512-BF16; oneDNN bf16 on",
    False,
    ("avx2", "avx512f", "avx512_bf16", "amx_bf16"),
)
AVX2 = Capabilities(
    "cpu",
    "test CPU (Zen 3)",
    False,
    "AVX2 without AMX or AVX512-BF16: bf16 products are emulated",
    False,
    ("avx2", "fma"),
)


@pytest.fixture(autouse=True)
def _no_emulation_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_EMULATED_ENV, raising=False)


def test_auto_picks_bf16_only_where_it_is_native() -> None:
    with override(NATIVE):
        assert resolve_score_dtype("auto", "cpu").dtype == "bfloat16"
        assert resolve_clip_dtype("auto", "cpu").dtype == "bfloat16"
        assert resolve_amp("auto", "cpu").dtype == "none"  # CPU autocast measured slower than float32
    with override(AVX2):
        for resolve in (resolve_score_dtype, resolve_clip_dtype):
            choice = resolve("auto", "cpu")
            assert choice.dtype == "float32" and choice.warning is None
        assert resolve_amp("auto", "cpu").dtype == "none"
    assert caps_mod.capabilities("cpu") is not NATIVE  # the override ends with its block


def test_cuda_auto_follows_the_compute_capability() -> None:
    ampere = Capabilities("cuda:0", "A100", True, "compute capability 8.0", True)
    volta = Capabilities("cuda:0", "V100", False, "compute capability 7.0: no bf16 tensor cores", False)
    with override(ampere):
        assert resolve_clip_dtype("auto", torch.device("cuda", 0)).dtype == "autocast-bf16"
        assert resolve_amp("auto", torch.device("cuda", 0)).dtype == "bf16"
        assert resolve_score_dtype("auto", torch.device("cuda", 0)).dtype == "bfloat16"
    with override(volta):
        assert resolve_clip_dtype("auto", torch.device("cuda", 0)).dtype == "float16"
        assert resolve_amp("auto", torch.device("cuda", 0)).dtype == "none"
        assert resolve_score_dtype("bfloat16", torch.device("cuda", 0)).dtype == "float32"


def test_explicit_bf16_on_a_cpu_without_it_runs_float32_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    with override(AVX2):
        for resolve, asked, fallback in (
            (resolve_score_dtype, "bfloat16", "float32"),
            (resolve_clip_dtype, "bfloat16", "float32"),
            (resolve_clip_dtype, "autocast-bf16", "float32"),
            (resolve_amp, "bf16", "none"),
        ):
            choice = resolve(asked, "cpu")
            assert choice.dtype == fallback and choice.requested == asked
            assert "no native bf16" in choice.warning and "AVX2" in choice.warning
            assert ALLOW_EMULATED_ENV in choice.warning  # the way to insist
        monkeypatch.setenv(ALLOW_EMULATED_ENV, "1")
        assert resolve_score_dtype("bfloat16", "cpu") == caps_mod.DtypeChoice("bfloat16", "bfloat16")
    with override(NATIVE):
        assert resolve_score_dtype("bfloat16", "cpu").warning is None
        assert resolve_clip_dtype("float32", "cpu").dtype == "float32"  # explicit float32 is never changed


def test_unknown_dtypes_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="auto, float32, bfloat16"):
        resolve_score_dtype("float16", "cpu")
    with pytest.raises(ConfigError, match="autocast-bf16"):
        resolve_clip_dtype("int8", "cpu")


def test_cpu_probe_reads_flags_and_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    real = caps_mod.capabilities("cpu")
    assert real.device == "cpu" and real.bf16 == caps_mod.onednn_bf16()  # this machine, as detected
    cases = [
        ({"avx2", "avx512f", "avx512_bf16"}, True, True, "AVX512-BF16"),
        ({"avx2", "avx512f", "avx512_bf16"}, False, False, "bf16 check is off"),
        ({"avx2", "fma"}, False, False, "AVX2 without"),
        ({"avx2", "avx512f"}, False, False, "AVX-512 without"),
    ]
    for flags, onednn, native, why in cases:
        monkeypatch.setattr(caps_mod, "cpu_flags", lambda f=flags: frozenset(f))
        monkeypatch.setattr(caps_mod, "onednn_bf16", lambda o=onednn: o)
        c = caps_mod.probe_cpu()
        assert (c.bf16, why in c.bf16_why) == (native, True), (flags, onednn, c)


# --------------------------------------------------------------------------- the stages


def _extract(captions: Path, out: Path, *extra: str):
    args = extract_args(captions, "--store-dtype", "float32", *extra, out=out)
    return invoke(args, catch_exceptions=False)


def test_extract_bf16_on_a_cpu_without_it_stores_float32_and_says_why(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "s.h5"
    with override(AVX2):
        res = _extract(tiny_folder_dataset, out, "--dtype", "bfloat16")
    assert res.exit_code == 0, res.output
    assert "no native bf16" in res.output and "running in float32" in res.output
    with open_store(out) as st:
        assert st.manifest["compute_dtype"] == "float32"
        assert st.manifest["device_capabilities"]["bf16"] is False


def test_extract_auto_resumes_with_the_stores_own_dtype(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.h5"
    with override(AVX2):  # auto: float32 here ...
        assert _extract(tiny_folder_dataset, out, "--limit", "3").exit_code == 0
    with override(NATIVE):  # ... bf16 on this machine, but the store is float32: resume, don't refuse
        res = _extract(tiny_folder_dataset, out, "--limit", "3")
        assert res.exit_code == 0 and "different configuration" not in res.output, res.output
        with open_store(out) as st:
            assert st.manifest["compute_dtype"] == "float32"
        fresh = tmp_path / "fresh.h5"
        assert _extract(tiny_folder_dataset, fresh, "--limit", "3").exit_code == 0
        with open_store(fresh) as st:
            assert st.manifest["compute_dtype"] == "bfloat16"


def _train_store(path: Path) -> Path:
    from ..helpers.stores import text_store

    return text_store(path)


def test_train_bf16_scoring_on_a_cpu_without_it_runs_float32(tmp_path: Path) -> None:
    from dab_pipeline.runs.config import TrainConfig
    from dab_pipeline.stages.train import run_train

    store = _train_store(tmp_path / "store.h5")
    cfg = TrainConfig(
        features=store,
        out=tmp_path / "run",
        epochs=1,
        batch_size=2,
        score_dtype="bfloat16",
        val_split="test",
        amp="bf16",
        model=ModelConfig(embed_dim=32, variant="dab", steps=2, drift_hidden=16, time_embed_dim=8),
    )
    events: list[Event] = []
    with override(AVX2):
        run_train(cfg, progress=events.append)
    warnings = [e.message for e in events if e.kind == "warning" and "no native bf16" in e.message]
    assert len(warnings) == 2 and any("score dtype" in w for w in warnings) and any("amp" in w for w in warnings)
    precision = json.loads((tmp_path / "run" / "precision.json").read_text())
    assert precision["score_dtype"] == {"requested": "bfloat16", "used": "float32"}
    assert precision["amp"] == {"requested": "bf16", "used": "none"}
    assert precision["device"]["name"] == AVX2.name
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["score_dtype"] == "bfloat16"  # the request, so the same command resumes


def test_search_warns_and_scores_float32(tmp_path: Path) -> None:
    from dab_pipeline.stages.search import SearchConfig, run_search

    from ..helpers.models import hand_made_run
    from ..helpers.stores import text_store

    store = text_store(tmp_path / "store.h5")
    run, _ = hand_made_run(tmp_path / "run", store)
    said: list[str] = []
    with override(AVX2):
        slow = run_search(
            SearchConfig(run, store, ["a cat sleeps"], k=3, device="cpu", dtype="bfloat16"), warn=said.append
        )
        exact = run_search(
            SearchConfig(run, store, ["a cat sleeps"], k=3, device="cpu", dtype="float32"), warn=said.append
        )
    assert len(said) == 1 and "no native bf16" in said[0]
    # it really ran float32: the same float32 computation twice, bit-equal on any CPU (bf16 would differ)
    assert [h.cost for h in slow[0].hits] == [h.cost for h in exact[0].hits]
    with override(AVX2):
        res = invoke(
            ["search", "--run", str(run), "--features", str(store), "--dtype", "bfloat16", "--json", "a cat sleeps"],
            catch_exceptions=False,
        )
    assert res.exit_code == 0 and "warning:" in res.output and "no native bf16" in res.output


# --------------------------------------------------------------------------- benchmarks and kernels


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its worker pools pickle its functions by module name
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return module


def test_scoring_benchmark_skips_emulated_bf16_rows() -> None:
    bench = _benchmark("scoring")
    with override(AVX2):
        keep, skipped = bench.runnable_dtypes(["float32", "bfloat16"], torch.device("cpu"))
        assert keep == ["float32"] and "no native bf16" in skipped["bfloat16"] and "--force-bf16" in skipped["bfloat16"]
        assert bench.runnable_dtypes(["float32", "bfloat16"], torch.device("cpu"), force=True)[0] == [
            "float32",
            "bfloat16",
        ]
        assert "not used by these rows" in bench.prepare_kernels(torch.device("cpu"), keep)
    with override(NATIVE):
        assert bench.runnable_dtypes(["float32", "bfloat16"], torch.device("cpu")) == (["float32", "bfloat16"], {})


@pytest.mark.slow
def test_extract_benchmark_skips_emulated_bf16(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bench = _benchmark("extract")
    with override(AVX2):
        res = bench.main(
            [
                "--videos",
                "2",
                "--frames-per-video",
                "8",
                "--size",
                "32x32",
                "--repeats",
                "1",
                "--workers",
                "0",
                "--batch-size",
                "2",
                "--dtype",
                "bfloat16",
                "--design-videos",
                "0",
                "--dtype-model",
                "dab-tiny",
                "--dtype-videos",
                "1",
            ]
        )
    assert res["config"]["dtype"] == "float32"
    assert set(res["skipped"]) == {"--dtype bfloat16", "encode dtype bfloat16", "encode dtype autocast-bf16"}
    assert set(res["design_dtype"]) == {"model", "images", "float32"}
    out = capsys.readouterr().out
    assert "skipped encode dtype bfloat16" in out and "bf16 not native" in out


def test_kernel_cache_key_follows_the_instruction_set(monkeypatch: pytest.MonkeyPatch) -> None:
    base = cpu_kernels.build_key()
    monkeypatch.setattr(cpu_kernels, "cpu_signature", lambda: "fpu sse2 avx2 fma")
    avx2 = cpu_kernels.build_key()
    monkeypatch.setattr(cpu_kernels, "cpu_signature", lambda: "fpu sse2 avx2 fma avx512f avx512bw")
    assert len({base, avx2, cpu_kernels.build_key()}) == 3
    monkeypatch.setenv("DAB_KERNEL_MARCH", "x86-64-v3")
    v3 = cpu_kernels.build_key()
    monkeypatch.delenv("DAB_KERNEL_MARCH")
    assert v3 != cpu_kernels.build_key()
    if platform.machine().lower() in ("x86_64", "amd64"):
        monkeypatch.setenv("DAB_KERNEL_MARCH", "x86-64-v3")
        assert "-march=x86-64-v3" in cpu_kernels.compile_flags()
    monkeypatch.setenv("DAB_KERNEL_MARCH", "native; rm -rf /")
    with pytest.raises(ValueError, match="not a -march value"):
        cpu_kernels.compile_flags()


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64-v3 is an x86 target")
def test_portable_build_without_avx512_matches_the_eager_spec(tmp_path: Path) -> None:
    # The kernel tests again, in a fresh process, against a build for AVX2 (no AVX-512): every
    # kernel's portable path held to the same eager spec.
    env = {**os.environ, "DAB_KERNEL_MARCH": "x86-64-v3", "DAB_KERNEL_CACHE": str(tmp_path), "DAB_CPU_KERNELS": "auto"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "scoring" / "test_cpu_kernels.py"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    # the fused fixture did not skip (tests of torch's own bf16 paths may, where this torch build lacks them)
    assert " passed" in tail and "compiled kernels unavailable" not in tail, tail
    built = list(tmp_path.glob("dab_cpu_*/dab_cpu_*.so"))
    assert len(built) == 1, built
    code = "from dab_pipeline.scoring.kernels.cpu import get_kernels; k = get_kernels(build=False); print(k.name)"
    name = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert name.stdout.strip() == "fused (x86-64-v3)"
