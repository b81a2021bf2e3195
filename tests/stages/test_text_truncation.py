"""Issue 37: captions over the text tower's context are truncated, and the store says so (the manifest's
text_truncation: the policy and, per split, how many were cut and by how much), as does one line of `dab extract`."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

from dab_pipeline.clip_models import load_clip, token_counts, tokenize_lengths
from dab_pipeline.stages.extract import TRUNCATION_POLICY, text_truncation, truncation_line
from dab_pipeline.store import open_store

from ..helpers.runner import extract_args, invoke

LONG = " ".join(f"word{i}" for i in range(60))  # 60 words of 2-3 BPE tokens each: far over 77 tokens


def test_token_counts_are_the_lengths_before_the_cut() -> None:
    bundle = load_clip("dab-tiny", None)
    texts = ["a cat on a mat", LONG]
    full, kept = token_counts(bundle, texts), tokenize_lengths(bundle, texts)
    assert full[0] == kept[0] == len(bundle.tokenizer.encode("a cat on a mat")) + 2
    assert full[1] > bundle.context_length and kept[1] == bundle.context_length == 77


def test_the_record_counts_cut_captions_per_split() -> None:
    bundle = load_clip("dab-tiny", None)
    caps = [SimpleNamespace(text=t, split=s) for t, s in [("short one", "train"), (LONG, "test"), ("x y", "test")]]
    rec = text_truncation(bundle, caps)
    n = int(token_counts(bundle, [LONG])[0])
    assert rec["policy"] == TRUNCATION_POLICY and rec["context_length"] == 77
    assert rec["splits"]["train"] == {"captions": 1, "cut": 0, "longest_tokens": 4, "tokens_dropped": 0}
    assert rec["splits"]["test"] == {"captions": 2, "cut": 1, "longest_tokens": n, "tokens_dropped": n - 77}
    line = truncation_line(rec)
    assert line.startswith("captions over the text tower's context of 77 tokens are truncated")
    assert f"test 1 of 2 (longest {n} tokens, {n - 77} dropped on average)" in line and "train" not in line
    assert truncation_line(text_truncation(bundle, caps[:1])) is None


def _dataset_with_a_long_caption(tiny_folder_dataset: Path, root: Path) -> Path:
    shutil.copytree(tiny_folder_dataset.parent / "videos", root / "videos")
    rows = list(csv.reader(tiny_folder_dataset.open()))
    rows[-1][1] = LONG  # the last caption of the test video
    with open(root / "captions.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return root / "captions.csv"


def test_extract_records_and_prints_the_cut(tiny_folder_dataset: Path, tmp_path: Path) -> None:
    captions = _dataset_with_a_long_caption(tiny_folder_dataset, tmp_path / "data")
    out = tmp_path / "long.h5"
    res = invoke(extract_args(captions, "--quiet", out=out), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the note wraps between words at 120 columns outside a terminal
    assert text.count("truncated") == 1 and "are truncated to it" in text, res.output
    assert "truncated to it (the start token, the first 75 tokens, the end token): test 1 of 2 (longest" in text
    with open_store(out) as st:
        rec = st.manifest["text_truncation"]
    assert rec["policy"] == TRUNCATION_POLICY and rec["context_length"] == 77
    assert rec["splits"]["test"]["cut"] == 1 and rec["splits"]["train"]["cut"] == 0


def test_extract_without_a_long_caption_prints_nothing_but_records_the_policy(
    tiny_folder_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "short.h5"
    res = invoke(extract_args(tiny_folder_dataset, "--quiet", out=out), catch_exceptions=False)
    assert res.exit_code == 0 and "truncated" not in res.output, res.output
    with open_store(out) as st:
        rec = st.manifest["text_truncation"]
    assert rec["policy"] == TRUNCATION_POLICY and all(s["cut"] == 0 for s in rec["splits"].values())
