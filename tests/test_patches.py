"""yarnlib.patch on real (tiny, random) transformers models against transformers' own models."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_models import (
    ARCHS,
    ROPE_KEYS,
    config_rope,
    hand_written_rope,
    native_rope_keys,
    tiny_config,
    tiny_model,
)
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from transformers.models.llama import modeling_llama

import yarnlib
from yarnlib.convert import MARKER
from yarnlib.patches import choose_attn_implementation, patch_state

ORIGINAL = 256  # tiny_config's max_position_embeddings
torch.manual_seed(0)
IDS = torch.randint(0, 128, (2, 3 * ORIGINAL))
LENGTHS = (100, 3 * ORIGINAL)  # below and above the original context
FACTOR = {m: 1.0 if m == "none" else 4.0 for m in yarnlib.METHODS}  # none scales nothing


def logits(model, ids=IDS, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


def native_twin(arch, spec, **overrides):
    """The same weights, configured natively in transformers from the spec's own dict."""
    return tiny_model(arch, **native_rope_keys(spec), **overrides)


THETA = 50000.0  # tiny_config's rope_theta
# transformers configured for each method at factor 4, written out by hand from the method
# definitions (not from yarnlib's spec or its conversions): the independent reference.
YARN_AT_4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
HAND_WRITTEN = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, ORIGINAL),
    "dynamic_ntk": ({"rope_type": "dynamic", "factor": 4.0}, ORIGINAL),  # scales beyond L
    "yarn": (YARN_AT_4, 4 * ORIGINAL),
    "ntk": ({"rope_type": "default", "rope_theta": THETA * 4.0 ** (16 / 14)}, ORIGINAL),
    "ntk_by_parts": ({**YARN_AT_4, "attention_factor": 1.0}, 4 * ORIGINAL),
}


def hand_written_twin(arch, method, knobs, **overrides):
    """The same weights, configured natively in transformers from ``HAND_WRITTEN``."""
    params, max_positions = HAND_WRITTEN[method]
    return tiny_model(
        arch,
        **hand_written_rope({"rope_theta": THETA, **params, **knobs}),
        max_position_embeddings=max_positions,
        **overrides,
    )


NATIVE = [
    ("linear", {}),
    ("dynamic_ntk", {}),
    ("yarn", {}),
    ("yarn", {"mscale": 0.707, "mscale_all_dim": 0.707}),
    ("yarn", {"attention_factor": 1.3, "beta_fast": 16.0, "truncate": False}),
]
LOWERED = [("ntk", {}), ("ntk_by_parts", {})]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method,knobs", NATIVE + LOWERED, ids=lambda x: str(x))
def test_patched_equals_native_transformers(arch, method, knobs):
    model = yarnlib.patch(tiny_model(arch), method, 4.0, **knobs)
    native = hand_written_twin(arch, method, knobs)
    for n in LENGTHS:
        torch.testing.assert_close(
            logits(model, IDS[:, :n]), logits(native, IDS[:, :n]), rtol=1e-5, atol=1e-5
        )


def test_every_method_changes_logits_beyond_original_only_where_it_should():
    base = logits(tiny_model())
    for method in yarnlib.METHODS[1:]:
        patched = logits(yarnlib.patch(tiny_model(), method, 4.0))
        assert not torch.allclose(patched, base), method
    # dynamic methods run plain RoPE within the original context
    for method in ("dynamic_ntk", "dynamic_yarn"):
        short = IDS[:, :ORIGINAL]
        assert torch.equal(
            logits(yarnlib.patch(tiny_model(), method, 4.0), short), logits(tiny_model(), short)
        )


def test_config_says_what_runs():
    model = yarnlib.patch(tiny_model("qwen2"), "yarn", 4.0)
    params = config_rope(model.config)
    assert params["rope_type"] == "yarn" and params["rope_theta"] == 50000.0
    assert params["original_max_position_embeddings"] == ORIGINAL
    assert model.config.max_position_embeddings == 4 * ORIGINAL
    assert yarnlib.RopeScaling.from_hf(model.config) == patch_state(model).spec


SAVE_AND_RELOAD = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    folders, ids, needs = sys.argv[1:]
    if needs == "import":
        import yarnlib  # noqa: F401  (teaches transformers yarnlib_dynamic_yarn)
    assert ("yarnlib" in sys.modules) == (needs == "import")
    ids = torch.tensor(json.loads(ids))
    out = {}
    for folder in json.loads(folders):
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
        with torch.no_grad():
            out[folder] = model(ids).logits.tolist()
    print(json.dumps(out))
    """
)
RELOADED = ["none", "linear", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "dynamic_yarn"]


@pytest.fixture(scope="module")
def reloads(tmp_path_factory):
    """method -> (saved config, logits of the patched model, logits reloaded in a fresh Python).
    One fresh interpreter per import mode (an interpreter start is most of the cost)."""
    ids = IDS[:1, : 3 * ORIGINAL]
    saved, expected = {}, {}
    for method in RELOADED:
        folder = tmp_path_factory.mktemp(method)
        model = yarnlib.patch(tiny_model("llama"), method, FACTOR[method])
        model.save_pretrained(folder)
        saved[method] = (str(folder), json.loads((folder / "config.json").read_text()))
        expected[method] = logits(model, ids)
    reloaded = {}
    # dynamic_yarn has no transformers equivalent: it needs `import yarnlib`, nothing else.
    for needs in ("plain", "import"):
        folders = [saved[m][0] for m in RELOADED if (m == "dynamic_yarn") == (needs == "import")]
        out = subprocess.run(
            [sys.executable, "-c", SAVE_AND_RELOAD, json.dumps(folders), json.dumps(ids.tolist()),
             needs],
            capture_output=True,
            text=True,
            check=True,
        )  # fmt: skip
        reloaded.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return {m: (saved[m][1], expected[m], torch.tensor(reloaded[saved[m][0]])) for m in RELOADED}


@pytest.mark.parametrize("method", RELOADED)
def test_save_pretrained_reloads_without_yarnlib(method, reloads):
    config, expected, reloaded = reloads[method]
    assert MARKER in config or method == "none"
    torch.testing.assert_close(reloaded, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_unpatch_restores_bits_and_config(arch):
    model = tiny_model(arch)
    before, config_before = logits(model), model.config.to_dict()
    rotary = model.model.rotary_emb
    yarnlib.patch(model, "yarn", 4.0)
    yarnlib.patch(model, "dynamic_yarn", 8.0)  # a second patch, then one unpatch
    assert not torch.equal(logits(model), before)
    assert "generate" in model.__dict__  # the wrapper declaring prompt + max_new_tokens
    yarnlib.unpatch(model)
    assert model.model.rotary_emb is rotary
    assert "generate" not in model.__dict__  # the class's own generate again
    assert model.generate.__func__ is type(model).generate
    assert torch.equal(logits(model), before)
    assert model.config.to_dict() == config_before
    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__
    with pytest.raises(ValueError, match="not patched"):
        yarnlib.unpatch(model)


def test_patch_twice_is_a_no_op_and_never_compounds():
    model = yarnlib.patch(tiny_model(), "yarn", 4.0)
    rotary = model.model.rotary_emb
    assert yarnlib.patch(model, "yarn", 4.0).model.rotary_emb is rotary
    yarnlib.patch(model, "yarn", 2.0)
    spec = patch_state(model).spec
    assert spec.factor == 2.0 and spec.original_max_position_embeddings == ORIGINAL
    assert model.config.max_position_embeddings == 2 * ORIGINAL


def test_patch_an_already_scaled_config_rescales_from_its_original():
    spec = yarnlib.RopeScaling("yarn", 4.0, ORIGINAL, 50000.0, 16)
    scaled = native_twin("llama", spec)  # e.g. a checkpoint shipped with yarn 4 in config.json
    yarnlib.patch(scaled, "yarn", 2.0)
    assert patch_state(scaled).spec == spec.replace(factor=2.0)
    twin = native_twin("llama", spec.replace(factor=2.0))
    torch.testing.assert_close(logits(scaled), logits(twin), rtol=1e-5, atol=1e-5)
    # ntk written by yarnlib stores the raised theta natively; the marker keeps the base
    ntk = yarnlib.patch(tiny_model(), "ntk", 4.0)
    reloaded = tiny_model(
        **{k: v for k, v in ntk.config.to_dict().items() if k in (*ROPE_KEYS, MARKER)}
    )
    yarnlib.patch(reloaded, "ntk", 2.0)
    assert patch_state(reloaded).spec.rope_theta == 50000.0
    torch.testing.assert_close(logits(reloaded), logits(yarnlib.patch(tiny_model(), "ntk", 2.0)))


@pytest.mark.parametrize("method", yarnlib.METHODS)
def test_greedy_generation_same_with_and_without_cache(method):
    model = yarnlib.patch(tiny_model("qwen3"), method, FACTOR[method])
    prompt = IDS[:1, : ORIGINAL - 20]  # generation crosses the original context
    kwargs = dict(max_new_tokens=60, do_sample=False, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    uncached = model.generate(prompt, use_cache=False, **kwargs)
    assert cached.shape[1] == prompt.shape[1] + 60
    assert torch.equal(cached, uncached)


def test_declared_length_fixes_the_dynamic_scale():
    model = yarnlib.patch(tiny_model(), "dynamic_yarn", 4.0)
    ids = IDS[:1, : 2 * ORIGINAL]
    with yarnlib.declare_length(model, 4 * ORIGINAL):
        declared = logits(model, ids)
    static = native_twin("llama", yarnlib.RopeScaling("yarn", 4.0, ORIGINAL, 50000.0, 16))
    torch.testing.assert_close(declared, logits(static, ids), rtol=1e-5, atol=1e-5)
    # outside the block, the scale follows the sequence: s_eff = 2 at 2 × original
    twice = native_twin("llama", yarnlib.RopeScaling("yarn", 2.0, ORIGINAL, 50000.0, 16))
    torch.testing.assert_close(logits(model, ids), logits(twice, ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="length"):
        with yarnlib.declare_length(model, 0):
            pass


def test_left_padding_with_position_ids():
    """A dynamic method scales to the longest position: with position ids ignored, the
    padded row would run at 400 tokens' scale instead of 300 (RoPE itself is relative)."""
    model = yarnlib.patch(tiny_model("qwen3"), "dynamic_yarn", 4.0)
    long, short = IDS[0, :400], IDS[1, :300]
    pad = torch.zeros(100, dtype=torch.long)
    batch = torch.stack([long, torch.cat([pad, short])])
    mask = torch.stack([torch.ones(400), torch.cat([torch.zeros(100), torch.ones(300)])]).long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    alone = logits(model, short[None])[0]
    padded = logits(model, batch[1:], attention_mask=mask[1:], position_ids=position_ids[1:])
    torch.testing.assert_close(padded[0, 100:], alone, rtol=1e-4, atol=1e-4)
    # in a batch, the scale is the batch's: the long row's 400 tokens
    padded = logits(model, batch, attention_mask=mask, position_ids=position_ids)
    torch.testing.assert_close(padded[0], logits(model, long[None])[0], rtol=1e-4, atol=1e-4)
    with yarnlib.declare_length(model, 400):
        at_400 = logits(model, short[None])[0]
    torch.testing.assert_close(padded[1, 100:], at_400, rtol=1e-4, atol=1e-4)
    assert (at_400 - alone).abs().max() > 100 * 1e-4  # the two scales are told apart


def reference_partial_apply(q, k, cos, sin, unsqueeze_dim=1):
    """Partial rotary as transformers writes it for GPT-NeoX/Phi: rotate the first
    cos.shape[-1] features with rotate_half, pass the rest through."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate(x):
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat([rot * cos + modeling_llama.rotate_half(rot) * sin, rest], dim=-1)

    return rotate(q), rotate(k)


@pytest.mark.parametrize("method", ["none", "yarn", "linear"])
def test_partial_rotary(method, monkeypatch):
    overrides = dict(partial_rotary_factor=0.5)
    model = yarnlib.patch(tiny_model("llama", **overrides), method, FACTOR[method])
    assert patch_state(model).spec.rotary_dim == 8
    ours = logits(model)
    # transformers' own tables for the same rope (its default rope ignores the partial
    # factor, so 'none' is expressed as linear with factor 1) and a reference rotation
    spec = patch_state(model).spec
    if method == "none":
        spec = spec.replace(method="linear", factor=1.0)
    yarnlib.unpatch(model)
    native = tiny_model("llama", **{**overrides, **native_rope_keys(spec, 0.5)})
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", reference_partial_apply)
    torch.testing.assert_close(ours, logits(native), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_kernel_route_equals_transformers_rotation(arch):
    plain = yarnlib.patch(tiny_model(arch), "yarn", 4.0, use_kernel=False)
    kernel = yarnlib.patch(tiny_model(arch), "yarn", 4.0, use_kernel=True)
    torch.testing.assert_close(logits(kernel), logits(plain), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementations(attn):
    model = yarnlib.patch(tiny_model("qwen2", attn_implementation=attn), "yarn", 4.0)
    native = hand_written_twin("qwen2", "yarn", {}, attn_implementation="eager")
    torch.testing.assert_close(logits(model), logits(native), rtol=1e-4, atol=1e-4)


def test_attention_choice_logic():
    assert choose_attn_implementation("auto", "cpu") == "sdpa"
    assert choose_attn_implementation("eager", "cpu") == "eager"
    with pytest.raises(ValueError, match="flash_attention_2.*CUDA"):
        choose_attn_implementation("flash_attention_2", "cpu")
    with pytest.raises(ValueError, match="attn_implementation"):
        choose_attn_implementation("flash", "cpu")


def test_bfloat16_model_keeps_float32_frequencies():
    model = yarnlib.patch(tiny_model(), "yarn", 4.0).to(torch.bfloat16)
    rotary = model.model.rotary_emb
    assert rotary.inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, patch_state(model).spec.inv_freq())
    cos, _ = rotary(torch.zeros(1, dtype=torch.bfloat16), torch.arange(4)[None])
    assert cos.dtype == torch.bfloat16


def test_unsupported_models_are_named():
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported architectures: llama"):
        yarnlib.patch(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)))
    with pytest.raises(ValueError, match="method"):
        yarnlib.patch(tiny_model(), "magic", 4.0)
    with pytest.raises(ValueError, match="factor"):
        yarnlib.patch(tiny_model(), "yarn", 0.5)
    with pytest.raises(ValueError, match="factor: method 'none'"):
        yarnlib.patch(tiny_model(), "none", 4.0)
    with pytest.raises(ValueError, match="use_kernel"):
        yarnlib.patch(tiny_model(), "yarn", 2.0, use_kernel="yes")


def test_base_model_class_and_mistral():
    from transformers import AutoModel

    config = tiny_config("mistral", sliding_window=None)
    base = AutoModel.from_config(config, attn_implementation="eager").eval()
    yarnlib.patch(base, "linear", 2.0)
    assert isinstance(base.rotary_emb, yarnlib.patches.rotary.YarnlibRotaryEmbedding)
    assert AutoModelForCausalLM is not None
