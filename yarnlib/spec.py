"""``RopeScaling``: the one frozen, validated description of a scaled rotary embedding."""

from __future__ import annotations

import math
from typing import Any

import torch

from yarnlib import frequencies
from yarnlib.frequencies import Frequencies

METHODS = ("none", "linear", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "dynamic_yarn")
ALIASES = {
    "default": "none",
    "pi": "linear",
    "dynamic": "dynamic_ntk",
    "ntk-by-parts": "ntk_by_parts",
    "dynamic-yarn": "dynamic_yarn",
    "dynamic-ntk": "dynamic_ntk",
}
# Methods whose frequencies depend on the original (pre-training) context length.
NEEDS_ORIGINAL = frozenset(
    {"dynamic_ntk", "ntk_by_parts", "yarn", "dynamic_yarn", "llama3", "longrope"}
)
# Scalings checkpoints ship (rope_type llama3, longrope): read and kept, never composed with
# another and never applied to a model that does not ship them, except longrope in the form
# ``yarnlib tune`` writes (see ``RopeScaling.is_applied_longrope``).
CHECKPOINT_METHODS = ("llama3", "longrope")
DYNAMIC = frozenset({"dynamic_ntk", "dynamic_yarn"})
STATIC_METHODS = tuple(m for m in METHODS if m not in DYNAMIC)
RAMP_METHODS = frozenset({"ntk_by_parts", "yarn", "dynamic_yarn"})
YARN_METHODS = frozenset({"yarn", "dynamic_yarn"})
YARN_KNOB_DEFAULTS = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": None,
    "mscale_all_dim": None,
    "attention_factor": None,
    "truncate": True,
}
# 1024 × a 128k context is 134M tokens, far past any model that runs; larger factors are typos
# (1e300 would write a 300-digit max_position_embeddings).
MAX_FACTOR = 1024.0
LLAMA3_KNOB_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
LONGROPE_KNOB_DEFAULTS = {"short_factor": None, "long_factor": None}
KNOB_DEFAULTS = {**YARN_KNOB_DEFAULTS, **LLAMA3_KNOB_DEFAULTS, **LONGROPE_KNOB_DEFAULTS}


def method_name(method: Any) -> Any:
    """``method`` canonicalised where it is a known name (else as given, for the error)."""
    try:
        return canonical_method(method)
    except ValueError:
        return method


def canonical_method(method: str) -> str:
    """The canonical method name for ``method`` or one of its aliases."""
    if not isinstance(method, str):
        raise ValueError(f"method must be a string, got {method!r}")
    key = method.strip().lower()
    key = ALIASES.get(key, key)
    if key not in METHODS + CHECKPOINT_METHODS:
        known = ", ".join(METHODS + CHECKPOINT_METHODS) + "; aliases: " + ", ".join(sorted(ALIASES))
        raise ValueError(f"method: unknown RoPE scaling method {method!r}; known: {known}")
    return key


def _finite_number(field: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{field} must be finite, got {value!r}")
    return float(value)


def checked_factor(method: str, factor: Any) -> float:
    """``factor`` as a float, if it is valid for the canonical ``method``."""
    value = _finite_number("factor", factor)
    if value < 1:
        raise ValueError(f"factor must be >= 1 (1 means no scaling), got {factor!r}")
    if value > MAX_FACTOR:
        raise ValueError(
            f"factor must be <= {MAX_FACTOR:g} (a context {MAX_FACTOR:g} × the original), "
            f"got {factor!r}"
        )
    if method == "none" and value != 1:
        raise ValueError(
            f"factor: method 'none' scales nothing, so factor must be 1, got {factor!r} "
            "(pick a scaling method to extend the context)"
        )
    return value


def _positive_int(field: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return value


def _rescale_factors(field: str, value: Any, rotary_dim: int, method: str):
    """longrope's per-frequency divisors: ``rotary_dim // 2`` positive numbers, as a tuple."""
    if value is None:
        if method == "longrope":
            raise ValueError(f"{field} is required for method 'longrope'")
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ValueError(f"{field} must be a list of {rotary_dim // 2} numbers, got {value!r}")
    numbers = tuple(_finite_number(field, v) for v in value)
    if len(numbers) != rotary_dim // 2 or min(numbers, default=0) <= 0:
        raise ValueError(
            f"{field} must hold {rotary_dim // 2} positive numbers (one per frequency), got "
            f"{len(numbers)}: {list(numbers)!r}"
        )
    return numbers


FIELDS = (
    "method",
    "factor",
    "original_max_position_embeddings",
    "rope_theta",
    "rotary_dim",
    *KNOB_DEFAULTS,
)


class RopeScaling:
    """A RoPE scaling method with every parameter it needs, validated at construction, immutable.

    ``factor`` is s, ``original_max_position_embeddings`` is L (the pre-training context),
    ``rope_theta`` is the *unscaled* base b, ``rotary_dim`` is d (the rotated part of a head).
    The ``attention_factor`` keyword fixes the YaRN attention factor; it is stored as
    ``fixed_attention_factor`` because ``attention_factor(seq_len)`` is the method that
    answers what the factor is.
    """

    __slots__ = (
        *(f if f != "attention_factor" else "fixed_attention_factor" for f in FIELDS),
        "shipped",
    )

    def __init__(
        self,
        method: str = "yarn",
        factor: float = 1.0,
        original_max_position_embeddings: int | None = None,
        rope_theta: float = 10000.0,
        rotary_dim: int | None = None,
        *,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        attention_factor: float | None = None,
        truncate: bool = True,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        short_factor: tuple[float, ...] | None = None,
        long_factor: tuple[float, ...] | None = None,
    ):
        set_ = object.__setattr__
        method = canonical_method(method)
        set_(self, "method", method)
        set_(self, "factor", checked_factor(method, factor))
        theta = _finite_number("rope_theta", rope_theta)
        if theta <= 1:
            raise ValueError(f"rope_theta must be > 1, got {rope_theta!r}")
        set_(self, "rope_theta", theta)
        if rotary_dim is None:
            raise ValueError(
                "rotary_dim is required: head_dim × partial_rotary_factor (an even integer >= 4)"
            )
        dim = _positive_int("rotary_dim", rotary_dim)
        if dim % 2 or dim < 4:
            raise ValueError(f"rotary_dim must be an even integer >= 4, got {rotary_dim!r}")
        set_(self, "rotary_dim", dim)
        original = _positive_int(
            "original_max_position_embeddings", original_max_position_embeddings, allow_none=True
        )
        if original is None and method in NEEDS_ORIGINAL:
            raise ValueError(
                f"original_max_position_embeddings is required for method {method!r} "
                "(the pre-training context length, e.g. 4096)"
            )
        set_(self, "original_max_position_embeddings", original)
        for name, value in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
            value = _finite_number(name, value)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
            set_(self, name, value)
        for name, value in (
            ("mscale", mscale),
            ("mscale_all_dim", mscale_all_dim),
            ("fixed_attention_factor", attention_factor),
        ):
            value = _finite_number(name.replace("fixed_", ""), value, allow_none=True)
            if value is not None and value <= 0:
                raise ValueError(f"{name.replace('fixed_', '')} must be > 0, got {value!r}")
            set_(self, name, value)
        for name, value in (
            ("low_freq_factor", low_freq_factor),
            ("high_freq_factor", high_freq_factor),
        ):
            value = _finite_number(name, value)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
            set_(self, name, value)
        for name, value in (("short_factor", short_factor), ("long_factor", long_factor)):
            set_(self, name, _rescale_factors(name, value, dim, method))
        if not isinstance(truncate, bool):
            raise ValueError(f"truncate must be True or False, got {truncate!r}")
        set_(self, "truncate", truncate)
        set_(self, "shipped", False)
        self._validate_knobs()

    def __setattr__(self, name, value):
        raise AttributeError(f"RopeScaling is immutable; use spec.replace({name}=...)")

    def fields(self) -> dict[str, Any]:
        """The constructor keywords that rebuild this spec."""
        return {
            f: getattr(self, "fixed_attention_factor" if f == "attention_factor" else f)
            for f in FIELDS
        }

    def knobs(self) -> dict[str, Any]:
        """The knobs (YaRN's, llama3's) that differ from their defaults."""
        fields = self.fields()
        return {k: fields[k] for k, d in KNOB_DEFAULTS.items() if fields[k] != d}

    def replace(self, **changes) -> RopeScaling:
        return RopeScaling(**{**self.fields(), **changes})

    def as_shipped(self) -> RopeScaling:
        """This spec marked as a checkpoint's own scaling (``is_checkpoint_scaling``): a YaRN
        read from a config that yarnlib did not write, with knobs showing it was trained so."""
        spec = self.replace()
        object.__setattr__(spec, "shipped", True)
        return spec

    def __reduce__(self):  # pickling (and copy) go through the validating constructor
        return (_rebuild, (self.fields(), self.shipped))

    def __eq__(self, other):
        # a shipped spec runs another context and refuses rescales: it is not the same spec
        if not isinstance(other, RopeScaling):
            return NotImplemented
        return (self.fields(), self.shipped) == (other.fields(), other.shipped)

    def __hash__(self):
        return hash((tuple(self.fields().items()), self.shipped))

    def __repr__(self):
        shown = {k: v for k, v in self.fields().items() if k not in KNOB_DEFAULTS}
        shown.update(self.knobs())
        text = "RopeScaling(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"
        return text + ".as_shipped()" if self.shipped else text

    def _validate_knobs(self):
        if self.beta_fast < self.beta_slow:
            raise ValueError(
                f"beta_fast must be >= beta_slow, got beta_fast={self.beta_fast!r}, "
                f"beta_slow={self.beta_slow!r}"
            )
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be > low_freq_factor, got high_freq_factor="
                f"{self.high_freq_factor!r}, low_freq_factor={self.low_freq_factor!r}"
            )
        # A knob the method ignores is a mistake the user should hear about.
        for field, value in self.knobs().items():
            allowed = (
                RAMP_METHODS if field in ("beta_fast", "beta_slow", "truncate") else YARN_METHODS
            )
            if field in LLAMA3_KNOB_DEFAULTS:
                allowed = ("llama3",)
            elif field in LONGROPE_KNOB_DEFAULTS:
                allowed = ("longrope",)
            elif field == "attention_factor":
                allowed = YARN_METHODS | {"longrope"}
            if self.method not in allowed:
                raise ValueError(
                    f"{field}={value!r} has no effect with method {self.method!r}; "
                    f"it applies to: {', '.join(sorted(allowed))}"
                )

    # -- the math -------------------------------------------------------------------------

    def frequencies(self, seq_len: int | None = None) -> Frequencies:
        """``(inv_freq, attention_factor)`` at ``seq_len`` (used by the dynamic methods only)."""
        if seq_len is not None:
            seq_len = _positive_int("seq_len", seq_len)
        fn = frequencies.METHOD_FUNCTIONS[self.method]
        return fn(
            rope_theta=self.rope_theta,
            rotary_dim=self.rotary_dim,
            factor=self.factor,
            original=self.original_max_position_embeddings,
            seq_len=seq_len,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            truncate=self.truncate,
            mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim,
            attention_factor=self.fixed_attention_factor,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            short_factor=self.short_factor,
            long_factor=self.long_factor,
        )

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        """float32 inverse frequencies, shape ``[rotary_dim // 2]``."""
        return self.frequencies(seq_len).inv_freq

    def attention_factor(self, seq_len: int | None = None) -> float:
        """The factor multiplying cos and sin (transformers' ``attention_scaling``)."""
        return self.frequencies(seq_len).attention_factor

    @property
    def is_dynamic(self) -> bool:
        return self.method in DYNAMIC

    @property
    def tables_depend_on_length(self) -> bool:
        """Whether the rotary tables change with the sequence length (the dynamic methods;
        longrope, short factors up to L and long ones beyond, unless they are equal): keys
        cached while a sequence was shorter were then rotated by other tables."""
        if self.method == "longrope":
            return self.short_factor != self.long_factor
        return self.is_dynamic

    @property
    def is_applied_longrope(self) -> bool:
        """longrope with equal short and long factors and a fixed attention factor: the form
        ``yarnlib tune`` writes. transformers picks the short factors up to L and the long ones
        beyond, vLLM the long ones once max_model_len exceeds L; equal factors run the same
        tables everywhere, so it is a plain re-scaling of the unscaled model (applied to it and
        re-scaled from it), where a checkpoint's own longrope is kept as it is."""
        return (
            self.method == "longrope"
            and self.short_factor == self.long_factor
            and self.fixed_attention_factor is not None
        )

    @property
    def is_checkpoint_scaling(self) -> bool:
        """A checkpoint's own scaling (llama3, longrope other than yarnlib's, a shipped YaRN
        with its knobs; see ``as_shipped``): kept as it is."""
        return self.shipped or (self.method in CHECKPOINT_METHODS and not self.is_applied_longrope)

    @property
    def max_position_embeddings(self) -> int | None:
        """The extended context L × s (None when L is unknown, and for a checkpoint's own
        scaling, which states its context apart from the factor: 131072 for 8192 × 8)."""
        if self.original_max_position_embeddings is None or self.is_checkpoint_scaling:
            return None
        return int(round(self.original_max_position_embeddings * self.factor))

    def rescaled(
        self,
        method: str,
        factor: float,
        original_max_position_embeddings: int | None = None,
        **knobs,
    ) -> RopeScaling:
        """``method`` at ``factor`` applied to the *unscaled* model this spec describes (its
        base theta, rotary dim and original context): scaling again never compounds."""
        original = original_max_position_embeddings or self.original_max_position_embeddings
        target = method_name(method)
        if target == "longrope" and not self.is_checkpoint_scaling:
            _check_applied_longrope(knobs)
        elif target in CHECKPOINT_METHODS and self.method != target:
            raise ValueError(
                f"method {method!r} is kept where a checkpoint ships it (rope_type "
                f"{target!r}), not applied to a model running {self.method!r}; "
                f"to extend this model use one of: {', '.join(METHODS[1:])}"
            )
        if self.is_checkpoint_scaling:
            same = target == self.method
            changes = dict(knobs, factor=factor, original_max_position_embeddings=original)
            if not same or self.replace(**changes) != self.replace():
                why = (
                    "its knobs would be dropped and the attention factor changed"
                    if self.shipped
                    else "no native form in transformers or vLLM, so patch, config files and "
                    "vLLM would disagree"
                )
                raise ValueError(
                    f"method: the checkpoint already runs rope {self.method!r} "
                    f"({self.describe()}), the frequencies it was trained with; yarnlib keeps "
                    f"them as they are and does not rescale them to method={method!r} "
                    f"factor={factor!r} ({why}). Use method {self.method!r} with factor "
                    f"{self.factor:g}, which runs the checkpoint's context unchanged everywhere; "
                    "for a longer context start from the unscaled base checkpoint"
                )
            return self
        if original is None:
            raise ValueError(
                f"original_max_position_embeddings: the config (rope {self.method!r}) does not "
                "record the original context; pass it explicitly"
            )
        return RopeScaling(method, factor, original, self.rope_theta, self.rotary_dim, **knobs)

    def describe(self) -> str:
        parts = [self.method, f"factor={self.factor:g}"]
        if self.original_max_position_embeddings:
            parts.append(f"original={self.original_max_position_embeddings}")
        parts += [f"theta={self.rope_theta:g}", f"rotary_dim={self.rotary_dim}"]
        parts += [
            f"{k}=[{len(v)} values]" if isinstance(v, tuple) else f"{k}={v}"
            for k, v in self.knobs().items()
        ]
        return " ".join(parts)

    # -- conversions (yarnlib.convert; vLLM's in yarnlib.vllm.kwargs) ----------------------------

    def to_hf(self, format: str = "v4") -> dict[str, Any]:
        from yarnlib import convert

        return convert.to_hf(self, format)

    @classmethod
    def from_hf(cls, config: Any, rotary_dim: int | None = None) -> RopeScaling:
        from yarnlib import convert

        return convert.from_hf(config, rotary_dim=rotary_dim)

    def to_vllm(self, head_dim: int | None = None, vllm_version: str | None = None):
        from yarnlib.vllm.kwargs import to_vllm  # vLLM's readers live in yarnlib.vllm

        return to_vllm(self, head_dim, vllm_version)


def _check_applied_longrope(knobs: dict[str, Any]) -> None:
    """longrope goes onto a model only as ``yarnlib tune`` writes it (see is_applied_longrope)."""
    short, long, attention = (
        knobs.get(k) for k in ("short_factor", "long_factor", "attention_factor")
    )
    if short is None or long is None or attention is None or list(short) != list(long):
        raise ValueError(
            "method 'longrope' applies to a model only with per-frequency factors, short_factor "
            "equal to long_factor, and an attention_factor (what transformers and vLLM run alike), "
            f"got short_factor={short!r}, long_factor={long!r}, attention_factor={attention!r}; "
            "pass a spec file of yarnlib tune (--spec best.json)"
        )


def _rebuild(fields: dict[str, Any], shipped: bool = False) -> RopeScaling:
    """A pickled spec (``shipped`` is absent from pickles written before it was kept)."""
    spec = RopeScaling(**fields)
    return spec.as_shipped() if shipped else spec
