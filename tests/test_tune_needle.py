"""``yarnlib tune --objective needle|mix`` (issue 29): the needle windows, the objective against
plain transformers, a task where only the needle objective keeps the slow frequencies in
range, and the command (resume, budget, refusals)."""

import json
import math
import random
import re
import shlex

import pytest
import torch
from test_eval_support import corpus_text, text_dataset, tiny_folder, tiny_tokenizer
from tiny_models import native_rope_keys, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from yarnlib.cli import main
from yarnlib.eval.store import CellStore
from yarnlib.spec import RopeScaling
from yarnlib.tune.needle import NeedleWindow, needle_objective, needle_window
from yarnlib.tune.search import Search, first_slow, per_dim_point, start_point, to_spec

L, N = 128, 512


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def text_ids(tok):
    return tok(corpus_text(3000), add_special_tokens=False)["input_ids"]


def by_hand_answers(tok, ids: list[int], keys: list[int]) -> list[int]:
    """Positions of each key's answer tokens, found in the token list itself: the last place
    where the tokens of " KEY" follow the tokens of "... key is"."""
    positions = []
    for key in keys:
        answer = tok(f" {key}", add_special_tokens=False)["input_ids"]
        starts = [i for i in range(len(ids)) if ids[i : i + len(answer)] == answer]
        assert tok.decode(ids[: starts[-1]]).endswith("key is")
        positions += range(starts[-1], starts[-1] + len(answer))
    return sorted(positions)


def test_needle_window_layout(tok, text_ids):
    """Exact length; key k's line at depth (k + 1/2) / K of the text; the answers are the key
    tokens after the questions at the end; seeded."""
    window = needle_window(tok, text_ids, 700, 4, seed=3)
    ids = window.input_ids.tolist()
    assert len(ids) == 700 and len(set(window.keys)) == 4
    assert sorted(window.answers) == by_hand_answers(tok, ids, window.keys)
    assert min(window.answers) > max(window.key_starts)

    def count(text):
        return len(tok(text, add_special_tokens=False)["input_ids"])

    names, lines = [], []
    for key, start in zip(window.keys, window.key_starts, strict=True):
        name, said = re.match(r"\nThe (\w+) key is (\d+)\.", tok.decode(ids[start:])).groups()
        assert int(said) == key
        names.append(name)
        lines.append(count(f"\nThe {name} key is {key}. Remember it.\n"))
    tail = sum(count(f"\nWhat is the {n} key? The {n} key is") + count(f" {k}") + count(".")
               for n, k in zip(names, window.keys, strict=True))  # fmt: skip
    n_text = 700 - sum(lines) - tail
    for k, start in enumerate(window.key_starts):  # text before key k: its depth's share
        assert start - sum(lines[:k]) == round((k + 0.5) / 4 * n_text)
    again = needle_window(tok, text_ids, 700, 4, seed=3)
    assert torch.equal(again.input_ids, window.input_ids)
    assert needle_window(tok, text_ids, 700, 4, seed=4).keys != window.keys
    with pytest.raises(ValueError, match="needles: 9; allowed"):
        needle_window(tok, text_ids, 700, 9, seed=3)
    with pytest.raises(ValueError, match="length: a needle window of 700 tokens"):
        needle_window(tok, text_ids[:100], 700, 4, seed=3)


def test_needle_objective_equals_the_key_tokens_nll_of_plain_transformers(tok, text_ids):
    """needle_objective of a yarn spec (yarnlib's patch, chunked head) against plain
    transformers with that yarn in its config, full float64 log-softmax, the answer positions
    found by hand; and mix = (1 - w) text NLL beyond L + w needle NLL."""
    model = tiny_model("llama", vocab_size=tok.vocab_size + 1, max_position_embeddings=L)
    native = RopeScaling.from_hf(model.config)
    spec = native.rescaled("yarn", N / L, L, beta_fast=8.0, beta_slow=2.0, attention_factor=1.2)
    windows = [needle_window(tok, text_ids[i * 50 :], N, 3, seed=i) for i in range(2)]
    got = needle_objective(model, windows, spec, L, None)
    mixed = needle_objective(model, windows, spec, L, 0.3)

    fields = {k: v for k, v in model.config.to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("llama", **{**fields, **native_rope_keys(spec)})
    plain = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    plain.load_state_dict(model.state_dict())
    answer_nll, text_nll, within_nll = [], [], []
    for window in windows:
        ids = window.input_ids
        with torch.no_grad():
            logp = plain(ids[None]).logits[0, :-1].double().log_softmax(-1)
        nll = -logp.gather(-1, ids[1:, None])[:, 0]  # nll[i - 1]: token i
        answers = by_hand_answers(tok, ids.tolist(), window.keys)
        answer_nll += [float(nll[p - 1]) for p in answers]
        text_nll += [float(nll[p - 1]) for p in range(L, N) if p not in answers]
        within_nll += [float(nll[p - 1]) for p in range(1, L) if p not in answers]  # 0: no NLL
    needle = sum(answer_nll) / len(answer_nll)
    text = sum(text_nll) / len(text_nll)
    assert got["objective"] == got["needle_nll"] == pytest.approx(needle, abs=2e-5)
    assert got["answer_tokens"] == len(answer_nll)
    assert mixed["nll_beyond_original"] == pytest.approx(text, abs=2e-5)
    assert mixed["objective"] == pytest.approx(0.7 * text + 0.3 * needle, abs=2e-5)
    within = sum(within_nll) / len(within_nll)
    assert got["nll_within_original"] == mixed["nll_within_original"]
    assert got["nll_within_original"] == pytest.approx(within, abs=2e-5)
    assert all_finite(got) and all_finite(mixed)


def all_finite(payload) -> bool:
    """Whether every number in a JSON-like payload is finite (json reads NaN back as NaN)."""
    if isinstance(payload, dict):
        return all(all_finite(v) for v in payload.values())
    if isinstance(payload, list):
        return all(all_finite(v) for v in payload)
    return not isinstance(payload, float) or math.isfinite(payload)


# A task where retrieval needs a slow frequency and local prediction wants it turned faster.
# One layer, two heads, hand-set weights, rope_theta 1e7, head_dim 16 (8 frequencies), L = 64:
# frequency 2 (wavelength 353 > L) is the first slower than L, and the only one either head
# uses. Head R: the query token Q matches the key tokens (content) through frequency 2 only,
# and copies the key; at distance D the match is scaled by cos(D x inv_freq_2): far keys are
# found only while frequency 2's divisor stays >= N/L. Head F: every token attends to every
# token through frequency 2 alone, so its attention decays with distance, the faster the
# smaller that divisor; it copies the filler tokens, which come in runs of 12: the NLL of the
# filler falls as the divisor falls (measured: 2.15 nats at 4, 1.20 at 1.6).
SL, SN = 64, 256
FILLER, KEYS, QUERY = range(8), range(8, 12), 12
OUT = 33  # output dims: token t is read from OUT + t


def slow_task_model():
    config = LlamaConfig(
        vocab_size=32, hidden_size=48, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=SL,
        rope_theta=1e7, rms_norm_eps=1e-9, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, 32] = 1  # a constant dimension, for head F's position-only query and key
        embed[torch.arange(32), torch.arange(32)] = 1  # token identity
        layer = model.model.layers[0]
        layer.input_layernorm.weight.fill_(math.sqrt(2 / 48))  # the norm then leaves x as is
        model.model.norm.weight.fill_(1.0)
        attn = layer.self_attn
        attn.q_proj.weight[2, QUERY] = 12.0  # head R, frequency 2 (dims 2 and 10)
        attn.k_proj.weight[2, list(KEYS)] = 12.0
        for j, t in enumerate(KEYS):
            attn.v_proj.weight[j, t] = 1.0
            attn.o_proj.weight[OUT + t, j] = 8.0
        attn.q_proj.weight[16 + 2, 32] = 45.0  # head F, frequency 2
        attn.k_proj.weight[16 + 2, 32] = 45.0
        for j in FILLER:
            attn.v_proj.weight[16 + j, j] = 1.0
            attn.o_proj.weight[OUT + j, 16 + j] = 6.0
        for t in (*FILLER, *KEYS):
            model.lm_head.weight[t, OUT + t] = 1.0
    return model


def runs(seed: int) -> list[int]:
    rng, out, before = random.Random(seed), [], None
    while len(out) < SN:
        before = rng.choice([t for t in FILLER if t != before])
        out += [before] * 12
    return out[:SN]


def slow_task_window(i: int, distance: int) -> NeedleWindow:
    """Filler runs, a key ``distance`` tokens before the query, the key as the answer."""
    ids, key = runs(i), KEYS[i % len(KEYS)]
    ids[SN - 2 - distance], ids[SN - 2], ids[SN - 1] = key, QUERY, key
    return NeedleWindow(torch.tensor(ids), [SN - 1], [key], [SN - 2 - distance])


def test_only_the_needle_search_keeps_the_slow_frequency_in_range(tmp_path):
    model = slow_task_model()
    native = RopeScaling.from_hf(model.config)
    assert first_slow(native, SL) == 2
    samples = [torch.tensor(runs(s)) for s in (100, 101)]
    windows = [slow_task_window(i, d) for i, d in enumerate((50, 110, 170, 240))]

    def search(name, scorer):
        store = CellStore(tmp_path / name, ("key",), {}, True, "trials.jsonl")
        found = Search(model, samples, native, SL, SN, store, budget=25, scorer=scorer)
        found.run(seed=0, space="per-dim")
        return found

    needle = search("needle", lambda spec, length=None: needle_objective(
        model, windows, spec, SL, None))  # fmt: skip
    nll = search("nll", None)
    start = per_dim_point(native, SL, start_point(SN / SL), SN / SL)
    assert start["divisors"][2] == SN / SL  # the YaRN defaults interpolate it fully
    assert needle.best_point["divisors"][2] >= SN / SL
    assert nll.best_point["divisors"][2] < SN / SL
    # and what that costs: the NLL-scored table loses the far keys
    lost = needle_objective(model, windows, to_spec(native, SL, nll.best_point), SL, None)
    kept = needle.best["needle_nll"]
    assert lost["needle_nll"] > kept + 1.0


def tune(model, data, out, budget, *extra):
    return main(
        ["tune", "--model", str(model), "--target-length", str(N), "--dataset", str(data),
         "--held-out", str(data), "--budget", str(budget), "--output", str(out), "--samples",
         "1", "--space", "yarn", *extra]
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


@pytest.mark.parametrize("objective", ["needle", "mix"])
def test_tune_objective_resumes_within_its_budget(model_dir, tmp_path, capsys, objective):
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    assert tune(model_dir, data, out, 2, "--objective", objective, "--needles", "3") == 0
    printed = capsys.readouterr().out
    assert "(2 computed now)" in printed
    # the retrieval check to run before shipping: N/2, 3N/4 and N against YaRN's defaults
    check = (
        f"yarnlib eval passkey --model {model_dir} --methods yarn:4 --spec "
        f"{out / 'best.json'} --lengths {N // 2},{3 * N // 4},{N} --output {out / 'passkey'}"
    )
    assert check in printed
    if objective == "needle":  # and it runs as printed (3 prompts a length here)
        assert main([*shlex.split(check)[1:], "--trials", "3"]) == 0
        result = json.loads((out / "passkey" / "passkey.json").read_text())
        assert {r["method"] for r in result["cells"]} == {"yarn:4", "spec:best"}
    # --mix-weight is no parameter of the needle objective: given, it continues the search
    weight = ["--mix-weight", "0.3"] if objective == "needle" else []
    assert tune(model_dir, data, out, 3, "--objective", objective, "--needles", "3", *weight) == 0
    assert "(1 computed now)" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["answer_tokens"] > 0 for r in records)
    for r in records:
        want = (
            r["needle_nll"]
            if objective == "needle"
            else (0.9 * r["nll_beyond_original"] + 0.1 * r["needle_nll"])
        )  # the default weight 0.1
        assert r["objective"] == pytest.approx(want, abs=1e-12)
    final = json.loads((out / "final.json").read_text())
    assert final["settings"]["objective"] == objective
    assert final["best"]["calibration"]["objective"] == min(r["objective"] for r in records)
    assert "needle_nll" in final["best"]["held_out"]
    assert all_finite(records) and all_finite(final)
    # best.json and final.json record what was minimised
    minimised = {"objective": objective, "needles": 3}
    minimised.update({"mix_weight": 0.1} if objective == "mix" else {})
    best = json.loads((out / "best.json").read_text())
    assert best["minimised"] == final["minimised"] == minimised
    # another objective in this folder would start over and replace them: refused
    kept = {name: (out / name).read_bytes() for name in ("best.json", "final.json", "trials.jsonl")}
    assert tune(model_dir, data, out, 1) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"objective: {out} holds a search minimising {objective} (needles 3" in err
    assert "this run asks for nll;" in err
    assert f"allowed: --objective {objective} --needles 3" in err
    assert {name: (out / name).read_bytes() for name in kept} == kept


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--objective", "ppl"], "objective: 'ppl'; allowed: nll, needle, mix"),
        (["--objective", "needle", "--needles", "0"], "needles: 0; allowed: an integer in [1, 8]"),
        (["--objective", "mix", "--mix-weight", "1"], "mix_weight: 1.0; allowed: a number in"),
        (["--objective", "needle", "--proxy-length", "256"], "proxy_length: 256 with --objective"),
    ],
)
def test_bad_objective_input_is_refused_by_name(model_dir, tmp_path, capsys, extra, message):
    data = text_dataset(tmp_path / "data", {"a": 1500})
    assert tune(model_dir, data, tmp_path / "out", 2, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_another_objective_parameter_in_the_folder_is_refused(model_dir, tmp_path, capsys):
    """A mix search's folder refuses another --mix-weight, --needles or --objective in one line
    (exit 2) before loading anything, its files left as they were; a search from before
    best.json recorded its objective is checked against final.json's settings (issue 52 D3)."""
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    mix = ["--objective", "mix", "--needles", "3"]
    assert tune(model_dir, data, out, 1, *mix) == 0
    kept = {name: (out / name).read_bytes() for name in ("best.json", "final.json", "trials.jsonl")}
    capsys.readouterr()
    for extra, field, asked in (
        (["--mix-weight", "0.3"], "mix_weight", "mix (needles 3, mix_weight 0.3)"),
        (["--needles", "2"], "needles", "mix (needles 2, mix_weight 0.1)"),
        (["--objective", "needle"], "objective", "needle (needles 3)"),
    ):
        assert tune(model_dir, data, out, 2, *mix, *extra) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"{field}: {out} holds a search minimising mix (needles 3, mix_weight 0.1) " in err
        assert f"(best.json), this run asks for {asked}; allowed: " in err
        assert "allowed: --objective mix --needles 3 --mix-weight 0.1 to continue it" in err
        assert {name: (out / name).read_bytes() for name in kept} == kept
    best = json.loads(kept["best.json"])
    del best["minimised"]  # as written before best.json recorded it
    (out / "best.json").write_text(json.dumps(best))
    assert tune(model_dir, data, out, 2, *mix, "--mix-weight", "0.3") == 2
    assert "mix_weight 0.1) (final.json)" in capsys.readouterr().err


def test_trials_of_another_mix_weight_are_not_reused(model_dir, tmp_path, capsys):
    """The trials are keyed on the mix weight: with the folder's best.json and final.json gone
    (nothing left to refuse by), a search with another weight computes every trial, each the
    mix of its own weight, not the stored ones of the other."""
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    mix = ["--objective", "mix", "--needles", "3"]
    assert tune(model_dir, data, out, 2, *mix, "--mix-weight", "0.1") == 0
    (out / "best.json").unlink()
    (out / "final.json").unlink()
    capsys.readouterr()
    assert tune(model_dir, data, out, 2, *mix, "--mix-weight", "0.3") == 0
    assert "(2 computed now)" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for r, weight in zip(records, (0.1, 0.1, 0.3, 0.3), strict=True):
        want = (1 - weight) * r["nll_beyond_original"] + weight * r["needle_nll"]
        assert r["objective"] == pytest.approx(want, abs=1e-12)
