"""The RoPE a planned length needs: whether the config covers it, and the factor that would.

A factor multiplies the original (pre-training) context L, never ``max_position_embeddings``:
Qwen3-8B says 40960 there but was pre-trained on 32768, and a folder that is already scaled
records L in its rope dict. ``yarnlib config`` and ``yarnlib finetune`` rescale from L too.
"""

from __future__ import annotations

import math
from fractions import Fraction

from yarnlib.plan.shapes import RopeContext


def factor_for(rope: RopeContext, context: int) -> float:
    """The factor over L (in hundredths, rounded up) that covers ``context`` and never covers
    less than the config does already."""
    target = max(context, rope.covered)
    return math.ceil(Fraction(100 * target, rope.original)) / 100


def scale_flags(rope: RopeContext, context: int) -> str:
    """``--method yarn --factor F --original-max-position-embeddings L`` for ``context``."""
    factor = factor_for(rope, context)
    return f"--method yarn --factor {factor:g} --original-max-position-embeddings {rope.original}"


def finetune_flags(rope: RopeContext | None, context: int) -> str:
    """The RoPE flags of ``yarnlib finetune`` for a ``context``-token window: the config's own
    RoPE when it covers the window (``--method none`` keeps it as it is), else YaRN over L."""
    if rope is None or context <= rope.covered or rope.own_scaling:
        return "--method none"
    return scale_flags(rope, context)


def hint(rope: RopeContext | None, context: int) -> str | None:
    """What to do first when ``context`` exceeds what the config's RoPE covers (else None)."""
    if rope is None or context <= rope.covered:
        return None
    covers = f"{context} tokens exceed the {rope.covered} that the config's RoPE covers"
    if rope.own_scaling:
        return (
            f"{covers} (the checkpoint's own {rope.method} ×{rope.factor:g} over {rope.original}"
            "), which yarnlib keeps as it is: extend the unscaled base model instead"
        )
    scaled = f"{rope.method} ×{rope.factor:g} over " if rope.method != "none" else ""
    return (
        f"{covers} ({scaled}an original context of {rope.original}): scale the RoPE first, "
        f"e.g. yarnlib config MODEL {scale_flags(rope, context)} --output DIR"
    )
