"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

One *evented* profile per execution context, and the summary first: a frame opens when its
subtree's cost starts and closes when it ends, laid out left to right in preorder. That is two
events per frame node whatever the number of samples, and the positions come from one prefix sum
over the frames' self weights, so they never decrease (speedscope rejects events out of order).
Frames are shared by all profiles: one per procedure, with its file and line.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import numpy as np

from callpath import __version__
from callpath.formats.stacks import FrameTree, check_nonnegative
from callpath.model import Metric

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_unit(metric: Metric) -> str:
    """speedscope's unit for a metric: seconds for times, bytes for sizes, else none."""
    name = metric.name.lower()
    if name.endswith("(sec)") or metric.unit.lower() in ("s", "sec", "seconds"):
        return "seconds"
    if name.endswith("(bytes)") or metric.unit.lower() == "bytes":
        return "bytes"
    return "none"


def evented_events(ft: FrameTree, point: np.ndarray) -> tuple[str, float]:
    """The ``events`` array (JSON text) of one profile and its end value."""
    selfw, incl = ft.frame_weights(point)
    keep = ft.kept(selfw, incl)
    if not len(keep):
        return "[]", 0.0
    # frame subtrees among the kept frames: preorder positions and subtree ends
    n = len(ft)
    pos = np.full(n, -1, dtype=np.int64)
    pos[keep] = np.arange(len(keep))
    depth = ft.depth()[keep]
    parent = ft.parent[keep]
    kp = np.where(parent >= 0, pos[np.maximum(parent, 0)], -1)
    size = np.ones(len(keep), dtype=np.int64)
    order = np.argsort(-depth, kind="stable")
    for d in np.unique(depth)[::-1]:
        if d == 0:
            break
        sel = order[depth[order] == d]
        np.add.at(size, kp[sel], size[sel])
    end = np.arange(len(keep)) + size
    csum = np.zeros(len(keep) + 1)
    np.cumsum(selfw[keep], out=csum[1:])
    # events: open k at slot k, close k at slot end[k]; at one slot closes (deepest first)
    # come before the open
    slots = np.concatenate([np.arange(len(keep)), end])
    kinds = np.concatenate([np.ones(len(keep), np.int64), np.zeros(len(keep), np.int64)])
    tie = np.concatenate([np.zeros(len(keep), np.int64), -depth])
    ev_order = np.lexsort((tie, kinds, slots))
    frames = np.concatenate([ft.frame[keep], ft.frame[keep]])[ev_order].tolist()
    at = csum[slots[ev_order]].tolist()
    typ = ["C", "O"]
    kk = kinds[ev_order].tolist()
    body = ",".join([f'{{"type":"{typ[t]}","frame":{f},"at":{a!r}}}'
                     for t, f, a in zip(kk, frames, at, strict=True)])
    return f"[{body}]", float(csum[-1])


def write_speedscope(ft: FrameTree, metric: Metric, profiles: list[tuple[str, np.ndarray]],
                     out: TextIO, name: str) -> None:
    """Write the file: ``profiles`` are (name, per-node point values) pairs."""
    unit = speedscope_unit(metric)
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
        events, end = evented_events(ft, point)
        if i:
            out.write(",")
        out.write('{"type":"evented","name":' + json.dumps(f"{pname}: {metric.name}")
                  + f',"unit":"{unit}","startValue":0,"endValue":{end!r},"events":')
        out.write(events)
        out.write("}")
    out.write('],"name":' + json.dumps(name) + ',"activeProfileIndex":0,"exporter":'
              + json.dumps(f"callpath {__version__}") + "}\n")
