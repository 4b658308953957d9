"""Defaults the docs state are the ones the code runs (issue 52, mutation round 4)."""

import re
from pathlib import Path

import torch

from yarnlib.cli import build_parser
from yarnlib.pose import pose_position_ids

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented(page: str, pattern: str) -> int:
    (found,) = re.findall(pattern, (DOCS / page).read_text())
    return int(found)


def test_tune_needles_default_is_the_documented_one():
    needles = documented("tune.md", r"`--needles K`\s+\(default (\d+)")
    args = build_parser().parse_args(
        ["tune", "--model", "m", "--target-length", "8", "--dataset", "d", "--output", "o"]
    )
    assert (args.objective, args.needles) == ("nll", needles)


def test_pose_position_ids_default_to_the_documented_chunks():
    """Left out, ``chunks`` is the documented count: as many chunk starts per row, and rows
    whose positions skip (the last one beyond window - 1)."""
    chunks = documented("finetune.md", r"pose_position_ids\(batch_size, window, target_length, "
                        r"chunks=(\d+)")  # fmt: skip
    drawn = pose_position_ids(50, 16, 64, generator=torch.Generator().manual_seed(0))
    assert drawn.chunk_starts.shape == (50, chunks)
    assert (drawn.position_ids[:, -1] > 15).any()
