"""``yarnlib inspect``: what a scaling method does to each frequency dimension."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from yarnlib import atomic
from yarnlib.config import current_spec
from yarnlib.frequencies import base_inv_freq, extrapolation_weight
from yarnlib.model_arg import add_model_argument
from yarnlib.spec import METHODS, RAMP_METHODS, RopeScaling, canonical_method

PLOT_FORMATS = (".png", ".svg", ".pdf")
DATA_WRITER = "yarnlib inspect --plot"  # marks the data files a later plot may replace


def dimension_table(spec: RopeScaling, seq_len: int | None = None) -> list[dict[str, Any]]:
    """One row per frequency pair: wavelength, rotations in L, new/old frequency, ramp value."""
    base = base_inv_freq(spec.rope_theta, spec.rotary_dim)
    scaled = spec.inv_freq(seq_len)
    original = spec.original_max_position_embeddings
    ramp = None
    if spec.method in RAMP_METHODS:
        ramp = 1 - extrapolation_weight(
            spec.rotary_dim,
            spec.rope_theta,
            original,
            spec.beta_fast,
            spec.beta_slow,
            spec.truncate,
        )
    rows = []
    for i, (old, new) in enumerate(zip(base.tolist(), scaled.tolist(), strict=True)):
        wavelength = 2 * math.pi / old
        rows.append(
            {
                "dim": i,
                "wavelength": wavelength,
                "rotations_in_original": None if original is None else original / wavelength,
                "frequency_ratio": new / old,
                "ramp": None if ramp is None else float(ramp[i]),
            }
        )
    return rows


def summary(spec: RopeScaling, seq_len: int | None) -> dict[str, Any]:
    return {
        "spec": spec.fields(),
        "seq_len": seq_len,
        "attention_factor": spec.attention_factor(seq_len),
        "max_position_embeddings": spec.max_position_embeddings,
        "dimensions": dimension_table(spec, seq_len),
    }


def print_table(result: dict[str, Any]) -> None:
    spec = RopeScaling(**result["spec"])
    print(f"{spec.describe()}  attention_factor={result['attention_factor']:.6g}")
    print(f"{'dim':>4} {'wavelength':>14} {'rot. in L':>12} {'new/old freq':>13} {'ramp':>6}")
    for row in result["dimensions"]:
        rotations = row["rotations_in_original"]
        ramp = row["ramp"]
        print(
            f"{row['dim']:>4} {row['wavelength']:>14.6g} "
            f"{'-' if rotations is None else format(rotations, '.4g'):>12} "
            f"{row['frequency_ratio']:>13.6g} {'-' if ramp is None else format(ramp, '.3f'):>6}"
        )


def plot(spec: RopeScaling, path: Path) -> dict[str, Any]:
    """Each method's new/old frequency ratio per dimension, side by side, at the same s and L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    original = spec.original_max_position_embeddings or 4096
    # Dynamic methods are drawn at the extended length L × s, where they reach the factor.
    seq_len = int(original * spec.factor)
    fig, axes = plt.subplots(1, len(METHODS), figsize=(3.0 * len(METHODS), 3.2), sharey=True)
    curves = {}
    for ax, method in zip(axes, METHODS, strict=True):
        knobs = spec.knobs() if method in RAMP_METHODS else {}
        if method not in ("yarn", "dynamic_yarn"):
            knobs = {k: v for k, v in knobs.items() if k in ("beta_fast", "beta_slow", "truncate")}
        other = RopeScaling(
            method=method,
            factor=1.0 if method == "none" else spec.factor,
            original_max_position_embeddings=original,
            rope_theta=spec.rope_theta,
            rotary_dim=spec.rotary_dim,
            **knobs,
        )
        ratios = [row["frequency_ratio"] for row in dimension_table(other, seq_len)]
        curves[method] = ratios
        ax.plot(range(len(ratios)), ratios, lw=2, color="C3" if method == spec.method else "C0")
        ax.set_yscale("log")
        ax.set_title(method, fontsize=10, fontweight="bold" if method == spec.method else None)
        ax.set_xlabel("frequency index i")
        ax.axhline(1 / spec.factor, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("new / old frequency")
    fig.suptitle(
        f"s={spec.factor:g}, L={original}, theta={spec.rope_theta:g}, d={spec.rotary_dim} "
        f"(dynamic methods at {seq_len} tokens)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_figure(path, fig, dpi=110)
    plt.close(fig)
    data = {
        "written_by": DATA_WRITER,
        "seq_len": seq_len,
        "frequency_ratio": curves,
        "spec": spec.fields(),
    }
    text = json.dumps(data, indent=2) + "\n"
    atomic.write_text(data_path(path), text, "plot")
    return data


def data_path(plot_path: Path) -> Path:
    """The plot's numbers: its name plus ``.json`` (``curves.png.json``), never a name such as
    ``config.json`` that the plot's folder may already hold."""
    return plot_path.with_name(plot_path.name + ".json")


def check_plot_path(plot_path: Path) -> None:
    """Refuse, before anything is drawn, a plot that would replace a file it does not own."""
    if plot_path.suffix.lower() not in PLOT_FORMATS:
        raise ValueError(
            f"plot: {str(plot_path)!r} must end in one of {', '.join(PLOT_FORMATS)} (the image)"
        )
    data = data_path(plot_path)
    if data.exists() and not _written_by_plot(data):
        raise ValueError(
            f"plot: {data} exists and was not written by `yarnlib inspect --plot`; it holds the "
            "plot's data, so choose another plot name or move that file"
        )
    # an image is ours only beside the data file an earlier plot wrote with it
    if plot_path.exists() and not data.exists():
        raise ValueError(
            f"plot: {plot_path} exists and was not written by `yarnlib inspect --plot` (no "
            f"{data.name} beside it); choose another plot name or move that file"
        )


def _written_by_plot(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("written_by") == DATA_WRITER


def spec_from_args(args: argparse.Namespace) -> RopeScaling:
    given = {
        "method": args.method,
        "factor": args.factor,
        "original_max_position_embeddings": args.original_max_position_embeddings,
        "rope_theta": args.rope_theta,
        "rotary_dim": args.rotary_dim,
    }
    if args.model_dir:
        spec = current_spec(args.model_dir)
        if args.method is None and args.factor is not None and spec.method == "none":
            given["method"] = "yarn"  # a factor on an unscaled folder: yarn, as in every command
        changes = {k: v for k, v in given.items() if v is not None}
        method = given["method"]
        if method is not None and canonical_method(method) == "none":
            changes.setdefault("factor", 1.0)  # the folder's factor would not apply
        if method and spec.method == "none" and args.original_max_position_embeddings is None:
            changes.setdefault("original_max_position_embeddings", spec.max_position_embeddings)
        return spec.replace(**changes) if changes else spec
    defaults = {"method": "yarn", "factor": 1.0, "rope_theta": 10000.0}
    return RopeScaling(**{**defaults, **{k: v for k, v in given.items() if v is not None}})


def run(args: argparse.Namespace) -> int:
    if args.plot:
        check_plot_path(Path(args.plot))
    spec = spec_from_args(args)
    result = summary(spec, args.seq_len)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    if args.plot:
        plot(spec, Path(args.plot))
        if not args.json:
            print(f"plot: {args.plot} (data: {data_path(Path(args.plot))})")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="per-dimension wavelengths, rotations and frequency ratios of a scaling method",
        description="Show what a RoPE scaling method does to each frequency dimension. Give the "
        "parameters, or a model folder (its config.json), or both (the flags override it).",
    )
    add_model_argument(parser, "model_dir", required=False, folder=True)
    parser.add_argument(
        "--method",
        help=f"one of {', '.join(METHODS)} (or an alias); default: yarn, or a folder's own",
    )
    parser.add_argument("--factor", type=float)
    parser.add_argument("--original-max-position-embeddings", type=int)
    parser.add_argument("--rope-theta", type=float)
    parser.add_argument("--rotary-dim", type=int)
    parser.add_argument(
        "--length",
        "--seq-len",
        dest="seq_len",
        type=int,
        help="current length, for the dynamic methods",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw every method's curve side by side (.png, .svg or .pdf); the numbers go to "
        "FILE.png.json",
    )
    parser.set_defaults(func=run)
