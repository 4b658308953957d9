"""``yarnlib finetune --pose``: one step against a step written in plain transformers + torch
with the same explicit position ids, exact resume, LoRA + bf16, flash-attn's sequence starts,
and bad input in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState
from test_finetune import fresh_accelerate_state, one_thread  # noqa: F401 (autouse fixtures)
from test_finetune_support import cyclic_texts, model_dir, text_folder
from tiny_models import config_rope, native_rope_keys
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import flash_attention_mask
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from yarnlib import RopeScaling, pose_position_ids
from yarnlib.cli import main as cli_main
from yarnlib.finetune.batches import micro_batch
from yarnlib.finetune.cli import check_args, parse_args
from yarnlib.finetune.data import PackedRows, tokenize
from yarnlib.finetune.loop import step_rows, train

SEQ, BATCH, TARGET, SEED, LR = 32, 2, 512, 3, 1e-3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pose")
    return model_dir(root / "model"), text_folder(root / "data", cyclic_texts(30))


def argv_for(setup, tmp_path, *extra: str) -> list[str]:
    model, data = setup
    return [
        "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "run"),
        "--cache-dir", str(tmp_path / "cache"), "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--lr", str(LR), "--warmup-steps", "0", "--report-to",
        "none", "--seed", str(SEED), "--pose", "--target-length", str(TARGET), *extra,
    ]  # fmt: skip


def run(setup, tmp_path, *extra: str):
    args = parse_args(argv_for(setup, tmp_path, *extra))
    check_args(args)
    return train(args)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def reference_step(setup, tmp_path, cross_document: bool) -> tuple[float, torch.Tensor]:
    """One AdamW step written out by hand on an unpatched model whose config runs YaRN ×2
    natively, with the PoSE ids passed explicitly and the mask built here (full causal, or
    block-causal per document with positions counted from each document's first token)."""
    model, data = setup
    stream = tokenize([str(data)], _tokenizer(model), tmp_path / "ref-cache", show_progress=False)
    rows = PackedRows(stream, SEQ)
    chosen = step_rows(0, BATCH, len(rows), SEED)
    ids = rows.input_ids(chosen)
    generator = torch.Generator().manual_seed(SEED * 2**32)
    pose = pose_position_ids(BATCH, SEQ, TARGET, 2, generator=generator).position_ids
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    labels = ids[:, 1:].clone()
    if cross_document:
        positions, allowed = pose, causal.expand(BATCH, SEQ, SEQ)
    else:
        starts = rows.position_ids(chosen) == 0
        positions, document = pose.clone(), torch.zeros_like(pose)
        for b in range(BATCH):
            for t in range(SEQ):
                if starts[b, t]:
                    base = int(pose[b, t])
                document[b, t] = int(starts[b, : t + 1].sum())
                positions[b, t] = pose[b, t] - base
        allowed = causal & (document[:, :, None] == document[:, None, :])
        labels[starts[:, 1:]] = -100  # a document's last token does not predict the next one
    spec = RopeScaling("yarn", factor=TARGET / 256, original_max_position_embeddings=256,
                       rope_theta=50000.0, rotary_dim=16)  # fmt: skip
    config = AutoConfig.from_pretrained(model, **native_rope_keys(spec))
    ref = AutoModelForCausalLM.from_pretrained(model, config=config, attn_implementation="sdpa")
    ref.train()
    logits = ref(input_ids=ids, position_ids=positions, attention_mask=allowed[:, None]).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0).step()
    return loss.item(), flat(ref)


def _tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@pytest.mark.parametrize(
    ("cross_document", "extra"),
    [
        (True, ()),
        (False, ("--no-cross-document-attention",)),
        # the dynamic method scales to the target (s = 512/256), not to a row's largest position
        (True, ("--method", "dynamic_yarn", "--use-kernel", "true")),
    ],
)
def test_one_pose_step_equals_a_plain_transformers_step(setup, tmp_path, cross_document, extra):
    ours = run(setup, tmp_path, "--steps", "1", "--chunk-size", "8", *extra)
    loss, weights = reference_step(setup, tmp_path, cross_document)
    assert ours.losses[1] == pytest.approx(loss, rel=1e-5)
    torch.testing.assert_close(flat(ours.model), weights, rtol=0, atol=2e-6)
    saved = AutoConfig.from_pretrained(ours.model_dir)
    assert RopeScaling.from_hf(saved).factor == TARGET / 256  # the saved model's config is at N
    if "dynamic_yarn" not in extra:  # dynamic configs keep the original length, as in HF
        assert saved.max_position_embeddings == TARGET


@pytest.mark.parametrize("lora", [(), ("--lora", "--lora-rank", "4")])
def test_resume_mid_run_equals_an_uninterrupted_run(setup, tmp_path, lora):
    """LoRA checkpoints hold the adapter only; the frozen base comes from --model."""
    common = ("--steps", "4", "--grad-accum", "2", "--pose-chunks", "3", *lora)
    straight = run(setup, tmp_path / "a", *common)
    AcceleratorState._reset_state(True)
    first = run(setup, tmp_path / "b", *common, "--save-every", "2", "--stop-after", "2")
    assert first.model_dir is None
    saved = sum(f.stat().st_size for f in (tmp_path / "b" / "run").glob("checkpoints/*/model*"))
    assert (saved < 100_000) == bool(lora)  # the tiny model's full weights are ~170 kB
    AcceleratorState._reset_state(True)
    resumed = run(setup, tmp_path / "b", *common, "--resume", "latest")
    assert {**first.losses, **resumed.losses} == pytest.approx(straight.losses, rel=1e-6)
    torch.testing.assert_close(flat(resumed.model), flat(straight.model), rtol=0, atol=1e-6)
    AcceleratorState._reset_state(True)
    with pytest.raises(ValueError, match="pose"):  # another target is another run
        run(setup, tmp_path / "b", "--steps", "4", "--grad-accum", "2", "--pose-chunks", "2",
            "--resume", "latest")  # fmt: skip


def test_lora_in_bf16_saves_the_adapter_and_a_model_at_the_target(setup, tmp_path):
    from peft import PeftModel

    result = run(setup, tmp_path, "--steps", "2", "--lora", "--lora-rank", "4",
                 "--mixed-precision", "bf16", "--lr", "1e-2")  # fmt: skip
    assert all(torch.isfinite(torch.tensor(v)) for v in result.losses.values())
    adapter = tmp_path / "run" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    saved = AutoConfig.from_pretrained(result.model_dir)
    assert config_rope(saved)["rope_type"] == "yarn" and saved.max_position_embeddings == TARGET
    # the base model with the saved config, plus the adapter, is the merged model
    base = AutoModelForCausalLM.from_pretrained(setup[0], config=saved)
    rebuilt = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    merged = AutoModelForCausalLM.from_pretrained(result.model_dir)
    torch.testing.assert_close(flat(rebuilt), flat(merged))
    assert not torch.equal(flat(merged), flat(AutoModelForCausalLM.from_pretrained(setup[0])))


def test_flash_attention_sees_starts_only_at_rows_and_documents():
    """transformers hands flash-attn's varlen kernel ``cu_seqlens`` found where positions are
    at their minimum: with PoSE ids those are the row and document starts, never a skip."""
    tokens = torch.arange(2, 26, dtype=torch.int32)
    tokens[[6, 17]] = 1  # EOS: documents start at stream offsets 0, 7 and 18
    from yarnlib.finetune.data import TokenStream

    data = PackedRows(TokenStream(tokens, torch.tensor([0, 7, 18]), "k"), 12)
    pose = pose_position_ids(2, 12, 400, 4, generator=torch.Generator().manual_seed(0))
    inputs, _ = micro_batch(data, torch.tensor([0, 1]), False, "flash_attention_2",
                            pose=pose.position_ids)  # fmt: skip
    cu_seqlens = prepare_fa_kwargs_from_position_ids(inputs["position_ids"])[0][0]
    assert cu_seqlens.tolist() == [0, 7, 12, 18, 24]  # documents, and the second row's start
    # with cross-document attention: one sequence per row, whatever the skips
    inputs, _ = micro_batch(data, torch.tensor([0]), True, "flash_attention_2",
                            pose=pose.position_ids[:1])  # fmt: skip
    assert flash_attention_mask(1, 12, 12, attention_mask=inputs["attention_mask"].bool()) is None
    cu_seqlens = prepare_fa_kwargs_from_position_ids(inputs["position_ids"])[0][0]
    assert cu_seqlens.tolist() == [0, 12]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (("--target-length", str(SEQ)), "target_length"),  # N ≤ window
        (("--target-length", "512", "--pose-chunks", "0"), "pose_chunks"),
        (("--target-length", "512", "--pose-chunks", str(SEQ + 1)), "pose_chunks"),
        (("--target-length", "1024", "--factor", "2"), "factor"),  # 2 × 256 < 1024
        ((), "target_length"),  # --pose without a target
    ],
)
def test_bad_pose_input_gets_one_line(setup, tmp_path, capsys, extra, field):
    model, data = setup
    code = cli_main([
        "finetune", "--model", str(model), "--dataset", str(data), "--output",
        str(tmp_path / "run"), "--seq-len", str(SEQ), "--steps", "1", "--report-to", "none",
        "--pose", *extra,
    ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"yarnlib finetune: error: {field}")
    assert not (tmp_path / "run").exists()


def test_a_target_below_the_original_context_names_the_target(setup, tmp_path, capsys):
    """PoSE's default factor is target / original: a target below the model's L=256 is the
    user's --target-length, not a factor below 1 they never gave (issue 52 D6)."""
    model, data = setup
    code = cli_main([
        "finetune", "--model", str(model), "--dataset", str(data), "--output",
        str(tmp_path / "run"), "--seq-len", str(SEQ), "--steps", "1", "--report-to", "none",
        "--pose", "--target-length", "128",
    ])  # fmt: skip
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err.startswith("yarnlib finetune: error: target_length: ")
    assert "--target-length 128 is below the model's original context of 256 tokens" in err
    assert "factor" not in err.split(";")[0] and not (tmp_path / "run").exists()
