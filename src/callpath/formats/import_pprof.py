"""Reader of pprof's ``profile.proto`` (gzipped or not), with :mod:`protowire`.

Samples keep their stacks: locations leaf first, each location's lines innermost first (the
last line is the function the others were inlined into), so frames come out root first with
their lines, inlined frames marked. Sample types become metrics: ``(cpu, nanoseconds)`` is
``cpu (sec)`` in seconds, a count keeps its type's name. A ``context`` label (what callpath's
export writes) names the execution context; without one all samples are one context.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from callpath.errors import FormatError
from callpath.formats import protowire as pw
from callpath.formats.import_build import Interner, StackSet, stackset, thread_ids
from callpath.model import Identifier, IdKind

LABEL_PART = re.compile(r"([A-Z]+) (\d+)")


def read_pprof(path: Path, data: bytes) -> StackSet:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise FormatError(path, f"gzip data is truncated or corrupt ({e}); expected a "
                              "gzipped pprof profile") from None
    strings: list[str] = []
    st_raw: list[tuple[int, int]] = []
    samples: list[bytes] = []
    locations: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}
    functions: dict[int, tuple[int, int, int]] = {}
    mappings: dict[int, int] = {}
    for f, _w, v in pw.fields(data, path):
        if f == 6 and isinstance(v, bytes):
            strings.append(v.decode("utf-8", "replace"))
        elif f == 1 and isinstance(v, bytes):
            d = _ints(v, path)
            st_raw.append((d.get(1, 0), d.get(2, 0)))
        elif f == 2 and isinstance(v, bytes):
            samples.append(v)
        elif f == 4 and isinstance(v, bytes):
            lid, mid, addr, lines = 0, 0, 0, []
            for g, _gw, gv in pw.fields(v, path):
                if g == 1 and isinstance(gv, int):
                    lid = gv
                elif g == 2 and isinstance(gv, int):
                    mid = gv
                elif g == 3 and isinstance(gv, int):
                    addr = gv
                elif g == 4 and isinstance(gv, bytes):
                    d = _ints(gv, path)
                    lines.append((d.get(1, 0), d.get(2, 0)))
            locations[lid] = (mid, addr, lines)
        elif f == 5 and isinstance(v, bytes):
            d = _ints(v, path)
            functions[d.get(1, 0)] = (d.get(2, 0), d.get(4, 0), d.get(5, 0))
        elif f == 3 and isinstance(v, bytes):
            d = _ints(v, path)
            mappings[d.get(1, 0)] = d.get(5, 0)
    if not strings or strings[0] != "":
        raise FormatError(path, "not a pprof profile (expected a string table starting with "
                          "the empty string)")
    if not st_raw:
        raise FormatError(path, "pprof profile without sample types")

    def s(i: int) -> str:
        if not 0 <= i < len(strings):
            raise FormatError(path, f"pprof string index {i} out of range "
                              f"(0..{len(strings) - 1})")
        return strings[i]

    metric_names, scales = [], []
    for t, u in st_raw:
        typ, unit = s(t), s(u)
        if unit == "nanoseconds":  # a comparison's tag stays last: "CPUTIME (sec) [base]"
            cut = typ.rindex(" [") if typ.endswith("]") and " [" in typ else len(typ)
            metric_names.append(f"{typ[:cut]} (sec){typ[cut:]}")
            scales.append(1e-9)
        else:
            metric_names.append(typ if unit in ("count", "") or typ.endswith(f"({unit})")
                                else f"{typ} ({unit})")
            scales.append(1.0)
    fns = Interner()
    frame_cache: dict[int, list[tuple[int, int, bool]]] = {}

    def frames_of(lid: int) -> list[tuple[int, int, bool]]:
        got = frame_cache.get(lid)
        if got is not None:
            return got
        loc = locations.get(lid)
        if loc is None:
            raise FormatError(path, f"pprof sample refers to location {lid}, which the "
                              "profile does not define")
        mid, addr, lines = loc
        module = s(mappings.get(mid, 0)) if mid else ""
        out: list[tuple[int, int, bool]] = []
        if not lines:
            base = module.rsplit("/", 1)[-1] or "<unknown module>"
            out.append((fns(f"{base}+{addr:#x}", "", module), 0, False))
        for k, (fid, line) in enumerate(reversed(lines)):
            fn = functions.get(fid)
            if fn is None:
                raise FormatError(path, f"pprof location {lid} refers to function {fid}, "
                                  "which the profile does not define")
            out.append((fns(s(fn[0]) or "<unknown>", s(fn[1]), module, fn[2]),
                        max(line, 0), k > 0))
        frame_cache[lid] = out
        return out

    contexts: dict[str, int] = {}
    stacks: list[list[tuple[int, int, bool]]] = []
    values: list[list[float]] = []
    ctx: list[int] = []
    n_met = len(metric_names)
    for raw in samples:
        locs: list[int] = []
        vals: list[int] = []
        label = ""
        for g, _gw, gv in pw.fields(raw, path):
            if g == 1:
                locs += pw.varint_list(gv, path) if isinstance(gv, bytes) else [gv]
            elif g == 2:
                vals += (pw.varint_list(gv, path, signed=True) if isinstance(gv, bytes)
                         else [gv - (1 << 64) if gv >= 1 << 63 else gv])
            elif g == 3 and isinstance(gv, bytes):
                d = _ints(gv, path)
                if s(d.get(1, 0)) in ("context", "thread"):
                    label = s(d.get(2, 0)) or str(d.get(3, 0))
        if len(vals) != n_met:
            raise FormatError(path, f"pprof sample with {len(vals)} values (expected one per "
                              f"sample type: {n_met})")
        if not locs or not any(vals):
            continue
        frames = [fr for lid in reversed(locs) for fr in frames_of(lid)]
        stacks.append(frames)
        values.append([v * sc for v, sc in zip(vals, scales, strict=True)])
        ctx.append(contexts.setdefault(label, len(contexts)))
    ids = [_identifiers(lb, i) for lb, i in contexts.items()] or thread_ids(1)
    return stackset(fns, stacks, ctx, values, metric_names, ids, title=path.name,
                    description=f"imported from pprof profile {path}")


def _ints(buf: bytes, path: Path) -> dict[int, int]:
    return {f: v for f, _, v in pw.fields(buf, path) if isinstance(v, int)}


def _identifiers(label: str, index: int) -> tuple[Identifier, ...]:
    """``NODE 0 RANK 1 THREAD 0`` back into identifiers; anything else is ``THREAD index``."""
    parts = LABEL_PART.findall(label)
    if parts and " ".join(f"{k} {v}" for k, v in parts) == label.strip():
        try:
            return tuple(Identifier(IdKind[k], int(v)) for k, v in parts)
        except KeyError:
            pass
    return (Identifier(IdKind.THREAD, index),)
