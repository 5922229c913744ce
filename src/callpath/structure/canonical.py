"""A canonical form of a structure, to compare two recoveries of the same binary.

Scope ids, element order, range splitting and the way inlining is spelled differ between
tools; what must agree is captured by four multisets:

- procedures: ``(link name, entry address)``;
- loops: ``(procedure, nesting path)``, the path being the loops (by line) and inlined callees
  from the procedure down to the loop;
- inlined sites: ``(procedure, callee, call line)``;
- statement lines: ``(procedure, line)``, once per pair (call sites count as statements);
- call sites: ``(procedure, line, callee)``, the callee being the link name of the procedure
  at the call's target address (its hex address if no procedure starts there, ``""`` for an
  indirect call). Compared only when the other structure has call sites (``has-calls="1"``):
  hpcstruct writes them for GPU binaries only.

Two of hpcstruct's habits are normalised, and reported separately by :func:`compare`:
aliens named ``<inline>`` are not DWARF inlining but hpcstruct's guess for lines outside the
procedure's line range, so they are transparent (their statements count for the procedure);
and an inlined site whose call line hpcstruct lost (``l="0"``, file ``<unknown>``) matches ours
by procedure and callee.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from callpath.structure.model import Kind, Structure

CATEGORIES = ("procedures", "loops", "inlined", "statements")
PSEUDO_INLINE = "<inline>"


@dataclass
class Canonical:
    procedures: Counter[tuple[str, int]]
    loops: Counter[tuple[str, tuple[str, ...]]]
    inlined: Counter[tuple[str, str, int]]
    statements: Counter[tuple[str, int]]
    calls: Counter[tuple[str, int, str]]


def canonical(s: Structure) -> Canonical:
    kids = s.children()
    procs: Counter[tuple[str, int]] = Counter()
    loops: Counter[tuple[str, tuple[str, ...]]] = Counter()
    inl: Counter[tuple[str, str, int]] = Counter()
    stmts: set[tuple[str, int]] = set()
    calls: Counter[tuple[str, int, str]] = Counter()
    targets = s.call_targets()

    def link_of(p: int) -> str:
        return s.text(int(s.link_name[p])) if s.link_name[p] >= 0 else s.text(int(s.name[p]))

    def walk(i: int, proc: str, path: tuple[str, ...]) -> None:
        for c in kids[i]:
            k = s.kind[c]
            if k == Kind.FILE:
                walk(c, proc, path)
            elif k == Kind.PROC:
                link = link_of(c)
                rs = s.ranges(c)
                procs[(link, rs[0][0] if rs else -1)] += 1
                walk(c, link, ())
            elif k == Kind.ALIEN:
                name = s.text(int(s.name[c]))
                if name == PSEUDO_INLINE:
                    walk(c, proc, path)
                else:
                    inl[(proc, name, int(s.call_line[c]))] += 1
                    walk(c, proc, (*path, f"A:{name}"))
            elif k == Kind.LOOP:
                p = (*path, f"L:{int(s.line[c])}")
                loops[(proc, p)] += 1
                walk(c, proc, p)
            elif k == Kind.STMT:
                stmts.add((proc, int(s.line[c])))
            elif k == Kind.CALL:
                stmts.add((proc, int(s.line[c])))
                t = int(s.target[c])
                callee = link_of(int(targets[c])) if targets[c] >= 0 else (
                    f"{t:#x}" if t else "")
                calls[(proc, int(s.line[c]), callee)] += 1

    walk(0, "", ())
    return Canonical(procs, loops, inl, Counter(stmts), calls)


@dataclass
class Match:
    category: str
    ours: int
    theirs: int
    matched: int
    only_ours: list[object]
    only_theirs: list[object]

    @property
    def percent(self) -> float:
        denom = max(self.ours, self.theirs)
        return 100.0 if denom == 0 else 100.0 * self.matched / denom


def _match(cat: str, a: Counter[Any], b: Counter[Any]) -> Match:
    common = a & b
    m = sum(common.values())
    return Match(cat, sum(a.values()), sum(b.values()), m, sorted((a - b).elements(), key=str),
                 sorted((b - a).elements(), key=str))


def compare(ours: Structure, theirs: Structure) -> dict[str, Match]:
    """Per-category agreement of ``ours`` with ``theirs`` (typically hpcstruct's); ``calls``
    only when ``theirs`` has call sites."""
    a, b = canonical(ours), canonical(theirs)
    out = {
        "procedures": _match("procedures", a.procedures, b.procedures),
        "loops": _match("loops", a.loops, b.loops),
        "statements": _match("statements", a.statements, b.statements),
    }
    # Inlined sites: exact first, then hpcstruct's lost call lines (0) by procedure and callee.
    ia: Counter[tuple[str, str, int]] = Counter(a.inlined)
    ib: Counter[tuple[str, str, int]] = Counter(b.inlined)
    exact = ia & ib
    ra, rb = ia - exact, ib - exact
    extra = 0
    for key, n in list(rb.items()):
        proc, callee, line = key
        if line != 0:
            continue
        for k2 in list(ra):
            if k2[:2] == (proc, callee) and n > 0:
                take = min(n, ra[k2])
                ra[k2] -= take
                rb[key] -= take
                n -= take
                extra += take
    ra, rb = +ra, +rb
    m = sum(exact.values()) + extra
    out["inlined"] = Match("inlined", sum(ia.values()), sum(ib.values()), m,
                           sorted(ra.elements(), key=str), sorted(rb.elements(), key=str))
    res = {c: out[c] for c in CATEGORIES}
    if theirs.has_calls:
        res["calls"] = _match("calls", a.calls, b.calls)
    return res
