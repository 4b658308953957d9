"""Independent passkey prompts (issue 29) and the Wilson intervals of their rates."""

import csv
import json
import re

import pytest
from benchmark_scripts import load
from test_eval_support import VOCAB, corpus_text, text_dataset, tiny_folder, tiny_tokenizer
from tiny_models import tiny_model

from yarnlib.cli import main
from yarnlib.eval import passkey
from yarnlib.eval.methods import parse_methods
from yarnlib.eval.passkey import Independent, by_length, cut, load_haystack
from yarnlib.eval.stats import mcnemar_exact, wilson
from yarnlib.eval.store import CellStore, settings_id


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def haystack(tok, tmp_path_factory):
    folder = text_dataset(tmp_path_factory.mktemp("hay"), {"a": 3000, "b": 2000})
    return folder, load_haystack(tok, [str(folder)])


@pytest.mark.parametrize(
    "successes,trials,low,high",
    # by hand: p = 7/10, z = 1.96: centre (0.7 + z²/20) / (1 + z²/10) = 0.64450, half
    # z·sqrt(0.021 + z²/400) / (1 + z²/10) = 0.24772; 0/10 and 10/10 have the exact end 0 / 1
    [(7, 10, 0.39678, 0.89221), (0, 10, 0.0, 0.27753), (10, 10, 0.72247, 1.0),
     (27, 30, 0.74379, 0.96540), (1, 1, 0.20655, 1.0)],
)  # fmt: skip
def test_wilson_against_hand_computed_bounds(successes, trials, low, high):
    got = wilson(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-6)


@pytest.mark.parametrize("successes,trials", [(3, 2), (-1, 4), (0, 0)])
def test_wilson_refuses_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="successes/trials"):
        wilson(successes, trials)


@pytest.mark.parametrize(
    "only_a,only_b,p",
    # by hand: 2 * P(X <= min) for X ~ Binomial(only_a + only_b, 1/2), capped at 1:
    # 7/0: 2/2^7; 10/3: 2 * (1 + 13 + 78 + 286) / 2^13; 5/0: 2/2^5
    [(7, 0, 0.015625), (0, 7, 0.015625), (10, 3, 0.0922851562), (5, 0, 0.0625), (4, 4, 1.0),
     (1, 0, 1.0), (0, 0, 1.0)],
)  # fmt: skip
def test_mcnemar_against_hand_computed_p_values(only_a, only_b, p):
    assert mcnemar_exact(only_a, only_b) == pytest.approx(p, abs=1e-10)


def test_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError, match="only_a/only_b: -1/2"):
        mcnemar_exact(-1, 2)


def test_rates_per_length_pool_the_cells():
    cells = [
        {"method": "m", "length": 8, "correct": 3, "trials": 5},
        {"method": "m", "length": 8, "correct": 4, "trials": 5},
        {"method": "m", "length": 16, "correct": 0, "trials": 3},
    ]
    rows = {r["length"]: r for r in by_length(cells)}
    assert (rows[8]["correct"], rows[8]["trials"], rows[8]["accuracy"]) == (7, 10, 0.7)
    assert (rows[8]["ci_low"], rows[8]["ci_high"]) == (0.3968, 0.8922)
    assert (rows[16]["ci_low"], rows[16]["ci_high"]) == (0.0, 0.5615)


def built(layout, tok, length, depth, trials, seed=0, distractors=0):
    return [
        (t, drawn, build())
        for t, drawn, build in layout.prompts(tok, length, depth, trials, seed, distractors)
    ]


def test_every_prompt_of_a_cell_is_its_own_draw(tok, haystack):
    """Per cell: distinct filler offsets, depths and keys, each depth inside the cell's bin;
    exact length; the key line where the depth says; the filler is the haystack from the
    prompt's offset on; the same seed gives the same prompts, another seed others."""
    _, ids = haystack
    layout = Independent(ids, 0.1, 0.9, bins=2)
    assert layout.cell_depths() == [0.3, 0.7]
    all_keys = []
    for b, depth in enumerate(layout.cell_depths()):
        cell = built(layout, tok, 700, depth, trials=9)
        assert [t for t, _, _ in cell] == list(range(b, 9, 2))
        offsets = [d["offset"] for _, d, _ in cell]
        depths = [d["prompt_depth"] for _, d, _ in cell]
        keys = [p.key for _, _, p in cell]
        all_keys += keys
        assert len(set(offsets)) == len(set(depths)) == len(set(keys)) == len(cell)
        lo, hi = layout.edges(b)
        assert all(lo <= d <= hi for d in depths)
        for _, drawn, prompt in cell:
            assert len(prompt.input_ids) == 700
            key_offset = round(drawn["prompt_depth"] * prompt.filler_tokens)
            assert prompt.key_start == prompt.header_tokens + key_offset
            head = prompt.input_ids[prompt.header_tokens : prompt.key_start]
            assert head == cut(ids, drawn["offset"], prompt.filler_tokens)[:key_offset]
            assert (
                tok.decode(prompt.input_ids[prompt.key_start :])
                .lstrip("\n")
                .startswith(f"The pass key is {prompt.key}.")
            )
    assert len(set(all_keys)) == 9  # keys differ across the cells of a length too
    again = built(layout, tok, 700, 0.3, trials=9)
    first = built(layout, tok, 700, 0.3, trials=9)
    assert [p.input_ids for *_, p in again] == [p.input_ids for *_, p in first]
    other = built(layout, tok, 700, 0.3, trials=9, seed=1)
    assert all(a.input_ids != b.input_ids for (*_, a), (*_, b) in zip(first, other, strict=True))


def test_depths_are_stratified_over_the_range(tok, haystack):
    """12 trials over [0, 1] in 3 bins: 4 per bin, one in each quarter of its bin."""
    layout = Independent(haystack[1], 0.0, 1.0, bins=3)
    for b, depth in enumerate(layout.cell_depths()):
        depths = sorted(d["prompt_depth"] for _, d, _ in layout.prompts(tok, 500, depth, 12, 0, 0))
        lo = b / 3
        assert [int((d - lo) * 12) for d in depths] == [0, 1, 2, 3]


def test_the_classic_filler_and_distractors_in_the_independent_layout(tok):
    layout = Independent(None, 0.5, 0.5)  # one depth: one cell
    assert layout.cell_depths() == [0.5]
    cell = built(layout, tok, 600, 0.5, trials=4, distractors=2)
    unit = layout.period(tok)
    assert len({d["offset"] for _, d, _ in cell}) == 4 and all(
        d["offset"] < unit for _, d, _ in cell
    )
    for _, _, prompt in cell:
        text = tok.decode(prompt.input_ids)
        assert len(prompt.input_ids) == 600 and text.count(" key is ") == 3
        assert passkey.FILLER.split(".")[1] in text


def test_wrapping_round_a_short_haystack(tok):
    ids = tok(corpus_text(30), add_special_tokens=False)["input_ids"]
    assert cut(ids, len(ids) - 2, 5) == ids[-2:] + ids[:3]
    prompt = built(Independent(ids), tok, 900, 0.5, trials=3)[0][2]
    assert len(prompt.input_ids) == 900


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model")


def test_cli_independent_outputs_intervals_and_resumes(model_dir, haystack, tmp_path, capsys):
    folder, _ = haystack
    out = tmp_path / "pk"
    args = ["eval", "passkey", "--model", str(model_dir), "--methods", "yarn:2",
            "--lengths", "200,300", "--trials", "4", "--depth-bins", "2", "--haystack",
            str(folder), "--max-new-tokens", "2", "--output", str(out)]  # fmt: skip
    assert main([*args, "--max-cells", "3"]) == 0
    assert main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "computed 1 cell;" in printed and "Wilson 95 % interval" in printed
    result = json.loads((out / "passkey.json").read_text())
    assert result["settings"]["layout"] == "independent" and len(result["cells"]) == 4
    for cell in result["cells"]:
        low, high = wilson(cell["correct"], cell["trials"])
        assert (cell["ci_low"], cell["ci_high"]) == (round(low, 4), round(high, 4))
        assert cell["trials"] == 2 and cell["depth"] in (0.25, 0.75)
        assert len({a["offset"] for a in cell["answers"]}) == 2
    assert {(r["length"], r["trials"]) for r in result["by_length"]} == {(200, 4), (300, 4)}
    with (out / "passkey.csv").open() as f:
        assert {"ci_low", "ci_high", "depth_low", "depth_high"} <= set(next(csv.reader(f)))
    with (out / "passkey_lengths.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["length"] for r in rows] == ["200", "300"] and "ci_high" in rows[0]
    assert (out / "passkey_lengths.png").stat().st_size > 0


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--layout", "classic", "--haystack", "x"], "haystack: given with --layout classic"),
        (["--layout", "grid"], "layout: 'grid'; allowed: independent, classic"),
        (["--trials", "2"], "trials: 2 prompts per length for 3 depth bins"),
        (["--depth-bins", "0"], "depth_bins must be a positive integer"),
        (["--haystack", "./missing"], "haystack: './missing' does not exist"),
    ],
)
def test_bad_layout_input(model_dir, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.setattr("yarnlib.eval.cli.load_model", pytest.fail)  # refused before loading
    args = ["eval", "passkey", "--model", str(model_dir), "--lengths", "200",
            "--output", str(tmp_path), *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_max_trials_fills_the_cells_evenly_and_resumes(tok, haystack, tmp_path):
    """One new prompt per run: the cell with the fewest finished prompts goes first; after as
    many runs as prompts, the cells equal those of one whole run."""
    model = tiny_model(vocab_size=VOCAB, attn_implementation="sdpa")
    layout = Independent(haystack[1], 0.0, 1.0, bins=2)
    keys = ("method", "length", "depth")
    run = (model, tok, parse_methods("yarn:2"), [200], [], 4)
    whole = CellStore(tmp_path / "whole", keys, {}, False)
    passkey.run_passkey(*run, whole, layout=layout)
    depths = []
    for _ in range(4):
        cells = CellStore(tmp_path / "pieces", keys, {}, True)
        trials = CellStore(tmp_path / "pieces", (*keys, "trial"), {}, True, passkey.TRIALS)
        before = set(trials.done)
        passkey.run_passkey(*run, cells, trial_store=trials, layout=layout, max_trials=1)
        (new,) = set(trials.done) - before
        depths.append(new[2])
    assert depths == [0.25, 0.75, 0.25, 0.75]
    assert cells.done.keys() == whole.done.keys()
    for key, cell in whole.done.items():
        assert cells.done[key]["answers"] == cell["answers"]


def test_two_runs_pair_prompt_by_prompt(model_dir, haystack, tmp_path, capsys):
    """Two runs with the same seed draw the same prompts, so benchmarks/passkey_paired.py pairs
    every prompt of one with one of the other; its counts are those of the answers, the none row
    is named after its folder, and runs in another precision are refused."""
    folder, _ = haystack
    for name, method in (("base", "none"), ("scaled", "yarn:2")):
        args = ["eval", "passkey", "--model", str(model_dir), "--methods", method,
                "--lengths", "200", "--trials", "4", "--depth-bins", "2", "--haystack",
                str(folder), "--max-new-tokens", "2", "--output", str(tmp_path / name)]  # fmt: skip
        assert main(args) == 0
    # make the random model's answers a known pattern: base right on prompts 0-2, yarn:2 on 2
    expected = {"both": 1, "only_a": 2, "only_b": 0, "neither": 1}
    for name, right in (("base", {0, 1, 2}), ("scaled", {2})):
        path = tmp_path / name / "passkey.json"
        data = json.loads(path.read_text())
        answers = [a for cell in data["cells"] for a in cell["answers"]]
        for i, a in enumerate(sorted(answers, key=lambda a: a["key"])):
            a["answer"] = a["key"] if i in right else None
        path.write_text(json.dumps(data))
    script = load("passkey_paired")
    script.main(
        [str(tmp_path / "base"), str(tmp_path / "scaled"), "--output", str(tmp_path / "p.json")]
    )
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["rows"]["base"]["200"]["correct"] == 3
    assert result["rows"]["yarn:2"]["200"]["correct"] == 1
    (pair,) = result["pairs"]
    assert (pair["a"], pair["b"], pair["prompts"]) == ("base", "yarn:2", 4)
    assert {k: pair[k] for k in expected} == expected
    assert pair["p_mcnemar"] == mcnemar_exact(2, 0) == 0.5
    assert "only a" in capsys.readouterr().out

    other = tmp_path / "other"
    other.mkdir()
    data = json.loads((tmp_path / "scaled" / "passkey.json").read_text())
    data["settings"]["dtype"] = {"bfloat16": "float32"}.get(data["settings"]["dtype"], "bfloat16")
    (other / "passkey.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="differ in {'dtype'"):
        script.main([str(tmp_path / "base"), str(other)])


@pytest.mark.parametrize("text", ["", " \n\t\n  \n"])
def test_a_blank_haystack_file_is_refused(model_dir, tmp_path, capsys, monkeypatch, text):
    """An empty or whitespace-only file holds no text; the check comes before the blank lines
    that separate documents, which would otherwise pass for text (issue 52 D1)."""
    monkeypatch.setattr("yarnlib.eval.cli.load_model", pytest.fail)  # refused before loading
    blank = tmp_path / "blank.txt"
    blank.write_text(text)
    args = ["eval", "passkey", "--model", str(model_dir), "--lengths", "200", "--haystack",
            str(blank), "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"haystack: {blank} holds no text (empty or whitespace only)" in err
    assert not (tmp_path / "out").exists()


def test_draws_are_independent_across_lengths(tok, haystack):
    """Each length draws its own keys, offsets and depths (and decoys): none is shared with
    another length's trials, the same trial number included."""
    layout = Independent(haystack[1], 0.0, 1.0, bins=3)
    short, long = (layout.draws(tok, n, 9, seed=0) for n in (300, 500))
    for i in range(3):  # key, filler offset, depth
        assert not {d[i] for d in short} & {d[i] for d in long}
    decoys = [
        {k for *_, p in built(layout, tok, n, depth, 9, distractors=2)
         for k in map(int, re.findall(r"key is (\d+)", tok.decode(p.input_ids))) if k != p.key}
        for n in (300, 500) for depth in layout.cell_depths()[:1]
    ]  # fmt: skip
    assert len(decoys[0]) == len(decoys[1]) == 6 and not decoys[0] & decoys[1]


def passkey_args(model_dir, hay, out, *extra):
    return ["eval", "passkey", "--model", str(model_dir), "--methods", "yarn:2", "--lengths",
            "200", "--trials", "4", "--depth-bins", "2", "--haystack", str(hay),
            "--max-new-tokens", "2", "--output", str(out), *extra]  # fmt: skip


def test_a_changed_haystack_is_drawn_again_on_resume(model_dir, tok, tmp_path, capsys):
    """Cells and trials are keyed on the haystack's tokens: after the file changes, --resume
    reuses neither the finished cell nor the finished trial cut from the old text, and ends
    with the cells of a fresh run on the new text (issue 52 D2)."""
    hay = tmp_path / "hay.txt"
    hay.write_text(corpus_text(3000))
    out = tmp_path / "out"
    assert main(passkey_args(model_dir, hay, out, "--max-trials", "3")) == 0  # 1 cell + 1 trial
    hay.write_text(corpus_text(150, seed=7))  # same path, another (much shorter) text
    new_tokens = len(load_haystack(tok, [str(hay)]))
    capsys.readouterr()
    assert main(passkey_args(model_dir, hay, out, "--resume")) == 0
    assert "computed 2 cells" in capsys.readouterr().out
    resumed = json.loads((out / "passkey.json").read_text())
    assert [c["resumed_trials"] for c in resumed["cells"]] == [0, 0]
    assert all(a["offset"] < new_tokens for c in resumed["cells"] for a in c["answers"])
    assert main(passkey_args(model_dir, hay, tmp_path / "fresh")) == 0
    fresh = json.loads((tmp_path / "fresh" / "passkey.json").read_text())
    assert [c["answers"] for c in resumed["cells"]] == [c["answers"] for c in fresh["cells"]]
    assert resumed["settings"]["haystack_tokens"] == fresh["settings"]["haystack_tokens"]


def test_cells_keyed_on_the_path_alone_are_reported_not_resumed(model_dir, tmp_path, capsys):
    """Cells written before the haystack's text was keyed (their settings id: the settings
    without ``haystack_tokens``): --report reads them as they are; a resumed computation
    refuses them in one line, leaving the files as they were."""
    hay = tmp_path / "hay.txt"
    hay.write_text(corpus_text(3000))
    out = tmp_path / "out"
    assert main(passkey_args(model_dir, hay, out)) == 0
    written = json.loads((out / "passkey.json").read_text())
    by_path = {k: v for k, v in written["settings"].items() if k != "haystack_tokens"}
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    old = "".join(json.dumps({**c, "settings_id": settings_id(by_path)}) + "\n" for c in cells)
    (out / "cells.jsonl").write_text(old)
    capsys.readouterr()
    assert main(passkey_args(model_dir, hay, out, "--resume")) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"resume: {out / 'cells.jsonl'} holds 2 cells keyed on the haystack's path" in err
    assert f"whether {hay} changed since" in err
    assert (out / "cells.jsonl").read_text() == old
    assert main(passkey_args(model_dir, hay, out, "--report")) == 0
    reported = json.loads((out / "passkey.json").read_text())
    assert [c["answers"] for c in reported["cells"]] == [c["answers"] for c in written["cells"]]
