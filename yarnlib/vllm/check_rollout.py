"""``yarnlib check-rollout``: do the patched transformers model and vLLM run the same RoPE?

Both score one long prompt in float32; the per-token prompt log-probabilities are compared
within and beyond the original context L. Run it before a long GRPO job: a rollout whose
RoPE differs from the actor's (e.g. ``rope_theta`` dropped from an override) shows up as a
large difference beyond L.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path
from typing import Any

import torch

from yarnlib import atomic
from yarnlib.models import pretrained_model, require_weights
from yarnlib.spec import RopeScaling
from yarnlib.vllm.args_cli import add_spec_arguments, model_kwargs, spec_from_args


def prompt_ids(model_dir: str | Path, length: int, seed: int, text_file: str | None) -> list[int]:
    """``length`` token ids: the text file's tokens repeated, or seeded random ids."""
    if text_file:
        from transformers import AutoTokenizer

        try:
            text = Path(text_file).read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise ValueError(
                f"prompt_file: cannot read {text_file!r} ({reason}); allowed: a UTF-8 text file"
            ) from None
        ids = AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]
        if not ids:
            raise ValueError(f"prompt_file: {text_file!r} has no tokens")
        return (ids * (length // len(ids) + 1))[:length]
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


@torch.no_grad()
def transformers_logprobs(
    model_dir, spec: RopeScaling, ids: list[int], scale_len: int, chunk: int = 1024
) -> torch.Tensor:
    """log p(token_i | tokens_<i) for i ≥ 1, float32, without a [tokens × vocab] tensor."""
    import yarnlib

    model = pretrained_model(model_dir, dtype=torch.float32).eval()
    yarnlib.patch(
        model,
        method=spec.method,
        factor=spec.factor,
        original_max_position_embeddings=spec.original_max_position_embeddings,
        **spec.knobs(),
    )
    # vLLM runs a dynamic method at the scale of one length; declare that length here too.
    with yarnlib.declare_length(model, scale_len):
        return sequence_logprobs(model, ids, chunk=chunk)


@torch.no_grad()
def sequence_logprobs(
    model, ids: list[int], temperature: torch.Tensor | float = 1.0, chunk: int = 1024
) -> torch.Tensor:
    """log softmax(logits / temperature) of token i given tokens < i, for i ≥ 1, float32, a
    chunk of positions at a time (``temperature`` may be one value per predicted token)."""
    tokens = torch.tensor([ids], device=model.device)
    hidden = model.model(input_ids=tokens).last_hidden_state[0, :-1]
    targets = tokens[0, 1:]
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=hidden.device)
    temperature = temperature.expand(len(targets))
    out = []
    for start in range(0, len(targets), chunk):
        stop = start + chunk
        logits = model.lm_head(hidden[start:stop]).float() / temperature[start:stop, None]
        out.append(logits.log_softmax(-1).gather(-1, targets[start:stop, None])[:, 0])
    return torch.cat(out).cpu()


def vllm_logprobs(
    model_dir, ids: list[int], kwargs: dict[str, Any], register_plugin: bool = True
) -> torch.Tensor:
    # In-process engine: the plugin registered here also serves an uninstalled checkout.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    from yarnlib.vllm import plugin

    if register_plugin:
        plugin.register()
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        seed=0,
        **kwargs,
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    result = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    del llm
    gc.collect()
    rows = result.prompt_logprobs[1:]  # the first token has no log-probability
    return torch.tensor([row[t].logprob for row, t in zip(rows, ids[1:], strict=True)])


def stats(delta: torch.Tensor) -> dict[str, Any]:
    if delta.numel() == 0:
        return {"tokens": 0, "max_abs": None, "mean_abs": None}
    return {"tokens": delta.numel(), "max_abs": delta.max().item(), "mean_abs": delta.mean().item()}


def compare(
    model_dir: str | Path,
    spec: RopeScaling,
    length: int,
    *,
    max_model_len: int | None = None,
    kwargs: dict[str, Any] | None = None,
    tolerance: float = 1e-3,
    seed: int = 0,
    prompt_file: str | None = None,
) -> dict[str, Any]:
    """Score ``length`` tokens with both engines; ``kwargs`` replaces ``llm_kwargs(spec)``."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an integer >= 2, got {length!r}")
    kwargs = kwargs if kwargs is not None else model_kwargs(model_dir, spec, max_model_len)
    engine_len = kwargs.get("max_model_len")
    if engine_len is None or length >= engine_len:
        raise ValueError(
            f"length must be < max_model_len ({engine_len}) so vLLM can add one token, got {length}"
        )
    ids = prompt_ids(model_dir, length, seed, prompt_file)
    check_runnable(model_dir)
    # vLLM must run a dynamic method at the scale of max_model_len (the fixed_scale_length
    # llm_kwargs writes): the transformers side declares that length, not the one in kwargs,
    # so an engine fixed at another length fails the check.
    expected = transformers_logprobs(model_dir, spec, ids, engine_len)
    got = vllm_logprobs(model_dir, ids, kwargs)
    delta = (got - expected).abs()
    original = spec.original_max_position_embeddings
    within = original - 1  # tokens at positions 1 .. L-1
    report = {
        "spec": spec.describe(),
        "length": length,
        "original_max_position_embeddings": original,
        "max_model_len": engine_len,
        "within": stats(delta[:within]),
        "beyond": stats(delta[within:]),
        "max_abs": delta.max().item(),
        "tolerance": tolerance,
    }
    report["passed"] = report["max_abs"] <= tolerance
    return report


def print_report(report: dict[str, Any]) -> None:
    print(
        f"check-rollout: {report['spec']} | {report['length']} tokens, "
        f"vLLM max_model_len={report['max_model_len']}, float32"
    )
    print(f"{'':<16}{'tokens':>8}{'max |Δ|':>12}{'mean |Δ|':>12}")
    original = report["original_max_position_embeddings"]
    for key, label in (("within", f"within L={original}"), ("beyond", "beyond L")):
        row = report[key]
        if row["tokens"]:
            print(f"{label:<16}{row['tokens']:>8}{row['max_abs']:>12.3e}{row['mean_abs']:>12.3e}")
    verdict = "PASS" if report["passed"] else "FAIL"
    print(f"{verdict}: max |Δ| {report['max_abs']:.3e} vs tolerance {report['tolerance']:.1e}")


def check_runnable(model_dir: str | Path) -> None:
    """Bad input before an engine starts: a folder without weights, or (on CPU) a head size
    vLLM's CPU attention refuses, asked of that backend itself."""
    require_weights(model_dir)
    if torch.cuda.is_available():
        return
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model_dir)
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    if not CPUAttentionBackend.supports_head_size(head_dim):
        allowed = ", ".join(map(str, CPUAttentionBackend.get_supported_head_sizes()))
        raise ValueError(
            f"head_dim: {head_dim} in {str(model_dir)!r} is not run by vLLM's CPU attention; "
            f"allowed on CPU: {allowed} (or run on a GPU)"
        )


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    kwargs = model_kwargs(args.model_dir, spec, args.max_model_len)
    if args.config_as_is:  # what verl's and EasyR1's rollouts do: config.json, no overrides
        kwargs = {"max_model_len": kwargs["max_model_len"]}
    to_stdout = args.json == "-"
    if to_stdout:  # stdout holds the JSON alone: vLLM's logging, unconfigured, goes to stderr
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    report = compare(
        args.model_dir,
        spec,
        args.length,
        kwargs=kwargs,
        tolerance=args.tolerance,
        seed=args.seed,
        prompt_file=args.prompt_file,
    )
    if to_stdout:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    if args.json and not to_stdout:
        atomic.write_text(args.json, json.dumps(report, indent=2) + "\n", "json")
    return 0 if report["passed"] else 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check-rollout",
        help="compare transformers (patched) and vLLM prompt log-probs on one long prompt",
        description="Score one long prompt with the yarnlib-patched transformers model and with "
        "vLLM (float32); print max/mean |Δ log p| within and beyond the original context. "
        "Exit 0: within the tolerance; 1: above it; 2: bad input (one line); 70: a crash.",
    )
    add_spec_arguments(parser)
    parser.add_argument("--length", type=int, required=True, help="prompt tokens N")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompt ids")
    parser.add_argument("--prompt-file", help="text to tokenize (repeated) instead of random ids")
    parser.add_argument(
        "--config-as-is",
        action="store_true",
        help="vLLM reads config.json without hf_overrides (for a folder rewritten by "
        "`yarnlib config`, as verl's and EasyR1's rollouts load it)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print the report as JSON instead of the table (vLLM's log then goes to stderr), "
        "or with FILE also write it there",
    )
    parser.set_defaults(func=run)
