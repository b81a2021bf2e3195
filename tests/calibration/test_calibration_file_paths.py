"""What a run's calibration.json is said to be when it is not a calibration file (issue 59)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dab_pipeline.calibration import CALIBRATION_FILE, read_calibration, read_run_calibration
from dab_pipeline.core.errors import ConfigError


def test_a_directory_at_calibration_json_is_called_a_directory(tmp_path: Path) -> None:
    """Issue 59, 8c: a directory at RUN/calibration.json was reported as "does not exist" (by search and serve too,
    which read it through read_run_calibration)."""
    run = tmp_path / "run"
    (run / CALIBRATION_FILE).mkdir(parents=True)
    for read in (lambda: read_calibration(run / CALIBRATION_FILE), lambda: read_run_calibration(run, "0" * 64)):
        with pytest.raises(ConfigError, match=r"calibration\.json is a directory, not a calibration file") as err:
            read()
        assert "does not exist" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="does not exist: make it with `dab calibrate"):  # a missing one still is
        read_calibration(tmp_path / CALIBRATION_FILE)
