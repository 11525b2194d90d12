"""The results as a chart: files/s per method and pass, median bars with min-max whiskers (PNG)."""

from __future__ import annotations

import statistics


def draw(path: str, title: str, passes: list[tuple[str, dict[str, list[float]]]], methods: list[str],
         ylabel: str = "files/s (decode: images/s)") -> str:
    """One group of bars per pass ``(label, {method: [values per round]})``, one bar per method."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(passes) + 2), 5), dpi=110)
    width = 0.8 / max(1, len(methods))
    for i, name in enumerate(methods):
        xs, mids, lo, hi = [], [], [], []
        for j, (_label, values) in enumerate(passes):
            v = [x for x in values.get(name, []) if x is not None]
            if v:
                mid = statistics.median(v)
                xs.append(j + (i - (len(methods) - 1) / 2) * width)
                mids.append(mid)
                lo.append(mid - min(v))
                hi.append(max(v) - mid)
        ax.bar(xs, mids, width, yerr=[lo, hi], capsize=2, label=name)
    ax.set_xticks(range(len(passes)), [label for label, _ in passes], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title + "\nbars: median of rounds; whiskers: min-max", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
