"""``yarnlib tune`` on tiny models: the search beats the YaRN defaults on a task whose best
setting is known, the spec file reloads in plain transformers, a rerun continues the search."""

import copy
import json
import signal

import pytest
import torch
from test_eval_support import text_dataset, tiny_folder
from tiny_models import tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import yarnlib
from yarnlib.cli import main
from yarnlib.eval.store import CellStore
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import read_spec_file, write_spec_file
from yarnlib.tune.search import Search, objective, start_point, to_spec

L, N = 128, 512  # original and target context: 4x
HIDDEN = dict(beta_fast=4.0, beta_slow=2.0, attention_factor=1.4)  # the teacher's yarn knobs


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


@pytest.fixture(scope="module")
def teacher_task():
    """A sharpened tiny model, and text sampled from the same weights run with yarn x4 and
    non-default knobs: the expected NLL of that text is lowest at the teacher's setting, not at
    the YaRN defaults."""
    model = sharpen(tiny_model("llama", attn_implementation="sdpa", max_position_embeddings=L))
    teacher = yarnlib.patch(copy.deepcopy(model), "yarn", N / L, **HIDDEN)
    torch.manual_seed(1)
    text = teacher.generate(
        torch.randint(0, 128, (2, 1)), do_sample=True, top_k=0, max_new_tokens=N - 1,
        min_new_tokens=N - 1, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    return model, list(text)


@pytest.fixture(scope="module")
def searched(teacher_task, tmp_path_factory):
    model, samples = teacher_task
    native = RopeScaling.from_hf(model.config)
    store = CellStore(tmp_path_factory.mktemp("search"), ("key",), {}, True, "trials.jsonl")
    search = Search(model, samples, native, L, N, store, budget=20)
    search.run(seed=0)
    return search


def reference_nll(plain, ids: torch.Tensor) -> torch.Tensor:
    """NLL of each token 1.. of ``ids`` from a plain transformers model: full logits, float64."""
    with torch.no_grad():
        logp = plain(ids[None]).logits[0, :-1].double().log_softmax(-1)
    return -logp.gather(-1, ids[1:, None])[:, 0]


def reference_nll_beyond_original(model, samples, spec: RopeScaling) -> float:
    """Plain transformers with ``spec`` in its config (no yarnlib code runs the model)."""
    fields = {k: v for k, v in model.config.to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("llama", **{**fields, **spec.to_hf("v5")})
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


def test_best_spec_exports_natively(searched, tmp_path, capsys):
    best = RopeScaling(**searched.best["spec"])
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
    # eval runs the file's exact spec as one more row, as plain transformers runs the export
    data = text_dataset(tmp_path / "data", {"a": 1500})
    assert main(
        ["eval", "perplexity", "--model", str(folder), "--methods", "yarn:4", "--spec", str(path),
         "--dataset", str(data), "--lengths", str(N), "--samples", "1",
         "--output", str(tmp_path / "ppl")]
    ) == 0  # fmt: skip
    cells = json.loads((tmp_path / "ppl" / "perplexity.json").read_text())["cells"]
    nll = {c["method"]: c["nll"] for c in cells}
    tokens = plain_tokens(folder, tmp_path / "data" / "a.txt")
    assert nll["spec:best"] == pytest.approx(float(reference_nll(plain, tokens).mean()), abs=1e-5)
    assert abs(nll["spec:best"] - nll["yarn:4"]) > 1e-2  # the knobs make a difference
    capsys.readouterr()
    assert main(["vllm-args", str(folder), "--spec", str(path), "--json"]) == 0
    kwargs = json.loads(capsys.readouterr().out)
    params = kwargs["hf_overrides"]["rope_parameters"]
    assert {k: params[k] for k in ("factor", "beta_fast", "beta_slow", "attention_factor")} == {
        k: getattr(best, k if k != "attention_factor" else "fixed_attention_factor")
        for k in ("factor", "beta_fast", "beta_slow", "attention_factor")
    }
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


def tune(model, data, out, budget):
    return main(
        ["tune", "--model", str(model), "--target-length", str(N), "--dataset", str(data),
         "--held-out", str(data), "--budget", str(budget), "--output", str(out)]
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


def test_rerun_continues_the_search(model_dir, tmp_path, capsys):
    model = model_dir
    data = text_dataset(tmp_path / "data", {"a": 1500, "b": 1500})
    out = tmp_path / "out"
    assert tune(model, data, out, 2) == 0
    first = (out / "trials.jsonl").read_text().splitlines()
    assert "(2 computed now)" in capsys.readouterr().out
    assert tune(model, data, out, 4) == 0
    assert "(2 computed now)" in capsys.readouterr().out  # only the two new trials
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert lines[:2] == first and len(lines) == 4
    # a kill during an append leaves half a line: the rerun computes that trial again only
    (out / "trials.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    assert tune(model, data, out, 4) == 0
    assert "(1 computed now)" in capsys.readouterr().out
    keys = [json.loads(line)["key"] for line in lines]
    again = [json.loads(x)["key"] for x in (out / "trials.jsonl").read_text().splitlines()[-1:]]
    assert again == keys[3:]
    best, final = read_spec_file(out / "best.json"), json.loads((out / "final.json").read_text())
    assert best == RopeScaling(**final["best"]["spec"])
    records = [json.loads(line) for line in lines]
    assert final["best"]["calibration"]["objective"] == min(r["objective"] for r in records)
    assert set(final["start"]["held_out"]) >= {"objective", "nll_within_original"}


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
