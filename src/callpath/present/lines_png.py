"""PNG drawings of the line × context views with matplotlib (imported here only, Agg).

Colours follow the seed: cold blue/green to hot red ("jet"), lines without cost in any
context black. The detail drawing prints the value in every cell and, beside it, the sorted
processor view (Figure 1c: a dark bar for the minimum, a light bar for max − min).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.analysis.lines import LineMatrix, Overview, line_stats, rows_dense, source_text
from callpath.errors import CallpathError
from callpath.present.lines_text import fmt_value


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _check(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise CallpathError(f"{out}: drawings are written as PNG; expected a file name ending "
                            "in .png")
    return out


def _save(fig: Any, out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    except OSError as e:
        raise CallpathError(f"{out}: cannot write the drawing: {e.strerror}") from None


def _cmap() -> Any:
    import matplotlib

    cmap = matplotlib.colormaps["jet"].copy()
    cmap.set_bad("black")
    return cmap


def save_detail_png(m: LineMatrix, rows: npt.NDArray[np.int64], path: str | os.PathLike[str],
                    *, normalize: str = "window") -> Path:
    """The detail window (Figure 1a-c) of ``rows``: heat map with values, source, min/max."""
    out = _check(path)
    if not len(rows):
        raise CallpathError("no line to draw: the range holds no line")
    plt = _pyplot()
    dense = rows_dense(m, rows)
    st = line_stats(m, rows)
    top = float(dense.max()) if normalize == "window" else float(m.vals.max(initial=0.0))
    top = top or 1.0
    shown = np.ma.masked_where(np.repeat((dense == 0).all(axis=1)[:, None], m.n_cols, axis=1),
                               dense / top)
    n = len(rows)
    h = max(2.5, 0.22 * n + 1.2)
    w_heat = max(2.0, 0.55 * m.n_cols)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(w_heat + 9, h), dpi=100,
                                  gridspec_kw={"width_ratios": [w_heat + 5, 3]})
    try:
        ax.imshow(shown, aspect="auto", cmap=_cmap(), vmin=0, vmax=1, interpolation="nearest")
        if n * m.n_cols <= 4000:
            for i in range(n):
                for c in range(m.n_cols):
                    if dense[i, c] != 0 or not (dense[i] == 0).all():
                        ax.text(c, i, fmt_value(float(dense[i, c])), ha="center",
                                va="center", fontsize=7, color="white")
        texts: dict[int, list[str] | None] = {}
        labels = []
        for r in rows.tolist():
            f = int(m.file_of_row[r])
            if f not in texts:
                texts[f] = source_text(m, f)
            ln = int(m.line_of_row[r])
            src = texts[f]
            s = src[ln - 1].strip() if src is not None and 1 <= ln <= len(src) else ""
            labels.append(f"{ln:>5} {s[:48]}")
        ax.set_yticks(range(n))
        ax.set_yticklabels(labels, fontsize=7, family="monospace")
        ax.yaxis.tick_right()
        ax.set_xticks(range(m.n_cols))
        ax.set_xticklabels(m.short_labels, fontsize=7)
        ax.set_title(f"{m.metric} per line and context (normalised to the "
                     f"{'window' if normalize == 'window' else 'program'})", fontsize=9)
        y = np.arange(n)
        ax2.barh(y, st["min"], color="#333366", height=0.7)
        ax2.barh(y, st["max"] - st["min"], left=st["min"], color="#aab4e8", height=0.7)
        for i in range(n):
            if st["max"][i] != 0:
                ax2.text(st["max"][i], i,
                         f" min {fmt_value(st['min'][i])}"
                         f"({m.short_labels[int(st['min_context'][i])]}) max "
                         f"{fmt_value(st['max'][i])}"
                         f"({m.short_labels[int(st['max_context'][i])]})",
                         va="center", fontsize=6)
        ax2.set_ylim(n - 0.5, -0.5)
        ax2.set_yticks([])
        ax2.set_title("min / max per line", fontsize=9)
        fig.tight_layout()
        _save(fig, out)
    finally:
        plt.close(fig)
    return out


def save_overview_png(m: LineMatrix, ov: Overview, path: str | os.PathLike[str], *,
                      outlines: list[tuple[int, int, str]] | None = None) -> Path:
    """The overview (Figure 4): strips side by side, each ``strip_lines`` rows high and one
    pixel column per display column; ``outlines`` are (first_row, last_row, colour) ranges of
    the axis drawn as rectangles through the overview's map."""
    out = _check(path)
    if not ov.n_orows:
        raise CallpathError("the overview is empty: no line has a cost")
    plt = _pyplot()
    grid = ov.strips()
    ns, sl, nc = grid.shape
    gap = 1
    img = np.full((sl, ns * (nc + gap)), np.nan)
    top = float(np.nanmax(grid)) or 1.0
    for s in range(ns):
        img[:, s * (nc + gap):s * (nc + gap) + nc] = grid[s] / top
    # zero cells black (the seed's colour for lines without cost), padding light grey
    shown = np.ma.masked_invalid(np.where(img == 0, np.nan, np.nan_to_num(img, nan=-1.0)))
    fig, ax = plt.subplots(figsize=(max(6.0, min(16, 0.06 * img.shape[1] + 3)), 6), dpi=100)
    try:
        cmap = _cmap()
        cmap.set_under("#d0d0d0")
        ax.imshow(shown, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        from matplotlib.patches import Rectangle

        for a, b, colour in outlines or []:
            for s, r0, nrows in ov.rectangles(a, b):
                ax.add_patch(Rectangle((s * (nc + gap) - 0.5, r0 - 0.5), nc, nrows,
                                       fill=False, edgecolor=colour, linewidth=1.5))
        every = max(1, -(-ns // 30))  # at most ~30 strip labels
        ax.set_xticks([s * (nc + gap) + nc / 2 - 0.5 for s in range(0, ns, every)])
        ax.set_xticklabels([str(s) for s in range(0, ns, every)], fontsize=7)
        ax.set_xlabel("strip")
        ax.set_ylabel("row in strip")
        ax.set_title(f"{m.metric}: {m.n_rows} lines, runs > {ov.skip} empty skipped, bins of "
                     f"{ov.bin} ({ov.reduce}), strips of {ov.strip_lines}", fontsize=9)
        fig.tight_layout()
        _save(fig, out)
    finally:
        plt.close(fig)
    return out
