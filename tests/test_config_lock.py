"""Two `yarnlib config --in-place` on one folder: one rewrites it, the other says the folder is
busy (exit 2, one line); the files stay consistent (issue 26, item 9). The in-place rewrites of
the verl and EasyR1 recipes take the same lock (issue 52, defect 4)."""

import os
import subprocess
import sys

import pytest
from test_eval_support import tiny_folder

from yarnlib import RopeScaling
from yarnlib.atomic import lock_folder
from yarnlib.cli import main
from yarnlib.config import current_spec, show
from yarnlib.integrations import easyr1, verl


@pytest.fixture
def model_dir(tmp_path):
    return tiny_folder(tmp_path / "model")


def test_a_second_rewrite_of_a_locked_folder_is_busy(model_dir, capsys):
    before = (model_dir / "config.json").read_bytes()
    with lock_folder(model_dir):  # held as a rewrite in progress holds it
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


# another process in the middle of an in-place rewrite: it holds the lock and has staged its
# new config.json under a temporary name beside the old one
HOLDER = """
import sys
from pathlib import Path
from yarnlib import atomic
with atomic.lock_folder(sys.argv[1]):
    staged = atomic.stage(Path(sys.argv[1]) / "config.json", lambda fd: atomic.write_all(fd, b"{}"))
    print(staged, flush=True)
    sys.stdin.readline()
"""


def recipe(framework: str, model_dir):
    if framework == "verl":
        return verl.apply, {"actor_rollout_ref": {"model": {"path": str(model_dir)}}}
    return easyr1.apply, {"worker": {"actor": {"model": {"model_path": str(model_dir)}}}}


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
def test_a_recipes_in_place_rewrite_waits_for_no_one_else(framework, model_dir):
    apply, cfg = recipe(framework, model_dir)
    spec = RopeScaling("yarn", 2.0, 256, 50000.0, 16)
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        staged = holder.stdout.readline().strip()
        assert staged, "the holding process did not start"
        with pytest.raises(ValueError) as refused:
            apply(cfg, spec, in_place=True)
        message = str(refused.value)
        assert "\n" not in message and f"{model_dir} is busy" in message, message
        assert os.path.exists(staged)  # the other rewrite's staged file is left to it
        files = {p.name: p.read_bytes() for p in model_dir.iterdir() if str(p) != staged}
        assert files == before  # no .bak, config.json as it was
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    os.unlink(staged)
    apply(cfg, spec, in_place=True)  # released: the rewrite goes through
    assert current_spec(model_dir) == spec
