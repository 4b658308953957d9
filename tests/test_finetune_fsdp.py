"""Two CPU processes under FSDP2 (``accelerate launch --config_file
examples/finetune/fsdp2_cpu.yaml``): each rank holds half of the weights and of the AdamW
states, as ``yarnlib plan`` counts them for two GPUs, and the run ends where one process on the
same global batch does (loss and updated weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_finetune_distributed import common_args, free_port, launch
from transformers import AutoModelForCausalLM

from yarnlib.cli import main as yarnlib_main
from yarnlib.finetune.cli import parse_args
from yarnlib.finetune.loop import train

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "finetune" / "fsdp2_cpu.yaml"
# each rank reports what it holds: local shards of the weights and of AdamW's two moments
SCRIPT = """
import json, os, sys
import torch
from accelerate.state import PartialState
from yarnlib.finetune.cli import parse_args
from yarnlib.finetune.loop import train

def local(t):
    return t.to_local() if hasattr(t, "to_local") else t

result = train(parse_args(sys.argv[2:]))
params = list(result.model.parameters())
moments = [local(v) for s in result.optimizer.state.values() for k, v in s.items() if k != "step"]
report = {
    "world": int(os.environ["WORLD_SIZE"]),
    "distributed_type": str(PartialState().distributed_type),
    "sharded": all(hasattr(p, "to_local") for p in params),
    "weight_bytes": sum(local(p).numel() * local(p).element_size() for p in params),
    "adamw_bytes": sum(m.numel() * m.element_size() for m in moments),
    "losses": result.losses,
}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(report, f)
# the process group is destroyed (end_training) and everything is written: leave without the
# interpreter's teardown, where torch 2.13's gloo threads can abort (pytorch/pytorch#179291)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""
# what that abort prints; a launch that dies of it is run once more, any other failure fails
GLOO_TEARDOWN = "terminate called without an active exception"


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fsdp")
    common = common_args(tmp_path, "--factor", "2", "--no-gradient-checkpointing")
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    for _ in range(2):
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        done = launch(
            [
                "accelerate.commands.launch", "--config_file", str(CONFIG), "--main_process_port",
                str(free_port()), str(script), str(tmp_path), *common,
                "--output", str(tmp_path / "run"),
            ]
        )  # fmt: skip
        if done.returncode == 0 or GLOO_TEARDOWN not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    return tmp_path, common, ranks


def test_each_rank_holds_the_half_the_plan_counts(fsdp_run, capsys):
    tmp_path, common, ranks = fsdp_run
    assert [(r["world"], r["distributed_type"]) for r in ranks] == [(2, "DistributedType.FSDP")] * 2
    assert all(r["sharded"] for r in ranks)  # DTensors, not DDP's full copies
    model = AutoModelForCausalLM.from_pretrained(common[1])
    full = sum(p.numel() for p in model.parameters()) * 4
    # the two shards together are the model (FSDP2 pads dim 0 only to a multiple of 2)
    assert full <= ranks[0]["weight_bytes"] + ranks[1]["weight_bytes"] <= full * 1.01
    assert yarnlib_main(
        [
            "plan", common[1], "--engine", "finetune", "--context", "32", "--gpus", "2",
            "--cp", "1", "--gpu-memory", "80GiB", "--offload", "none", "--json",
        ]
    ) == 0  # fmt: skip
    lines = json.loads(capsys.readouterr().out)["bytes_per_gpu"]
    for rank in ranks:
        planned_weights = lines["actor weights (fp32, sharded)"]
        assert rank["weight_bytes"] == pytest.approx(planned_weights, rel=0.01)
        assert rank["adamw_bytes"] == pytest.approx(lines["AdamW states (sharded)"], rel=0.01)


def test_two_fsdp_ranks_end_where_one_process_does(fsdp_run):
    tmp_path, common, ranks = fsdp_run
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(ranks[0]["losses"]) == 2
    saved = flat(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model"))
    start = flat(AutoModelForCausalLM.from_pretrained(common[1]))
    assert (saved - start).abs().max() > 1e-4
    one = train(parse_args([*common, "--grad-accum", "2", "--output", str(tmp_path / "one")]))
    torch.testing.assert_close(saved, flat(one.model), rtol=0, atol=1e-6)
    losses = {int(k): v for k, v in ranks[0]["losses"].items()}
    assert losses == pytest.approx(one.losses, rel=1e-6)


def test_lora_under_fsdp_is_refused_in_one_line(tmp_path):
    common = common_args(tmp_path, "--factor", "2", "--lora")
    done = launch(
        [
            "accelerate.commands.launch", "--config_file", str(CONFIG), "--main_process_port",
            str(free_port()), "-m", "yarnlib.finetune", *common,
            "--output", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    assert done.returncode != 0
    assert "yarnlib finetune: error: lora: --lora under FSDP is not supported" in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
