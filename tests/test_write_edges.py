"""Edges of the safe writes that the earlier tests left open (issue 52, mutation round over the
safe-write code): a failed rename or an interrupt leaves no temporary file, a link at the final
name lends no mode, an in-place rewrite keeps each file's mode, stays whole on a full disk at
any write, removes its journal only once the renames are on disk and sweeps only its own
temporary files; --output refuses a folder inside the model reached through a link and leaves
nothing when a copy fails; --dry-run never completes an interrupted rewrite."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_config_files import killed_at, snapshot
from test_eval_support import tiny_folder
from test_safe_writes import DiskCalls, FullDisk

from yarnlib import atomic
from yarnlib.cli import main
from yarnlib.config.file_set import JOURNAL

UMASK = os.umask(0o022)
os.umask(UMASK)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The tiny model with finite limits: a rewrite changes all three files."""
    path = tiny_folder(tmp_path_factory.mktemp("tiny") / "model")
    for name, key in (("tokenizer_config.json", "model_max_length"),
                      ("generation_config.json", "max_length")):  # fmt: skip
        settings = json.loads((path / name).read_text())
        (path / name).write_text(json.dumps({**settings, key: 256}, indent=2) + "\n")
    return path


@pytest.fixture
def folder(pristine, tmp_path):
    """A fresh copy of the tiny model folder (config, tokenizer and generation config)."""
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def config(path: Path, *args: str) -> int:
    return main(["config", str(path), *args])


# -- atomic writes ---------------------------------------------------------------------------


def test_a_link_at_the_final_name_lends_the_new_file_no_mode(tmp_path):
    private = tmp_path / "private.key"
    private.write_text("secret\n")
    private.chmod(0o600)
    result = tmp_path / "result.json"
    result.symlink_to(private)
    atomic.write_text(result, "{}\n")
    assert not result.is_symlink() and result.read_text() == "{}\n"
    assert result.stat().st_mode & 0o777 == 0o666 & ~UMASK  # a plain open's, not the target's
    assert private.read_text() == "secret\n" and private.stat().st_mode & 0o777 == 0o600


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    taken = tmp_path / "final.json"  # a folder holds the final name: the rename itself fails
    taken.mkdir()
    (taken / "inside").write_text("")
    with pytest.raises(ValueError) as error:
        atomic.write_text(taken, "{}\n", "spec")
    assert str(error.value) == (
        f"spec: cannot write {taken} (Is a directory); it was left as it was"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.json"]
    assert [p.name for p in taken.iterdir()] == ["inside"]


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path):
    def save(f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # Ctrl-C in the middle of torch.save

    with pytest.raises(KeyboardInterrupt):
        atomic.write_with(tmp_path / "model.pt", save)
    assert list(tmp_path.iterdir()) == []


# -- config --in-place -------------------------------------------------------------------------


def test_an_in_place_rewrite_keeps_each_files_mode(folder):
    modes = {"config.json": 0o600, "tokenizer_config.json": 0o640, "generation_config.json": 0o604}
    for name, mode in modes.items():
        (folder / name).chmod(mode)
    assert config(folder, "--factor", "2", "--in-place") == 0
    for name, mode in modes.items():
        assert (folder / name).stat().st_mode & 0o777 == mode, name
        assert (folder / (name + ".bak")).stat().st_mode & 0o777 == mode, name


def test_the_journal_is_removed_only_once_the_renames_are_on_disk(folder, monkeypatch):
    calls = DiskCalls(monkeypatch)
    unlink = os.unlink

    def traced_unlink(path, *args, **kwargs):
        calls.events.append(("unlink", str(path)))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", traced_unlink)
    assert config(folder, "--factor", "2", "--in-place") == 0
    events = calls.events
    removed = events.index(("unlink", str(folder / JOURNAL)))
    last_rename = max(i for i, event in enumerate(events) if event[0] == "replace")
    assert events[last_rename][2] != str(folder / JOURNAL) and last_rename < removed
    assert ("fsync", str(folder)) in events[last_rename:removed], events[last_rename:]


def test_a_full_disk_at_any_write_of_an_in_place_rewrite_changes_nothing(
    folder, monkeypatch, capsys
):
    before = snapshot(folder)
    clean = FullDisk(0)
    trial = Path(shutil.copytree(folder, folder.with_name("trial")))
    with monkeypatch.context() as m:
        m.setattr(os, "write", clean)
        assert config(trial, "--factor", "2", "--in-place") == 0
    assert clean.calls == 7  # three files, their three .bak files, the journal
    capsys.readouterr()
    for fail_at in range(1, clean.calls + 1):
        with monkeypatch.context() as m:
            m.setattr(os, "write", FullDisk(fail_at))
            assert config(folder, "--factor", "2", "--in-place") == 2, fail_at
        err = capsys.readouterr().err
        assert err == (
            f"yarnlib config: error: model_dir: cannot write in {folder}: No space left on device\n"
        ), fail_at
        assert snapshot(folder) == before, fail_at


def test_the_sweep_removes_only_the_rewrites_own_temporary_files(folder):
    others = ["notes.tmp", ".model.safetensors.x1y2.tmp", "config.json.tmp"]
    for name in others:
        (folder / name).write_text("someone else's\n")
    killed = folder / ".config.json.k1ll3d.tmp"  # what a killed rewrite staged
    killed.write_text("{}")
    assert config(folder, "--factor", "2", "--in-place") == 0
    assert not killed.exists()
    for name in others:
        assert (folder / name).read_text() == "someone else's\n", name


def test_a_dry_run_never_completes_an_interrupted_rewrite(folder, capsys):
    # renamed: the journal, config.json.bak; killed before config.json
    assert killed_at(folder, ["--factor", "2", "--in-place"], 3)
    before = snapshot(folder)
    capsys.readouterr()
    assert config(folder, "--factor", "2", "--dry-run") == 2
    assert "was interrupted" in capsys.readouterr().err
    assert snapshot(folder) == before and (folder / JOURNAL).exists()


# -- config --output ---------------------------------------------------------------------------


def test_an_output_inside_the_model_folder_through_a_link_is_refused(folder, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(folder, target_is_directory=True)
    before = snapshot(folder)
    assert config(folder, "--factor", "2", "--output", str(link / "scaled")) == 2
    assert capsys.readouterr().err == (
        f"yarnlib config: error: output: {link / 'scaled'} is inside the model folder {folder}\n"
    )
    assert snapshot(folder) == before


def test_a_copy_that_fails_leaves_no_output_and_no_temporary_folder(folder, tmp_path, capsys):
    # an HF cache snapshot whose blob was never downloaded: a link to nothing
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(tmp_path / "blobs" / "missing")
    parent = tmp_path / "out"
    parent.mkdir()
    assert config(folder, "--factor", "2", "--output", str(parent / "scaled")) == 2
    assert capsys.readouterr().err == (
        f"yarnlib config: error: output: cannot write {parent / 'scaled'}: No such file or "
        "directory\n"
    )
    assert list(parent.iterdir()) == []
