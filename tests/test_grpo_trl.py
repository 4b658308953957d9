"""GRPO end to end with TRL: 2 steps of examples/grpo_knights_knaves.py on a tiny model whose
prompts are ~3x its original context (L = 256), rollouts in vLLM, and the log-prob gap
between rollout and actor; plus yarnlib.integrations.trl.apply's refusals and the puzzles."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from yarnlib import RopeScaling
from yarnlib.integrations import knights_knaves as kk

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "grpo_knights_knaves.py"
ORIGINAL = 256
TOLERANCE = {"max_abs": 1e-3, "mean_abs": 1e-4}


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("grpo") / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    # lr 1e-3 and a reward that never ties: step 1 really changes the weights, so step 2's
    # rollout agrees with the actor only if the new weights reached the engine.
    argv = ["--model", "tiny", "--steps", "2", "--extra-reward", "smoke"]
    argv += ["--learning-rate", "1e-3", "--output", str(out)]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *argv], env=env, capture_output=True, text=True, timeout=900
    )
    path = out / "summary.json"
    if proc.returncode or not path.exists():
        raise AssertionError(f"example failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(path.read_text())


def test_two_steps_ran_beyond_the_original_context(summary):
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    for step in summary["steps"]:
        # ~3x L prompts: every completion token sits beyond L
        assert min(step["prompt_tokens"]) > 2.5 * ORIGINAL
        assert sum(step["completion_tokens"]) > 0
        assert step["rollout_seconds"] > 0 and step["tokens_per_second"] > 0
    assert summary["max_model_len"] <= ORIGINAL * 4


@pytest.mark.parametrize("step", [0, 1])
def test_rollout_matches_actor_with_yarnlib(summary, step):
    record = summary["steps"][step]
    gap = record["gap"]
    for part in ("within", "beyond"):
        assert gap[part]["tokens"] > 0
        for key, limit in TOLERANCE.items():
            assert gap[part][key] <= limit, (step, part, gap)
    # every token after a sequence's first is scored once: positions 1..L-1 within, the rest
    # (all longer than L) beyond
    sequences = len(record["prompt_tokens"])
    scored = sum(record["prompt_tokens"]) + sum(record["completion_tokens"]) - sequences
    assert gap["within"]["tokens"] == sequences * (ORIGINAL - 1)
    assert gap["within"]["tokens"] + gap["beyond"]["tokens"] == scored


def test_gap_splits_at_the_original_context():
    """|Δ| of the tokens at positions 1..8 is 1..8: with L = 4, positions 1..3 are within
    (max 3, mean 2) and 4..8 beyond (max 8, mean 6), the token at L counted once."""
    import torch

    from yarnlib.integrations.logprob_gap import gap

    got = gap([[0.0] * 8], [torch.arange(1, 9, dtype=torch.float32)], original=4)
    assert got["within"] == {"tokens": 3, "max_abs": 3.0, "mean_abs": 2.0}
    assert got["beyond"] == {"tokens": 5, "max_abs": 8.0, "mean_abs": 6.0}


def test_mistaken_setups_are_far_outside(summary):
    table = summary["gap_table"]
    assert len(table) == 3
    for name, row in table.items():
        if name.startswith("yarnlib"):
            continue
        assert row["beyond"]["max_abs"] > 100 * TOLERANCE["max_abs"], (name, row)
        assert row["beyond"]["mean_abs"] > 100 * TOLERANCE["mean_abs"], (name, row)


# -- apply(): refusals before any model loads, and what it writes ---------------------------------


@pytest.fixture
def model_dir(tmp_path):
    from tiny_models import tiny_config

    folder = tmp_path / "tiny"
    tiny_config("llama", rope_theta=100000.0).save_pretrained(folder)
    return folder


def spec(method="yarn"):
    return RopeScaling(method, 4.0, ORIGINAL, rope_theta=100000.0, rotary_dim=16)


def test_apply_writes_scaled_folder_and_lengths(model_dir, tmp_path):
    from trl import GRPOConfig

    from yarnlib.integrations import trl as yarnlib_trl

    args = GRPOConfig(output_dir=str(tmp_path / "t"), use_cpu=True, max_completion_length=64)
    path, new = yarnlib_trl.apply(
        model_dir, spec(), args, output=tmp_path / "scaled", max_prompt_length=800
    )
    assert new is not args and args.vllm_max_model_length is None
    assert new.vllm_max_model_length == 864
    config = json.loads((Path(path) / "config.json").read_text())
    assert RopeScaling.from_hf(config) == spec()
    assert config["max_position_embeddings"] == 4 * ORIGINAL
    assert yarnlib_trl.server_command(path, new).endswith(f"{path} --max-model-len 864")


@pytest.mark.parametrize(
    "case, pattern",
    [
        (
            "too long",
            r"max_prompt_length \+ args.max_completion_length = 1000 \+ 64 = 1064 exceeds",
        ),
        ("dynamic", r"method 'dynamic_yarn'.*use a static method"),
        ("no config", r"model: .* is not a model folder with config.json"),
    ],
)
def test_apply_refuses_before_writing(model_dir, tmp_path, case, pattern):
    from yarnlib.integrations import trl as yarnlib_trl

    kwargs = dict(output_dir=str(tmp_path / "t"), use_cpu=True, max_completion_length=64)
    prompt, method, folder = 800, "yarn", model_dir
    if case == "too long":
        prompt = 1000
    elif case == "dynamic":
        method, kwargs["use_vllm"] = "dynamic_yarn", True
    else:
        folder = tmp_path / "empty"
        folder.mkdir()
    with pytest.raises(ValueError, match=pattern):
        yarnlib_trl.apply(
            folder, spec(method), kwargs, output=tmp_path / "out", max_prompt_length=prompt
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "prompt, completion, max_model_len, refused",
    [
        (960, 64, None, None),  # prompt + completion = L × s: accepted
        (961, 64, None, r"= 1025 exceeds"),
        (800, 64, 864, None),  # vllm_max_model_length = prompt + completion
        (800, 64, 863, r"must be in 864\.\.1024"),
        (800, 64, 1024, None),  # = L × s
        (800, 64, 1025, r"must be in 864\.\.1024"),
    ],
)
def test_apply_lengths_at_the_boundaries(
    model_dir, tmp_path, prompt, completion, max_model_len, refused
):
    from yarnlib.integrations import trl as yarnlib_trl

    kwargs = dict(output_dir=str(tmp_path / "t"), use_cpu=True, max_completion_length=completion)
    kwargs["vllm_max_model_length"] = max_model_len
    out = tmp_path / "out"
    if refused:
        with pytest.raises(ValueError, match=refused):
            yarnlib_trl.apply(model_dir, spec(), kwargs, output=out, max_prompt_length=prompt)
        assert not out.exists()
        return
    _, args = yarnlib_trl.apply(model_dir, spec(), kwargs, output=out, max_prompt_length=prompt)
    assert args.vllm_max_model_length == (max_model_len or prompt + completion)


def test_rollout_refuses_dynamic_methods():
    from yarnlib.integrations.trl_rollout import VLLMRollout

    with pytest.raises(ValueError, match="dynamic_ntk"):
        VLLMRollout("unused", spec("dynamic_ntk"), 1024)


# -- the puzzles and the reward --------------------------------------------------------------------


def as_python(sentence: str, names) -> str:
    """The rendered English statement as a Python expression over the names (a second path)."""
    expr = sentence.rstrip(".")
    expr = re.sub(r"^If (.*), then (.*)$", r"(not (\1)) or (\2)", expr)
    expr = expr.replace(" if and only if ", " == ")
    expr = re.sub(r"(\w+) is a knight", r"(\1)", expr)
    return re.sub(r"(\w+) is a knave", r"(not \1)", expr)


def test_puzzles_have_one_solution_that_fits_the_text():
    puzzles = kk.make_puzzles(20, seed=3)
    assert {len(p.names) for p in puzzles} == {2, 3, 4, 5}
    assert kk.make_puzzles(20, seed=3) == puzzles  # seeded
    for puzzle in puzzles:
        assert kk.consistent_worlds(list(puzzle.statements)) == [puzzle.knights]
        world = dict(zip(puzzle.names, puzzle.knights, strict=True))
        said = re.findall(r'^(\w+) says: "(.*)"$', puzzle.text(), re.M)
        for name, sentence in said:
            assert eval(as_python(sentence, puzzle.names), {}, world) == world[name], sentence


def test_reward_scores_like_logic_rl():
    puzzle = kk.make_puzzles(1, seed=0)[0]
    names, truth = [list(puzzle.names)], [list(puzzle.knights)]
    right = f"<think>ok</think><answer>{puzzle.solution_text()}</answer>"
    flipped = right.replace("knight", "KN").replace("knave", "knight").replace("KN", "knave")
    missing = f"<think>ok</think><answer>{puzzle.names[0]} is a knight</answer>"
    cases = {right: (1, 2), flipped: (1, -1.5), missing: (1, -2), puzzle.solution_text(): (-1, -2)}
    for completion, (fmt, answer) in cases.items():
        assert kk.format_reward([completion]) == [fmt], completion
        assert kk.answer_reward([completion], names, truth) == [answer], completion
