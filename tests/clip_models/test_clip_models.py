"""clip_models: loading (tags, local files, QuickGELU), encoding with stored states, trainable heads.

Everything runs on the tiny random-weights architecture ``dab-tiny`` on CPU; no
test touches the network (open_clip's download is monkeypatched where a tag is used).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from open_clip import pretrained as oc_pretrained
from open_clip.transformer import QuickGELU
from PIL import Image
from torch import nn

from dab_pipeline import clip_models as cm
from dab_pipeline.core.errors import ConfigError, UnknownNameError, WeightsError
from dab_pipeline.core.fsutil import sha256_file

from ..helpers.benchmarks import load_script

TEXTS = ["a dog runs on the beach", "hi", "a man is cooking pasta in a small kitchen while talking"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return cm.write_tiny_weights(tmp_path_factory.mktemp("w") / "tiny.pt", seed=0)


@pytest.fixture(scope="module")
def bundle(tiny_path):
    return cm.load_clip("dab-tiny", str(tiny_path))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # default_tiny_weights() must never write into the real ~/.cache during tests.
    monkeypatch.setenv("DAB_CACHE", str(tmp_path / "dab-cache"))


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))  # (B, 3, H, W)


def _openai_torchscript(state: dict, path: Path, image_size: int = 32) -> Path:
    """Write ``state`` the way OpenAI ships CLIP: a TorchScript archive whose state dict
    also carries input_resolution / context_length / vocab_size (in fp16, like the release)."""

    class Holder(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    root = Holder()
    for key, value in state.items():
        mod = root
        *parents, leaf = key.split(".")
        for p in parents:
            if not hasattr(mod, p):
                mod.add_module(p, Holder())
            mod = getattr(mod, p)
        mod.register_buffer(leaf, value.detach().clone().half())
    for key, value in {"input_resolution": image_size, "context_length": 77, "vocab_size": 49408}.items():
        root.register_buffer(key, torch.tensor(value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(root).save(str(path))
    return path


def _reference_model(name: str, state: dict) -> nn.Module:
    m = open_clip.create_model(name)
    m.load_state_dict(state)
    return m.eval()


# --------------------------------------------------------------------------- loading


def test_tiny_bundle_describes_the_model(bundle, tiny_path):
    assert bundle.model_name == "dab-tiny"
    assert bundle.pretrained == str(tiny_path.absolute())
    assert bundle.weights_path == tiny_path.absolute()
    assert bundle.weights_sha256 == sha256_file(tiny_path)
    assert (bundle.embed_dim, bundle.vision_width, bundle.text_width) == (32, 64, 64)
    assert (bundle.num_vision_layers, bundle.num_text_layers) == (3, 3)
    assert bundle.vision_tokens == (32 // 8) ** 2 + 1
    assert bundle.image_size == 32 and bundle.context_length == 77
    assert bundle.quick_gelu is False and bundle.weights_format == "open_clip" and bundle.warnings == []
    assert not bundle.model.training
    assert not any(p.requires_grad for p in bundle.model.parameters())
    desc = json.loads(json.dumps(bundle.describe()))
    assert desc["model"] == "dab-tiny" and desc["embed_dim"] == 32 and desc["weights_sha256"] == bundle.weights_sha256
    # The weights in the model are the file's, not open_clip's random init.
    state = torch.load(tiny_path, weights_only=True)
    assert torch.equal(bundle.model.visual.proj, state["visual.proj"])


def test_preprocess_and_tokenizer_work_offline(bundle):
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    x = bundle.preprocess(img)
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    tokens = bundle.tokenizer(TEXTS)
    assert tokens.shape == (3, 77)


def test_tiny_weights_are_deterministic(tmp_path):
    a = torch.load(cm.write_tiny_weights(tmp_path / "a.pt", seed=0), weights_only=True)
    b = torch.load(cm.write_tiny_weights(tmp_path / "b.pt", seed=0), weights_only=True)
    c = torch.load(cm.write_tiny_weights(tmp_path / "c.pt", seed=1), weights_only=True)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same seeded computation twice: bit-equal
    assert not torch.equal(a["visual.proj"], c["visual.proj"])


def test_default_tiny_weights_are_cached_and_used(tmp_path):
    path = cm.default_tiny_weights()
    assert path == tmp_path / "dab-cache" / path.name and path.is_file()
    mtime = path.stat().st_mtime_ns
    assert cm.default_tiny_weights() == path and path.stat().st_mtime_ns == mtime  # not rewritten
    b = cm.load_clip("dab-tiny", None)
    assert b.pretrained is None and b.weights_path == path and b.weights_sha256 == sha256_file(path)


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        cm.load_clip("ViT-Q-99", None)
    msg = str(err.value)
    assert "ViT-Q-99" in msg and "ViT-B-32" in msg and "dab-tiny" in msg


def test_missing_local_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "ViT-B-32.pt"
    with pytest.raises(WeightsError) as err:
        cm.load_clip("dab-tiny", str(missing))
    assert str(missing) in str(err.value)


def test_unknown_tag_lists_tags():
    with pytest.raises(UnknownNameError) as err:
        cm.load_clip("ViT-B-32", "laion9000")
    assert "laion9000" in str(err.value) and "openai" in str(err.value)


def test_no_weights_for_a_real_model_is_an_error():
    with pytest.raises(WeightsError, match="no weights given for CLIP model ViT-B-32"):
        cm.load_clip("ViT-B-32", None)


def test_unreadable_and_mismatched_files(tmp_path, tiny_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot read weights file .*junk.pt"):
        cm.load_clip("dab-tiny", str(junk))
    state = torch.load(tiny_path, weights_only=True)
    state["visual.proj"] = torch.zeros(64, 16)
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    with pytest.raises(WeightsError, match="does not fit architecture dab-tiny"):
        cm.load_clip("dab-tiny", str(bad))


def test_openai_tag_offline_is_one_clear_error(tmp_path, monkeypatch):
    calls = []

    def no_network(cfg, *args, **kwargs):
        calls.append(cfg)
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(oc_pretrained, "download_pretrained", no_network)
    monkeypatch.setattr(cm.weights, "offline_reason", lambda cfg: None)  # the host answers, the download fails
    with pytest.raises(WeightsError) as err:
        cm.load_clip("ViT-B-32", "openai", cache_dir=str(tmp_path / "empty-cache"))
    msg = str(err.value)
    assert len(calls) == 1  # the (empty) cache was checked, then one download attempt
    assert "could not fetch" in msg and "openai" in msg and "--pretrained /path/to/ViT-B-32.pt" in msg
    assert "name resolution" in msg and "\n" not in msg


def test_offline_machine_fails_fast_without_retrying(tmp_path, monkeypatch):
    import socket

    def download(*args, **kwargs):
        raise AssertionError("no download may be attempted offline (huggingface_hub retries for ~a minute)")

    def unreachable(address, timeout=None):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(oc_pretrained, "download_pretrained", download)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(WeightsError) as err:
        cm.load_clip("ViT-B-32", "openai", cache_dir=str(tmp_path / "empty-cache"))
    msg = str(err.value)
    assert "huggingface.co is not reachable" in msg and "--pretrained /path/to/ViT-B-32.pt" in msg
    assert "\n" not in msg
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE"):
        cm.load_clip("ViT-B-32", "openai", cache_dir=str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # behind a proxy the host is not probed
    assert cm.offline_reason({"hf_hub": "timm/x/"}) is None


def test_tiny_weights_file_is_byte_identical_in_any_folder(tmp_path):
    a = cm.write_tiny_weights(tmp_path / "one" / "w.pt", seed=0)
    b = cm.write_tiny_weights(tmp_path / "another-folder" / "weights-file.pt", seed=0)
    assert a.read_bytes() == b.read_bytes()
    assert sha256_file(a) == sha256_file(b)


def test_tag_resolved_from_cache_without_download(tmp_path, monkeypatch, tiny_path):
    # A fake tag for dab-tiny whose weights sit in a Hugging Face cache layout, trained with QuickGELU.
    cache = tmp_path / "hf"
    snap = cache / "models--dab--tiny-test" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "open_clip_pytorch_model.bin").write_bytes(tiny_path.read_bytes())
    (cache / "models--dab--tiny-test" / "refs").mkdir()
    (cache / "models--dab--tiny-test" / "refs" / "main").write_text("0123abcd")
    real_cfg = oc_pretrained.get_pretrained_cfg

    def cfg(model, tag):
        if model.startswith("dab-tiny") and tag == "fake":
            return {"hf_hub": "dab/tiny-test/", "quick_gelu": True, "mean": (0.5, 0.5, 0.5), "std": (0.25,) * 3}
        return real_cfg(model, tag)

    def no_network(*args, **kwargs):
        raise AssertionError("a cached tag must not be downloaded")

    monkeypatch.setattr(oc_pretrained, "get_pretrained_cfg", cfg)
    monkeypatch.setattr(oc_pretrained, "download_pretrained", no_network)
    b = cm.load_clip("dab-tiny", "fake", cache_dir=str(cache))
    assert b.pretrained == "fake"
    assert b.weights_path.name == "open_clip_pytorch_model.bin"
    assert b.weights_sha256 == sha256_file(tiny_path)
    assert b.model_name == "dab-tiny-quickgelu" and b.quick_gelu
    assert any("QuickGELU" in w for w in b.warnings)
    assert b.mean == (0.5, 0.5, 0.5) and b.std == (0.25, 0.25, 0.25)  # the tag's preprocessing


# --------------------------------------------------------------------------- QuickGELU


@pytest.mark.parametrize("fmt", ["torchscript", "state_dict_with_openai_keys"])
def test_openai_file_switches_to_quickgelu(tmp_path, tiny_path, fmt, images):
    state = torch.load(tiny_path, weights_only=True)
    if fmt == "torchscript":
        path = _openai_torchscript(state, tmp_path / "ViT-tiny.pt")
    else:
        path = tmp_path / "openai_sd.pt"
        torch.save(
            {
                **state,
                "input_resolution": torch.tensor(32),
                "context_length": torch.tensor(77),
                "vocab_size": torch.tensor(49408),
            },
            path,
        )
    b = cm.load_clip("dab-tiny", str(path))
    assert b.model_name == "dab-tiny-quickgelu" and b.quick_gelu and b.weights_format == "openai"
    assert any(isinstance(m, QuickGELU) for m in b.model.modules())
    assert not any(isinstance(m, nn.GELU) for m in b.model.modules())
    assert len(b.warnings) == 1 and "QuickGELU" in b.warnings[0] and str(path) in b.warnings[0]

    # Features are those of the QuickGELU architecture, and would be wrong with GELU.
    if fmt == "torchscript":  # the archive stores fp16, like OpenAI's
        state = {k: v.half().float() for k, v in state.items()}
    quick = _reference_model("dab-tiny-quickgelu", state)
    gelu = _reference_model("dab-tiny", state)
    feats, _ = cm.encode_images(b, images)
    with torch.no_grad():
        torch.testing.assert_close(feats, quick.encode_image(images), atol=1e-5, rtol=1e-5)
        assert (feats - gelu.encode_image(images)).abs().max() > 1e-3


def test_openai_file_with_quickgelu_name_needs_no_switch(tmp_path, tiny_path):
    path = _openai_torchscript(torch.load(tiny_path, weights_only=True), tmp_path / "oa.pt")
    b = cm.load_clip("dab-tiny-quickgelu", str(path))
    assert b.model_name == "dab-tiny-quickgelu" and b.quick_gelu and b.warnings == []


def test_plain_file_keeps_gelu_and_override_is_warned(tmp_path, tiny_path):
    b = cm.load_clip("dab-tiny", str(tiny_path))
    assert b.model_name == "dab-tiny" and not b.quick_gelu and b.warnings == []
    path = _openai_torchscript(torch.load(tiny_path, weights_only=True), tmp_path / "oa.pt")
    forced = cm.load_clip("dab-tiny", str(path), quick_gelu=False)
    assert forced.model_name == "dab-tiny" and not forced.quick_gelu
    assert any("quick_gelu=False was requested" in w for w in forced.warnings)


def test_detect_openai_weights(tmp_path, tiny_path):
    assert cm.detect_openai_weights(tiny_path) is None
    path = _openai_torchscript(torch.load(tiny_path, weights_only=True), tmp_path / "oa.pt")
    assert "TorchScript" in cm.detect_openai_weights(path)
    hinted = tmp_path / "vit_base_patch32_clip_224.openai" / "open_clip_pytorch_model.bin"
    hinted.parent.mkdir()
    hinted.write_bytes(tiny_path.read_bytes())
    assert "OpenAI" in cm.detect_openai_weights(hinted)
    # Only the file's own folder counts, not any ancestor that happens to mention openai.
    far = tmp_path / "openai_experiments" / "run1" / "laion.pt"
    far.parent.mkdir(parents=True)
    far.write_bytes(tiny_path.read_bytes())
    assert cm.detect_openai_weights(far) is None


def test_openai_release_hash_is_recognised(tmp_path, tiny_path, monkeypatch):
    copy = tmp_path / "weights.pt"
    copy.write_bytes(tiny_path.read_bytes())
    monkeypatch.setattr(cm.weights, "_openai_release_hashes", lambda: {sha256_file(copy): "ViT-B-32.pt"})
    b = cm.load_clip("dab-tiny", str(copy))
    assert b.quick_gelu and b.model_name == "dab-tiny-quickgelu"
    assert "OpenAI's release ViT-B-32.pt" in b.warnings[0]


# --------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("k", [None, 0, 1, 2, 3])
def test_encode_images_equals_open_clip(bundle, images, k):
    feats, states = cm.encode_images(bundle, images, k)
    with torch.no_grad():
        ref = bundle.model.encode_image(images)  # (B, D)
    assert feats.shape == (5, 32)
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)
    if k is None:
        assert states is None
    elif k == 0:
        assert states.shape == (5, 64)  # pooled class token before ln_post
    else:
        assert states.shape == (5, 17, 64)


@pytest.mark.parametrize("k", [None, 0, 1, 2, 3])
def test_encode_texts_equals_open_clip(bundle, k):
    enc = cm.encode_texts(bundle, TEXTS, k)
    tokens = bundle.tokenizer(TEXTS)
    with torch.no_grad():
        ref = bundle.model.encode_text(tokens)  # (M, D)
    torch.testing.assert_close(enc.features, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(enc.tokens, tokens)
    expected_len = tokens.argmax(dim=-1) + 1  # EOT index + 1
    assert torch.equal(enc.lengths, expected_len)
    assert np.array_equal(cm.tokenize_lengths(bundle, TEXTS), expected_len.numpy())
    assert enc.lengths.tolist()[1] == 3  # "hi": SOT, hi, EOT
    if k is None:
        assert enc.states is None
    elif k == 0:
        assert enc.states.shape == (3, 64)
    else:
        assert [tuple(s.shape) for s in enc.states] == [(int(n), 64) for n in expected_len]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_heads_reproduce_features_and_train(bundle, images, k):
    feats, vstates = cm.encode_images(bundle, images, k)
    vhead = cm.VisionHead.from_bundle(bundle, k)
    assert vhead.num_blocks == k
    out = vhead(vstates)  # (B, D)
    torch.testing.assert_close(out, feats, atol=1e-5, rtol=1e-5)

    enc = cm.encode_texts(bundle, TEXTS, k)
    thead = cm.TextHead.from_bundle(bundle, k)
    if k == 0:
        tout = thead(enc.states)  # (M, D)
    else:
        padded, lengths = cm.pad_text_states(enc.states)
        assert torch.equal(lengths, enc.lengths)
        tout = thead(padded, lengths)
    torch.testing.assert_close(tout, enc.features, atol=1e-5, rtol=1e-5)

    (out.square().sum() + tout.square().sum()).backward()
    for head in (vhead, thead):
        params = list(head.named_parameters())
        assert params and all(p.requires_grad for _, p in params)
        missing = [n for n, p in params if p.grad is None or not p.grad.abs().sum() > 0]
        assert missing == [], f"no gradient for {missing}"
    # The heads are copies: the frozen model is untouched.
    assert not any(p.requires_grad or p.grad is not None for p in bundle.model.parameters())


def test_text_head_ignores_padding(bundle):
    enc = cm.encode_texts(bundle, TEXTS, 2)
    head = cm.TextHead.from_bundle(bundle, 2)
    padded, lengths = cm.pad_text_states(enc.states)
    noisy = padded.clone()
    for i, n in enumerate(lengths.tolist()):
        noisy[i, n:] = 1e3  # garbage after EOT must not matter (causal mask)
    with torch.no_grad():
        torch.testing.assert_close(head(noisy, lengths), head(padded, lengths))


def test_pad_text_states():
    a, b = torch.ones(4, 6), torch.full((2, 6), 2.0)
    states, lengths = cm.pad_text_states([a, b])
    assert states.shape == (2, 4, 6) and lengths.tolist() == [4, 2]
    assert torch.equal(states[1, :2], b) and torch.equal(states[1, 2:], torch.zeros(2, 6))


@pytest.mark.parametrize("k", [-1, 4, 1.5])
def test_invalid_trainable_blocks(bundle, images, k):
    with pytest.raises(ConfigError, match="trainable_blocks"):
        cm.encode_images(bundle, images, k)
    with pytest.raises(ConfigError, match="trainable_blocks"):
        cm.TextHead.from_bundle(bundle, k)


# --------------------------------------------------------------------------- dtypes


def test_bfloat16_runs_close_to_float32(bundle, tiny_path, images):
    b16 = cm.load_clip("dab-tiny", str(tiny_path), dtype="bfloat16")
    assert b16.dtype == "bfloat16" and b16.model.visual.conv1.weight.dtype == torch.bfloat16
    f16, states = cm.encode_images(b16, images, 1)
    f32, _ = cm.encode_images(bundle, images, 1)
    assert f16.dtype == torch.float32 and states.shape == (5, 17, 64)
    assert torch.nn.functional.cosine_similarity(f16, f32).min() > 0.98
    t16 = cm.encode_texts(b16, TEXTS, None).features
    t32 = cm.encode_texts(bundle, TEXTS, None).features
    assert torch.nn.functional.cosine_similarity(t16, t32).min() > 0.98
    # Heads built from a bf16 bundle train in float32.
    assert cm.VisionHead.from_bundle(b16, 1).proj.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["float16", "autocast-bf16", "float64", "int8"])
def test_bad_dtypes_on_cpu(tiny_path, dtype):
    with pytest.raises(ConfigError, match=dtype):
        cm.load_clip("dab-tiny", str(tiny_path), dtype=dtype)


def test_torchscript_weights_are_read_without_running_the_archive(tmp_path, tiny_path):
    """OpenAI's release format is a TorchScript program: dab reads its tensors, never its code."""
    state = torch.load(tiny_path, weights_only=True)
    path = _openai_torchscript(state, tmp_path / "oa.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = dict(torch.jit.load(str(path), map_location="cpu").state_dict())
    got = cm.read_torchscript_tensors(path)
    assert got.keys() == reference.keys()
    for k in got:
        assert got[k].dtype == reference[k].dtype and torch.equal(got[k], reference[k]), k


def test_torchscript_archive_with_foreign_objects_is_refused(tmp_path, tiny_path):
    """A data.pkl that names anything but TorchScript module state and tensors is refused, unexecuted."""
    import pickle
    import zipfile

    path = _openai_torchscript(torch.load(tiny_path, weights_only=True), tmp_path / "oa.pt")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    bad = tmp_path / "evil.pt"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = pickle.dumps(Evil(), protocol=2) if item.filename.endswith("/data.pkl") else src.read(item)
            dst.writestr(item, data)
    with pytest.raises(WeightsError, match="posix.system is not allowed|os.system is not allowed"):
        cm.load_clip("dab-tiny", str(bad))
    assert not marker.exists()


# --------------------------------------------------------------------------- dab-world


def test_dab_world_weights_ship_with_their_recorded_hash():
    meta = json.loads((cm.WEIGHTS_DIR / "dab-world.json").read_text())
    path = cm.WEIGHTS_DIR / meta["file"]
    assert path.stat().st_size == meta["bytes"] < 8_000_000  # small enough to live in the repository
    assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"]
    assert meta["config"]["world_seed"] != 0  # pretrained on its own part of the world


def test_dab_world_loads_its_own_weights_without_pretrained():
    b = cm.load_clip("dab-world", None)
    meta = json.loads((cm.WEIGHTS_DIR / "dab-world.json").read_text())
    assert b.pretrained is None and b.weights_sha256 == meta["sha256"]
    assert b.embed_dim == 64 and b.image_size == 64 and not b.quick_gelu
    # the compact token embedding expands to the full table: the world's words are non-zero, others zero
    table = b.model.token_embedding.weight
    ids = b.tokenizer(["a small red circle on grass"])[0]
    assert table[ids[ids != 0]].abs().sum(dim=1).min() > 0
    assert table[20000].abs().sum() == 0


def test_damaged_dab_world_file_is_one_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "weights"
    fake.mkdir()
    meta = json.loads((cm.WEIGHTS_DIR / "dab-world.json").read_text())
    (fake / "dab-world.json").write_text(json.dumps(meta))
    (fake / meta["file"]).write_text("version https://git-lfs.github.com/spec/v1\n")  # a Git LFS pointer
    monkeypatch.setattr(cm.weight_files, "WEIGHTS_DIR", fake)
    with pytest.raises(WeightsError, match="damaged"):
        cm.load_clip("dab-world", None)


def test_dab_world_sees_the_world():
    """Zero-shot, dab-world matches held-out world frames to their captions far above chance."""
    from dab_pipeline.world import frame_caption_pairs

    pretrain = load_script("pretrain_dab_world")  # the script that trained it: its frame -> caption check
    frame_to_caption, normalise = pretrain.frame_to_caption, pretrain.normalise
    b = cm.load_clip("dab-world", None)
    frames, texts = frame_caption_pairs(seed=4242, count=200, size=(64, 64))  # a stream it never saw
    res = frame_to_caption(b.model.eval(), b.tokenizer, normalise(frames, b.mean, b.std), texts)
    assert res["R@1"] > 10 * res["chance_R@1"] and res["R@5"] > 40, res


@pytest.mark.parametrize("model", ["dab-tiny", "dab-tiny-quickgelu"])
def test_short_query_encoding_equals_the_full_context(model: str) -> None:
    """The causal text tower up to EOT gives encode_text's features exactly (search queries)."""
    from dab_pipeline.clip_models import encode_queries_short, encode_texts, load_clip

    bundle = load_clip(model, None)
    texts = ["a dog", "a much longer caption about a red ball rolling down a hill at night", "x"]
    full = encode_texts(bundle, texts).features
    short = encode_queries_short(bundle, texts)
    torch.testing.assert_close(short, full, rtol=1e-5, atol=1e-5)
    n_used = int(bundle.tokenizer(texts).argmax(dim=-1).max()) + 1
    assert n_used < bundle.context_length  # the point: fewer positions than the context
    # a batch is packed into one sequence (each query sees only its own tokens): each as when encoded alone
    batch = [*texts, "a dog", "", "two red balls and a blue one on a table"]
    packed = encode_queries_short(bundle, batch)
    alone = torch.cat([encode_queries_short(bundle, [t]) for t in batch])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[0], packed[3], rtol=1e-5, atol=1e-5)


def test_many_queries_are_packed_in_bounded_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    from dab_pipeline.clip_models import encode, encode_queries_short, load_clip

    bundle = load_clip("dab-tiny", None)
    texts = [f"caption number {i} " + "word " * (i % 9) for i in range(23)]
    whole = encode_queries_short(bundle, texts)
    sizes: list[int] = []
    real = encode._encode_packed
    monkeypatch.setattr(
        encode, "_encode_packed", lambda b, t, e, m: sizes.append(int((e + 1).sum())) or real(b, t, e, m)
    )
    monkeypatch.setattr(encode, "PACK_TOKENS", 40)
    torch.testing.assert_close(encode_queries_short(bundle, texts), whole, rtol=1e-5, atol=1e-5)
    assert len(sizes) > 3 and max(sizes) <= 40
