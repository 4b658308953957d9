"""The ``yarnlib config`` tool: show or rewrite the RoPE settings of a model folder on disk.

``files`` is the API (re-exported here), ``cli`` the command, ``json_text`` the
order-preserving edits of a JSON file's text, ``file_set`` the journal that rewrites several
files as a set.

    from yarnlib import config
    spec = config.target_spec("Qwen2.5-7B-Instruct", method="yarn", factor=4)
    print(config.diff(config.plan("Qwen2.5-7B-Instruct", spec)))
"""

from yarnlib.config.files import (
    FORMATS,
    WEIGHTS,
    Change,
    apply,
    complete_interrupted,
    current_spec,
    diff,
    plan,
    show,
    target_spec,
)

__all__ = [
    "FORMATS",
    "WEIGHTS",
    "Change",
    "apply",
    "complete_interrupted",
    "current_spec",
    "diff",
    "plan",
    "show",
    "target_spec",
]
