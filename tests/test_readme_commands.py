"""The README's first commands on a tiny model, in order: the rows they print mean what they say."""

import json
import shutil

import pytest
from test_eval_support import text_dataset, tiny_folder

from yarnlib.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    native = tiny_folder(root / "native", initializer_range=0.5)  # original context 256
    scaled = root / "scaled"
    shutil.copytree(native, scaled)
    return native, scaled, text_dataset(root / "data", {"a": 700, "b": 600})


def perplexities(model, data, out, capsys) -> tuple[dict, str]:
    assert main(
        ["eval", "perplexity", "--model", str(model), "--methods", "none,yarn:4",
         "--lengths", "512", "--samples", "2", "--dataset", str(data), "--output", str(out)]
    ) == 0  # fmt: skip
    err = capsys.readouterr().err
    cells = json.loads((out / "perplexity.json").read_text())["cells"]
    return {c["method"]: c for c in cells}, err


def test_the_none_row_after_config_in_place_says_it_runs_yarn(folders, tmp_path, capsys):
    native, scaled, data = folders
    # README: `yarnlib config path/to/model --factor 4 --in-place`
    assert main(["config", str(scaled), "--factor", "4", "--in-place"]) == 0
    rows, err = perplexities(scaled, data, tmp_path / "scaled", capsys)
    # the 'none' row of a folder already scaled runs YaRN x4: said on stderr and in its record
    assert "the 'none' row runs the model as saved" in err and "yarn factor=4" in err
    assert (rows["none"]["scaling"], rows["none"]["factor"]) == ("yarn", 4.0)
    assert rows["none"]["perplexity"] == pytest.approx(rows["yarn:4"]["perplexity"], rel=1e-6)
    # the unscaled folder: no warning, a none row that is the unscaled model
    unscaled, err = perplexities(native, data, tmp_path / "native", capsys)
    assert "warning" not in err
    assert (unscaled["none"]["scaling"], unscaled["none"]["factor"]) == ("none", 1.0)
    assert unscaled["yarn:4"]["perplexity"] == pytest.approx(rows["yarn:4"]["perplexity"], rel=1e-6)
    assert abs(unscaled["none"]["perplexity"] / rows["none"]["perplexity"] - 1) > 1e-3
