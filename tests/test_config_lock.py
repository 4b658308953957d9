"""Two `yarnlib config --in-place` on one folder: one rewrites it, the other says the folder is
busy (exit 2, one line); the files stay consistent (issue 26, item 9)."""

import subprocess
import sys

import pytest
from test_eval_support import tiny_folder

from yarnlib.atomic import lock_folder
from yarnlib.cli import main
from yarnlib.config import current_spec, show


@pytest.fixture
def model_dir(tmp_path):
    return tiny_folder(tmp_path / "model")


def test_a_second_rewrite_of_a_locked_folder_is_busy(model_dir, capsys):
    before = (model_dir / "config.json").read_bytes()
    with lock_folder(model_dir, "config"):  # held as a rewrite in progress holds it
        assert main(["config", str(model_dir), "--factor", "2", "--in-place"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is busy" in err and str(model_dir) in err
    assert (model_dir / "config.json").read_bytes() == before
    assert main(["config", str(model_dir), "--factor", "2", "--in-place"]) == 0  # released
    assert current_spec(model_dir).factor == 2.0


def test_two_processes_racing_on_one_folder(model_dir):
    def start(factor):
        argv = [sys.executable, "-m", "yarnlib.cli", "config", str(model_dir),
                "--factor", factor, "--in-place"]  # fmt: skip
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    for _ in range(2):  # each round starts two interpreters: seconds of imports
        racers = {factor: start(factor) for factor in ("2", "4")}
        ended = {f: (p.wait(timeout=300), p.stderr.read()) for f, p in racers.items()}
        for factor, (code, err) in ended.items():
            assert code in (0, 2) and "Traceback" not in err, (factor, code, err)
            if code == 2:  # the last line (an import may warn before it)
                assert "is busy" in err.strip().splitlines()[-1], err
        done = [float(f) for f, (code, _) in ended.items() if code == 0]
        assert done, ended  # the lock never stops both
        report = show(model_dir)
        assert report["inconsistencies"] == [] and report["spec"]["factor"] in done
        leftovers = [
            p.name for p in model_dir.iterdir() if p.name.endswith((".tmp", "journal.json"))
        ]
        assert leftovers == []
