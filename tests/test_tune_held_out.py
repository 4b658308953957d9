"""``tune --held-out`` with the needle and mix objectives: the held-out numbers come from the
held-out documents alone, with keys of their own (issue 52, mutation round 4)."""

import json

import pytest
from test_eval_support import text_dataset, tiny_folder
from test_tune_needle import L, N

from yarnlib.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


def start_scores(model_dir, dataset, held_out, out, objective) -> dict:
    """final.json's start row (the YaRN defaults: the same spec in every search)."""
    args = ["tune", "--model", str(model_dir), "--target-length", str(N), "--dataset",
            str(dataset), "--held-out", str(held_out), "--budget", "1", "--output", str(out),
            "--samples", "1", "--space", "yarn", "--objective", objective,
            "--needles", "3"]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "final.json").read_text())["start"]


@pytest.mark.parametrize("objective", ["needle", "mix"])
def test_held_out_scores_depend_on_the_held_out_text_alone(model_dir, tmp_path, objective):
    """The same spec scored on the same held-out file gives the same held-out numbers whatever
    the calibration file; and held-out windows hide other keys than the calibration ones, so
    even the calibration text itself, given as held-out, scores otherwise (the keys of its
    calibration windows are those the search fitted)."""
    # text_dataset seeds the i-th document's text with i; those of 10 words are too short
    one = text_dataset(tmp_path / "one", {"a": 1500})
    two = text_dataset(tmp_path / "two", {"b": 10, "c": 1500})
    held = text_dataset(tmp_path / "held", {"x": 10, "y": 10, "z": 1500})
    first = start_scores(model_dir, one, held, tmp_path / "first", objective)
    second = start_scores(model_dir, two, held, tmp_path / "second", objective)
    assert first["calibration"]["objective"] != second["calibration"]["objective"]
    assert first["held_out"] == second["held_out"]
    itself = start_scores(model_dir, one, one, tmp_path / "itself", objective)
    assert itself["calibration"] == first["calibration"]
    assert itself["held_out"]["answer_tokens"] > 0
    assert itself["held_out"]["objective"] != pytest.approx(
        itself["calibration"]["objective"], abs=1e-6
    )
