"""``yarnlib.patch`` / ``yarnlib.unpatch`` for transformers' LLaMA, Mistral and Qwen models."""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from yarnlib import convert
from yarnlib.hf_compat import TESTED_TEXT, hf_format, transformers_version, warn_if_untested
from yarnlib.patches import rotation
from yarnlib.patches.rotary import YarnlibRotaryEmbedding
from yarnlib.spec import RopeScaling

# model_type -> the rotary module class transformers builds for it
SUPPORTED = {
    "llama": "LlamaRotaryEmbedding",
    "mistral": "MistralRotaryEmbedding",
    "qwen2": "Qwen2RotaryEmbedding",
    "qwen2_moe": "Qwen2MoeRotaryEmbedding",
    "qwen3": "Qwen3RotaryEmbedding",
    "qwen3_moe": "Qwen3MoeRotaryEmbedding",
}
# config attributes a patch may change; unpatch puts each back (or removes it)
CONFIG_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings")
_MISSING = object()


@dataclass
class PatchState:
    """What ``unpatch`` needs: the original module and config values, and the spec now run."""

    original_rotary: nn.Module
    original_config: dict[str, Any]
    original_spec: RopeScaling
    spec: RopeScaling
    use_kernel: bool | str = "auto"
    dispatcher_module: str | None = None  # where the q/k rotation dispatcher is installed


def _architectures() -> str:
    return ", ".join(f"{t} ({c.removesuffix('RotaryEmbedding')})" for t, c in SUPPORTED.items())


def rotary_owner(model: nn.Module) -> nn.Module:
    """The module holding ``rotary_emb`` (the base ``*Model``), validating the architecture."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    owner = model if hasattr(model, "rotary_emb") else getattr(model, "model", None)
    rotary = getattr(owner, "rotary_emb", None)
    if model_type not in SUPPORTED or rotary is None:
        raise ValueError(
            f"model: {type(model).__name__} (model_type {model_type!r}) has no supported rotary "
            f"embedding; supported architectures: {_architectures()}"
        )
    return owner


def patch_state(model: nn.Module) -> PatchState | None:
    return getattr(model, "_yarnlib_patch", None)


def _snapshot(config) -> dict[str, Any]:
    keys = (*CONFIG_KEYS, convert.MARKER)
    return {
        k: copy.deepcopy(config.__dict__[k]) if k in config.__dict__ else _MISSING for k in keys
    }


def _restore(config, snapshot: dict[str, Any]) -> None:
    for key, value in snapshot.items():
        if value is _MISSING:
            if key in config.__dict__:
                delattr(config, key)
        else:
            setattr(config, key, copy.deepcopy(value))


def _write_config(config, spec: RopeScaling) -> None:
    """Make ``config`` say what the patched model runs, in the keys the installed transformers
    reads (4.x: rope_theta + rope_scaling; 5.x: rope_parameters, rope_theta inside)."""
    format = hf_format()
    keys = convert.to_hf(spec, format=format)
    if format == "v4":
        config.rope_theta, config.rope_scaling = keys["rope_theta"], keys["rope_scaling"]
    else:
        params = keys["rope_parameters"]
        old = getattr(config, "rope_parameters", None) or {}
        if "partial_rotary_factor" in old:
            params["partial_rotary_factor"] = old["partial_rotary_factor"]
        config.rope_parameters = params
        if "rope_scaling" in config.__dict__:
            config.rope_scaling = None  # a stale 4.x key would win over rope_parameters
    if "max_position_embeddings" in keys:
        config.max_position_embeddings = keys["max_position_embeddings"]
    if convert.MARKER in keys:
        setattr(config, convert.MARKER, keys[convert.MARKER])
    elif convert.MARKER in config.__dict__:
        delattr(config, convert.MARKER)


def check_config_runs(config, spec: RopeScaling) -> None:
    """Raise unless the installed transformers computes ``spec``'s frequencies from ``config``.

    A saved config must load to what the patched model runs; this asks the version's own
    ``ROPE_INIT_FUNCTIONS`` instead of trusting which keys it reads.
    """
    rope_type = convert.rope_parameters_of(convert.config_dict(config))["rope_type"]
    init = ROPE_INIT_FUNCTIONS.get(rope_type)
    if init is None:  # 5.x keeps "default" on the rotary class: theta alone
        return
    problem = (
        f"config: transformers {transformers_version()} reads the rope settings yarnlib "
        f"writes ({rope_type!r}) as other frequencies than {spec.describe()}; a saved model "
        f"would run differently. yarnlib is tested on transformers {TESTED_TEXT}"
    )
    # the dynamic methods equal 'none' up to the original length: check the full factor too
    for length in [None, spec.max_position_embeddings] if spec.is_dynamic else [None]:
        try:
            inv_freq, attention_factor = init(config, torch.device("cpu"), seq_len=length)
        except (KeyError, TypeError) as error:  # keys this version does not read
            raise ValueError(f"{problem} ({type(error).__name__}: {error})") from error
        expected, expected_factor = spec.frequencies(length)
        if not torch.equal(inv_freq.float(), expected) or attention_factor != expected_factor:
            raise ValueError(problem)


def patch(
    model: nn.Module,
    method: str = "yarn",
    factor: float = 4.0,
    original_max_position_embeddings: int | None = None,
    *,
    use_kernel: bool | str = "auto",
    **knobs,
) -> nn.Module:
    """Run ``model`` with a scaled rotary embedding; returns the model (changed in place).

    ``original_max_position_embeddings`` defaults to the original recorded in an already
    scaled config, else to ``max_position_embeddings``. Patching again re-scales from the
    original; patching twice with the same arguments changes nothing.
    """
    owner = rotary_owner(model)
    state = patch_state(model)
    current = state.original_spec if state else RopeScaling.from_hf(model.config)
    spec = current.rescaled(method, factor, original_max_position_embeddings, **knobs)
    if spec.method == "longrope" and spec.is_checkpoint_scaling:  # its rotary already runs it
        return model
    head_dim = head_dim_of(model.config)
    routed = rotation.needs_dispatcher(use_kernel, spec.rotary_dim, head_dim)
    if state and state.spec == spec and state.use_kernel == use_kernel:
        return model
    warn_if_untested()
    written = copy.deepcopy(model.config)
    _write_config(written, spec)
    check_config_runs(written, spec)  # before anything changes: a failed patch changes nothing
    if state is None:
        state = PatchState(owner.rotary_emb, _snapshot(model.config), current, spec)
        model._yarnlib_patch = state
    state.spec, state.use_kernel = spec, use_kernel
    _set_dispatcher(state, type(owner).__module__ if routed else None)
    device = state.original_rotary.inv_freq.device
    owner.rotary_emb = YarnlibRotaryEmbedding(spec, head_dim, use_kernel, device=device)
    _write_config(model.config, spec)
    _wrap_generate(model)
    return model


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _set_dispatcher(state: PatchState, module: str | None) -> None:
    if state.dispatcher_module == module:
        return
    if state.dispatcher_module:
        rotation.uninstall(state.dispatcher_module)
    if module:
        rotation.install(module)
    state.dispatcher_module = module


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original rotary module and config exactly."""
    state = patch_state(model)
    if state is None:
        raise ValueError(f"model: this {type(model).__name__} is not patched by yarnlib")
    rotary_owner(model).rotary_emb = state.original_rotary
    _set_dispatcher(state, None)
    _restore(model.config, state.original_config)
    model.__dict__.pop("generate", None)
    del model._yarnlib_patch
    return model


def yarnlib_rotary(model: nn.Module) -> YarnlibRotaryEmbedding | None:
    rotary = rotary_owner(model).rotary_emb
    return rotary if isinstance(rotary, YarnlibRotaryEmbedding) else None


@contextlib.contextmanager
def declare_length(model: nn.Module, length: int):
    """Fix the dynamic scale of the sequences started inside the block at ``length`` tokens."""
    rotary = yarnlib_rotary(model)
    if rotary is None:
        raise ValueError("model: declare_length needs a model patched by yarnlib.patch")
    if not isinstance(length, int) or length <= 0:
        raise ValueError(f"length must be a positive integer, got {length!r}")
    previous, rotary.declared_length = rotary.declared_length, length
    try:
        yield model
    finally:
        rotary.declared_length = previous


def _generation_length(model: nn.Module, args, kwargs) -> int | None:
    inputs = kwargs.get("input_ids", args[0] if args else None)
    if inputs is None:
        inputs = kwargs.get("inputs_embeds")
    if inputs is None:
        return None
    prompt = inputs.shape[1]
    config = kwargs.get("generation_config") or model.generation_config
    new = kwargs.get("max_new_tokens", config.max_new_tokens)
    if new is not None:
        return prompt + new
    return kwargs.get("max_length", config.max_length)


def _wrap_generate(model: nn.Module) -> None:
    """Dynamic methods: ``generate`` declares prompt + max_new_tokens for its sequences."""
    if "generate" in model.__dict__ or not hasattr(model, "generate"):
        return
    generate = type(model).generate

    @functools.wraps(generate)
    def generate_with_declared_length(*args, **kwargs):
        rotary = yarnlib_rotary(model)
        length = _generation_length(model, args, kwargs)
        if rotary is None or not rotary.spec.is_dynamic or length is None:
            return generate(model, *args, **kwargs)
        with declare_length(model, length):
            return generate(model, *args, **kwargs)

    model.generate = generate_with_declared_length
