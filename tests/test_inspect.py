"""`yarnlib inspect`: the table's numbers, JSON, the plot, a model folder, and bad input."""

import json
import math
import os
import sys

import pytest

from yarnlib import RopeScaling
from yarnlib.cli import main
from yarnlib.convert import to_hf
from yarnlib.inspect_cli import check_plot_path

ARGS = [
    "inspect",
    "--method",
    "yarn",
    "--factor",
    "4",
    "--original-max-position-embeddings",
    "4096",
    "--rope-theta",
    "10000",
    "--rotary-dim",
    "64",
]


def test_json_rows_are_the_spec(capsys):
    assert main([*ARGS, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    spec = RopeScaling("yarn", 4, 4096, 1e4, 64)
    rows = result["dimensions"]
    assert len(rows) == 32 and result["attention_factor"] == spec.attention_factor()
    for row, new in zip(rows, spec.inv_freq().tolist(), strict=True):
        old = 10000 ** (-2 * row["dim"] / 64)
        assert row["wavelength"] == pytest.approx(2 * math.pi / old, rel=1e-6)
        assert row["rotations_in_original"] == pytest.approx(4096 * old / (2 * math.pi), rel=1e-6)
        assert row["frequency_ratio"] == pytest.approx(new / old, rel=1e-6)
    # fast dimensions keep their frequency (ramp 0), slow ones are divided by s (ramp 1)
    assert rows[0]["ramp"] == 0 and rows[0]["frequency_ratio"] == 1
    assert rows[-1]["ramp"] == 1 and rows[-1]["frequency_ratio"] == pytest.approx(0.25)


def test_table_and_plot(tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert main([*ARGS, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "wavelength" in out and "attention_factor=1.13863" in out
    assert png.stat().st_size > 10_000
    data = json.loads((tmp_path / "curves.png.json").read_text())
    assert set(data["frequency_ratio"]) >= {"none", "linear", "yarn", "dynamic_yarn"}
    assert data["frequency_ratio"]["linear"] == pytest.approx([0.25] * 32)


def test_model_folder(tmp_path, capsys):
    spec = RopeScaling("ntk", 2, 8192, 1e5, 64)
    config = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, **to_hf(spec)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["method"] == "ntk"
    # flags override the folder: plain model scaled by yarn 4 from its max_position_embeddings
    (tmp_path / "config.json").write_text(
        json.dumps({**config, **to_hf(spec.replace(method="none", factor=1.0))})
    )
    assert main(["inspect", str(tmp_path), "--method", "yarn", "--factor", "4", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)["spec"]
    assert fields["original_max_position_embeddings"] == 8192 and fields["factor"] == 4


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["inspect", "--method", "magic", "--rotary-dim", "64"]) == 2
    assert "method" in capsys.readouterr().err
    assert main(["inspect", "--method", "none", "--factor", "4", "--rotary-dim", "64"]) == 2
    assert "factor: method 'none' scales nothing" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text('{\n  "model_type": "llama",\n  oops\n}')
    assert main(["inspect", str(tmp_path)]) == 2
    assert "line 3" in capsys.readouterr().err


def test_plot_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    config.update(to_hf(RopeScaling("yarn", 4, 256, 1e4, 16)))
    original = json.dumps(config, indent=2)
    (tmp_path / "config.json").write_text(original)
    # the data file of DIR/config.png used to be DIR/config.json
    assert main(["inspect", str(tmp_path), "--plot", str(tmp_path / "config.png")]) == 0
    assert (tmp_path / "config.json").read_text() == original
    data = json.loads((tmp_path / "config.png.json").read_text())
    assert data["frequency_ratio"]["none"] == [1.0] * 8
    check_plot_path(tmp_path / "config.png")  # its own data file may be replaced next time
    capsys.readouterr()
    (tmp_path / "notes.png.json").write_text("my notes")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG a picture of mine")  # no data file beside it
    for plot, message in (
        ("notes.png", "not written by"),
        ("config.json", "must end in"),
        ("photo.png", "photo.png exists and was not written by"),
    ):
        assert main(["inspect", str(tmp_path), "--plot", str(tmp_path / plot)]) == 2
        assert message in capsys.readouterr().err
    assert (tmp_path / "notes.png.json").read_text() == "my notes"
    assert (tmp_path / "photo.png").read_bytes() == b"\x89PNG a picture of mine"
    assert (tmp_path / "config.json").read_text() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "config.png",
        "config.png.json",
        "notes.png.json",
        "photo.png",
    ]


def test_output_cut_short_by_a_closed_pipe_is_quiet(monkeypatch):
    """`yarnlib inspect ... | head -1`: no BrokenPipeError traceback, the shell's SIGPIPE code."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `head` exits
    stdout = open(write_end, "w")  # noqa: SIM115 (closed below, after main)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main([*ARGS[:-1], "4096"]) == 141  # 2048 rows, more than a pipe holds
    stdout.close()  # the exit flush of what is still buffered: must not raise either
