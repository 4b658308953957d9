"""Two processes on one machine (torchrun, gloo on CPU) train through accelerate's DDP and end
with identical weights, different from the initial ones, and equal to one process trained on
the same global batch (two micro-batches of accumulation)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_finetune_support import cyclic_texts, model_dir, text_folder
from transformers import AutoModelForCausalLM

from yarnlib.finetune.cli import parse_args
from yarnlib.finetune.loop import train

REPO = Path(__file__).resolve().parents[1]
# each rank writes its weights (the process group is gone after accelerate's end_training);
# rank 1 is slow to save, as a loaded rank is: the main process must not move the staging
# folder while another rank still writes into it
SCRIPT = """
import os, sys, time
import torch
import transformers
from accelerate.state import PartialState
from yarnlib.finetune.cli import parse_args
from yarnlib.finetune.loop import train

if os.environ["RANK"] == "1":
    save = transformers.PreTrainedModel.save_pretrained
    def late_save(self, *args, **kwargs):
        time.sleep(2)
        return save(self, *args, **kwargs)
    transformers.PreTrainedModel.save_pretrained = late_save
args = parse_args(sys.argv[2:])
result = train(args)
flat = torch.cat([p.detach().flatten() for p in result.model.parameters()])
torch.save({"weights": flat, "losses": result.losses, "world": int(os.environ["WORLD_SIZE"]),
            "backend": PartialState().backend},
           os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def common_args(tmp_path, *extra: str) -> list[str]:
    model = model_dir(tmp_path / "model")
    data = text_folder(tmp_path / "data", cyclic_texts(40))
    return [
        "--model", str(model), "--dataset", str(data), "--cache-dir", str(tmp_path / "cache"),
        "--seq-len", "32", "--batch-size", "2", "--steps", "2", "--method", "yarn",
        "--lr", "1e-3", "--warmup-steps", "0", "--report-to", "none", *extra,
    ]  # fmt: skip


def launch(command: list[str]) -> subprocess.CompletedProcess:
    """A launcher command (torchrun, accelerate launch) with the repo and tests importable."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", *command], env=env, capture_output=True, text=True, timeout=300
    )


def two_ranks(tmp_path, common: list[str]) -> list[dict]:
    """Run ``common`` on two torchrun processes (output tmp_path/run); each rank's report."""
    script = tmp_path / "two_ranks.py"
    script.write_text(SCRIPT)
    done = launch(
        [
            "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(script), str(tmp_path), *common,
            "--output", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]


def one_process_agrees(tmp_path, common: list[str], rank: dict) -> None:
    """One process accumulating the two halves of the global batch ends where the ranks did."""
    single = train(parse_args([*common, "--grad-accum", "2", "--output", str(tmp_path / "one")]))
    weights = torch.cat([p.detach().flatten() for p in single.model.parameters()])
    torch.testing.assert_close(rank["weights"], weights, rtol=0, atol=1e-6)
    assert rank["losses"] == pytest.approx(single.losses, rel=1e-6)


def test_two_processes_agree_on_the_weights(tmp_path):
    common = common_args(tmp_path, "--factor", "2", "--no-cross-document-attention")
    model = common[1]
    ranks = two_ranks(tmp_path, common)
    assert [(r["world"], r["backend"]) for r in ranks] == [(2, "gloo"), (2, "gloo")]
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(ranks[0]["losses"]) == 2
    initial = AutoModelForCausalLM.from_pretrained(model)
    start = torch.cat([p.detach().flatten() for p in initial.parameters()])
    assert (ranks[0]["weights"] - start).abs().max() > 1e-4
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert torch.equal(
        torch.cat([p.detach().flatten() for p in saved.parameters()]), ranks[0]["weights"]
    )
    assert not (tmp_path / "run" / "model.tmp").exists()  # the slow rank wrote into no stray copy
    # Each rank must train on its own half of the global batch: one process accumulating both
    # halves ends where the two did (had both ranks read the same rows, it would not).
    one_process_agrees(tmp_path, common, ranks[0])


def test_two_processes_with_pose_equal_one(tmp_path):
    """PoSE ids are drawn for the global batch from (seed, step): each rank takes its rows'
    ids, so two ranks end where one process accumulating both halves does."""
    common = common_args(tmp_path, "--pose", "--target-length", "512", "--pose-chunks", "3")
    ranks = two_ranks(tmp_path, common)
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])
    one_process_agrees(tmp_path, common, ranks[0])


def test_two_ranks_say_saved_once(tmp_path):
    """`torchrun -m yarnlib.finetune` on two processes: one `saved` line for the run."""
    common = common_args(tmp_path, "--factor", "2")
    done = launch(
        [
            "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), "-m", "yarnlib.finetune", *common,
            "--output", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count(f"saved {tmp_path / 'run' / 'model'}") == 1, done.stdout
