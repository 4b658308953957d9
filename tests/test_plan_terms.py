"""Terms of `yarnlib plan` that a slip in one factor would change without any other test
noticing, each against a hand formula written out here (issue 52): ring attention's K and V
gathered in the attention's backward with context parallelism, the MLP's share of vLLM's
tensor-parallel rule, and the loss head over a sequence shorter than a loss chunk."""

from pathlib import Path

import pytest
import torch
from loss_peak import loss_peak
from ms_swift import run_with_swift
from test_plan import QWEN3_8B, QWEN25_7B
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from yarnlib.plan import memory, parallel, planner
from yarnlib.plan.shapes import shape_from_config

GIB = 1024**3
HEAD = "loss head (logits, log-softmax, grads)"
LAYER = "layer recompute + backward"


def _qwen3_layer_bytes_per_token() -> int:
    """Qwen3-8B, bf16 layers under FSDP: what one recomputed decoder layer keeps per token."""
    h, q, k, i, n, kv = 4096, 32 * 128, 8 * 128, 12288, 32, 8
    norms = 2 * (4 + 2 + 2) * h  # float32 input, bf16 normalised copy and output, two norms
    attention = 2 * (2 * q + 2 * k) + 4 * n  # q, k, v, output in bf16; float32 logsumexp
    qk_norm = (4 + 2) * (q + k) + 4 * (n + kv)  # float32 q and k, bf16 normalised, rsqrt
    mlp = 4 * 2 * i  # gate, silu(gate), up, product
    return norms + attention + qk_norm + mlp + 2 * 4


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_gathers_k_and_v_after_the_mlp_backward(cp):
    """torch's ring (all-gather rotation) gathers K and V of the whole sequence in the
    attention's backward, after the checkpoint's recomputed MLP tensors have been handed to
    their backward and freed: for Qwen3-8B the MLP's backward stays the layer's peak."""
    shape = shape_from_config(QWEN3_8B)
    context = 131072
    setup = planner.Setup(shape, "finetune", context, 8, 1, 140 * GIB, cp=cp)
    tokens = context // cp
    layer = _qwen3_layer_bytes_per_token() * tokens
    transient = (2 * 12288 * 2 + 2 * 4096 * 2) * tokens  # mul backward + bf16 residual grads
    plan = planner.evaluate(setup, sp=1, cp=cp, tp=1, offload="none")
    assert plan.lines[LAYER] == layer + transient
    # a second path: the same local tokens without context parallel
    alone = planner.evaluate(planner.replace(setup, context=tokens, cp=1), 1, 1, 1, "none")
    assert plan.lines[LAYER] == alone.lines[LAYER]


def test_ring_attention_backward_is_the_peak_of_a_narrow_mlp():
    # Qwen3-8B's attention with an MLP of 1024: at cp 8 the attention's backward is the peak
    shape = shape_from_config({**QWEN3_8B, "intermediate_size": 1024})
    context, cp = 131072, 8
    tokens = context // cp
    h, q, k, i = 4096, 32 * 128, 8 * 128, 1024
    setup = planner.Setup(shape, "finetune", context, 8, 1, 140 * GIB, cp=cp)
    plan = planner.evaluate(setup, sp=1, cp=cp, tp=1, offload="none")
    layer = (_qwen3_layer_bytes_per_token() - 4 * 2 * 12288 + 4 * 2 * i) * tokens
    # K and V of all 131072 tokens gathered once (bf16); per local token: two bf16 residual
    # grads, the attention output's grad, float32 accumulators of the q, k, v grads and one
    # ring step's bf16 grads, the kernel's float32 dq and its K and V grads at 32 heads (8 kv
    # heads: grouped-query), the float32 K and V grads sent and received; minus the MLP's four
    # tensors, the second norm's three and its rsqrt, freed
    gathered = 2 * context * k * 2
    ring = (2 * h * 2 + 2 * q + (4 + 2) * (q + 2 * k) + 4 * q + 2 * 2 * q + 2 * 2 * k * 4) * tokens
    freed = (4 * 2 * i + (4 + 2 + 2) * h + 4) * tokens
    mlp = (2 * i * 2 + 2 * h * 2) * tokens
    assert gathered + ring - freed > mlp
    assert plan.lines[LAYER] == layer + gathered + ring - freed


def test_vllm_tp_needs_the_mlp_to_split():
    # 32 heads / 8 kv heads allow tp 4 and 8; an intermediate size of 12290 (2 × 6145) splits
    # over 2 ranks only (vLLM's MergedColumnParallelLinear divides it by tp)
    blocked = shape_from_config({**QWEN3_8B, "intermediate_size": 12290})
    assert parallel.ulysses_degrees(blocked, 8) == [1, 2, 4, 8]
    assert parallel.tensor_parallel_degrees(blocked, 8) == [1, 2]
    with pytest.raises(ValueError, match="intermediate 12290"):
        parallel.check_tensor_parallel(blocked, 4, 8)
    setup = planner.Setup(blocked, "verl", 8192, 8, 1, 80 * GIB, tp=4)
    with pytest.raises(ValueError, match="^tp: 4"):
        planner.choose(setup)


@pytest.mark.parametrize("engine, tokens", [("finetune", 512), ("verl", 512), ("finetune", 700)])
def test_loss_head_of_a_sequence_shorter_than_the_chunk(engine, tokens):
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, engine, tokens, 8, 1, 80 * GIB, logits="chunked")
    plan = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")
    vocab = 152064
    # float32 log-softmax, its grad and the logits' grad, for the rows there are (< 1024)
    assert plan.lines[HEAD] == 12 * tokens * vocab
    if engine == "verl":  # the log-prob forward's bf16 logits and float32 log-softmax
        assert plan.lines["log-prob forward (no grad)"] == max(
            (3 * 18944 * 2 + 2 * 3584 * 4) * tokens, (2 + 8) * tokens * vocab
        )
    acts = memory.activations(
        shape, tokens, memory.PRECISIONS["bf16-fsdp"], checkpointing=True, chunk=1024
    )
    assert acts.head == 12 * tokens * vocab


def test_loss_head_of_a_trl_completion_shorter_than_the_chunk():
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(
        shape, "trl", 4096, 8, 1, 80 * GIB, prompt=3584, response=512, logits="chunked",
        trl_version=(1, 12),  # Liger's fused linear cross-entropy, before TRL 1.15
    )  # fmt: skip
    plan = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")
    assert plan.lines[HEAD] == 12 * 512 * 152064  # TRL's loss covers the completion only
    # since 1.15 its fused head, over the completion's rows too (the prompt's are masked)
    fused = planner.evaluate(planner.replace(setup, trl_version=(1, 16)), 1, 1, 1, "none")
    assert fused.lines[HEAD] == (8 * 512 + 6 * 152064) * 3584 + 2 * 512 * 32768
    logprob = (3 * 18944 * 2 + 2 * 3584 * 4) * 4096  # a layer's transient outweighs the head
    assert fused.lines["log-prob forward (no grad)"] == logprob


@pytest.mark.parametrize("logits, liger", [("chunked", True), ("full", False)])
def test_sft_with_liger_counts_its_rmsnorm_and_swiglu(logits, liger):
    """``use_liger_kernel`` (the sft fragment's chunked loss) swaps in Liger's RMSNorm, which
    keeps its bf16 input and a float32 rstd per row (``ctx.save_for_backward(X, W, RSTD)``),
    and Liger's SwiGLU, which keeps gate and up (``save_for_backward(a, b)``) and writes their
    grads over them, so its backward adds only the incoming grad of the product."""
    shape = shape_from_config(QWEN3_8B)
    tokens = 65536
    setup = planner.Setup(shape, "sft", tokens, 8, 1, 140 * GIB, backend="deepspeed", logits=logits)
    h, i = 4096, 12288
    layer = _qwen3_layer_bytes_per_token()
    transient = (2 * i * 2 + 2 * h * 2) * tokens
    if liger:  # per norm: no float32 copy (4h); MLP: no silu(gate) (2i); backward: one grad
        layer -= 2 * 4 * h + 2 * i
        transient -= i * 2 * tokens
    plan = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")
    assert plan.lines[LAYER] == layer * tokens + transient
    final_norm = (2 if liger else 4 + 2) * h + 4  # Liger: bf16 input only; + float32 rstd
    assert plan.lines["final norm (kept for the loss head)"] == final_norm * tokens
    rest = 2 * 128 * 2 + 8  # bf16 cos and sin, input ids
    assert plan.lines["activations kept (all layers)"] == (36 * 2 * h + rest) * tokens


def test_liger_is_the_trl_engines_chunked_loss_only():
    shape = shape_from_config(QWEN3_8B)
    for engine, logits, liger in [
        ("sft", "chunked", True),
        ("trl", "chunked", True),
        ("sft", None, False),  # SFTTrainer's default: TRL's own fused LM head, plain layers
        ("verl", "chunked", False),  # verl's own fused kernels, transformers' RMSNorm and MLP
        ("finetune", "chunked", False),  # yarnlib finetune's chunked loss
    ]:
        setup = planner.Setup(shape, engine, 8192, 8, 1, 140 * GIB, logits=logits)
        assert setup.liger is liger, engine


def _residual_grad_bytes(precision: str) -> int:
    """Bytes per element of the grad a real transformers decoder layer passes back through the
    residual stream, run as the precision runs it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="sdpa")
    if precision == "bf16-fsdp":
        model.to(torch.bfloat16)
    widths = []
    model.model.layers[0].register_full_backward_hook(
        lambda module, grad_in, grad_out: widths.append(grad_out[0].element_size())
    )
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(input_ids=ids).logits
    logits.float().sum().backward()
    return widths[0]


@pytest.mark.parametrize("precision", ["bf16-fsdp", "bf16", "fp32"])
def test_backward_transient_counts_residual_grads_in_the_streams_dtype(precision):
    """The two residual-stream grads beside a layer's MLP backward are as wide as the stream:
    bf16 where the layers run on bf16 weights (FSDP, DeepSpeed), float32 under autocast or in
    float32 (the plan counted 4 bytes everywhere before)."""
    width = _residual_grad_bytes(precision)
    shape = shape_from_config(QWEN25_7B)
    p = memory.PRECISIONS[precision]
    acts = memory.activations(shape, 1000, p, checkpointing=True)
    assert acts.backward == (2 * 18944 * p.compute + 2 * 3584 * width) * 1000


def _reserved_over_allocated(loss_of) -> int:
    """What PyTorch's CUDA caching allocator would reserve beyond its allocated peak in one
    training step of a tiny Llama in bf16 with checkpointing (a large vocabulary, so that the
    loss head's tensors are the step's largest), the step's allocations recorded on CPU and
    replayed through a model of the allocator's rules (tests/caching_allocator.py)."""
    from caching_allocator import replay, trace

    torch.manual_seed(0)
    config = tiny_config(vocab_size=32768, max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 32768, (1, 1024))

    def step():
        loss_of(model, ids).backward()  # the model's output is gone before backward

    allocator = replay(trace(step))
    return allocator.peak_reserved - allocator.peak_allocated


def test_full_logits_leave_their_forward_block_cached():
    """The term `yarnlib plan` adds to a full-logits step's reserved total: the forward's bf16
    logits, freed before backward and too small for the backward's float32 grads, stay cached.
    The chunked loss leaves what its chunks fragment, a few chunks' worth, not the sequence's
    (for the plan's 1024-row chunk under 1 GiB up to a 160k vocabulary: within its reserve)."""
    from yarnlib.chunked_loss import causal_lm_loss

    shape = shape_from_config(tiny_config(vocab_size=32768).to_dict())
    cached = memory.cached_logits_bytes(shape, 1024, memory.PRECISIONS["bf16-fsdp"])
    assert cached == 2 * 1024 * 32768  # 64 MiB
    full = _reserved_over_allocated(lambda model, ids: model(ids, labels=ids).loss)
    # plus the layers' own fragmentation: 3 MiB on transformers 5, 24 MiB on 4.57 (whose SDPA
    # gets a materialised mask per layer)
    assert cached <= full <= 1.5 * cached
    chunked = _reserved_over_allocated(
        lambda model, ids: causal_lm_loss(model, ids, chunk_size=256)[0]
    )
    assert chunked <= 4 * memory.cached_logits_bytes(shape, 256, memory.PRECISIONS["bf16-fsdp"])
    assert chunked < full


def test_ms_swift_sequence_parallel_loss_keeps_bf16_tensors_only():
    """ms-swift's sequence-parallel loss is ``CrossEntropyLoss(reduction='none')`` of the bf16
    logits (``per_token_loss_func_sp``): 3 bf16 tensors of rows × vocab at its peak, where
    transformers' loss (upcast to float32) holds 12 bytes."""
    shape = shape_from_config(tiny_config(vocab_size=32768).to_dict())
    p = memory.PRECISIONS["bf16-fsdp"]
    planned = memory.bf16_loss_bytes(shape, 1024, 0, p)
    assert planned == 6 * 1024 * 32768
    peak = loss_peak(lambda logits, labels: torch.nn.CrossEntropyLoss(reduction="none")(
        logits, labels))  # fmt: skip
    assert planned <= peak <= planned + 2**20


@pytest.mark.parametrize("chunk, per_entry", [(128, 5), (256, 6), (1024, 10)])
def test_ms_swift_chunked_loss_is_its_own_chunked_cross_entropy(tmp_path, chunk, per_entry):
    """``CELOSS_PARALLEL_SIZE``: ms-swift's own ``ChunkedCrossEntropyLoss`` (4.6) keeps the
    bf16 logits and fills a grad buffer of their size, whole, plus a few chunks; a chunk as long
    as the local rows is worse than none (10 bytes per row and vocabulary entry against 6)."""
    shape = shape_from_config(tiny_config(vocab_size=32768).to_dict())
    planned = memory.bf16_loss_bytes(shape, 1024, chunk, memory.PRECISIONS["bf16-fsdp"])
    assert planned == per_entry * 1024 * 32768
    done = run_with_swift([str(Path(__file__).parent / "loss_peak.py"), str(chunk)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.strip().splitlines()[-1])
    assert planned <= peak <= planned + 2**20


def test_trl_fused_head_is_trls_own_chunked_logprob():
    """TRL 1.15+'s SFT loss, its fused LM head (``ChunkedLogProbFunction``, traced on a real
    step): float32 accumulators for the grads of the hidden states and the head's weight, cast
    to bf16 beside them, 6 bytes per element of rows × hidden and vocabulary × hidden. On CPU
    its tiles are folded by torch ops with float32 temporaries (the Triton kernel folds them in
    place), so the trace runs narrow tiles and bounds them apart."""
    kernel = pytest.importorskip("trl.kernels.chunked_logprob")
    from caching_allocator import replay, trace
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    # the tile the plan adds: 4096 rows × 32768 vocabulary entries in bf16, TRL's own sizes
    assert (kernel.TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE) == (4096, 32768)
    rows, hidden_size, vocab, narrow = 2048, 1024, 8192, 64
    shape = shape_from_config(tiny_config(vocab_size=vocab, hidden_size=hidden_size).to_dict())
    planned = memory.trl_fused_head_bytes(shape, rows)
    # plus, on a GPU, the labelled rows' hidden states gathered for it (``hidden_states[mask]``)
    assert planned == (8 * rows + 6 * vocab) * hidden_size + 2 * rows * vocab
    torch.manual_seed(0)
    hidden = torch.randn(rows, hidden_size, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,))

    def step():
        args = (hidden, weight, None, labels, 1.0, narrow, None, 1.0, ("log_probs",))
        (-kernel.ChunkedLogProbFunction.apply(*args)[0].sum()).backward()

    step()
    peak = replay(trace(step)).peak_allocated
    accumulators = 6 * (rows + vocab) * hidden_size
    assert accumulators <= peak <= accumulators + 16 * 4 * rows * narrow


def test_sft_plans_the_loss_of_its_trl_version():
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "sft", 32768, 4, 1, 80 * GIB, backend="deepspeed")
    fused = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")  # TRL 1.16, tested
    assert setup.logits_mode == "fused" and not setup.liger and not fused.reserved
    assert fused.lines[HEAD] == (8 * 32768 + 6 * 152064) * 3584 + 2 * 4096 * 32768
    # use_liger_kernel on TRL 1.15+: Liger's layers, TRL's head (not Liger's 1024 rows)
    liger = planner.evaluate(planner.replace(setup, logits="chunked"), 1, 1, 1, "none")
    assert liger.lines[HEAD] == fused.lines[HEAD] and liger.lines[LAYER] < fused.lines[LAYER]
    old = planner.replace(setup, trl_version=(1, 12))  # before 1.13: the full logits
    full = planner.evaluate(old, 1, 1, 1, "none")
    assert full.lines[HEAD] == 12 * 32768 * 152064 and full.reserved
    old_liger = planner.evaluate(planner.replace(old, logits="chunked"), 1, 1, 1, "none")
    assert old_liger.lines[HEAD] == 12 * 1024 * 152064


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--trl-version", "1.16", "--logits", "full"], "logits"),  # TRL 1.15+: no full logits
        (["--trl-version", "1.14"], "trl_version"),  # chunked_nll: not modelled
        (["--trl-version", "one"], "trl_version"),
        (["--engine", "finetune", "--trl-version", "1.12"], "trl_version"),
        (
            ["--engine", "trl", "--prompt", "1024", "--response", "15360", "--logits", "full"],
            "logits",
        ),  # fmt: skip
    ],
)
def test_trl_versions_it_does_not_plan(tmp_path, capsys, argv, field):
    from test_plan import _plan

    base = ["--engine", "sft", "--context", "16384", "--gpus", "4", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *base, *argv)
    assert code == 2 and f"error: {field}" in out.err and "allowed" in out.err


def test_swift_with_ulysses_plans_its_own_loss():
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "swift", 65536, 4, 1, 80 * GIB, backend="deepspeed")
    plan = planner.evaluate(setup, sp=4, cp=1, tp=1, offload="none")
    assert plan.lines[HEAD] == 6 * 16384 * 152064 and not plan.reserved  # no cached block
    # Liger's kernels in the layers, but ms-swift takes its own loss of the full logits
    liger = planner.evaluate(planner.replace(setup, logits="chunked"), 4, 1, 1, "none")
    assert liger.lines[HEAD] == plan.lines[HEAD]
    assert liger.lines[LAYER] < plan.lines[LAYER]
    chunked = planner.evaluate(planner.replace(setup, sp_loss_chunk=2048), 4, 1, 1, "none")
    assert chunked.lines[HEAD] == (2 * 16384 + 4 * 2048) * 2 * 152064
    # without Ulysses its loss is transformers' (or Liger's), as the sft engine plans it
    alone = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")
    sft = planner.evaluate(
        planner.replace(setup, engine="sft", trl_version=(1, 12)), 1, 1, 1, "none"
    )
    assert alone.lines == sft.lines and alone.reserved == sft.reserved


@pytest.mark.parametrize("engine", ["sft", "finetune"])
def test_the_plan_adds_the_cached_logits_to_the_reserved_total_only(engine):
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, engine, 16384, 4, 1, 80 * GIB, logits="full", trl_version=(1, 12))
    full = planner.evaluate(setup, 1, 1, 1, "none")
    cached = 2 * 16384 * 152064  # bf16 logits of 16384 rows
    assert full.lines[planner.CACHED_LOGITS] == cached
    states = sum(v for k, v in full.lines.items() if k in planner.RESIDENT + planner.WORKING)
    kept = full.lines["activations kept (all layers)"]
    head = full.lines["final norm (kept for the loss head)"] + full.lines[HEAD]
    allocated = states + kept + max(head, full.lines[LAYER])
    assert full.phases["update"] == allocated + setup.reserve
    reserved = states + kept + max(head + cached, full.lines[LAYER])
    assert full.reserved["update"] == reserved + setup.reserve > full.phases["update"]
    chunked = planner.evaluate(planner.replace(setup, logits="chunked"), 1, 1, 1, "none")
    assert planner.CACHED_LOGITS not in chunked.lines and not chunked.reserved
    # the GRPO engines' log-prob passes are not transformers' loss: not counted there
    verl = planner.evaluate(planner.replace(setup, engine="verl"), 1, 1, 1, "none")
    assert planner.CACHED_LOGITS not in verl.lines and not verl.reserved


def test_the_cached_logits_do_not_decide_the_verdict():
    """The allocator frees its cached blocks and retries before it reports out of memory: a run
    whose live tensors fit fits, though nvidia-smi would show more than the GPU."""
    setup = planner.Setup(shape_from_config(QWEN25_7B), "sft", 16384, 4, 1, 80 * GIB,
                          logits="full", offload="none", sp=1, trl_version=(1, 12))  # fmt: skip
    plan = planner.evaluate(setup, 1, 1, 1, "none")
    between = planner.replace(
        setup, gpu_bytes=(plan.phases["update"] + plan.reserved["update"]) // 2
    )
    squeezed = planner.evaluate(between, 1, 1, 1, "none")
    assert squeezed.phases["update"] < between.gpu_bytes < squeezed.reserved["update"]
    assert squeezed.fits


def test_the_final_norm_is_counted_beside_the_loss_head_only():
    """The final norm's backward runs right after the loss head's and frees what it kept, before
    any layer's recompute (benchmarks/plan_layer.py traces a real layer's step: with it beside
    the recompute the plan was 8 % high)."""
    shape = shape_from_config(QWEN3_8B)
    h, tokens = 4096, 65536
    final_norm = ((4 + 2) * h + 4) * tokens  # float32 input, bf16 output, float32 rstd
    for logits, peak in (("chunked", LAYER), ("full", HEAD)):
        setup = planner.Setup(shape, "finetune", tokens, 8, 1, 140 * GIB, logits=logits)
        plan = planner.evaluate(setup, 1, 1, 1, "none")
        assert plan.lines["final norm (kept for the loss head)"] == final_norm
        states = sum(v for k, v in plan.lines.items() if k in planner.RESIDENT + planner.WORKING)
        kept = plan.lines["activations kept (all layers)"]
        beside = final_norm if peak == HEAD else 0
        assert plan.lines[peak] + beside == max(plan.lines[LAYER], final_norm + plan.lines[HEAD])
        assert plan.phases["update"] == states + kept + beside + plan.lines[peak] + setup.reserve
