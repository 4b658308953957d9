"""Memory formulas, in bytes per GPU (or per process), for training and serving a decoder model.

The activation terms count what autograd keeps for backward in a transformers decoder layer
(Llama / Qwen2 / Qwen3 code paths), tensor by tensor, per token:

    RMSNorm      its float32 input (a copy when the residual is bf16), the normalised input in
                 the residual dtype, and its output as the next linears keep it (under autocast
                 each linear keeps its own bf16 cast: 3 for q/k/v, 2 for gate/up)
    attention    q, k, v and the output in the compute dtype, plus the float32 logsumexp per
                 head (flash / SDPA's flash path; the output doubles as o_proj's input);
                 eager keeps the float32 softmax [heads × T] per token (and its bf16 cast)
    q/k norm     Qwen3: float32 q and k plus the normalised copies
    MLP          gate, silu(gate), up and their product: 4 × intermediate
    MoE          the same per routed expert, plus the gathered inputs and the router's scores
    Liger        (``use_liger_kernel``: TRL, transformers' Trainer) its RMSNorm keeps the input in
                 its own dtype and a float32 rstd per row, no float32 copy
                 (``LigerRMSNormFunction``: X, W, RSTD); its SwiGLU keeps gate and up only and
                 writes their grads over them in backward (``LigerSiLUMulFunction``: a, b)

Outside the layers, the final norm keeps its float32 input, output and rstd for the loss head
only (its backward frees them before any layer's). ``tests/test_plan.py`` checks these sums
against the bytes autograd saves in real transformers models, ``benchmarks/plan_memory.py`` the
resulting peaks against measured ones, ``benchmarks/plan_layer.py`` one recomputed layer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from yarnlib.plan.shapes import ModelShape

GIB = 1024**3


@dataclass(frozen=True)
class Precision:
    """Bytes per element: master weights/grads/optimizer (``param``), matmul operands and
    outputs (``compute``), the residual stream between layers (``residual``); ``autocast``:
    weights stay float32 and every linear keeps its own bf16 cast of input and weight."""

    name: str
    param: int
    compute: int
    residual: int
    autocast: bool


PRECISIONS = {
    "fp32": Precision("fp32", 4, 4, 4, False),
    # torch.autocast over float32 weights (accelerate's mixed precision without FSDP)
    "bf16": Precision("bf16", 4, 2, 4, True),
    # FSDP mixed precision: layers run on bf16 copies of the weights (verl, FSDP2 + accelerate)
    "bf16-fsdp": Precision("bf16-fsdp", 4, 2, 2, False),
}
ATTENTION = ("flash", "sdpa", "eager")


def _norm(width: int, consumers: int, p: Precision, liger: bool = False) -> int:
    """Bytes per token an RMSNorm of ``width`` leaves for backward, output included; Liger's
    keeps its input instead of a float32 copy and a normalised one (its rstd is in ``rsqrt``)."""
    output = consumers * p.compute if p.autocast else p.residual
    kept = p.residual if liger else 4 + p.residual
    return (kept + output) * width


def attention_bytes(shape: ModelShape, attended: int, attn: str, p: Precision) -> int:
    """Per token: what one attention block keeps; ``attended``: keys each query sees (eager)."""
    c = p.compute
    qk_norm = 0
    if shape.qk_norm:  # float32 q and k, their normalised copies, one rsqrt per head
        heads = shape.num_attention_heads + shape.num_key_value_heads
        qk_norm = (4 + c) * (shape.q_width + shape.kv_width) + 4 * heads
    if attn == "eager":  # k and v repeated to every query head; the float32 softmax kept
        scores = (4 + (c if c < 4 else 0)) * shape.num_attention_heads * attended
        return 4 * c * shape.q_width + scores + qk_norm
    lse = 4 * shape.num_attention_heads
    return c * (2 * shape.q_width + 2 * shape.kv_width) + lse + qk_norm


def mlp_bytes(shape: ModelShape, p: Precision, liger: bool = False) -> int:
    c = p.compute
    if not shape.num_experts:  # gate, act(gate), up, their product; Liger: no act(gate)
        return (3 if liger else 4) * c * shape.intermediate_size
    routed = shape.num_experts_per_tok
    # per routed expert: its gathered input and weighted output, then the gated MLP
    return routed * (4 * c * shape.intermediate_size + 2 * c * shape.hidden_size) + (
        8 * shape.num_experts  # router logits and softmax, float32
    )


def layer_bytes_per_token(
    shape: ModelShape, attn: str, p: Precision, attended: int = 0, liger: bool = False
) -> int:
    """Bytes one decoder layer keeps for backward per token (no checkpointing); ``liger``: its
    two RMSNorms and the MLP run Liger's kernels (q/k norms stay transformers')."""
    h = shape.hidden_size
    norms = _norm(h, 3, p, liger) + _norm(h, 2, p, liger)
    rsqrt = 2 * 4
    mlp = mlp_bytes(shape, p, liger)
    return norms + attention_bytes(shape, attended, attn, p) + mlp + rsqrt


def model_bytes_per_token(shape: ModelShape, p: Precision) -> int:
    """Per token, outside the layers and kept through the whole backward: rotary cos/sin,
    input ids."""
    rotary = 2 * shape.head_dim * (p.residual if not p.autocast else 4)
    return rotary + 8


def final_norm_bytes_per_token(shape: ModelShape, p: Precision, liger: bool = False) -> int:
    """Per token, what the final norm keeps: its float32 input and output in the compute
    dtype (Liger's: the input only) and a float32 rstd. Its backward runs right after the
    loss head's, before any layer's, and frees them."""
    return (p.residual if liger else 4 + p.residual) * shape.hidden_size + 4


def linear_params(shape: ModelShape) -> int:
    """Weights of the matmuls in one layer (autocast keeps a bf16 copy of each; the biases'
    casts are not kept: their grads need no input)."""
    norms = 2 * shape.hidden_size + (2 * shape.head_dim if shape.qk_norm else 0)
    biases = shape.q_width + 2 * shape.kv_width if shape.attention_bias else 0
    return shape.layer_params - norms - biases


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one training micro-batch of ``tokens`` local tokens."""

    saved: int  # kept by autograd at the end of the forward
    recompute: int  # one layer recomputed in backward (checkpointing), else 0
    backward: int  # the largest transient of a layer's backward
    head: int  # the loss head's peak (logits, log-softmax and their grads)
    final_norm: int  # kept by the final norm for the head; freed before a layer's backward


def activations(
    shape: ModelShape,
    tokens: int,
    p: Precision,
    *,
    checkpointing: bool,
    attn: str = "flash",
    chunk: int = 0,
    attended: int | None = None,
    offloaded: bool = False,
    liger: bool = False,
    ring: bool = False,
) -> Activations:
    """``tokens``: this rank's tokens (sequence / context parallel: the local shard);
    ``attended``: keys a query attends (the full sequence; eager attention only);
    ``chunk``: loss chunk in tokens (0: the full logits); ``offloaded``: what the layers keep
    goes to CPU memory layer by layer, two layers' worth at most on the GPU (verl's
    ``enable_activation_offload``: one group offloading while the next computes); ``liger``:
    Liger's RMSNorm and SwiGLU kernels in the layers (``use_liger_kernel``); ``ring``: context
    parallel, ``tokens`` a shard of ``attended``."""
    attended = tokens if attended is None else attended
    layer = layer_bytes_per_token(shape, attn, p, attended, liger) * tokens
    weights = 2 * linear_params(shape) if p.autocast else 0  # bf16 copies kept per layer
    per_layer = shape.hidden_size * p.residual * tokens if checkpointing else layer + weights
    layers = min(2, shape.num_hidden_layers) if offloaded else shape.num_hidden_layers
    saved = layers * per_layer + model_bytes_per_token(shape, p) * tokens
    final_norm = final_norm_bytes_per_token(shape, p, liger) * tokens
    # mul backward of act(gate) * up: its two output grads beside the incoming one, while the
    # product down_proj kept is already freed (Liger: the incoming grad only, the two written
    # over gate and up); plus the grads of the residual stream in and out, in its dtype
    mlp_grads = (1 if liger else 2) * shape.intermediate_size * p.compute
    backward = (mlp_grads + 2 * shape.hidden_size * p.residual) * tokens
    if shape.num_experts:
        backward *= shape.num_experts_per_tok
    if ring:  # the attention's backward comes after the MLP side has been freed
        h = shape.hidden_size
        freed = (mlp_bytes(shape, p, liger) + _norm(h, 2, p, liger) + 4) * tokens
        backward = max(backward, ring_backward_bytes(shape, tokens, attended, p) - freed)
    rows = min(chunk, tokens) if chunk else tokens
    head = logits_bytes(shape, rows, p)
    # a float32 residual stream: the first norm's float32 input is the layer's input itself,
    # which checkpointing keeps in ``saved``; the recompute does not make it a second time
    shared = shape.hidden_size * 4 * tokens if p.residual == 4 else 0
    recompute = layer + weights - shared if checkpointing else 0
    return Activations(saved, recompute, backward, head, final_norm)


def ring_backward_bytes(shape: ModelShape, tokens: int, context: int, p: Precision) -> int:
    """A layer's transient at its attention's backward under torch's context parallel (ring
    attention, all-gather rotation, the default): K and V of the whole ``context`` gathered
    once into one buffer; float32 accumulators for the grads of the local q, k and v
    (``convert_to_f32``); one ring step's grads from the attention kernel in the compute dtype,
    the kernel's float32 dq accumulator and, with grouped-query attention, its K and V grads at
    the query heads' width before their sum (flash attention's backward); the float32 K and V
    grads passed on around the ring, sent and received; plus the grad of the attention output
    and the two residual grads. Read in
    ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``
    (``_templated_ring_attention_backward``); not measured (it needs GPUs)."""
    c, q, k = p.compute, shape.q_width, shape.kv_width
    gathered = 2 * context * k * c
    per_token = 2 * shape.hidden_size * p.residual + c * q + (4 + c) * (q + 2 * k)
    per_token += 4 * q + (2 * c * q if k < q else 0) + 2 * 2 * k * 4
    return gathered + per_token * tokens


def logits_bytes(shape: ModelShape, rows: int, p: Precision) -> int:
    """Peak of the loss head over ``rows`` positions, in its backward: the float32
    log-softmax kept for it, the incoming grad and the grad of the logits (the bf16 logits and
    their float32 copy are gone by then: cross-entropy keeps only its output)."""
    return 12 * rows * shape.vocab_size


def bf16_loss_bytes(shape: ModelShape, rows: int, chunk: int, p: Precision) -> int:
    """Peak of ms-swift's sequence-parallel loss over ``rows`` local positions, in its backward:
    ``CrossEntropyLoss(reduction='none')`` of the logits in the compute dtype, no float32 copy
    (``per_token_loss_func_sp``). Unchunked: the log-softmax output kept for backward, its
    incoming grad and the logits' grad (the logits themselves are freed with the model's
    output): 3 tensors of rows × vocab. With ``chunk`` (``CELOSS_PARALLEL_SIZE``, its
    ``ChunkedCrossEntropyLoss``): the logits it keeps and the grad buffer it fills, whole, plus
    the same 3 tensors per chunk, beside the previous chunk's grad (held until the loop rebinds
    it). Traced on real steps in ``tests/test_plan_terms.py``."""
    vocab = p.compute * shape.vocab_size
    if not chunk:
        return 3 * rows * vocab
    first, second = min(chunk, rows), min(chunk, max(0, rows - chunk))
    return (2 * rows + max(3 * first, 3 * second + first)) * vocab


def _trl_tile(shape: ModelShape, rows: int) -> int:
    """TRL's fused head computes the logits in tiles of 4096 rows × 32768 entries, bf16."""
    return 2 * min(rows, 4096) * min(shape.vocab_size, 32768)


def trl_fused_head_bytes(shape: ModelShape, rows: int) -> int:
    """Peak of TRL's fused LM head (1.15 and later; ``ChunkedLogProbFunction``) over ``rows``
    labelled positions, in its backward: on a GPU it gathers their hidden states into a new
    bf16 tensor kept for the backward (``hidden_states[mask]``, 2 bytes per element of rows ×
    hidden), recomputes the logits tile by tile and accumulates the grads of the hidden states
    and of the head's weight in float32, then casts both to bf16 beside them (6 bytes per
    element of rows × hidden and of vocabulary × hidden), plus the tile. The function traced on
    a real step in ``tests/test_plan_terms.py``; the gather read in ``add_fused_lm_head``."""
    return (8 * rows + 6 * shape.vocab_size) * shape.hidden_size + _trl_tile(shape, rows)


def cached_logits_bytes(shape: ModelShape, rows: int, p: Precision) -> int:
    """What CUDA's caching allocator reserves beyond the live tensors at the loss backward when
    the loss runs over all ``rows`` in one piece (transformers' loss, torchtitan's): the
    forward's logits in the compute dtype are freed before backward (the model's output is
    dropped), but their block is smaller than each float32 tensor the backward then asks for,
    and a request is served from one free block at least its size (blocks of separate segments
    never merge), so it stays cached beside a newly reserved one. ``max_memory_reserved()``
    and nvidia-smi count it; ``max_memory_allocated()`` does not."""
    return p.compute * rows * shape.vocab_size


def activation_peak(acts: Activations) -> int:
    """The saved activations plus the larger of the head's peak (beside what the final norm
    keeps for it) and a layer's backward transient (the final norm's backward has run)."""
    return acts.saved + max(acts.final_norm + acts.head, acts.recompute + acts.backward)


def forward_peak(
    shape: ModelShape, tokens: int, p: Precision, rows: int, fused: bool = False
) -> int:
    """A forward without grad (log-prob passes): one layer's largest transient (gate, up and
    their product beside the residual stream) or the logits and log-softmax of ``rows``; with
    TRL's fused head (``fused``) its gathered hidden states, one tile and seven float32
    running statistics per row instead of the logits."""
    experts = max(1, shape.num_experts_per_tok)
    layer = (3 * shape.intermediate_size * experts * p.compute + 2 * shape.hidden_size * 4) * tokens
    if fused:
        head = 2 * rows * shape.hidden_size + _trl_tile(shape, rows) + 7 * 4 * rows
    else:
        head = (p.compute + 8) * rows * shape.vocab_size
    return max(layer, head)


def step_peak(
    shape: ModelShape,
    acts: Activations,
    p: Precision,
    grad_params: int,
    largest_param: int,
) -> int:
    """Peak of one unsharded training step above the weights and optimizer states: the
    activation peak with the head's weight grad already there, or, at the optimizer step,
    every grad plus AdamW's temporaries (the for-each-parameter loop of CPU tensors)."""
    head_grad = p.param * shape.vocab_size * shape.hidden_size
    optimizer = p.param * grad_params + 2 * p.param * largest_param
    return max(activation_peak(acts) + head_grad, optimizer)
