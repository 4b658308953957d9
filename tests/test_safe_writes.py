"""Result files are never written through a symlink, and a failed write (a full disk, a read-only
folder) ends the command with one line (exit 2), leaving no empty or partial file under a final
name and no temporary file (issue 26, items 8, 10, 11)."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_eval_support import text_dataset, tiny_folder, tiny_tokenizer

from yarnlib import atomic
from yarnlib.cli import main
from yarnlib.eval.plots import plot_perplexity
from yarnlib.eval.store import CellStore
from yarnlib.finetune import checkpoint, data, logs
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import read_spec_file, write_spec_file

WORKER = Path(__file__).with_name("full_disk_worker.py")
L = 128
SPEC = RopeScaling(method="yarn", factor=4.0, original_max_position_embeddings=L, rotary_dim=16)
RECORD = {"method": "none", "length": 128, "perplexity": 3.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("data"), {"a": 400, "b": 300})


def victim(tmp_path) -> Path:
    """A file someone else owns, the target of the planted links."""
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text("not yours\n")
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


# -- item 8: planted symlinks ---------------------------------------------------------------------


def test_tune_best_json_never_written_through_a_planted_link(tmp_path):
    target = victim(tmp_path)
    out = tmp_path / "tune"
    out.mkdir()
    (out / "best.json.tmp").symlink_to(target)  # the name the old writer staged under
    (out / "final.json").symlink_to(target)  # a result file that is itself a link
    write_spec_file(out / "best.json", SPEC)
    atomic.write_text(out / "final.json", "{}\n")
    assert target.read_text() == "not yours\n"
    assert not (out / "best.json").is_symlink() and read_spec_file(out / "best.json") == SPEC
    assert not (out / "final.json").is_symlink() and (out / "final.json").read_text() == "{}\n"


@pytest.mark.parametrize("resume", [False, True])
def test_a_symlinked_cell_store_is_refused(tmp_path, resume):
    target = victim(tmp_path)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "cells.jsonl").symlink_to(target)
    with pytest.raises(ValueError, match=r"cells.jsonl is a symlink; allowed: a plain file"):
        CellStore(out, ("method", "length"), {}, resume=resume)
    assert target.read_text() == "not yours\n"


def test_eval_refuses_a_symlinked_cell_store_in_one_line(model_dir, data_dir, tmp_path, capsys):
    target = victim(tmp_path)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "cells.jsonl").symlink_to(target)
    argv = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
            "--methods", "none", "--lengths", "64", "--samples", "1",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert "is a symlink" in capsys.readouterr().err
    assert target.read_text() == "not yours\n"


def test_plots_replace_a_link_instead_of_writing_through_it(tmp_path):
    target = victim(tmp_path)
    path = tmp_path / "perplexity.png"
    path.symlink_to(target)
    plot_perplexity([RECORD, {**RECORD, "length": 256}], L, path)
    assert target.read_text() == "not yours\n"
    assert not path.is_symlink() and path.read_bytes().startswith(b"\x89PNG")


def test_inspect_plot_never_opens_a_planted_temporary_name(tmp_path, capsys):
    target = victim(tmp_path)
    plot = tmp_path / "curves.png"
    # the old writer's temporary names were predictable: this process's id
    for name in (f".curves.png.{os.getpid()}.tmp", f".curves.png.json.{os.getpid()}.tmp"):
        (tmp_path / name).symlink_to(target)
    argv = ["inspect", "--factor", "4", "--original-max-position-embeddings", "128",
            "--rotary-dim", "16", "--plot", str(plot)]  # fmt: skip
    assert main(argv) == 0
    assert target.read_text() == "not yours\n"
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert json.loads(plot.with_name("curves.png.json").read_text())["spec"]["factor"] == 4.0


def test_finetune_files_never_written_through_links(tmp_path):
    target = victim(tmp_path)
    # the training log: appended to each step, truncated on resume
    log_path = tmp_path / "log.jsonl"
    log_path.symlink_to(target)
    with pytest.raises(ValueError, match="log.jsonl is a symlink"):
        logs.JsonlLog(log_path, enabled=True).write({"step": 1})
    checkpoint.truncate_log(log_path, step=0)
    assert target.read_text() == "not yours\n" and not log_path.is_symlink()
    # the token cache, staged under a fixed name before
    cache = tmp_path / "cache"
    cache.mkdir()
    tokenizer = tiny_tokenizer()
    text_dataset(tmp_path / "docs", {"a": 50})
    key = data.cache_key([str(tmp_path / "docs")], tokenizer, "text", "train", None)
    (cache / f"tokens-{key}.pt.tmp").symlink_to(target)
    stream = data.tokenize([str(tmp_path / "docs")], tokenizer, cache, show_progress=False)
    assert target.read_text() == "not yours\n"
    cached = torch.load(cache / f"tokens-{key}.pt", weights_only=True)
    assert torch.equal(cached["tokens"], stream.tokens)
    # a staging folder left as a link by someone: replaced by a fresh folder, never entered
    staging = tmp_path / "model.tmp"
    staging.symlink_to(target.parent)
    atomic.fresh_folder(staging)
    assert staging.is_dir() and not staging.is_symlink() and not any(staging.iterdir())
    assert target.read_text() == "not yours\n"


def test_result_files_get_the_mode_a_plain_open_gives(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    fresh = atomic.write_text(tmp_path / "fresh.json", "{}\n")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0o600
    kept = tmp_path / "kept.json"
    kept.write_text("")
    kept.chmod(0o640)
    atomic.write_text(kept, "{}\n")
    assert kept.stat().st_mode & 0o777 == 0o640


# -- item 10: a full disk, simulated by os.write failing at each write in turn -------------------


class FullDisk:
    """os.write that, on call number ``fail_at`` (0: never), writes half of its data and raises
    ENOSPC, as a disk filling up mid-write does (a short write, then the error); counts calls."""

    def __init__(self, fail_at: int):
        self.fail_at, self.calls = fail_at, 0
        self.write = os.write

    def __call__(self, fd, data):
        self.calls += 1
        if self.calls == self.fail_at:
            self.write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.write(fd, data)


def check_results(out: Path) -> None:
    """Each result file present is whole: no 0-byte or cut file under a final name."""
    for path in out.glob("*.jsonl"):
        [json.loads(line) for line in path.read_text().splitlines()]
    for path in out.glob("*.json"):
        json.loads(path.read_text())
    if (out / "best.json").exists():
        read_spec_file(out / "best.json")
    if (out / "perplexity.csv").exists():
        result = json.loads((out / "perplexity.json").read_text())
        assert (out / "perplexity.csv").read_text().count("\n") == len(result["cells"]) + 1
    if (out / "perplexity.png").exists():
        assert (out / "perplexity.png").read_bytes().endswith(b"IEND\xaeB`\x82")


def eval_argv(model_dir, data_dir, out):
    return ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
            "--methods", "none,yarn:2", "--lengths", "64,192", "--samples", "1",
            "--output", str(out)]  # fmt: skip


def tune_argv(model_dir, data_dir, out):
    return ["tune", "--model", str(model_dir), "--target-length", "192", "--dataset",
            str(data_dir), "--samples", "1", "--budget", "2", "--space", "yarn",
            "--output", str(out)]  # fmt: skip


@pytest.mark.parametrize("command", [eval_argv, tune_argv], ids=["eval", "tune"])
def test_a_full_disk_at_each_write_ends_in_one_line(
    command, model_dir, data_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    clean = FullDisk(0)
    with monkeypatch.context() as m:
        m.setattr(os, "write", clean)
        assert main(command(model_dir, data_dir, out)) == 0
    capsys.readouterr()
    # every result file goes through the checked writer: cells, JSON, CSV, plot (eval);
    # trials, best.json, final.json (tune)
    assert clean.calls >= 4
    for fail_at in range(1, clean.calls + 1):
        shutil.rmtree(out)
        disk = FullDisk(fail_at)
        with monkeypatch.context() as m:
            m.setattr(os, "write", disk)
            code = main(command(model_dir, data_dir, out))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (fail_at, err)
        assert "Traceback" not in "\n".join(err)
        assert err[-1].startswith(f"yarnlib {command(model_dir, data_dir, out)[0]}: error: ")
        assert "No space left on device" in err[-1], err[-1]
        assert leftovers(out) == [], fail_at
        check_results(out)


def test_a_failed_append_leaves_no_partial_line(tmp_path, monkeypatch):
    store = CellStore(tmp_path, ("method", "length"), {}, resume=False)
    store.add(RECORD)
    before = (tmp_path / "cells.jsonl").read_text()
    monkeypatch.setattr(os, "write", FullDisk(1))
    with pytest.raises(ValueError, match=r"output: cannot write .*cells.jsonl \(No space left"):
        store.add({**RECORD, "length": 256})
    assert (tmp_path / "cells.jsonl").read_text() == before


# -- item 11: read-only output folders ------------------------------------------------------------


def test_config_output_under_a_file_is_one_line(model_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "scaled"  # a file where a folder is expected: fails for root too
    assert main(["config", str(model_dir), "--factor", "2", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("yarnlib config: error: output: ")


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root writes into read-only folders (chmod does "
    "not stop it); test_real_faults_in_a_tmpfs covers root with a read-only mount",
)
def test_read_only_output_folders_are_one_line(model_dir, data_dir, tmp_path, capsys):
    ro = tmp_path / "ro"
    (ro / "existing").mkdir(parents=True)
    ro.chmod(0o555)
    (ro / "existing").chmod(0o555)
    try:
        assert main(["config", str(model_dir), "--factor", "2", "--output", str(ro / "out")]) == 2
        assert capsys.readouterr().err.startswith("yarnlib config: error: output: ")
        assert main(eval_argv(model_dir, data_dir, ro / "existing")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("yarnlib eval: error: output: ") and "Permission" in err[-1]
    finally:
        ro.chmod(0o755)
        (ro / "existing").chmod(0o755)


# -- items 10 and 11 for real: a tiny tmpfs, and a read-only mount --------------------------------


def in_mount_namespace(folder: Path) -> list[str]:
    """A command prefix that runs in a mount namespace of its own (root inside), or skips."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1): cannot mount a tmpfs")
    prefix = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    probe = [*prefix, sys.executable, "-c", "import subprocess, sys; subprocess.run(['mount', "
             "'-t', 'tmpfs', 'tmpfs', sys.argv[1]], check=True)", str(folder)]  # fmt: skip
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot run Python on a tmpfs of its own here: {done.stderr.strip()[-200:]}")
    return prefix


def test_real_faults_in_a_tmpfs(model_dir, data_dir, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    prefix = in_mount_namespace(mount)
    argv = [*prefix, sys.executable, str(WORKER), str(mount), str(model_dir), str(data_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = json.loads(done.stdout.splitlines()[-1])
    full = [r for r in runs if r["case"] == "full"]
    # the sizes ran out at several different writes, and the last size was enough
    assert [r["code"] for r in full][-1] == 0
    assert len({tuple(r["files"]) for r in full if r["code"] == 2}) >= 2, full
    for run in runs:
        if run["code"] == 0:
            continue
        assert run["code"] == 2 and not run["traceback"], run
        assert run["last_line"].startswith(f"yarnlib {run['command']}: error: "), run
        assert run["leftovers"] == [] and run["partial"] == [], run
    reasons = {r["case"]: r["last_line"] for r in runs if r["code"]}
    assert "No space left on device" in reasons["full"]
    assert "Read-only file system" in reasons["read-only config"]
    assert "Read-only file system" in reasons["read-only eval"]


def test_finetune_checkpoints_on_a_full_disk(tmp_path):
    """`finetune --save-every` whose second checkpoint runs out of room in each writer
    (safetensors, torch.save large and small, yarnlib's run.json): one line (exit 2), no
    step-*.tmp left, the first checkpoint byte for byte as it was (issue 52, defect 5)."""
    from full_disk_worker import CHECKPOINT_FILES, FULL_AT
    from test_finetune_support import cyclic_texts, text_folder
    from test_finetune_support import model_dir as finetune_model

    mount = tmp_path / "mnt"
    mount.mkdir()
    prefix = in_mount_namespace(mount)
    model = finetune_model(tmp_path / "model")
    data = text_folder(tmp_path / "data", cyclic_texts(40))
    argv = [*prefix, sys.executable, str(WORKER), "finetune", str(mount), str(model), str(data),
            str(tmp_path / "cache")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    enough, *full = json.loads(done.stdout.splitlines()[-1])
    assert enough["code"] == 0 and enough["checkpoint_files"] == sorted(CHECKPOINT_FILES)
    assert [run["full_at"] for run in full] == list(FULL_AT)
    for run in full:
        assert run["code"] == 2 and not run["traceback"], run
        final = mount / "out" / "checkpoints" / "step-000002"
        assert run["last_line"] == (
            f"yarnlib finetune: error: checkpoint: cannot write {final} (No space left on "
            "device); nothing of step 2 was kept, the earlier checkpoints are as they were (free "
            "space, then --resume latest)"
        ), run
        assert run["leftovers"] == [] and run["partial"] == [], run
        assert run["checkpoints"] == ["step-000001"] and run["first_kept"], run
        # the failed save's folder held the files written before the one the disk ran out in
        written = CHECKPOINT_FILES[: CHECKPOINT_FILES.index(run["full_at"])]
        (staged,) = run["staged"]
        assert set(written) <= set(staged) <= {*written, run["full_at"]}, run


# -- issue 52: the data is on disk before the rename makes it the file ---------------------------


class DiskCalls:
    """os.fsync and os.replace as they run (the real ones, called through): each recorded with
    the path the fsynced descriptor has open, in order."""

    def __init__(self, monkeypatch):
        self.events = []
        fsync, replace = os.fsync, os.replace

        def traced_fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return fsync(fd)

        def traced_replace(src, dst, **kwargs):
            self.events.append(("replace", str(src), str(dst)))
            return replace(src, dst, **kwargs)

        monkeypatch.setattr(os, "fsync", traced_fsync)
        monkeypatch.setattr(os, "replace", traced_replace)

    def replaced(self) -> list[str]:
        return [event[2] for event in self.events if event[0] == "replace"]

    def check_flushed_before_renamed(self) -> None:
        for i, event in enumerate(self.events):
            if event[0] == "replace":
                assert ("fsync", event[1]) in self.events[:i], (event, self.events[:i])


def test_each_atomic_write_is_flushed_before_its_rename(tmp_path, monkeypatch):
    calls = DiskCalls(monkeypatch)
    atomic.write_text(tmp_path / "a.json", "{}\n")
    atomic.write_with(tmp_path / "b.pt", lambda f: torch.save({"x": torch.ones(3)}, f))
    write_spec_file(tmp_path / "best.json", SPEC)
    atomic.append_text(tmp_path / "log.jsonl", "{}\n")
    assert calls.replaced() == [str(tmp_path / n) for n in ("a.json", "b.pt", "best.json")]
    calls.check_flushed_before_renamed()
    assert calls.events[-1] == ("fsync", str(tmp_path / "log.jsonl"))  # the append, flushed
    assert (tmp_path / "a.json").read_text() == "{}\n" and read_spec_file(tmp_path / "best.json")


def test_an_in_place_config_rewrite_is_on_disk_in_order(model_dir, tmp_path, monkeypatch):
    """config --in-place: every staged file flushed before its rename, and the journal renamed
    and the folder flushed before the first file changes (a crash then finds the journal)."""
    folder = shutil.copytree(model_dir, tmp_path / "model")
    calls = DiskCalls(monkeypatch)
    assert main(["config", str(folder), "--factor", "2", "--in-place"]) == 0
    calls.check_flushed_before_renamed()
    renames = [i for i, event in enumerate(calls.events) if event[0] == "replace"]
    journal = calls.events[renames[0]]
    assert journal[2] == str(folder / ".yarnlib_journal.json")
    assert calls.events[renames[0] + 1] == ("fsync", str(folder))
    assert str(folder / "config.json") in calls.replaced()[1:]
