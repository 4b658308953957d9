"""benchmarks/mix_weights.py: the Pareto front and the pick per mix weight from stored trials,
against values worked out by hand."""

import json
from pathlib import Path

import pytest
from benchmark_scripts import load

from yarnlib.spec import RopeScaling
from yarnlib.spec_file import read_spec_file


def spec(factor):
    return RopeScaling(
        method="yarn", factor=factor, original_max_position_embeddings=8192, rotary_dim=64
    )


# (factor naming the candidate, text NLL beyond L, needle NLL)
CANDIDATES = [(4.0, 3.36, 1.77), (5.0, 3.41, 0.95), (6.0, 3.47, 0.72), (7.0, 3.45, 1.00)]


def write_trials(folder: Path, rows, needle=True):
    folder.mkdir(parents=True)
    lines = []
    for factor, text, needle_nll in rows:
        t = {"key": f"yarn:factor={factor}", "space": "yarn", "nll_beyond_original": text,
             "length": 32768, "spec": spec(factor).fields()}  # fmt: skip
        if needle:
            t["needle_nll"] = needle_nll
        lines.append(json.dumps(t))
    (folder / "trials.jsonl").write_text("\n".join(lines) + "\n")


def test_front_and_picks_match_the_hand_computed_ones(tmp_path, capsys):
    # by hand: factor 7 (3.45, 1.00) is beaten on both parts by factor 5 (3.41, 0.95); at
    # w = 0.1 the sums are 3.201 (4), 3.164 (5), 3.195 (6), 3.205 (7): factor 5; at w = 0.5
    # 2.565, 2.180, 2.095, 2.225: factor 6; at w = 0 the text NLL alone: factor 4.
    write_trials(tmp_path / "needle", CANDIDATES)
    # a second search that visited factor 4 again: counted once, the first folder's trial kept
    write_trials(tmp_path / "mix", [(4.0, 9.0, 9.0)])
    out, picked = tmp_path / "mix_weights.json", tmp_path / "picked.json"
    load("mix_weights").main([str(tmp_path / "needle"), str(tmp_path / "mix"), "--output", str(out),
                   "--spec-at", "0.1", str(picked)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["candidates"] == 4
    assert [r["slowest_divisor"] for r in result["front"]] == [4.0, 5.0, 6.0]
    by_weight = {r["weight"]: r["slowest_divisor"] for r in result["choices"]}
    assert (by_weight[0.0], by_weight[0.1], by_weight[0.5], by_weight[1.0]) == (4.0, 5.0, 6.0, 6.0)
    assert read_spec_file(picked) == spec(5.0)
    # yarn's own temperature where the spec leaves it unset: 0.1 ln 5 + 1
    assert result["choices"][4]["attention_factor"] == pytest.approx(1.1609, abs=1e-4)
    assert json.loads(picked.read_text())["chosen_by"]["mix_weight"] == 0.1
    assert "weight 0.1" in capsys.readouterr().out


def test_trials_without_the_needle_part_are_refused(tmp_path):
    write_trials(tmp_path / "nll", CANDIDATES, needle=False)
    with pytest.raises(SystemExit, match="without needle_nll"):
        load("mix_weights").main([str(tmp_path / "nll")])
