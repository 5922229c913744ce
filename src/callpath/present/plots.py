"""Per-execution-context graphs as PNG files: hpcviewer's plot, sorted plot and histogram.

matplotlib is imported inside the function (with the non-interactive Agg backend), so that
nothing else in callpath pays for it and no display is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from callpath.analysis.percontext import ContextValues
from callpath.errors import CallpathError

PLOT_KINDS = ("plot", "sorted", "histogram")


def save_plot(data: ContextValues, kind: str, path: str | os.PathLike[str], *, title: str,
              metric: str, bins: int | None = None) -> Path:
    """Draw the values of one node across execution contexts and save them as PNG.

    ``plot``: value per context in context order; ``sorted``: the same values in increasing
    order (load imbalance shows as a slope); ``histogram``: how many contexts fall in each
    value range."""
    if kind not in PLOT_KINDS:
        raise CallpathError(f"plot kind {kind!r}: expected one of {', '.join(PLOT_KINDS)}")
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise CallpathError(f"{out}: plots are written as PNG; expected a file name ending "
                            "in .png")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    vals = data.values
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        if kind == "plot":
            ax.plot(np.arange(len(vals)), vals, marker="o", linestyle="-", markersize=3)
            ax.set_xlabel("execution context")
            ax.set_ylabel(metric)
            _context_ticks(ax, data.labels)
        elif kind == "sorted":
            ax.plot(np.arange(len(vals)), np.sort(vals), marker="o", linestyle="-",
                    markersize=3)
            ax.set_xlabel("execution contexts, sorted by value")
            ax.set_ylabel(metric)
        else:
            nbins = bins or max(1, min(50, int(np.ceil(np.sqrt(len(vals))))))
            ax.hist(vals, bins=nbins)
            ax.set_xlabel(metric)
            ax.set_ylabel("execution contexts")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(out, format="png")
        except OSError as e:
            raise CallpathError(f"{out}: cannot write the plot: {e.strerror}") from None
    finally:
        plt.close(fig)
    return out


def _context_ticks(ax: object, labels: list[str]) -> None:
    """Label the x axis with context names when there are few enough to read."""
    if len(labels) <= 16:
        ax.set_xticks(range(len(labels)))  # type: ignore[attr-defined]
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)  # type: ignore[attr-defined]
