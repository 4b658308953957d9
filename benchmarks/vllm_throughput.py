"""vLLM generation throughput: native yarn vs the yarnlib plugin's dynamic_yarn.

Both engines run the same tiny random Llama with the same scale (the plugin fixes
dynamic_yarn at max_model_len M, which is yarn with factor M / L), so any difference is the
plugin's cost. Both engines live in one process at once and take turns, round by round, in
A B B A order; each adjacent A/B pair gives one ratio and the median ratio is reported.
Engines started one after the other differ by up to ±30 % on a shared CPU for reasons that
have nothing to do with RoPE (where each engine's memory lands, the host's load at the
time), which pairing cancels. Greedy decoding, so both engines must produce the same
tokens: that is checked. The rotary layers alone (vLLM's YaRN module and the plugin's, same
kernel, different table) are timed too.

    python benchmarks/vllm_throughput.py --prompts 16 --max-tokens 128 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

ORIGINAL = 512  # L of the benchmark model
FACTOR = 4.0


def build_model(folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1024,
        max_position_embeddings=ORIGINAL,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def start_engine(folder, kwargs, dtype, eager):
    from vllm import LLM

    llm = LLM(
        model=str(folder),
        dtype=dtype,
        enforce_eager=eager,
        skip_tokenizer_init=True,
        seed=0,
        **kwargs,
    )
    rotary = llm.apply_model(lambda model: type(model.model.layers[0].self_attn.rotary_emb))
    return llm, rotary[0].__name__


def generate(llm, prompts, max_tokens) -> tuple[float, list[list[int]]]:
    """Generated tokens per second of one round, and the tokens."""
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
    )
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return sum(map(len, tokens)) / elapsed, tokens


def rotary_layers(configs, tokens: int, repeats: int) -> tuple[dict[str, float], bool]:
    """Median time of one rotary forward over ``tokens`` positions per configuration, and
    whether the two cos/sin tables are bit-identical. Run before any engine starts."""
    import torch
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        layers = {
            name: get_rope(
                64, kwargs["max_model_len"], True, kwargs["hf_overrides"]["rope_parameters"]
            )
            for name, kwargs in configs.items()
        }
    generator = torch.Generator().manual_seed(0)
    positions = torch.randint(0, ORIGINAL * int(FACTOR), (tokens,), generator=generator)
    query = torch.randn(tokens, 4 * 64, generator=generator)
    key = torch.randn(tokens, 2 * 64, generator=generator)
    times: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(repeats):
        for name, layer in layers.items():  # interleaved
            q, k = query.clone(), key.clone()
            start = time.perf_counter()
            layer.forward_cpu(positions, q, k)
            times[name].append((time.perf_counter() - start) * 1e6)
    native, ours = (layer.cos_sin_cache for layer in layers.values())
    return {name: statistics.median(t) for name, t in times.items()}, torch.equal(native, ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="requests per round")
    parser.add_argument("--prompt-len", type=int, default=640, help="tokens per prompt (> L)")
    parser.add_argument("--max-tokens", type=int, default=128, help="generated tokens each")
    parser.add_argument("--pairs", type=int, default=24, help="timed A/B round pairs")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", action="store_true", help="let vLLM compile (default: eager)")
    parser.add_argument("--out", type=Path, help="JSON file (default: next to this script)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the plugin registers here

    import torch

    from yarnlib import RopeScaling
    from yarnlib.vllm import llm_kwargs, plugin

    plugin.register()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dynamic = RopeScaling("dynamic_yarn", FACTOR, ORIGINAL, 10000.0, 64)
    max_model_len = dynamic.max_position_embeddings
    static = dynamic.replace(method="yarn")  # same scale: s = max_model_len / L = FACTOR
    configs = {"native yarn": llm_kwargs(static), "plugin dynamic_yarn": llm_kwargs(dynamic)}
    generator = torch.Generator().manual_seed(0)
    prompts = [
        {
            "prompt_token_ids": torch.randint(
                0, 1024, (args.prompt_len,), generator=generator
            ).tolist()
        }
        for _ in range(args.prompts)
    ]
    layer_us, identical = rotary_layers(configs, 4096, 100)
    names = list(configs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp))
        engines, rotary = {}, {}
        for name in names:
            engines[name], rotary[name] = start_engine(
                tmp, configs[name], args.dtype, not args.compile
            )
        # Warm-up round of each engine; greedy decoding must give the same tokens.
        tokens = [generate(engines[name], prompts, args.max_tokens)[1] for name in names]
        same_tokens = tokens[0] == tokens[1]
        # A B, B A, A B, ...: a slow drift of the machine weighs on both equally.
        order = [names if pair % 2 == 0 else names[::-1] for pair in range(args.pairs)]
        for pair in tqdm(order, desc="A/B round pairs"):
            for name in pair:
                rates[name].append(generate(engines[name], prompts, args.max_tokens)[0])
    native_rates, plugin_rates = (rates[name] for name in names)
    pair_ratios = [p / n for p, n in zip(plugin_rates, native_rates, strict=True)]
    ratio = statistics.median(pair_ratios)
    median = {name: statistics.median(r) for name, r in rates.items()}
    print(f"{'engine':<22}{'rotary layer':>28}{'median tok/s':>14}{'min':>10}{'max':>10}")
    for name, r in rates.items():
        print(f"{name:<22}{rotary[name]:>28}{median[name]:>14.1f}{min(r):>10.1f}{max(r):>10.1f}")
    print(
        f"plugin / native, median of {len(pair_ratios)} paired rounds: {ratio:.3f} "
        f"(pairs {min(pair_ratios):.3f}..{max(pair_ratios):.3f}; target >= 0.95)"
    )
    print(f"same greedy tokens: {same_tokens}")
    print(f"cos/sin tables bit-identical: {identical}")
    print(
        "rotary layer, 4096 tokens, median of 100: "
        + ", ".join(f"{name} {us:.0f} us" for name, us in layer_us.items())
    )
    layer_ratio = layer_us["native yarn"] / layer_us["plugin dynamic_yarn"]
    print(f"rotary layer speed plugin / native: {layer_ratio:.3f}")
    info = {
        "device": device,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {"layers": 4, "hidden": 256, "head_dim": 64, "original": ORIGINAL},
        "max_model_len": max_model_len,
        "rotary_layer_class": rotary,
        "tokens_per_second": rates,
        "median": median,
        "pair_ratios": pair_ratios,
        "ratio": ratio,
        "same_greedy_tokens": same_tokens,
        "rotary_layer_us": layer_us,
        "rotary_layer_ratio": layer_ratio,
        "tables_identical": identical,
    }
    out = args.out or Path(__file__).with_name(f"vllm_throughput_{device}.json")
    out.write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
