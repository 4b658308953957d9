"""``yarnlib tune`` on tiny models: each search beats its start on a task whose best setting is
known, both exports (yarn, longrope) reload in plain transformers, a rerun continues the search,
the proxy's ranking report holds the numbers of its trials."""

import copy
import json
import math
import shutil
import signal

import pytest
import torch
from test_eval_support import corpus_text, text_dataset, tiny_folder
from tiny_models import native_rope_keys, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import yarnlib
from yarnlib.cli import main
from yarnlib.eval.store import CellStore, settings_id
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import read_spec_file, write_spec_file
from yarnlib.tune.search import (
    Search,
    first_slow,
    objective,
    per_dim_point,
    repaired,
    spearman,
    start_point,
    to_spec,
    trial_key,
)

L, N = 128, 512  # original and target context: 4x
HIDDEN = dict(beta_fast=4.0, beta_slow=2.0, attention_factor=1.4)  # the teacher's yarn knobs
# a per-dim teacher no yarn setting runs: yarn x4's high frequencies, then a plateau at 4 and
# the low frequencies stretched beyond the factor
HIDDEN_DIVISORS = [1.0, 1.33333, 2.0, 4.0, 4.0, 6.0, 6.0, 8.0]


def sharpen(model):
    """Large q/k and head weights: RoPE then changes the predictions of a random model a lot."""
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    return model


def sharpened(folder):
    sharpen(AutoModelForCausalLM.from_pretrained(folder)).save_pretrained(folder)
    return folder


def sampled_task(**teacher):
    """A sharpened tiny model, and text sampled from the same weights patched with
    ``teacher``: the expected NLL of that text is lowest at the teacher's setting, not at the
    YaRN defaults."""
    model = sharpen(tiny_model("llama", attn_implementation="sdpa", max_position_embeddings=L))
    teacher = yarnlib.patch(copy.deepcopy(model), **teacher)
    torch.manual_seed(1)
    text = teacher.generate(
        torch.randint(0, 128, (2, 1)), do_sample=True, top_k=0, max_new_tokens=N - 1,
        min_new_tokens=N - 1, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    return model, list(text)


@pytest.fixture(scope="module")
def teacher_task():
    return sampled_task(method="yarn", factor=N / L, **HIDDEN)


@pytest.fixture(scope="module")
def per_dim_task():
    return sampled_task(
        method="longrope", factor=N / L, short_factor=HIDDEN_DIVISORS,
        long_factor=HIDDEN_DIVISORS, attention_factor=1.3,
    )  # fmt: skip


def run_search(task, path, space, budget, slow_in_range=False):
    model, samples = task
    native = RopeScaling.from_hf(model.config)
    store = CellStore(path, ("key",), {}, True, "trials.jsonl")
    search = Search(model, samples, native, L, N, store, budget=budget, slow_in_range=slow_in_range)
    search.run(seed=0, space=space)
    return search


@pytest.fixture(scope="module")
def searched(teacher_task, tmp_path_factory):
    return run_search(teacher_task, tmp_path_factory.mktemp("search"), "yarn", 20)


@pytest.fixture(scope="module")
def searched_per_dim(per_dim_task, tmp_path_factory):
    return run_search(per_dim_task, tmp_path_factory.mktemp("per-dim"), "per-dim", 30)


def reference_nll(plain, ids: torch.Tensor) -> torch.Tensor:
    """NLL of each token 1.. of ``ids`` from a plain transformers model: full logits, float64."""
    with torch.no_grad():
        logp = plain(ids[None]).logits[0, :-1].double().log_softmax(-1)
    return -logp.gather(-1, ids[1:, None])[:, 0]


def reference_nll_beyond_original(model, samples, spec: RopeScaling) -> float:
    """Plain transformers with ``spec`` in its config (no yarnlib code runs the model)."""
    fields = {k: v for k, v in model.config.to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("llama", **{**fields, **native_rope_keys(spec)})
    plain = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    plain.load_state_dict(model.state_dict())
    return float(torch.cat([reference_nll(plain, ids)[L - 1 :] for ids in samples]).mean())


def test_search_beats_the_yarn_defaults(teacher_task, searched):
    model, samples = teacher_task
    native = searched.native
    start = objective(model, samples, to_spec(native, L, start_point(N / L)), L)["objective"]
    best = searched.best
    hidden = objective(model, samples, native.rescaled("yarn", N / L, L, **HIDDEN), L)
    assert best["objective"] < start - 1.0  # 3.1 -> 1.3 nats when this was written
    assert best["objective"] < hidden["objective"] + 0.05  # about as good as the teacher's
    assert searched.computed == len(searched.seen) == 20
    # the recorded objective is the NLL plain transformers gives with the best spec
    spec = RopeScaling(**best["spec"])
    assert spec.knobs()  # not the defaults
    expected = reference_nll_beyond_original(model, samples, spec)
    assert best["objective"] == pytest.approx(expected, abs=2e-4)


def test_per_dim_search_beats_its_start(per_dim_task, searched_per_dim):
    """From the YaRN defaults' tables the per-dim search gets close to a longrope teacher that
    no yarn setting expresses; every trial keeps the divisors valid."""
    model, samples = per_dim_task
    search = searched_per_dim
    start = per_dim_point(search.native, L, start_point(N / L), N / L)
    assert search.start == start
    start_value = search.trials[trial_key(start)][1]["objective"]
    best = search.best
    assert best["space"] == "per-dim"
    assert best["objective"] < start_value - 0.15  # 1.511 -> 1.315 nats when this was written
    hidden = RopeScaling("longrope", N / L, L, 50000.0, 16, short_factor=HIDDEN_DIVISORS,
                         long_factor=HIDDEN_DIVISORS, attention_factor=1.3)  # fmt: skip
    teacher = objective(model, samples, hidden, L)["objective"]
    assert best["objective"] < teacher + 0.05  # about as good as the teacher's
    assert search.computed == len(search.seen) == 30
    for record in search.store.done.values():
        divisors = record["divisors"]
        assert divisors == sorted(divisors) and divisors[0] >= 1 and divisors[-1] >= N / L
    # the recorded objective is the NLL plain transformers gives with the longrope spec
    spec = RopeScaling(**best["spec"])
    assert spec.is_applied_longrope and spec.max_position_embeddings == N
    expected = reference_nll_beyond_original(model, samples, spec)
    assert best["objective"] == pytest.approx(expected, abs=2e-4)


def test_first_slow_is_the_first_wavelength_beyond_the_original_context(per_dim_task):
    native = RopeScaling.from_hf(per_dim_task[0].config)  # theta 50000, rotary_dim 16, L 128
    wavelengths = [2 * math.pi * 50000.0 ** (2 * i / 16) for i in range(8)]  # 6.3, 24, 94, 364..
    assert first_slow(native, L) == next(i for i, w in enumerate(wavelengths) if w > L) == 3
    assert first_slow(native, 10**9) is None
    assert repaired([1.0] * 8, 4.0) == (1.0,) * 7 + (4.0,)
    assert repaired([1.0, 2.0, 1.5, 3.0, 2.0, 5.0, 1.0, 1.0], 4.0, 3) == (1, 2, 2, 4, 4, 5, 5, 5)


def test_per_dim_search_keeps_slow_frequencies_in_range(per_dim_task, tmp_path):
    """``slow_in_range``: every trial keeps the divisors of the frequencies slower than L at
    >= N/L (the teacher's do), and the search still beats its start."""
    search = run_search(per_dim_task, tmp_path, "per-dim", 15, slow_in_range=True)
    records = list(search.store.done.values())
    assert len(records) == 15
    assert all(min(r["divisors"][3:]) >= N / L for r in records)
    start = per_dim_point(search.native, L, start_point(N / L), N / L)
    assert search.best["objective"] < search.trials[trial_key(start)][1]["objective"] - 0.05


@pytest.mark.parametrize("space", ["yarn", "per-dim"])
def test_best_spec_exports_natively(searched, searched_per_dim, space, tmp_path, capsys):
    best = RopeScaling(**{"yarn": searched, "per-dim": searched_per_dim}[space].best["spec"])
    searched = {"yarn": searched, "per-dim": searched_per_dim}[space]
    path = write_spec_file(tmp_path / "best.json", best, objective=searched.best["objective"])
    assert read_spec_file(path) == best
    folder = sharpened(tiny_folder(tmp_path / "model", max_position_embeddings=L))
    # written onto a folder already scaled (yarn x2): the file's spec, not compounded
    assert main(["config", str(folder), "--factor", "2", "--output", str(tmp_path / "x2")]) == 0
    assert (
        main(["config", str(tmp_path / "x2"), "--spec", str(path), "--output", str(tmp_path / "x")])
        == 0
    )
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "x")  # no yarnlib involved
    assert torch.equal(plain.model.rotary_emb.inv_freq, best.inv_freq())
    assert plain.model.rotary_emb.attention_scaling == pytest.approx(best.attention_factor())
    assert plain.config.max_position_embeddings == N
    # eval runs each file's exact spec as one more row, as plain transformers runs the export
    data = text_dataset(tmp_path / "data", {"a": 1500})
    start = to_spec(searched.native, L, searched.start)
    start_path = write_spec_file(tmp_path / "start.json", start)
    argv = ["eval", "perplexity", "--model", str(folder), "--methods", "yarn:4", "--spec",
            str(path), str(start_path), "--dataset", str(data), "--lengths", str(N),
            "--samples", "1", "--output", str(tmp_path / "ppl")]  # fmt: skip
    assert main(argv) == 0
    cells = json.loads((tmp_path / "ppl" / "perplexity.json").read_text())["cells"]
    nll = {c["method"]: c["nll"] for c in cells}
    tokens = plain_tokens(folder, tmp_path / "data" / "a.txt")
    assert nll["spec:best"] == pytest.approx(float(reference_nll(plain, tokens).mean()), abs=1e-5)
    assert abs(nll["spec:best"] - nll["yarn:4"]) > 1e-2  # the knobs make a difference
    if space == "yarn":  # the start is the yarn defaults: yarn:4 itself
        assert nll["spec:start"] == pytest.approx(nll["yarn:4"], abs=1e-6)
    twice = [*argv[:7], str(path), str(tmp_path / "x" / "best.json"), *argv[9:]]
    (tmp_path / "x" / "best.json").write_bytes(path.read_bytes())
    assert main(twice) == 2  # two rows spec:best: refused, naming the field
    # reset gives back the native files; applying again writes the same files (no compounding)
    written = {f.name: f.read_bytes() for f in (tmp_path / "x").glob("*.json")}
    assert main(["config", str(tmp_path / "x"), "--reset", "--in-place"]) == 0
    assert (tmp_path / "x" / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert main(["config", str(tmp_path / "x"), "--spec", str(path), "--in-place"]) == 0
    assert {f.name: f.read_bytes() for f in (tmp_path / "x").glob("*.json")} == written
    capsys.readouterr()
    assert main(["vllm-args", str(folder), "--spec", str(path), "--json"]) == 0
    kwargs = json.loads(capsys.readouterr().out)
    params = kwargs["hf_overrides"]["rope_parameters"]
    assert kwargs["max_model_len"] == N
    if space == "yarn":
        assert {k: params[k] for k in ("factor", "beta_fast", "beta_slow", "attention_factor")} == {
            k: getattr(best, k if k != "attention_factor" else "fixed_attention_factor")
            for k in ("factor", "beta_fast", "beta_slow", "attention_factor")
        }
    else:  # vLLM's longrope: the same factors at every length, the attention factor as mscale
        assert params["rope_type"] == "longrope"
        assert params["short_factor"] == params["long_factor"] == list(best.short_factor)
        assert params["short_mscale"] == params["long_mscale"] == best.fixed_attention_factor
        assert params["original_max_position_embeddings"] == L
    # a spec tuned for another model (another rope_theta) is refused by name
    other = tiny_folder(tmp_path / "other", max_position_embeddings=L, rope_theta=10000.0)
    assert main(["vllm-args", str(other), "--spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rope_theta=50000.0" in err and "rope_theta=10000.0" in err
    assert main(["vllm-args", str(folder), "--spec", str(path), "--factor", "2"]) == 2
    assert "drop --factor" in capsys.readouterr().err


def plain_tokens(folder, text_file) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return torch.tensor(tokenizer(text_file.read_text())["input_ids"][:N])


def tune(model, data, out, budget, *extra):
    return main(
        ["tune", "--model", str(model), "--target-length", str(N), "--dataset", str(data),
         "--held-out", str(data), "--budget", str(budget), "--output", str(out), *extra]
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


@pytest.mark.parametrize("space", ["yarn", "per-dim"])
def test_rerun_continues_the_search(model_dir, tmp_path, capsys, space):
    model = model_dir
    data = text_dataset(tmp_path / "data", {"a": 1500, "b": 1500})
    out = tmp_path / "out"
    assert tune(model, data, out, 2, "--space", space) == 0
    first = (out / "trials.jsonl").read_text().splitlines()
    assert "(2 computed now)" in capsys.readouterr().out
    assert tune(model, data, out, 4, "--space", space) == 0
    assert "(2 computed now)" in capsys.readouterr().out  # only the two new trials
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert lines[:2] == first and len(lines) == 4
    assert {json.loads(line)["key"].split(":")[0] for line in lines} == {space}
    # a kill during an append leaves half a line: the rerun computes that trial again only
    (out / "trials.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    assert tune(model, data, out, 4, "--space", space) == 0
    assert "(1 computed now)" in capsys.readouterr().out
    keys = [json.loads(line)["key"] for line in lines]
    again = [json.loads(x)["key"] for x in (out / "trials.jsonl").read_text().splitlines()[-1:]]
    assert again == keys[3:]
    best, final = read_spec_file(out / "best.json"), json.loads((out / "final.json").read_text())
    assert best == RopeScaling(**final["best"]["spec"])
    records = [json.loads(line) for line in lines]
    assert final["best"]["calibration"]["objective"] == min(r["objective"] for r in records)
    stored = [  # the half line stays in the file, skipped on reading
        json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines() if x.endswith("}")
    ]
    assert final["computed_now"] == 1 and len(stored) == 4
    # the total is the stored trials' times summed (a fast machine may round it to 0.0)
    assert final["trial_seconds"] == round(sum(r["seconds"] for r in stored), 1)
    assert all(r["seconds"] > 0 for r in stored)
    assert set(final["start"]["held_out"]) >= {"objective", "nll_within_original"}


def test_summary_shows_each_rows_margin_over_the_start_and_the_held_out(
    model_dir, tmp_path, capsys
):
    data = text_dataset(tmp_path / "data", {"a": 1500})
    assert tune(model_dir, data, tmp_path / "out", 3) == 0
    printed = capsys.readouterr().out.splitlines()
    final = json.loads((tmp_path / "out" / "final.json").read_text())
    head = next(i for i, line in enumerate(printed) if line.startswith("objective: "))
    assert "calibration" in printed[head + 1] and "held-out" in printed[head + 1]
    table = printed[
        head + 2 : next(i for i, line in enumerate(printed) if line.startswith("best:"))
    ]
    rows = {line[:22].strip(): line[22:].split() for line in table}
    start = final["start"]
    for name, words in rows.items():
        row = final["start" if name.startswith("start") else name]
        numbers = [float(w) for w in words if w.lstrip("+-").replace(".", "").isdigit()]
        values = [row["calibration"]["objective"], row["held_out"]["objective"]]
        if name.startswith("start"):
            assert numbers == pytest.approx(values, abs=1e-6)
        else:
            margins = [v - start[part]["objective"] for v, part in zip(
                values, ("calibration", "held_out"), strict=True)]  # fmt: skip
            assert numbers == pytest.approx(
                [values[0], margins[0], values[1], margins[1]], abs=2e-6
            )
    assert set(rows) >= {"start (yarn defaults)", "best"}


def test_a_changed_calibration_file_is_searched_again(model_dir, tmp_path, capsys):
    data = text_dataset(tmp_path / "data", {"a": 1500, "b": 1500})
    assert tune(model_dir, data, tmp_path / "out", 2, "--space", "yarn") == 0
    (data / "a.txt").write_text(corpus_text(1500, seed=7))  # same path, other text
    capsys.readouterr()
    assert tune(model_dir, data, tmp_path / "out", 2, "--space", "yarn") == 0
    assert "(2 computed now)" in capsys.readouterr().out  # no stale trial reused
    assert tune(model_dir, data, tmp_path / "fresh", 2, "--space", "yarn") == 0
    resumed, fresh = (
        json.loads((tmp_path / d / "final.json").read_text()) for d in ("out", "fresh")
    )
    assert resumed["best"]["calibration"] == fresh["best"]["calibration"]


def test_resuming_with_another_target_length_is_refused(model_dir, tmp_path, capsys):
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    assert tune(model_dir, data, out, 1, "--space", "yarn") == 0
    first_err = capsys.readouterr().err
    best = (out / "best.json").read_bytes()
    argv = ["tune", "--model", str(model_dir), "--target-length", str(3 * N // 4), "--dataset"]
    assert main([*argv, str(data), "--budget", "1", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"holds a search for {N} tokens" in err and f"asks for {3 * N // 4}" in err
    assert (out / "best.json").read_bytes() == best
    # one document for --samples 2: said, not silent (issue 26 D15)
    assert "warning: samples: 2 requested, but too few documents" in first_err


def test_spearman_against_a_hand_computed_example():
    # ranks differ by 1,1,1,1,0: rho = 1 - 6 * 4 / (5 * (25 - 1)) = 0.8
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # a tie shares rank 2.5: ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4) give 4.5 / sqrt(4.5 * 5)
    assert spearman([0.1, 0.5, 0.5, 0.9], [3, 7, 5, 8]) == pytest.approx(4.5 / (22.5**0.5))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1], [1, 2]) is None and spearman([1], [2]) is None


def test_proxy_report(model_dir, tmp_path, capsys):
    """Both spaces searched at M = 3N/4, the best candidates confirmed at N: the report holds
    the trials' objectives at M and N, their rank correlation, and best.json the best at N."""
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out, proxy = tmp_path / "out", 3 * N // 4
    assert tune(model_dir, data, out, 6, "--proxy-length", str(proxy), "--confirm", "2") == 0
    printed = capsys.readouterr().out
    assert "Spearman rank correlation" in printed
    records = {
        r["key"]: r for r in map(json.loads, (out / "trials.jsonl").read_text().split("\n")[:-1])
    }
    report = json.loads((out / "final.json").read_text())["proxy"]
    rows = report["candidates"]
    assert report["proxy_length"] == proxy and 3 <= len(rows) <= 5
    searched = [r for r in records.values() if r["length"] == proxy]
    assert len(searched) == 6 and {r["space"] for r in searched} == {"yarn", "per-dim"}
    best_two = sorted(r["objective"] for r in searched)[:2]
    assert [r["objective_proxy"] for r in rows[:2]] == best_two  # the two best, distinct
    for row in rows:
        assert records[row["key"]]["length"] == N
        assert records[row["key"]]["objective"] == row["objective"]
        assert records[f"{row['key']}@{proxy}"]["objective"] == row["objective_proxy"]
    expected = spearman([r["objective_proxy"] for r in rows], [r["objective"] for r in rows])
    assert report["spearman"] == expected
    best = min(rows, key=lambda r: r["objective"])
    assert read_spec_file(out / "best.json") == RopeScaling(**records[best["key"]]["spec"])
    # the proxy objective is the NLL beyond L of the first M tokens, as plain transformers gives
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = plain_tokens(model_dir, data / "a.txt")[:proxy]
    spec = RopeScaling(**records[rows[0]["key"]]["spec"])
    expected = reference_nll_beyond_original(model, [ids], spec)
    assert rows[0]["objective_proxy"] == pytest.approx(expected, abs=2e-4)


def test_ctrl_c_keeps_the_trials_and_the_best_so_far(
    model_dir, tmp_path, monkeypatch, capsys, ctrl_c
):
    add = CellStore.add

    def add_then_interrupt(self, record):  # Ctrl-C right after the first trial is stored
        add(self, record)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(CellStore, "add", add_then_interrupt)
    data = text_dataset(tmp_path / "data", {"a": 1500})
    try:
        code = tune(model_dir, data, tmp_path / "out", 4)
    except KeyboardInterrupt:  # escaping, it would also stop this pytest session
        pytest.fail("Ctrl-C escaped as a KeyboardInterrupt traceback")
    assert code == 130
    assert "rerun the same command to continue" in capsys.readouterr().err
    (trial,) = [json.loads(x) for x in (tmp_path / "out" / "trials.jsonl").read_text().splitlines()]
    assert read_spec_file(tmp_path / "out" / "best.json") == RopeScaling(**trial["spec"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--target-length": str(L)}, "target_length: 128 is not beyond the original context 128"),
        ({"--budget": "0"}, "budget must be a positive integer, got 0"),
        ({"--dataset": "short"}, "dataset: no document has the target length of 512 tokens"),
        ({"--space": "all"}, "space: 'all'; allowed: yarn, per-dim, both"),
        ({"--proxy-length": str(N)}, "proxy_length: 512; allowed: a length between the original"),
        (  # 0 is not "from the config" (issue 26 D18)
            {"--original-max-position-embeddings": "0"},
            "original_max_position_embeddings must be a positive integer, got 0",
        ),
    ],
)
def test_bad_input_is_refused_by_name(model_dir, tmp_path, capsys, change, message):
    text_dataset(tmp_path / "short", {"a": 30})
    text_dataset(tmp_path / "long", {"a": 1500})
    argv = {"--model": str(model_dir), "--target-length": str(N), "--dataset": "long"}
    argv.update({"--budget": "2", "--output": str(tmp_path / "out"), **change})
    for key in ("--dataset",):
        argv[key] = str(tmp_path / argv[key])
    assert main(["tune", *[x for kv in argv.items() for x in kv]]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not JSON"),
        ('{"format": "other"}', "has format 'other'; allowed: 'yarnlib-rope-spec/1'"),
        ('{"format": "yarnlib-rope-spec/1", "spec": {"factor": 0.5, "rotary_dim": 16}}',
         "factor must be >= 1"),
    ],
)  # fmt: skip
def test_a_bad_spec_file_is_refused_by_name(tmp_path, text, message):
    path = tmp_path / "best.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="spec: ") as error:
        read_spec_file(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_plot_tune_reads_the_miniatures_results(tmp_path):
    """benchmarks/plot_tune.py on the committed miniature results: the divisors it plots are
    base / inv_freq (a tuned longrope's are its factors, the yarn start's run from 1 to the
    factor), its perplexities are the held-out ones the docs' table quotes, proxy runs left out."""
    from benchmark_scripts import BENCHMARKS, load

    plot_tune = load("plot_tune")
    results = BENCHMARKS.parent / "docs" / "mini_tune" / "results.json"
    plot_tune.main([str(results), "--output", str(tmp_path / "plot")])

    data = json.loads((tmp_path / "plot.json").read_text())
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert sorted(data) == ["4x, search at N", "8x, search at N"]
    runs = json.loads(results.read_text())["runs"]
    for name, quoted in (
        ("4x, search at N", (142.04, 138.06, 134.00)),
        ("8x, search at N", (132.98, 127.77, 127.20)),
    ):
        run = data[name]
        assert [round(run[r]["held_out_perplexity"], 2) for r in plot_tune.ROLES] == list(quoted)
        per_dim = runs[name]["per-dim"]["spec"]
        assert per_dim["method"] == "longrope"
        assert run["per-dim"]["divisors"] == pytest.approx(per_dim["short_factor"], rel=1e-6)
        start = run["start"]["divisors"]
        assert start[0] == pytest.approx(1.0) and start[-1] == pytest.approx(
            runs[name]["start"]["spec"]["factor"]
        )
        assert start == sorted(start)

    # tune_smollm2.py's results.json holds one run under "tune" (its final.json)
    single = tmp_path / "final.json"
    single.write_text(json.dumps({"tune": runs["8x, search at N"]}))
    plot_tune.main([str(single), "--output", str(tmp_path / "plotted")])
    assert json.loads((tmp_path / "plotted.json").read_text())["tune"] == data["8x, search at N"]


def test_confirm_rescores_exactly_the_candidates_it_names(tmp_path, monkeypatch):
    """Known proxy trials, a stubbed objective at N: confirm(2) re-scores the 2 best with
    distinct tables (C and B: D runs C's tables, E comes third), the start A and each space's
    best (P1 for per-dim, C for yarn), nothing else."""
    from yarnlib.tune import search as search_module

    native = RopeScaling("none", 1.0, L, 10000.0, 8)
    lo, proxy = N / L, 3 * N // 4
    start = start_point(lo)
    points = {
        "A": start,
        "C": {**start, "beta_fast": 8.0},
        "D": {**start, "beta_fast": 8.01},  # the same correction range: C's tables
        "B": {**start, "factor": 5.0},
        "E": {**start, "factor": 6.0},
        "P1": {"factor": lo, "divisors": (1.0, 2.0, 3.0, 4.0), "attention_factor": 1.1},
        "P2": {"factor": lo, "divisors": (1.0, 1.0, 4.0, 4.0), "attention_factor": 1.2},
    }
    proxy_values = {"C": 1.0, "D": 1.01, "B": 1.2, "E": 1.3, "P1": 1.5, "P2": 2.5, "A": 3.0}
    store = CellStore(tmp_path, ("key",), {}, False, "trials.jsonl")
    search = Search(None, [], native, L, N, store, budget=10, proxy_length=proxy)
    assert search.same_tables(points["C"], points["D"])
    assert not search.same_tables(points["C"], points["B"])
    for name, point in points.items():
        key = trial_key(point, proxy)
        record = {"key": key, "space": "per-dim" if name[0] == "P" else "yarn", "length": proxy}
        search.trials[key] = (point, {**record, "objective": proxy_values[name]})
    search.start = start
    rescored = []

    def at_n(model, samples, spec, original, length=None):
        assert length is None  # confirmed at N
        rescored.append(spec)
        return {"objective": spec.attention_factor(), "nll_within_original": 0.0}

    monkeypatch.setattr(search_module, "objective", at_n)
    report = search.confirm(2)
    names = {trial_key(p): n for n, p in points.items()}
    assert sorted(names[row["key"]] for row in report["candidates"]) == ["A", "B", "C", "P1"]
    assert len(rescored) == 4


def test_repaired_caps_and_floors_exactly():
    """By hand, N/L = 4: a divisor is capped at 4 N/L = 16, floored at 1 and at the one before
    (non-decreasing), the last at least N/L, each rounded to 6 significant digits."""
    assert repaired([1.0, 100.0, 1.0], 4.0) == (1.0, 16.0, 16.0)
    assert repaired([0.5, 0.25, 2.0, 1.5], 1.0) == (1.0, 1.0, 2.0, 2.0)
    assert repaired([1.0, 2.0], 3.0) == (1.0, 3.0)
    assert repaired([1.23456789, 2.5], 2.0) == (1.23457, 2.5)


def test_the_same_text_under_another_path_is_not_searched_again(model_dir, tmp_path, capsys):
    """Trials are keyed on the calibration tokens: a clone elsewhere resumes its folder. A trial
    written while the dataset's paths were in the key (an alias) still counts."""
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    assert tune(model_dir, data, out, 2, "--space", "yarn") == 0
    moved = shutil.copytree(data, tmp_path / "elsewhere")
    capsys.readouterr()
    assert tune(model_dir, moved, out, 2, "--space", "yarn") == 0
    assert "(0 computed now)" in capsys.readouterr().out
    # the key as it was: the same settings with the dataset's paths
    final = json.loads((out / "final.json").read_text())["settings"]
    keyed = {k: final[k] for k in ("model", "dtype", "target_length", "text_column", "samples",
                                   "original_max_position_embeddings", "calibration")}  # fmt: skip
    old_id = settings_id({**keyed, "dataset": [str(data)]})
    lines = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert {r["settings_id"] for r in lines} == {settings_id(keyed)}
    (out / "trials.jsonl").write_text(
        "".join(json.dumps({**r, "settings_id": old_id}) + "\n" for r in lines)
    )
    assert tune(model_dir, data, out, 2, "--space", "yarn") == 0
    assert "(0 computed now)" in capsys.readouterr().out
    assert tune(model_dir, moved, out, 2, "--space", "yarn") == 0  # the old key names `data`
    assert "(2 computed now)" in capsys.readouterr().out
