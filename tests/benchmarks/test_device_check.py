"""benchmarks/device_check.sh, the GPU run prepared on the CPU: every step at a tiny size, so a GPU run cannot
fail on a typo (issue 28)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_device_check_runs_every_step_on_the_cpu(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEVICE_CHECK_ON_CPU": "1",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    res = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device_check.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )  # the steps' limits, 4x on the CPU
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    steps = (tmp_path / "steps.txt").read_text().splitlines()
    assert len(steps) == 6 and all(line.endswith(" s") and ": exit 0 " in line for line in steps), steps
    for log in ("device.txt", "peak.txt", "tests.txt", "scoring.txt", "train.txt", "encode.txt", "ddp.txt"):
        assert (tmp_path / log).stat().st_size > 0, log
    train = (tmp_path / "train.txt").read_text()
    assert "frozen (CLIP frozen), amp bf16" in train and "finetune (all" in train and "MSR-VTT-9k epoch" in train
    assert "-> OK" in (tmp_path / "ddp.txt").read_text()
    scoring = (tmp_path / "scoring.txt").read_text()
    from dab_pipeline.runtime.capabilities import capabilities

    # bf16 rows where the CPU multiplies bf16 natively (the GPU always does); an AVX2-only CPU times float32 alone
    assert ("engine bfloat16" if capabilities("cpu").bf16 else "engine float32") in scoring, scoring[-2000:]
