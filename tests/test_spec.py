"""RopeScaling against transformers' own functions, float64 references and its properties."""

import copy
import math
import pickle

import pytest
import torch
from tiny_models import native_rope_keys
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from yarnlib import METHODS, RopeScaling
from yarnlib.eval.methods import Method, parse_methods
from yarnlib.finetune.loop import rope_spec

HF_NAME = {"linear": "linear", "dynamic_ntk": "dynamic", "yarn": "yarn"}
HEAD_DIMS = (64, 80, 128, 256)
THETAS = (1e4, 5e5, 1e6)
FACTORS = (1, 2, 4, 8, 16, 32)
ORIGINALS = (2048, 4096, 32768)


def hf_config(spec: RopeScaling, head_dim: int, partial: float = 1.0) -> LlamaConfig:
    """A transformers config built from nothing but ``spec.to_hf`` (and the head geometry), in
    the keys the installed transformers reads."""
    params = native_rope_keys(spec, partial if partial != 1.0 else None)
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, **params)


def hf_frequencies(spec, config, seq_len=None):
    return ROPE_INIT_FUNCTIONS[HF_NAME[spec.method]](config, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("method", sorted(HF_NAME))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_bit_identical_to_transformers(method, head_dim):
    for theta in THETAS:
        for factor in FACTORS:
            for original in ORIGINALS:
                spec = RopeScaling(method, factor, original, theta, head_dim)
                config = hf_config(spec, head_dim)
                lengths = [None] if method != "dynamic_ntk" else [None, original // 2, 3 * original]
                for seq_len in lengths:
                    inv_freq, attention = hf_frequencies(spec, config, seq_len)
                    assert spec.inv_freq(seq_len).dtype == torch.float32
                    assert torch.equal(spec.inv_freq(seq_len), inv_freq), (spec, seq_len)
                    assert spec.attention_factor(seq_len) == attention


YARN_KNOBS = [
    {"mscale": 0.707, "mscale_all_dim": 0.707},
    {"mscale": 1.0, "mscale_all_dim": 0.5},
    {"attention_factor": 0.9},
    {"truncate": False},
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"beta_fast": 4.0, "beta_slow": 4.0},  # zero-width ramp
]


@pytest.mark.parametrize("knobs", YARN_KNOBS, ids=lambda k: ",".join(k))
@pytest.mark.parametrize("partial", [1.0, 0.5, 0.25])
def test_yarn_knobs_and_partial_rotary_bit_identical(knobs, partial):
    for head_dim in HEAD_DIMS:
        for factor in (2, 8, 32):
            rotary_dim = int(head_dim * partial)
            spec = RopeScaling("yarn", factor, 4096, 5e5, rotary_dim, **knobs)
            inv_freq, attention = hf_frequencies(spec, hf_config(spec, head_dim, partial))
            assert inv_freq.shape == (rotary_dim // 2,)
            assert torch.equal(spec.inv_freq(), inv_freq)
            assert spec.attention_factor() == attention


@pytest.mark.parametrize("method", ["linear", "dynamic_ntk"])
def test_partial_rotary_linear_dynamic_bit_identical(method):
    spec = RopeScaling(method, 4, 4096, 1e6, 32)
    config = hf_config(spec, 128, partial=0.25)
    for seq_len in (None, 10000):
        assert torch.equal(spec.inv_freq(seq_len), hf_frequencies(spec, config, seq_len)[0])


# -- float64 references written from the YaRN paper ------------------------------------------


def theta64(b, d):
    return torch.tensor([b ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


def ntk_reference(b, d, s):
    return theta64(b * s ** (d / (d - 2)), d)


def ntk_by_parts_reference(b, d, s, length, alpha=1.0, beta=32.0):
    """The paper's "NTK-by-parts" as in its reference code: the ramp is linear over the
    dimension index between the dimensions that turn β and α times within L
    (d_r = d·ln(L / 2πr) / 2·ln b); θ' = (1−γ)·θ/s + γ·θ."""
    theta = theta64(b, d)
    low, high = (
        d * math.log(length / (2 * math.pi * r)) / (2 * math.log(b)) for r in (beta, alpha)
    )
    low, high = max(low, 0.0), min(high, d - 1.0)
    index = torch.arange(d // 2, dtype=torch.float64)
    gamma = 1 - ((index - low) / (high - low)).clamp(0, 1)
    return (1 - gamma) * theta / s + gamma * theta


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_ntk_matches_float64_paper(head_dim):
    for theta in THETAS:
        for factor in FACTORS:
            spec = RopeScaling("ntk", factor, None, theta, head_dim)
            ref = ntk_reference(theta, head_dim, factor)
            torch.testing.assert_close(spec.inv_freq().double(), ref, rtol=2e-6, atol=0)
            # NTK-aware: the lowest frequency is divided by exactly s, the highest kept.
            assert spec.inv_freq()[0] == 1.0
            low = spec.inv_freq()[-1].double() / theta64(theta, head_dim)[-1]
            assert low.item() == pytest.approx(1 / factor, rel=1e-5)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_ntk_by_parts_matches_float64_paper_without_truncation(head_dim):
    # truncate=False keeps the exact (fractional) ramp of the paper.
    for theta in THETAS:
        for factor in (2, 8, 32):
            for original in ORIGINALS:
                spec = RopeScaling(
                    "ntk_by_parts", factor, original, theta, head_dim, truncate=False
                )
                ref = ntk_by_parts_reference(theta, head_dim, factor, original)
                torch.testing.assert_close(spec.inv_freq().double(), ref, rtol=2e-5, atol=0)
                assert spec.attention_factor() == 1.0


def test_yarn_attention_factor_is_paper_formula():
    for factor in (1.5, 2, 4, 16, 32):
        spec = RopeScaling("yarn", factor, 4096, 1e4, 128)
        assert spec.attention_factor() == pytest.approx(0.1 * math.log(factor) + 1)


# -- properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_factor_one_is_plain_rope(method):
    plain = RopeScaling("none", 1, 4096, 5e5, 128)
    spec = RopeScaling(method, 1, 4096, 5e5, 128)
    # The dynamic methods are plain RoPE until the original context (checked below); here: at L.
    seq_len = 4096 if spec.is_dynamic else None
    # yarn blends θ·(1−γ) + θ·γ, which can round one ulp off θ: compare within 1 ulp.
    torch.testing.assert_close(spec.inv_freq(seq_len), plain.inv_freq(), rtol=1.2e-7, atol=0)
    assert spec.attention_factor(seq_len) == 1.0


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_dynamic_methods_are_plain_until_original(method):
    plain = RopeScaling("none", 1, 4096, 1e4, 64).inv_freq()
    spec = RopeScaling(method, 8, 4096, 1e4, 64)
    for seq_len in (None, 1, 100, 4096):
        assert torch.equal(spec.inv_freq(seq_len), plain)
        assert spec.attention_factor(seq_len) == 1.0
    assert not torch.equal(spec.inv_freq(4097), plain)


def test_dynamic_yarn_is_yarn_at_effective_factor():
    spec = RopeScaling("dynamic_yarn", 4, 4096, 1e4, 64)
    for seq_len, s_eff in ((8192, 2.0), (6144, 1.5), (4096 * 8, 8.0)):
        yarn = RopeScaling("yarn", s_eff, 4096, 1e4, 64)
        assert torch.equal(spec.inv_freq(seq_len), yarn.inv_freq())
        assert spec.attention_factor(seq_len) == yarn.attention_factor()


def test_yarn_keeps_highest_and_divides_lowest_frequencies():
    for factor in (2, 4, 16):
        base = RopeScaling("none", 1, 4096, 1e4, 128).inv_freq()
        spec = RopeScaling("yarn", factor, 4096, 1e4, 128)
        assert torch.equal(spec.inv_freq()[:4], base[:4])
        torch.testing.assert_close(spec.inv_freq()[-4:], base[-4:] / factor, rtol=1e-6, atol=0)


def test_linear_divides_every_frequency():
    base = RopeScaling("none", 1, None, 1e4, 64).inv_freq()
    assert torch.equal(RopeScaling("pi", 4, None, 1e4, 64).inv_freq(), base / 4)


def test_aliases():
    pairs = {
        "default": "none",
        "pi": "linear",
        "dynamic": "dynamic_ntk",
        "ntk-by-parts": "ntk_by_parts",
        "dynamic-yarn": "dynamic_yarn",
    }
    for alias, method in pairs.items():
        factor = 1 if method == "none" else 2  # none scales nothing
        assert RopeScaling(alias, factor, 4096, 1e4, 64).method == method


def test_frozen_hashable_picklable():
    spec = RopeScaling("yarn", 4, 4096, 1e4, 64, mscale=0.707, mscale_all_dim=0.707)
    with pytest.raises(AttributeError):
        spec.factor = 8
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert hash(spec) == hash(spec.replace())
    assert spec.replace(factor=8).factor == 8.0 and spec.factor == 4.0
    assert "mscale=0.707" in repr(spec)


# -- validation ------------------------------------------------------------------------------

BAD = [
    ({"factor": 0.5}, "factor"),
    ({"factor": float("nan")}, "factor"),
    ({"factor": float("inf")}, "factor"),
    ({"factor": 1e300}, "factor must be <= 1024"),
    ({"method": "none", "factor": 4}, "factor: method 'none' scales nothing"),
    ({"method": "rope-magic"}, "method"),
    ({"rotary_dim": 63}, "rotary_dim"),
    ({"rotary_dim": 0}, "rotary_dim"),
    ({"rotary_dim": -64}, "rotary_dim"),
    ({"rotary_dim": None}, "rotary_dim"),
    ({"rope_theta": 1.0}, "rope_theta"),
    ({"rope_theta": -5.0}, "rope_theta"),
    ({"rope_theta": float("nan")}, "rope_theta"),
    ({"original_max_position_embeddings": None}, "original_max_position_embeddings"),
    ({"original_max_position_embeddings": -1}, "original_max_position_embeddings"),
    ({"beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast"),
    ({"mscale": float("inf")}, "mscale"),
    ({"attention_factor": -1.0}, "attention_factor"),
    ({"truncate": "yes"}, "truncate"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_names_the_field(change, field):
    kwargs = dict(
        method="yarn",
        factor=4,
        original_max_position_embeddings=4096,
        rope_theta=1e4,
        rotary_dim=64,
    )
    kwargs.update(change)
    with pytest.raises(ValueError, match=field):
        RopeScaling(**kwargs)


def test_eval_and_finetune_methods_follow_the_spec_rules():
    assert parse_methods("none,yarn:4") == [Method("none", 1.0), Method("yarn", 4.0)]
    for bad, message in (("none:4", "'none:4': factor: method 'none'"), ("yarn:2e3", "<= 1024")):
        with pytest.raises(ValueError, match=message):
            parse_methods(bad)
    config = LlamaConfig(head_dim=16, max_position_embeddings=256)
    assert rope_spec(config, "none", None, None) is None  # finetune --method none: RoPE as is
    with pytest.raises(ValueError, match="factor: method 'none'"):
        rope_spec(config, "none", 4.0, None)


def test_unknown_method_lists_known_ones():
    with pytest.raises(ValueError, match="linear.*ntk.*dynamic_yarn"):
        RopeScaling("magic", 2, 4096, 1e4, 64)


@pytest.mark.parametrize("method", ["dynamic_ntk", "ntk_by_parts", "yarn", "dynamic_yarn"])
def test_methods_needing_original_length(method):
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RopeScaling(method, 2, None, 1e4, 64)


def test_knob_of_another_method_is_an_error():
    with pytest.raises(ValueError, match="mscale.*linear"):
        RopeScaling("linear", 2, 4096, 1e4, 64, mscale=1.0)
    with pytest.raises(ValueError, match="attention_factor"):
        RopeScaling("ntk_by_parts", 2, 4096, 1e4, 64, attention_factor=1.2)


def test_rescaled_starts_from_the_unscaled_model():
    scaled = RopeScaling("yarn", 4, 4096, 1e6, 128, mscale=1.0, mscale_all_dim=1.0)
    again = scaled.rescaled("linear", 2)
    assert again == RopeScaling("linear", 2, 4096, 1e6, 128)
    assert scaled.rescaled("yarn", 8, 8192).original_max_position_embeddings == 8192
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RopeScaling("linear", 2, None, 1e4, 64).rescaled("yarn", 4)


# -- issue 52, defect 7: a checkpoint's own YaRN survives pickle and copy ----------------------


def shipped_behaviour(spec: RopeScaling) -> tuple:
    """What a shipped spec decides: its context, that it is kept, and which rescales it refuses."""
    try:
        spec.rescaled("yarn", 8)
        refusal = None
    except ValueError as error:
        refusal = str(error)
    kept = spec.rescaled("yarn", spec.factor)
    return (spec.max_position_embeddings, spec.is_checkpoint_scaling, refusal, kept.knobs())


def spawned_copy(spec: RopeScaling) -> tuple[RopeScaling, int | None]:
    """``spec`` pickled into a spawned process (as Ray and multiprocessing send it) and back,
    with the context that process read from its copy."""
    import multiprocessing
    import operator

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.apply(operator.attrgetter("max_position_embeddings"), (spec,))
        back = pool.apply(copy.copy, (spec,))
    return back, there


def test_a_shipped_spec_survives_pickle_and_copy():
    config = {"rope_theta": 1e4, "max_position_embeddings": 4096 * 40, "head_dim": 64}
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                              "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096}  # fmt: skip
    shipped = RopeScaling.from_hf(config)  # DeepSeek-V3's knobs, not written by yarnlib
    expected = shipped_behaviour(shipped)
    assert expected[:2] == (None, True) and "knobs would be dropped" in expected[2]
    assert expected[3] == {"mscale": 1.0, "mscale_all_dim": 1.0}
    plain = shipped.replace()  # the same fields, not the checkpoint's own: behaves otherwise
    assert shipped_behaviour(plain)[:3] == (163840, False, None)
    assert plain != shipped and repr(shipped) == repr(plain) + ".as_shipped()"
    back, there = spawned_copy(shipped)
    copies = [pickle.loads(pickle.dumps(shipped)), copy.deepcopy(shipped), copy.copy(shipped), back]
    for twin in copies:
        assert twin.shipped and twin == shipped and hash(twin) == hash(shipped)
        assert shipped_behaviour(twin) == expected
    assert there is None  # the spawned process read the checkpoint's context as unknown too


def test_marking_a_spec_as_shipped_leaves_that_spec_as_it_was():
    knobs = {"mscale": 1.0, "mscale_all_dim": 1.0}
    plain = RopeScaling("yarn", 4.0, 4096, 1e4, 64, **knobs)
    index = {plain: "applied by yarnlib"}
    shipped = plain.as_shipped()
    assert shipped.shipped and shipped is not plain and shipped != plain
    # the spec marked is immutable: its context, its rescales and its hash stay
    assert not plain.shipped and not plain.is_checkpoint_scaling
    assert plain.max_position_embeddings == 4096 * 4 and shipped.max_position_embeddings is None
    assert plain.rescaled("yarn", 8.0).max_position_embeddings == 4096 * 8
    assert index[RopeScaling("yarn", 4.0, 4096, 1e4, 64, **knobs)] == "applied by yarnlib"
