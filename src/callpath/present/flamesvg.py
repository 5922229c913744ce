"""A standalone SVG flame graph (``callpath report DB --flame -o FILE.svg``).

Geometry comes from :mod:`callpath.analysis.flame` (rectangles of at least one pixel), so the
file stays small whatever the size of the tree. Every rectangle is a ``<g class="frame">``
holding a ``<title>`` (name, value, percent: the tooltip), the ``<rect>`` and, when there is
room, a ``<text>`` label; ``data-parent`` numbers the enclosing frame so that a reader (or a
test) can check that children fit inside their parent. Colours: a warm hue per name (the
classic flame graph palette, stable across runs), or on a comparison database red where the
delta is positive (slower), blue where it is negative, saturation by the size of the delta.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.flame import FlameFrame, flame_frame
from callpath.analysis.flame_labels import delta_column, rect_names, rect_values
from callpath.analysis.topdown import TopDownView, View
from callpath.errors import CallpathError

F64 = npt.NDArray[np.float64]

ROW = 17
MARGIN = 10
TOP = 34
FONT = 11
CHAR_W = 6.4  # mean advance of the 11 px monospace font, for clipping labels


def _warm(name: str) -> str:
    h = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=3).digest()
    return f"rgb({205 + h[0] % 50},{int(230 * h[1] / 255)},{int(55 * h[2] / 255)})"


def _diff(v: float, scale: float) -> str:
    if not math.isfinite(v) or scale <= 0 or v == 0:
        return "rgb(220,220,220)"
    s = min(1.0, abs(v) / scale)
    c = int(220 - 190 * s)
    return f"rgb(235,{c},{c})" if v > 0 else f"rgb({c},{c},235)"


def render_svg(frame: FlameFrame, names: Sequence[str], values: F64, *, title: str,
               metric: str, width: int = 1200, icicle: bool = False,
               colors: F64 | None = None, color_name: str | None = None) -> str:
    """The SVG document of a frame. ``values`` are the rectangles' values (for tooltips),
    ``colors`` optional differential values (e.g. a ``[delta]`` column)."""
    inner = width - 2 * MARGIN
    depth_n = int(frame.depth.max()) + 1 if len(frame) else 1
    height = TOP + depth_n * ROW + MARGIN + (16 if colors is not None else 0)
    scale = float(np.nanmax(np.abs(colors))) if colors is not None and len(colors) else 0.0
    total = frame.total
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="{FONT}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fdfdf6"/>',
        f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="15">'
        f'{escape(title)}</text>',
        f'<text x="{MARGIN}" y="30" fill="#555">{escape(metric)}: total {total:.6g}'
        f'{" — " + escape(str(color_name)) + " as colour" if color_name else ""}</text>',
    ]
    xs = MARGIN + frame.x * inner
    ws = frame.w * inner
    for i in range(len(frame)):
        d = int(frame.depth[i])
        y = TOP + d * ROW if icicle else TOP + (depth_n - 1 - d) * ROW
        name = names[i]
        v = float(values[i])
        pct = 100.0 * v / total if total else 0.0
        fill = _diff(float(colors[i]), scale) if colors is not None else _warm(name)
        tip = f"{name} — {v:.6g} ({pct:.2f}%)"
        if colors is not None:
            tip += f", {color_name}: {float(colors[i]):+.6g}"
        out.append(f'<g class="frame" data-index="{i}" data-parent="{int(frame.parent[i])}" '
                   f'data-depth="{d}" data-value="{v:.9g}">')
        out.append(f"<title>{escape(tip)}</title>")
        out.append(f'<rect x="{xs[i]:.3f}" y="{y}" width="{ws[i]:.3f}" height="{ROW - 1}" '
                   f'fill="{fill}" rx="2"/>')
        room = int((ws[i] - 6) / CHAR_W)
        if room >= 3:
            label = name if len(name) <= room else name[:room - 2] + ".."
            out.append(f'<text x="{xs[i] + 3:.3f}" y="{y + ROW - 5}">{escape(label)}</text>')
        out.append("</g>")
    if colors is not None:
        y = height - 8
        out.append(f'<text x="{MARGIN}" y="{y}" fill="#555">colour: red = {escape(str(color_name))}'
                   f' &gt; 0 (more), blue &lt; 0 (less); strongest at |{scale:.3g}|</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def flame_svg(columns: ColumnSet, view: View, col: ColumnDef, start: int, *, title: str,
              width: int = 1200) -> str:
    """The flame graph (Top-down) or icicle (other views) of ``start`` for column ``col``:
    inclusive widths in Top-down, the metric's exclusive values otherwise (see
    :func:`callpath.analysis.flame.flame_frame`); coloured by the delta column on a
    comparison database."""
    if col.scope == "exclusive" or (col.metric is None and not isinstance(view, TopDownView)):
        raise CallpathError(f"--flame: column {col.title!r} cannot set widths: expected an "
                            "inclusive column (a measured metric outside Top-down)")
    excl = col if isinstance(view, TopDownView) or col.metric is None \
        else columns.columns[2 * col.metric + 1]
    frame = flame_frame(view, lambda: columns.values(view, col),
                        lambda: columns.values(view, excl), start, 1.0 / (width - 2 * MARGIN))
    values = rect_values(columns, view, excl, frame)
    values[0] = frame.total
    delta = delta_column(columns, excl)
    colors = rect_values(columns, view, delta, frame) if delta is not None else None
    return render_svg(frame, rect_names(view, frame), values, title=title, metric=excl.title,
                      width=width, icicle=not isinstance(view, TopDownView), colors=colors,
                      color_name=delta.title if delta is not None else None)
