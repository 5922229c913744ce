"""Chrome's trace-event JSON (the format of ``chrome://tracing`` and Perfetto's UI) from a
database's traces.

One track (thread) per traced execution context. The trace's samples become nested complete
events (``"ph": "X"``): at every depth, a run of consecutive samples under the same frame node is
one slice from its first sample to the sample after its last, so slices nest perfectly (the same
frame node implies the same callers), which both viewers require. The samples themselves are
kept as the format's ``samples`` list, each pointing into ``stackFrames`` (one entry per frame
node, with its parent), so the file holds exactly one sample entry per trace sample that was
running (context 0, "not running", makes neither slices nor a sample entry). Times are
microseconds since the trace's first timestamp (``otherData.start_ns`` keeps the epoch).
``traceEvents`` comes first and its events hold no arrays: Perfetto's JSON reader stops at the
first top-level key it does not know and rejects event objects with array values.
"""

from __future__ import annotations

import json
from typing import TextIO

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.stacks import FrameTree

I64 = npt.NDArray[np.int64]


def _runs(ft: FrameTree, fnode: I64) -> tuple[I64, I64, I64]:
    """Runs of one track: (first sample, last sample, frame node) of every slice, for the
    samples' owner frame nodes ``fnode`` (-1 where not running)."""
    live = np.flatnonzero(fnode >= 0)
    if not len(live):
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    offsets, path = ft.paths(fnode[live])
    counts = np.diff(offsets)
    samp = np.repeat(live, counts)
    depth = np.arange(len(path), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    order = np.lexsort((samp, depth))
    s, d, node = samp[order], depth[order], path[order]
    start = np.ones(len(s), dtype=bool)
    start[1:] = (d[1:] != d[:-1]) | (s[1:] != s[:-1] + 1) | (node[1:] != node[:-1])
    first = np.flatnonzero(start)
    last = np.append(first[1:], len(s)) - 1
    return s[first], s[last], node[first]


def write_chrome(ft: FrameTree, out: TextIO, *, title: str) -> int:
    """Write the trace; returns the number of sample entries (the running trace samples)."""
    exp = ft.exp
    if exp.traces is None or not exp.traces.lines:
        raise CallpathError("the database has no traces (expected one measured with "
                            "'callpath run -t' or hpcrun -t) for a Chrome trace")
    node_of = exp.node_of_ctx()
    t0 = int(exp.traces.min_timestamp)
    names = ft.names
    events: list[str] = []
    samples: list[str] = []
    used = np.zeros(len(ft), dtype=bool)
    labels = {p.index: exp.context_label(p) for p in exp.profiles}
    events.append(json.dumps({"ph": "M", "pid": 1, "name": "process_name",
                              "args": {"name": title}}))
    for line in exp.traces.lines:
        tid = int(line.prof_index)
        events.append(json.dumps({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                                  "args": {"name": labels.get(tid, f"context {tid}")}}))
        events.append(json.dumps({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index",
                                  "args": {"sort_index": tid}}))
        ts = np.asarray(line.timestamps, dtype=np.int64) - t0
        ctx = np.asarray(line.ctx_ids, dtype=np.int64)
        if not len(ts):
            continue
        node = np.where((ctx > 0) & (ctx < len(node_of)),
                        node_of[np.minimum(ctx, len(node_of) - 1)], -1)
        fnode = np.where(node >= 0, ft.owner[np.maximum(node, 0)], -1)
        gaps = np.diff(ts)
        step = int(np.median(gaps)) if len(gaps) else 1000
        nxt = np.append(ts[1:], ts[-1] + max(step, 1))
        first, last, fn = _runs(ft, fnode)
        used[fn] = True
        us = ts / 1000.0
        dur = (nxt[last] - ts[first]) / 1000.0
        events += [f'{{"ph":"X","pid":1,"tid":{tid},"ts":{a:.3f},"dur":{b:.3f},'
                   f'"name":{json.dumps(names[f])}}}'
                   for a, b, f in zip(us[first].tolist(), dur.tolist(),
                                      ft.frame[fn].tolist(), strict=True)]
        live = np.flatnonzero(fnode >= 0)
        samples += [f'{{"tid":{tid},"pid":1,"ts":{a:.3f},"sf":"{k}","weight":1}}'
                    for a, k in zip(us[live].tolist(), fnode[live].tolist(), strict=True)]
    # stack frames: every frame node a sample or slice names, and its callers
    cur = np.flatnonzero(used)
    while len(cur):
        par = ft.parent[cur]
        par = par[(par >= 0) & ~used[np.maximum(par, 0)]]
        used[par] = True
        cur = np.unique(par)
    frames = np.flatnonzero(used)
    sf = []
    for k, f, p in zip(frames.tolist(), ft.frame[frames].tolist(), ft.parent[frames].tolist(),
                       strict=True):
        parent = f',"parent":"{p}"' if p >= 0 else ""
        sf.append(f'"{k}":{{"name":{json.dumps(names[f])},"category":"callpath"{parent}}}')
    out.write('{"traceEvents":[\n')
    out.write(",\n".join(events))
    out.write('\n],"samples":[\n')
    out.write(",\n".join(samples))
    out.write('\n],"stackFrames":{')
    out.write(",".join(sf))
    # no displayTimeUnit: some Perfetto versions read it as the unit of "ts" itself
    out.write('},"otherData":' + json.dumps(
        {"exporter": "callpath", "title": title, "start_ns": t0}) + "}\n")
    return len(samples)
