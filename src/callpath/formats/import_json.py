"""Reader of speedscope's JSON file format (sampled and evented profiles).

Each profile becomes an execution context (``THREAD i``), frames become procedures (name, file,
first line). A file callpath exported starts with its summary profile, which is the sum of the
others: it is skipped when the per-context profiles follow, so that values are not counted
twice. Evented profiles are replayed: the time between two events is cost of the open stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from callpath.errors import FormatError
from callpath.formats.import_build import Interner, StackSet, stackset, thread_ids

UNIT_SECONDS = {"seconds": 1.0, "milliseconds": 1e-3, "microseconds": 1e-6,
                "nanoseconds": 1e-9}


def is_speedscope(doc: object) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("profiles"), list) and \
        isinstance(doc.get("shared"), dict)


def read_speedscope(path: Path, doc: Any) -> StackSet:
    if not is_speedscope(doc):
        raise FormatError(path, "JSON, but not a speedscope file (expected an object with "
                          "'shared.frames' and 'profiles')")
    frames = doc["shared"].get("frames")
    if not isinstance(frames, list):
        raise FormatError(path, "speedscope 'shared.frames' is not a list")
    fns = Interner()
    fid: list[int] = []
    for i, fr in enumerate(frames):
        if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
            raise FormatError(path, f"speedscope frame {i} has no name (expected "
                              "{'name': ...})")
        line = fr.get("line", 0)
        fid.append(fns(fr["name"], str(fr.get("file") or ""), "",
                       line if isinstance(line, int) and line > 0 else 0))
    profiles = doc["profiles"]
    if not profiles:
        raise FormatError(path, "speedscope file with no profiles")
    exporter = str(doc.get("exporter", ""))
    first = profiles[0]
    if (exporter.startswith("callpath") and len(profiles) > 1 and isinstance(first, dict)
            and str(first.get("name", "")).startswith("summary")):
        profiles = profiles[1:]
    stacks: list[list[tuple[int, int, bool]]] = []
    values: list[list[float]] = []
    ctx: list[int] = []
    units: set[str] = set()
    metric = ""
    for pi, prof in enumerate(profiles):
        if not isinstance(prof, dict):
            raise FormatError(path, f"speedscope profile {pi} is not an object")
        unit = str(prof.get("unit", "none"))
        units.add(unit)
        scale = UNIT_SECONDS.get(unit, 1.0)
        name = str(prof.get("name", ""))
        if exporter.startswith("callpath") and ": " in name:
            metric = name.split(": ", 1)[1]
        agg: dict[tuple[int, ...], float] = {}
        typ = prof.get("type")
        if typ == "sampled":
            samples, weights = prof.get("samples"), prof.get("weights")
            if not isinstance(samples, list) or not isinstance(weights, list) or \
                    len(samples) != len(weights):
                raise FormatError(path, f"speedscope profile {pi}: expected 'samples' and "
                                  "'weights' lists of the same length")
            for s, w in zip(samples, weights, strict=True):
                key = _stack(path, pi, s, len(fid))
                if not isinstance(w, int | float):
                    raise FormatError(path, f"speedscope profile {pi}: weight {w!r} is not a "
                                      "number")
                agg[key] = agg.get(key, 0.0) + float(w)
        elif typ == "evented":
            _replay(path, pi, prof.get("events"), len(fid), agg)
        else:
            raise FormatError(path, f"speedscope profile {pi}: type {typ!r} (expected "
                              "'sampled' or 'evented')")
        for key, w in agg.items():
            if w:  # an empty stack keeps its cost (at the entry point)
                stacks.append([(fid[f], 0, False) for f in key])
                values.append([w * scale])
                ctx.append(pi)
    if not metric:
        u = units.pop() if len(units) == 1 else "none"
        metric = "time (sec)" if u in UNIT_SECONDS else ("bytes" if u == "bytes"
                                                          else "samples")
    return stackset(fns, stacks, ctx, values, [metric], thread_ids(len(profiles)),
                    title=str(doc.get("name") or path.name),
                    description=f"imported from speedscope file {path}")


def _stack(path: Path, pi: int, s: object, nframes: int) -> tuple[int, ...]:
    if not isinstance(s, list) or not all(isinstance(f, int) and 0 <= f < nframes for f in s):
        raise FormatError(path, f"speedscope profile {pi}: a sample is not a list of frame "
                          f"indices 0..{nframes - 1}")
    return tuple(s)


def _replay(path: Path, pi: int, events: object, nframes: int,
            agg: dict[tuple[int, ...], float]) -> None:
    if not isinstance(events, list):
        raise FormatError(path, f"speedscope profile {pi}: 'events' is not a list")
    stack: list[int] = []
    last = None
    for j, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("type") not in ("O", "C") or \
                not isinstance(ev.get("frame"), int) or \
                not isinstance(ev.get("at"), int | float):
            raise FormatError(path, f"speedscope profile {pi} event {j}: expected "
                              "{'type': 'O'|'C', 'frame': INDEX, 'at': NUMBER}")
        at = float(ev["at"])
        frame = ev["frame"]
        if not 0 <= frame < nframes:
            raise FormatError(path, f"speedscope profile {pi} event {j}: frame {frame} out of "
                              f"range (0..{nframes - 1})")
        if last is not None:
            if at < last:
                raise FormatError(path, f"speedscope profile {pi} event {j}: events out of "
                                  "order (time goes back)")
            if stack and at > last:
                key = tuple(stack)
                agg[key] = agg.get(key, 0.0) + (at - last)
        last = at
        if ev["type"] == "O":
            stack.append(frame)
        else:
            if not stack or stack[-1] != frame:
                raise FormatError(path, f"speedscope profile {pi} event {j}: closes frame "
                                  f"{frame}, which is not the innermost open frame")
            stack.pop()


def read_json(path: Path, text: str) -> StackSet:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise FormatError(path, f"not valid JSON ({e}); expected a speedscope file") from None
    return read_speedscope(path, doc)
