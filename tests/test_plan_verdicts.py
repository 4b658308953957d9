"""`yarnlib plan`'s verdicts and advice, followed as a user would follow them: a "fits" whose
fragment, re-planned with its own values, still fits; suggestions that fit when their flags are
added to the command; config.json fields refused in one line; the RoPE advice computed from the
original context; `python -m yarnlib`."""

import argparse
import json
import re
import shlex
import subprocess
import sys

import pytest
from test_plan import LLAMA31_8B, QWEN3_8B, QWEN25_7B, _plan

from yarnlib.cli import main
from yarnlib.finetune.cli import add_arguments as finetune_arguments
from yarnlib.plan.shapes import shape_from_config

GIB = 1024**3
# Qwen2.5's model cards: add this block for 128k, leaving max_position_embeddings at 32768
QWEN25_YARN = {
    **QWEN25_7B,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}
# Qwen3-8B scaled by `yarnlib config --factor 4 --original-max-position-embeddings 32768`
QWEN3_128K = {
    **QWEN3_8B,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "rope_type": "yarn"},
}


def plan(tmp_path, capsys, config, *argv):
    code, out = _plan(tmp_path, capsys, config, *argv)
    return code, (json.loads(out.out) if "--json" in argv and code != 2 else out)


def followed(argv: list[str], suggestion: str) -> list[str]:
    """``argv`` with the flags a suggestion names in its parentheses set (replaced or added)."""
    flags = shlex.split(re.search(r"\((--[^)]*)\)$", suggestion).group(1))
    argv = list(argv)
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def test_easyr1_kv_cache_is_planned_with_the_fragments_batched_tokens(tmp_path, capsys):
    # issue 50 item 1: EasyR1 runs vLLM without chunked prefill, so the fragment sets
    # max_num_batched_tokens to the whole sequence; the profiling forward over that many tokens
    # is what vLLM subtracts before sizing the cache
    argv = ["--engine", "easyr1", "--context", "163840", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, report = plan(tmp_path, capsys, LLAMA31_8B, *argv, "--json")
    assert code == 0 and report["fits"]
    vllm = report["fragment"]["worker"]["rollout"]
    assert vllm["max_num_batched_tokens"] == 163840
    shape = shape_from_config(LLAMA31_8B)
    tp, u = vllm["tensor_parallel_size"], vllm["gpu_memory_utilization"]
    # what vLLM is left with, by hand: its share, less the bf16 weights per rank, a forward over
    # the fragment's 163840 tokens (residual and normed states, q/k/v/out, gate/up/product of
    # the rank's slice) and the float32 logits of 256 sampled rows, less 1 GiB of overhead
    h, i, d, kv_rank = 4096, 14336, 128, max(1, 8 // tp)
    per_token = 2 * (4 * h + (2 * 32 * d + 2 * kv_rank * d) // tp + 3 * i // tp)
    forward = 163840 * per_token + 2 * 4 * 256 * 128256
    budget = int(u * 80 * GIB) - -(-2 * shape.params // tp) - forward - GIB
    blocks = budget // (16 * 2 * 32 * kv_rank * d * 2)
    assert report["rollout"]["kv_blocks"] == blocks
    assert report["rollout"]["sequences_at_once"] == blocks // (163840 // 16) >= 1


def test_suggestions_fit_when_followed_with_a_cp_the_windows_must_divide(tmp_path, capsys):
    # issue 50 item 3: cp 3 needs windows in multiples of 6; the search stepped by 1024 and
    # crashed on a length the user never gave
    argv = ["--engine", "finetune", "--cp", "3", "--gpus", "3", "--gpu-memory", "24GiB"]
    argv += ["--context", str(6144 * 32)]
    code, report = plan(tmp_path, capsys, QWEN25_7B, *argv, "--json")
    assert code == 1 and report["suggestions"]
    for suggestion in report["suggestions"]:
        again = followed(argv, suggestion)
        window = int(again[again.index("--context") + 1])
        assert window % 6 == 0 and window <= 6144 * 32
        assert plan(tmp_path, capsys, QWEN25_7B, *again, "--json")[0] == 0, suggestion


@pytest.mark.parametrize("engine, gpu", [("trl", "24GiB"), ("trl", "40GiB"), ("easyr1", "40GiB")])
def test_shorter_response_is_shorter_and_fits_when_followed(tmp_path, capsys, engine, gpu):
    # issue 50 item 4: the context given beside prompt and response must shrink with them
    argv = ["--engine", engine, "--prompt", "2048", "--response", "16384", "--context", "85536"]
    argv += ["--gpus", "8", "--gpu-memory", gpu]
    code, report = plan(tmp_path, capsys, QWEN25_7B, *argv, "--json")
    assert code == 1
    shorter = [s for s in report["suggestions"] if "shorter" in s]
    assert shorter
    for suggestion in report["suggestions"]:
        again = followed(argv, suggestion)
        assert int(again[again.index("--response") + 1]) <= 16384
        assert int(again[again.index("--context") + 1]) < 85536 or "--context" not in suggestion
        assert plan(tmp_path, capsys, QWEN25_7B, *again, "--json")[0] == 0, suggestion


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"num_key_value_heads": -4}, "num_key_value_heads"),
        ({"num_key_value_heads": 56}, "num_key_value_heads"),  # more than the 28 heads
        ({"num_key_value_heads": 5}, "num_key_value_heads"),  # 28 heads in groups of 5
        ({"num_key_value_heads": "4"}, "num_key_value_heads"),
        ({"head_dim": -128}, "head_dim"),
        ({"head_dim": "128"}, "head_dim"),
        ({"max_position_embeddings": "32768"}, "max_position_embeddings"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"hidden_size": 16}, "head_dim"),  # 3584 // 28 heads derived as 0
        ({"rope_scaling": {"type": "yarn", "factor": "4"}}, "factor"),
    ],
)
def test_bad_config_fields_are_one_line(tmp_path, capsys, changes, field):
    # issue 50 item 5: these gave plans ("fits: yes") or a TypeError traceback
    argv = ["--context", "4096", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = plan(tmp_path, capsys, {**QWEN25_7B, **changes}, *argv)
    assert code == 2 and out.out == ""
    message = out.err.strip()
    assert "\n" not in message and f"config.json: {field}" in message
    assert "allowed" in message or "must" in message


def test_a_config_scaled_as_the_model_card_says_is_not_told_to_scale(tmp_path, capsys):
    # issue 50 item 6: YaRN ×4 over 32768 covers 131072 with max_position_embeddings at 32768
    argv = ["--context", "131072", "--gpus", "8", "--gpu-memory", "140GiB", "--json"]
    code, report = plan(tmp_path, capsys, QWEN25_YARN, *argv)
    assert "rope" not in report
    code, report = plan(tmp_path, capsys, QWEN25_7B, *argv)
    assert "--factor 4 --original-max-position-embeddings 32768" in report["rope"]


def _factor(advice: str) -> tuple[float, int]:
    found = re.search(r"--factor (\S+) --original-max-position-embeddings (\d+)", advice)
    return float(found.group(1)), int(found.group(2))


@pytest.mark.parametrize(
    "config, context, factor",
    [
        (QWEN3_8B, 131072, 4.0),  # issue 53 item 2: 4 over 32768, not 3.2 over 40960
        (QWEN3_128K, 262144, 8.0),  # already ×4: the new factor is over 32768 again
        (QWEN3_128K, 140000, 4.28),  # 140000 / 32768 = 4.272…, rounded up in hundredths
        (QWEN25_YARN, 200000, 6.11),
    ],
)
def test_rope_advice_scales_the_original_context(tmp_path, capsys, config, context, factor):
    argv = ["--context", str(context), "--gpus", "8", "--nodes", "8", "--gpu-memory", "140GiB"]
    code, report = plan(tmp_path, capsys, config, *argv, "--json")
    given, original = _factor(report["rope"])
    assert (given, original) == (factor, 32768)
    # followed, the factor covers the context and never less than the config covered before
    assert given * original >= max(context, config["max_position_embeddings"])


def test_rope_advice_followed_with_yarnlib_config_covers_the_context(tmp_path, capsys):
    argv = ["--context", "140000", "--gpus", "8", "--nodes", "8", "--gpu-memory", "140GiB"]
    code, report = plan(tmp_path, capsys, QWEN3_128K, *argv, "--json")
    command = report["rope"].split("e.g. ")[1].replace("MODEL", str(tmp_path / "model"))
    command = command.replace("DIR", str(tmp_path / "scaled"))
    assert main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    scaled = json.loads((tmp_path / "scaled" / "config.json").read_text())
    assert 140000 <= scaled["max_position_embeddings"] and scaled["max_position_embeddings"] > (
        131072
    )


def test_no_rope_advice_for_a_folder_that_covers_the_context(tmp_path, capsys):
    # issue 53 item 2: 48870 / 40960 gave --factor 1.19312 for a folder extended to 131072
    hand_scaled = {**QWEN3_128K, "max_position_embeddings": 40960}
    argv = ["--context", "48870", "--gpus", "8", "--gpu-memory", "140GiB", "--json"]
    for config in (QWEN3_128K, hand_scaled):
        assert "rope" not in plan(tmp_path, capsys, config, *argv)[1]


def _finetune_command(tmp_path, capsys, config, context):
    argv = ["--engine", "finetune", "--context", str(context), "--gpus", "8"]
    code, report = plan(tmp_path, capsys, config, *argv, "--nodes", "4", "--gpu-memory", "140GiB")
    assert code == 0
    command = report.out.split("# then\n")[1].strip()
    parts = shlex.split(command.replace("--steps STEPS", "--steps 10"))  # the user's own
    parser = argparse.ArgumentParser()
    finetune_arguments(parser)
    return command, parser.parse_args(parts[parts.index("yarnlib.finetune") + 1 :])


def test_finetune_command_names_the_factor(tmp_path, capsys):
    # issue 53 item 13: no `--factor FACTOR` placeholder; the RoPE of the run is the advice's
    command, args = _finetune_command(tmp_path, capsys, QWEN3_8B, 131072)
    assert "FACTOR" not in command
    assert (args.method, args.factor, args.original_max_position_embeddings) == (
        "yarn",
        4.0,
        32768,
    )
    assert args.seq_len == 131072
    # a config that covers the window already trains with its own RoPE
    command, args = _finetune_command(tmp_path, capsys, QWEN25_YARN, 65536)
    assert args.method == "none" and args.factor is None


@pytest.mark.parametrize("text", ["80G", "80g", "80 gigs"])
def test_gpu_memory_unit_errors_name_the_units(tmp_path, capsys, text):
    # issue 50 item 7: "80G" has a unit; name what is accepted instead of "needs a unit"
    argv = ["--context", "4096", "--gpus", "8", "--gpu-memory", text]
    code, out = plan(tmp_path, capsys, QWEN25_7B, *argv)
    message = out.err.strip()
    assert code == 2 and "needs a unit" not in message
    assert "gpu_memory" in message and "GB" in message and "GiB" in message


def test_gpu_memory_as_nvidia_smi_shows_it(tmp_path, capsys):
    argv = ["--context", "4096", "--gpus", "8", "--json", "--gpu-memory"]
    code, report = plan(tmp_path, capsys, QWEN25_7B, *argv, "81559MiB")
    assert report["run"]["gpu_bytes"] == 81559 * 1024**2


def test_python_m_yarnlib_runs_the_same_command(tmp_path, capsys):
    # a plan that does not fit: the output and the exit status 1 come through `python -m`
    argv = ["--context", "4096", "--gpus", "1", "--gpu-memory", "8GiB", "--json"]
    code, in_process = plan(tmp_path, capsys, QWEN25_7B, *argv)
    done = subprocess.run(
        [sys.executable, "-m", "yarnlib", "plan", str(tmp_path / "model"), *argv],
        capture_output=True,
        text=True,
    )
    assert done.returncode == code == 1, done.stderr
    assert json.loads(done.stdout) == in_process
