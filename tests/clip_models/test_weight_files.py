"""weight_files.load_state_dict, dab's copy of open_clip's factory.load_state_dict (so that loading weights does
not import open_clip): the forms it unwraps, each read back to the same tensors, and an empty file in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dab_pipeline.clip_models.weight_files import load_state_dict, read_weights
from dab_pipeline.core.errors import WeightsError

STATE = {"visual.proj": torch.arange(6.0).reshape(2, 3), "text_projection": torch.ones(3, 2)}


def _same(got: dict) -> bool:
    return set(got) == set(STATE) and all(torch.equal(got[k], v) for k, v in STATE.items())


@pytest.mark.parametrize("form", ["plain", "state_dict", "module", "safetensors"])
def test_each_form_reads_back_the_same_tensors(form: str, tmp_path: Path) -> None:
    path = tmp_path / ("w.safetensors" if form == "safetensors" else "w.pt")
    if form == "safetensors":
        pytest.importorskip("safetensors")
        from safetensors.torch import save_file

        save_file(STATE, str(path))
    elif form == "state_dict":  # a training checkpoint: the weights under "state_dict"
        torch.save({"state_dict": STATE, "epoch": 3}, path)
    elif form == "module":  # saved from a DataParallel / DDP wrapper
        torch.save({f"module.{k}": v for k, v in STATE.items()}, path)
    else:
        torch.save(STATE, path)
    assert _same(load_state_dict(path))
    state, openai = read_weights(path)
    assert _same(state) and openai is None


def test_a_file_of_no_tensors_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt"
    torch.save({}, path)
    with pytest.raises(WeightsError, match=r"empty\.pt holds no tensors") as err:
        read_weights(path)
    assert "\n" not in str(err.value) and "StopIteration" not in str(err.value)
