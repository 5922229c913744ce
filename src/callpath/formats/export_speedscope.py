"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

One *evented* profile per execution context, and the summary first: a frame opens when its
subtree's cost starts and closes when it ends, laid out left to right in preorder. That is two
events per frame node whatever the number of samples, and the positions come from one prefix sum
over the frames' self weights, so they never decrease (speedscope rejects events out of order).
Positions are integers (times in nanoseconds, counts as counts; see
:func:`~callpath.formats.stacks.integer_scale`): exact, and printed 3x faster than floats.
Frames are shared by all profiles: one per procedure, with its file and line.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import numpy as np

from callpath import __version__
from callpath.formats.stacks import FrameTree, IntegerScale, check_nonnegative, integer_scale
from callpath.model import Metric

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_unit(metric: Metric, scale: IntegerScale) -> str:
    """speedscope's unit for a metric written as integers: nanoseconds for times, bytes for
    sizes, else none."""
    if scale.unit == "nanoseconds":
        return "nanoseconds"
    if metric.name.lower().endswith("(bytes)") or metric.unit.lower() == "bytes":
        return "bytes"
    return "none"


def evented_events(ft: FrameTree, point: np.ndarray, factor: float = 1.0) -> tuple[str, int]:
    """The ``events`` array (JSON text) of one profile and its end value. Positions are
    integers (``point * factor`` rounded per frame), exact and fast to print."""
    selfw, incl = ft.frame_weights(point)
    keep = ft.kept(selfw, incl)
    if not len(keep):
        return "[]", 0
    # a callable frame's subtree among the kept frames: the kept frames inside its subtree of
    # the calling context tree (frames are in preorder); entries and the root hold only
    # their own slot (they never parent a frame)
    cct = ft.exp.cct
    nodes = ft.nodes[keep]
    end = np.searchsorted(nodes, cct.subtree_end[nodes], side="left").astype(np.int64)
    end = np.where(ft.top[keep], np.arange(len(keep)) + 1, end)
    csum = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(np.rint(selfw[keep] * factor).astype(np.int64), out=csum[1:])
    # events: open k at slot k, close k at slot end[k]; at one slot closes come before the
    # open, the deepest first (a descendant comes after its ancestors in preorder)
    idx = np.arange(len(keep), dtype=np.int64)
    slots = np.concatenate([idx, end])
    kinds = np.concatenate([np.ones(len(keep), np.int64), np.zeros(len(keep), np.int64)])
    tie = np.concatenate([np.zeros(len(keep), np.int64), -idx])
    ev_order = np.lexsort((tie, kinds, slots))
    frames = np.concatenate([ft.frame[keep], ft.frame[keep]])[ev_order].tolist()
    at = csum[slots[ev_order]].tolist()
    typ = ["C", "O"]
    kk = kinds[ev_order].tolist()
    body = ",".join([f'{{"type":"{typ[t]}","frame":{f},"at":{a}}}'
                     for t, f, a in zip(kk, frames, at, strict=True)])
    return f"[{body}]", int(csum[-1])


def write_speedscope(ft: FrameTree, metric: Metric, profiles: list[tuple[str, np.ndarray]],
                     out: TextIO, name: str) -> None:
    """Write the file: ``profiles`` are (name, per-node point values) pairs."""
    scale = integer_scale(metric, np.concatenate([p for _, p in profiles]))
    unit = speedscope_unit(metric, scale)
    frames: list[dict[str, Any]] = []
    for nm, fl, ln in zip(ft.names, ft.files, ft.def_lines, strict=True):
        fr: dict[str, Any] = {"name": nm}
        if fl:
            fr["file"] = fl
        if ln > 0:
            fr["line"] = ln
        frames.append(fr)
    out.write('{"$schema":' + json.dumps(SCHEMA) + ',"shared":{"frames":')
    out.write(json.dumps(frames, separators=(",", ":")))
    out.write('},"profiles":[')
    for i, (pname, point) in enumerate(profiles):
        check_nonnegative(point, metric, "speedscope")
        events, end = evented_events(ft, point, scale.factor)
        if i:
            out.write(",")
        out.write('{"type":"evented","name":' + json.dumps(f"{pname}: {metric.name}")
                  + f',"unit":"{unit}","startValue":0,"endValue":{end},"events":')
        out.write(events)
        out.write("}")
    out.write('],"name":' + json.dumps(name) + ',"activeProfileIndex":0,"exporter":'
              + json.dumps(f"callpath {__version__}") + "}\n")
