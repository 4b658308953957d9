"""The two pictures of an evaluation; each is drawn from the cells saved in the results JSON."""

from __future__ import annotations

from pathlib import Path

from yarnlib import atomic


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tokens(n: int) -> str:
    return f"{n / 1024:g}k" if n >= 1024 else str(n)


def plot_perplexity(records: list[dict], original: int | None, path: Path, title: str = "") -> Path:
    """Perplexity vs context length, one line per method, the original context marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = list(dict.fromkeys(r["method"] for r in records))
    colors = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20").colors
    for i, method in enumerate(methods):
        rows = sorted((r["length"], r["perplexity"]) for r in records if r["method"] == method)
        xs, ys = [n for n, _ in rows], [p for _, p in rows]
        ax.plot(xs, ys, marker="o", label=method, color=colors[i % len(colors)])
    if original:
        ax.axvline(original, color="grey", ls="--", lw=1)
        ax.annotate(
            f"original context {original}",
            (original, 0),
            xycoords=("data", "axes fraction"),
            xytext=(4, 6),
            textcoords="offset points",
            fontsize=8,
            color="grey",
        )
    ax.set_xscale("log", base=2)
    lengths = sorted({r["length"] for r in records})
    ax.set_xticks(lengths, [_tokens(n) for n in lengths])
    ax.minorticks_off()
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter

    # plain numbers on the log axis (matplotlib writes 3.4×10¹ otherwise)
    for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(title or "Perplexity vs context length")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_figure(path, fig, dpi=110)
    plt.close(fig)
    return path


def plot_passkey(records: list[dict], path: Path, title: str = "") -> Path:
    """Accuracy heatmap (depth down, length across), one panel per method; each cell says its
    rate, correct/trials and the Wilson 95 % interval."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in records))
    lengths = sorted({r["length"] for r in records})
    depths = sorted({r["depth"] for r in records})
    acc = {(r["method"], r["length"], r["depth"]): r["accuracy"] for r in records}
    label = {(r["method"], r["length"], r["depth"]): _rate_label(r) for r in records}
    width = 1.5 + max(1.6, 0.8 * len(lengths)) * len(methods)
    fig, axes = plt.subplots(1, len(methods), figsize=(width, 2.2 + 0.4 * len(depths)))
    axes = [axes] if len(methods) == 1 else list(axes)
    image = None
    for i, (ax, method) in enumerate(zip(axes, methods, strict=True)):
        grid = [[acc.get((method, n, d), float("nan")) for n in lengths] for d in depths]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [_tokens(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths] if i == 0 else [])
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("length")
        for y, d in enumerate(depths):
            for x, n in enumerate(lengths):
                if (method, n, d) in label:
                    ax.text(x, y, label[method, n, d], ha="center", va="center", fontsize=7)
    axes[0].set_ylabel("key depth")
    fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy")
    fig.suptitle(title or "Passkey retrieval accuracy", fontsize=10, y=1.04)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_figure(path, fig, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _rate_label(record: dict) -> str:
    if "ci_low" not in record:  # a cell written before the intervals
        return f"{record['accuracy']:.0%}"
    low, high = 100 * record["ci_low"], 100 * record["ci_high"]
    return (
        f"{record['accuracy']:.0%} ({record['correct']}/{record['trials']})\n[{low:.0f}–{high:.0f}]"
    )


def plot_passkey_lengths(rows: list[dict], path: Path, title: str = "") -> Path:
    """Accuracy per length (all trials of a length), one line per method, with the Wilson 95 %
    interval as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20").colors
    for i, method in enumerate(methods):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["length"])
        xs = [r["length"] * (1 + 0.015 * (i - len(methods) / 2)) for r in mine]  # side by side
        ys = [r["accuracy"] for r in mine]
        errors = [[y - r["ci_low"] for y, r in zip(ys, mine, strict=True)],
                  [r["ci_high"] - y for y, r in zip(ys, mine, strict=True)]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=method,
                    color=colors[i % len(colors)])  # fmt: skip
    lengths = sorted({r["length"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_tokens(n) for n in lengths])
    ax.minorticks_off()
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("passkey accuracy (95 % Wilson interval)")
    ax.set_title(title or "Passkey retrieval accuracy per length")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_figure(path, fig, dpi=110)
    plt.close(fig)
    return path


def plot_ruler(records, averages, threshold, effective, path: Path, title: str = "") -> Path:
    """RULER score per length, one panel per row: each task a thin line, the average over the
    tasks thick with its Wilson 95 % interval, the threshold dashed and the row's effective
    length (``effective``: row → length or None) in its title."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in records))
    tasks = list(dict.fromkeys(r["task"] for r in records))
    lengths = sorted({r["length"] for r in records})
    fig, axes = plt.subplots(1, len(methods), figsize=(1.5 + 3.6 * len(methods), 4), sharey=True)
    axes = [axes] if len(methods) == 1 else list(axes)
    colors = plt.get_cmap("tab20").colors
    for ax, method in zip(axes, methods, strict=True):
        for i, task in enumerate(tasks):
            mine = sorted((r["length"], r["score"]) for r in records
                          if r["method"] == method and r["task"] == task)  # fmt: skip
            ax.plot([n for n, _ in mine], [s for _, s in mine], marker=".", lw=0.8,
                    color=colors[i % len(colors)], label=task)  # fmt: skip
        mean = sorted((r for r in averages if r["method"] == method), key=lambda r: r["length"])
        if mean:
            ys = [r["score"] for r in mean]
            errors = [[y - r["ci_low"] for y, r in zip(ys, mean, strict=True)],
                      [r["ci_high"] - y for y, r in zip(ys, mean, strict=True)]]  # fmt: skip
            ax.errorbar([r["length"] for r in mean], ys, yerr=errors, color="black", lw=2.2,
                        marker="o", capsize=3, label="average")  # fmt: skip
        if threshold is not None:
            ax.axhline(threshold, color="grey", ls="--", lw=1, label="threshold")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [_tokens(n) for n in lengths])
        ax.minorticks_off()
        ax.set_ylim(-0.03, 1.03)
        found = effective.get(method, "")
        if method in effective:
            found = f" (effective: {_tokens(found) if found else 'none'})"
        ax.set_title(f"{method}{found}", fontsize=9)
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("RULER score")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(title or "RULER", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_figure(path, fig, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
