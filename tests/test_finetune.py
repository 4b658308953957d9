"""Fine-tuning loop on CPU with tiny models: learning, saved config, exact resume, packing,
errors before the first step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from test_finetune_support import char_tokenizer, cyclic_texts, model_dir, text_folder
from tiny_models import config_rope
from transformers import AutoConfig, AutoModelForCausalLM

from yarnlib import RopeScaling
from yarnlib.cli import main as cli_main
from yarnlib.finetune import checkpoint
from yarnlib.finetune.batches import block_causal_mask, micro_batch
from yarnlib.finetune.checks import check_length, check_seq_len
from yarnlib.finetune.cli import check_args, parse_args
from yarnlib.finetune.data import PackedRows, TokenStream, cache_key, labels_for, tokenize
from yarnlib.finetune.loop import train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    AcceleratorState._reset_state(True)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """On 2 cores shared with other jobs, two OpenMP threads ran these steps 20-60x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    return model_dir(root / "model"), text_folder(root / "data", cyclic_texts(60))


def argv_for(setup, tmp_path, *extra: str) -> list[str]:
    model, data = setup
    return [
        "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "run"),
        "--cache-dir", str(tmp_path / "cache"), "--seq-len", "64", "--batch-size", "2",
        "--method", "yarn", "--factor", "2", "--lr", "3e-3", "--warmup-steps", "2",
        "--report-to", "none", "--seed", "1", *extra,
    ]  # fmt: skip


def args_for(setup, tmp_path, *extra: str):
    args = parse_args(argv_for(setup, tmp_path, *extra))
    check_args(args)
    return args


def test_loss_falls_and_saved_model_carries_the_patched_config(setup, tmp_path):
    result = train(args_for(setup, tmp_path, "--steps", "12", "--chunk-size", "16"))
    losses = [result.losses[s] for s in sorted(result.losses)]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 13))
    assert all(r["tokens_per_s"] > 0 and r["memory_gib"] > 0 for r in log)

    saved = AutoConfig.from_pretrained(result.model_dir)
    trained = result.model.config
    assert config_rope(saved) == config_rope(trained)
    assert config_rope(saved)["rope_type"] == "yarn"
    assert RopeScaling.from_hf(saved) == RopeScaling(
        method="yarn", factor=2, original_max_position_embeddings=256, rope_theta=50000.0,
        rotary_dim=16,
    )  # fmt: skip
    reloaded = AutoModelForCausalLM.from_pretrained(result.model_dir, attn_implementation="sdpa")
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 8, 9]])
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, result.model(ids).logits)


KILLED_RUN = """
import sys, time
from yarnlib.finetune import logs
from yarnlib.finetune.__main__ import main

write = logs.JsonlLog.write


def write_then_hang(self, record):
    write(self, record)
    if record["step"] == 5:
        time.sleep(600)  # the test kills the process here, two steps past its checkpoint


logs.JsonlLog.write = write_then_hang
sys.exit(main(sys.argv[1:]))
"""


def test_kill_and_resume_gives_the_same_losses(setup, tmp_path):
    common = ("--steps", "6", "--grad-accum", "2", "--chunk-size", "24")
    straight = train(args_for(setup, tmp_path / "a", *common))
    AcceleratorState._reset_state(True)

    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    argv = argv_for(setup, tmp_path / "b", *common, "--save-every", "3")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    run = tmp_path / "b" / "run"
    process = subprocess.Popen([sys.executable, str(script), *argv], env=env)
    try:
        deadline = time.monotonic() + 300
        while '"step": 5' not in _text(run / "log.jsonl"):
            assert process.poll() is None and time.monotonic() < deadline, (
                "run did not reach step 5"
            )
            time.sleep(0.5)
    finally:
        process.kill()  # SIGKILL: no cleanup, as on a preempted node
        process.wait()
    assert (run / "checkpoints" / "step-000003").is_dir()
    assert not (run / "checkpoints" / "step-000006").exists()
    (run / "checkpoints" / "step-000005.tmp").mkdir()  # as if killed while saving

    resumed = train(args_for(setup, tmp_path / "b", *common, "--resume", "latest"))
    assert sorted(resumed.losses) == [4, 5, 6]
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]  # the killed run's 4 and 5 dropped
    for record in log:
        assert abs(record["loss"] - straight.losses[record["step"]]) <= 1e-6, (log, straight)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def test_resume_refuses_other_data_or_settings_and_a_fresh_run_old_checkpoints(setup, tmp_path):
    train(args_for(setup, tmp_path, "--steps", "2", "--save-every", "1", "--stop-after", "1"))
    AcceleratorState._reset_state(True)
    changed = args_for(setup, tmp_path, "--steps", "2", "--batch-size", "3", "--resume", "latest")
    with pytest.raises(ValueError, match="global_batch"):
        train(changed)
    AcceleratorState._reset_state(True)
    # the yarn:2 checkpoint resumed as pi (= linear):4 with another lr names every change
    other = ("--method", "pi", "--factor", "4", "--lr", "1e-3", "--resume", "latest")
    with pytest.raises(ValueError) as error:
        train(args_for(setup, tmp_path, "--steps", "2", *other))
    assert (
        "step-000001 was written by another run (method: checkpoint 'yarn', now 'linear'; "
        "factor: checkpoint 2.0, now 4.0; lr: checkpoint 0.003, now 0.001)" in str(error.value)
    )
    AcceleratorState._reset_state(True)
    with pytest.raises(
        ValueError, match=r"holds an earlier run \(checkpoints/\); allowed: --resume"
    ):
        train(args_for(setup, tmp_path, "--steps", "2"))
    AcceleratorState._reset_state(True)
    train(args_for(setup, tmp_path, "--steps", "1", "--overwrite"))
    # the earlier run's checkpoints are gone: they would pass for this run's "latest"
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ValueError, match="overwrite: --overwrite starts a new run, --resume"):
        args_for(setup, tmp_path, "--steps", "1", "--overwrite", "--resume", "latest")


def test_a_finished_run_is_replaced_only_with_overwrite(setup, tmp_path):
    model = tmp_path / "run" / "model"
    train(args_for(setup, tmp_path, "--steps", "1", "--warmup-steps", "0"))
    saved = {p.name: p.read_bytes() for p in model.iterdir()}
    AcceleratorState._reset_state(True)
    with pytest.raises(
        ValueError, match=r"holds an earlier run \(model/\); allowed: --overwrite to replace it,"
    ):
        train(args_for(setup, tmp_path, "--steps", "1", "--seed", "2"))
    assert {p.name: p.read_bytes() for p in model.iterdir()} == saved
    AcceleratorState._reset_state(True)
    again = ("--steps", "1", "--warmup-steps", "0", "--seed", "2", "--overwrite")
    second = train(args_for(setup, tmp_path, *again))
    reloaded = AutoModelForCausalLM.from_pretrained(model).state_dict()
    for name, value in second.model.state_dict().items():
        torch.testing.assert_close(reloaded[name], value, atol=0, rtol=0)
    assert (model / "model.safetensors").read_bytes() != saved["model.safetensors"]
    assert not model.with_name("model.tmp").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="output: .*file is a file; allowed: a new or existing"):
        checkpoint.check_new_run(tmp_path / "file", overwrite=True)


def stream_of(docs: list[list[int]]) -> TokenStream:
    lengths = torch.tensor([len(d) for d in docs])
    tokens = torch.tensor([t for d in docs for t in d], dtype=torch.int32)
    return TokenStream(tokens, torch.cumsum(lengths, 0) - lengths, "test")


def test_packing_positions_labels_and_mask_never_cross_documents():
    # documents (EOS = 1 ends each): 5, 3, 9 and 4 tokens → rows of 8 tokens
    docs = [[2, 3, 4, 5, 1], [6, 7, 1], [8, 9, 10, 11, 12, 13, 14, 15, 1], [16, 17, 18, 1]]
    rows = PackedRows(stream_of(docs), 8)
    assert len(rows) == 2  # 21 tokens: the last 5 do not fill a row
    index = torch.tensor([0, 1])
    ids, pos = rows.input_ids(index), rows.position_ids(index)
    assert ids.tolist() == [[2, 3, 4, 5, 1, 6, 7, 1], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]]
    labels = labels_for(ids, pos)
    assert labels[0].tolist() == [3, 4, 5, 1, -100, 7, 1, -100]  # no EOS → next document
    mask = block_causal_mask(pos)[0, 0]
    document = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    for i in range(8):
        for j in range(8):
            assert bool(mask[i, j]) == (j <= i and document[i] == document[j])
    # a row starting mid-document restarts its positions (flash-attn varlen finds starts at 0)
    shifted = PackedRows(stream_of([[2] * 11 + [1], [3, 1], [4, 1]]), 5)
    assert shifted.position_ids(torch.tensor([1, 2])).tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_documents_see_nothing_of_their_neighbours(attn):
    """Each document inside a packed row gives exactly the logits it gives alone."""
    from tiny_models import tiny_model

    model = tiny_model("llama", attn_implementation=attn)
    docs = [[5, 6, 7, 8, 9, 1], [20, 21, 22, 1], [30, 31, 32, 33, 34, 35, 36, 1]]
    rows = PackedRows(stream_of(docs), 18)
    inputs, labels = micro_batch(rows, torch.tensor([0]), False, attn)
    with torch.no_grad():
        packed = model(**inputs).logits[0]
        start = 0
        for doc in docs:
            alone = model(input_ids=torch.tensor([doc])).logits[0]
            torch.testing.assert_close(packed[start : start + len(doc)], alone)
            start += len(doc)
    flat, flat_labels = micro_batch(rows, torch.tensor([0]), False, "flash_attention_2")
    assert set(flat) == {"input_ids", "position_ids"} and flat["input_ids"].shape == (1, 18)
    assert torch.equal(flat_labels, labels)


def test_flash_gets_positions_restarting_at_each_document():
    """The flash-attention path has no mask: the documents of 6, 4 and 8 tokens are told
    apart only by their position ids, and transformers' own packing helpers must find the
    documents' boundaries (cu_seqlens) from them."""
    from transformers import modeling_flash_attention_utils as fa

    docs = [[5, 6, 7, 8, 9, 1], [20, 21, 22, 1], [30, 31, 32, 33, 34, 35, 36, 1]]
    rows = PackedRows(stream_of(docs), 18)
    flat, _ = micro_batch(rows, torch.tensor([0]), False, "flash_attention_2")
    positions = flat["position_ids"]
    assert positions.tolist() == [[*range(6), *range(4), *range(8)]]
    assert fa._is_packed_sequence(positions, batch_size=1)
    (cu_seqlens, _), (longest, _) = fa.prepare_fa_kwargs_from_position_ids(positions)
    assert cu_seqlens.tolist() == [0, 6, 10, 18] and int(longest) == 8


def test_tokenize_caches_on_disk(tmp_path):
    data = text_folder(tmp_path / "data", ["abc", "de"])
    first = tokenize([str(data)], char_tokenizer(), tmp_path / "cache", show_progress=False)
    assert first.tokens.tolist() == [2, 3, 4, 1, 5, 6, 1] and first.doc_starts.tolist() == [0, 4]
    assert len(list((tmp_path / "cache").glob("tokens-*.pt"))) == 1
    again = tokenize([str(data)], char_tokenizer(), tmp_path / "cache", show_progress=False)
    assert again.key == first.key and torch.equal(again.tokens, first.tokens)


class PlantedCode:
    def __reduce__(self):  # unpickling it runs os.mkdir(marker)
        return os.mkdir, (self.marker,)


def test_a_planted_token_cache_never_runs_code(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch < 2.6's default
    data, tokenizer = text_folder(tmp_path / "data", ["abc"]), char_tokenizer()
    planted = PlantedCode()
    planted.marker = str(tmp_path / "code-ran")
    cache = (
        tmp_path / "cache" / f"tokens-{cache_key([str(data)], tokenizer, 'text', 'train', None)}.pt"
    )
    cache.parent.mkdir()
    torch.save({"tokens": planted, "doc_starts": torch.zeros(1)}, cache)
    with pytest.raises(ValueError, match=f"cache: {cache} is not a token cache yarnlib wrote"):
        tokenize([str(data)], tokenizer, tmp_path / "cache", show_progress=False)
    assert not (tmp_path / "code-ran").exists()


def test_errors_before_the_first_step(setup, tmp_path):
    with pytest.raises(ValueError, match="seq_len: 100 is not a multiple of 8"):
        check_seq_len(100, cp_size=4)
    spec = RopeScaling(method="yarn", factor=2, original_max_position_embeddings=256, rotary_dim=16)
    with pytest.warns(UserWarning, match="exceeds original_max_position_embeddings"):
        check_length(1024, spec)
    small = args_for(setup, tmp_path, "--steps", "1", "--seq-len", "512", "--batch-size", "64")
    with pytest.raises(ValueError, match="fewer than one global batch"):
        train(small)
    with pytest.raises(ValueError, match="factor: required"):
        check_args(parse_args(["--model", "m", "--dataset", "d", "--output", "o",
                               "--seq-len", "8", "--steps", "1"]))  # fmt: skip
    model, data = setup
    argv = ["finetune", "--model", str(model), "--dataset", str(data), "--output",
            str(tmp_path / "x"), "--seq-len", "64", "--steps", "1", "--method", "bogus",
            "--factor", "2", "--report-to", "none"]  # fmt: skip
    assert cli_main(argv) == 2


def test_checkpoint_latest_skips_unfinished(tmp_path):
    for name in ("step-000002", "step-000010", "step-000011.tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert checkpoint.resolve_resume("latest", tmp_path).name == "step-000010"
    with pytest.raises(ValueError, match="resume"):
        checkpoint.resolve_resume("latest", tmp_path / "nothing")


@pytest.mark.parametrize("record", ["[1, 2]", "null", "{not json", None])
def test_a_run_record_that_is_not_an_object_is_refused_in_one_line(tmp_path, record):
    if record is not None:
        (tmp_path / checkpoint.RUN_FILE).write_text(record)
    with pytest.raises(ValueError, match="resume: cannot read .*run.json"):
        checkpoint.check_same_run(tmp_path, {"method": "yarn"})


EXAMPLES = sorted((REPO / "examples" / "finetune").glob("*.yaml"))


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.stem)
def test_example_accelerate_configs_pass_the_launcher(config):
    """Each example resolves under `accelerate launch` (no GPU needed to check the config)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    argv = ["--config_file", str(config), "-m", "yarnlib.finetune"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    # the GPU examples train in bf16; the CPU one in float32 (bf16 is slow on most CPUs)
    assert args.num_processes >= 1
    assert args.mixed_precision == ("no" if config.stem.endswith("_cpu") else "bf16")
    if args.use_fsdp:
        env = prepare_multi_gpu_env(args)
        assert env["FSDP_VERSION"] == "2"
        if config.stem.startswith("context_parallel"):
            assert env["PARALLELISM_CONFIG_CP_SIZE"] == "8"


def test_lora_trains_adapters_and_saves_a_merged_patched_model(setup, tmp_path):
    extra = ("--steps", "2", "--lora", "--lora-rank", "4", "--method", "linear")
    result = train(args_for(setup, tmp_path, *extra))
    saved = AutoConfig.from_pretrained(result.model_dir)
    assert config_rope(saved)["rope_type"] == "linear" and config_rope(saved)["factor"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(result.model_dir)
    names = [n for n, _ in reloaded.named_parameters()]
    assert not any("lora" in n for n in names)
    base = AutoModelForCausalLM.from_pretrained(setup[0])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(reloaded.state_dict()[q], base.state_dict()[q])  # adapter merged
    mlp = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(reloaded.state_dict()[mlp], base.state_dict()[mlp])  # not a target


def test_the_oldest_checkpoints_go_and_a_step_saved_again_replaces_its_checkpoint(setup, tmp_path):
    """--keep-checkpoints 2 keeps the two newest; resuming from an earlier checkpoint saves the
    later step again, over the folder the first pass left (issue 52, mutation round)."""
    common = ("--steps", "3", "--save-every", "1", "--warmup-steps", "0")
    first = train(args_for(setup, tmp_path, *common))
    folder = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000002", "step-000003"]
    AcceleratorState._reset_state(True)
    resumed = train(args_for(setup, tmp_path, *common, "--resume", str(folder / "step-000002")))
    assert sorted(resumed.losses) == [3] and abs(resumed.losses[3] - first.losses[3]) <= 1e-6
    assert sorted(p.name for p in folder.iterdir()) == ["step-000002", "step-000003"]


def test_a_run_resumed_with_its_model_named_another_way_is_the_same_run(
    setup, tmp_path, monkeypatch
):
    """run.json pins the model folder, not the spelling: a resume naming it relatively or
    through a link is the same run."""
    model, _ = setup
    train(args_for(setup, tmp_path, "--steps", "2", "--save-every", "1", "--stop-after", "1"))
    (tmp_path / "link").symlink_to(model, target_is_directory=True)
    monkeypatch.chdir(model.parent)
    for name in (model.name, str(tmp_path / "link")):
        AcceleratorState._reset_state(True)
        argv = argv_for(setup, tmp_path, "--steps", "2", "--resume", "latest")
        argv[argv.index(str(model))] = name
        args = parse_args(argv)
        check_args(args)
        assert sorted(train(args).losses) == [2], name
