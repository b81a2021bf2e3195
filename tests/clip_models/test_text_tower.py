"""The query path without open_clip's package: dab's TextTower gives open_clip's text features, its tokenizer
(open_clip's file loaded alone) open_clip's tokens, and a store's CLIP is loaded as its text tower only where that
is the same model with the same weights; anything else is left to load_clip."""

from __future__ import annotations

import sys
from pathlib import Path

import open_clip
import pytest
import torch

from dab_pipeline import clip_models as cm
from dab_pipeline.clip_models import text_tower, tokenizer
from dab_pipeline.core.errors import WeightsError
from dab_pipeline.search import encode_queries

TEXTS = ["a dog runs on the beach", "hi", "", "a man is cooking pasta in a small kitchen while talking"]


def _manifest(bundle: cm.ClipBundle, **extra) -> dict:
    """What an extraction records of its CLIP (the parts a query encoder reads)."""
    return {
        "model": bundle.model_name,
        "pretrained": bundle.pretrained,
        "weights_sha256": bundle.weights_sha256,
        "quick_gelu": bundle.quick_gelu,
        "clip": {"weights_path": str(bundle.weights_path), "weights_format": bundle.weights_format},
        **extra,
    }


@pytest.mark.parametrize("model", ["dab-tiny-quickgelu", "dab-world"])  # GELU: dab-world; dab-tiny: the search tests
def test_the_text_tower_gives_open_clips_features(model: str) -> None:
    full = cm.load_clip(model, None)
    alone = cm.load_text_clip(_manifest(full))
    assert isinstance(alone.model, cm.TextTower) and alone.model_name == model
    assert alone.quick_gelu == full.quick_gelu == model.endswith("quickgelu")
    acts = {type(m).__name__ for m in alone.model.modules()} & {"QuickGELU", "GELU"}
    assert acts == {"QuickGELU" if full.quick_gelu else "GELU"}
    tokens = full.tokenizer(TEXTS)
    torch.testing.assert_close(alone.tokenizer(TEXTS), tokens, rtol=0, atol=0)
    want = full.model.encode_text(tokens)  # (M, D) open_clip's
    torch.testing.assert_close(alone.model.encode_text(tokens), want, rtol=1e-5, atol=1e-5)
    # the search's encoder (packed up to each EOT) on the tower: the same features (on CLIP: test_clip_models.py)
    torch.testing.assert_close(cm.encode_queries_short(alone, TEXTS), want, rtol=1e-5, atol=1e-5)
    assert alone.context_length == full.context_length and alone.embed_dim == full.embed_dim
    assert alone.logit_scale == pytest.approx(full.logit_scale)
    assert cm.unknown_words(alone, ["a zebra", "a red ball"]) == cm.unknown_words(full, ["a zebra", "a red ball"])


def test_the_tokenizer_is_open_clips_file_loaded_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """With open_clip's modules out of sight the tokenizer is loaded from open_clip/tokenizer.py alone; its tokens
    are open_clip's (unicode, an empty string, a caption longer than the context: cut, EOT kept last)."""
    texts = ["a café in Zürich — naïve 東京 🙂", "", "ÀÉÎ õü", " ".join(["word"] * 100), "A Dog, RUNS!!  twice"]
    for ctx, name in ((77, "ViT-B-32"), (64, "dab-world")):
        want = cm.open_clip_with_our_models().get_tokenizer(name)(texts)  # dab-world registered, whatever ran first
        monkeypatch.delitem(sys.modules, tokenizer.OPEN_CLIP_MODULE)
        monkeypatch.delitem(sys.modules, tokenizer.STANDALONE_MODULE, raising=False)
        tok = tokenizer.bpe_tokenizer(ctx)
        assert type(tok).__module__ == tokenizer.STANDALONE_MODULE and tokenizer.is_bpe_tokenizer(tok)
        assert Path(sys.modules[tokenizer.STANDALONE_MODULE].__file__).parent == Path(open_clip.__file__).parent
        got = tok(texts)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.shape == (len(texts), ctx) and int(got[3, -1]) == tok.eot_token_id  # the long one, cut
        monkeypatch.undo()
    assert tokenizer.is_bpe_tokenizer(open_clip.get_tokenizer("ViT-B-32")) and not tokenizer.is_bpe_tokenizer(str)


def test_a_plain_text_tower_is_recognised_from_its_config() -> None:
    for name in ("ViT-B-32", "ViT-B-32-quickgelu", "ViT-L-14", "RN50", "dab-world"):
        cfg = text_tower.TextTowerConfig.plain(text_tower.model_config(name))
        assert cfg is not None and cfg.quick_gelu == name.endswith("quickgelu"), name
    for name in ("ViT-B-16-SigLIP", "coca_ViT-B-32", "xlm-roberta-base-ViT-B-32", "no-such-model"):
        assert text_tower.TextTowerConfig.plain(text_tower.model_config(name)) is None, name
    vit = text_tower.TextTowerConfig.plain(text_tower.model_config("ViT-B-32"))
    assert (vit.width, vit.heads, vit.layers, vit.context_length, vit.embed_dim) == (512, 8, 12, 77, 512)


def test_other_cases_are_left_to_load_clip(tmp_path: Path) -> None:
    full = cm.load_clip("dab-tiny", None)
    base = _manifest(full)
    assert cm.load_text_clip({**base, "weights_sha256": None}) is None  # nothing to compare the file with
    assert cm.load_text_clip({**base, "weights_sha256": "0" * 64}) is None  # another file: load_clip refuses it
    assert cm.load_text_clip({**base, "quick_gelu": True}) is None  # built with an activation forced
    assert cm.load_text_clip({**base, "clip": {"weights_format": "openai"}}) is None  # load_clip would switch
    assert cm.load_text_clip({**base, "model": "ViT-B-16-SigLIP"}) is None
    assert cm.load_text_clip({**base, "pretrained": "no-such-tag", "clip": {}}) is None  # open_clip's cache
    # a tag whose file (recorded at extraction) is still here with its sha256: read from there
    tagged = cm.load_text_clip({**base, "pretrained": "some-tag"})
    assert tagged is not None and tagged.pretrained == "some-tag" and tagged.weights_path == full.weights_path
    local = tmp_path / "tiny.pt"
    local.write_bytes(Path(full.weights_path).read_bytes())
    from_file = cm.load_text_clip({**base, "pretrained": str(local)})
    assert from_file is not None and from_file.pretrained == str(local) and from_file.weights_path == local


def test_a_store_of_other_weights_is_refused_in_one_line() -> None:
    full = cm.load_clip("dab-tiny", None)
    with pytest.raises(WeightsError) as err:
        encode_queries({**_manifest(full), "weights_sha256": "ab" * 32}, ["a query"])
    assert "differ from the ones the store was built with" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(Exception, match="encodes no image"):
        cm.load_text_clip(_manifest(full)).preprocess(None)
