"""The built wheel on its own: installed with ``--no-deps`` into a folder of its own and run from
outside the repository, it has the plays, the lm-eval task files and the vLLM plugin entry
point, and its commands run (a fresh clone or a user's stack has no ``../shared``)."""

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import Distribution
from pathlib import Path

import pytest
from test_eval_support import tiny_folder

REPO = Path(__file__).resolve().parents[1]
PLAYS = sorted(p.name for p in (REPO / "yarnlib" / "data" / "shakespeare").glob("*.txt"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The wheel built from a copy of the sources (no stale build/ folder, no repository
    around it), installed with --no-deps into a --target folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "yarnlib", src / "yarnlib", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)]
    subprocess.run(build, check=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("yarnlib-*.whl")
    target = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def run(site, cwd, *args):
    """``args`` in a Python that sees the installed wheel first, then the pinned stack."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_wheel_carries_the_plays_tasks_and_plugin(site):
    (dist,) = Distribution.discover(name="yarnlib", path=[str(site)])
    files = {str(f) for f in dist.files}
    assert {f"yarnlib/data/shakespeare/{p}" for p in PLAYS} <= files
    assert len(PLAYS) == 14 and "yarnlib/data/shakespeare/README.md" in files
    assert {
        "yarnlib/eval/tasks/yarnlib_passkey/yarnlib_passkey.yaml",
        "yarnlib/eval/tasks/yarnlib_passkey/utils.py",
    } <= files
    (plugin,) = dist.entry_points.select(group="vllm.general_plugins")
    assert (plugin.name, plugin.value) == ("yarnlib", "yarnlib.vllm.plugin:register")
    (script,) = dist.entry_points.select(group="console_scripts")
    assert script.value == "yarnlib.cli:main"
    for play in PLAYS:  # byte for byte the repository's texts
        installed = site / "yarnlib" / "data" / "shakespeare" / play
        assert (
            installed.read_bytes()
            == (REPO / "yarnlib" / "data" / "shakespeare" / play).read_bytes()
        )


def test_the_installed_commands_run_outside_the_repository(site, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = run(
        site, outside, "-c",
        "import yarnlib, yarnlib.documents as d, yarnlib.eval.cli as e; "
        "print(yarnlib.__file__); print(d.DEFAULT_DATASET); print(e.TASKS_DIR)",
    )  # fmt: skip
    for line in where.split():
        assert Path(line).is_relative_to(site), where  # the wheel, not the editable checkout
    model = tiny_folder(tmp_path / "model")
    cli = str(site / "bin" / "yarnlib")
    run(site, outside, cli, "eval", "perplexity", "--model", str(model), "--lengths", "256",
        "--methods", "none", "--samples", "1", "--output", "out")  # fmt: skip
    result = json.loads((outside / "out" / "perplexity.json").read_text())
    # the default documents are the packaged plays, first by file name
    assert result["documents"] == {"256": [Path(PLAYS[0]).stem]}
    (cell,) = result["cells"]
    assert cell["samples"] == 1 and 1 < cell["perplexity"] < float("inf")
    shown = run(site, outside, cli, "inspect", "--method", "yarn", "--factor", "4",
                "--original-max-position-embeddings", "4096", "--rope-theta", "10000",
                "--rotary-dim", "32")  # fmt: skip
    assert "1.1386" in shown  # 0.1 ln 4 + 1, YaRN's attention factor at s = 4
