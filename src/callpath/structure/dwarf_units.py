"""What :mod:`~callpath.structure.dwarf_info` found in each DWARF unit, kept on disk between
runs (beside a module's line programs, :class:`~callpath.structure.dwarf_lines.LineCache`).

On-demand structure reads a module's DWARF only around the addresses no earlier run analysed;
every run of a program meets procedures no earlier run did, and their units were walked again
each time (a warm ``profile --native`` of a PyTorch loop: 51 of libpython's units, 52k DIEs,
about a third of the native structure's time). The first time a unit is needed it is walked
whole (every subprogram, not only those near the addresses) and its records kept: a later
run takes the records near its addresses from here, as a walk limited to them would have
found them. What a walk around some addresses skips is a subtree: each subprogram DIE with
children and a sibling pointer is kept with the span of records inside it, and those are
left out when its code does not meet the addresses (:meth:`UnitRecords.near`). File numbers
stay the unit's own (the caller maps them); names are resolved before they are kept.

Records are numpy columns, per unit slices of one file's columns: a run reads the units it
needs without building a Python object per record, and adds the units it walked by
appending to the columns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Ranges = list[tuple[int, int]]
I64 = npt.NDArray[np.int64]

#: per-record columns (prefix s: subprograms, i: inlined records, k: skippable subtrees) and
#: each kind's range columns (``<p>_rptr`` into ``<p>_rlo``/``<p>_rhi``)
_COLS = {"s": ("off", "name", "link", "file", "line", "noret"),
         "i": ("sub", "parent", "file", "line", "name"),
         "k": ("slo", "shi", "ilo", "ihi")}
_UNIT_COLS = ("u_off", "u_stmt", "u_dir")
_LISTS = ("n_name", "g_name")  # unit-level and any-level no-return names


@dataclass
class UnitRecords:
    """One unit's records, walked whole. ``names`` is the pool the name columns index;
    files are the unit's file numbers (-1: none); ``i_sub`` and ``i_parent`` index the
    unit's own records, as do the spans of ``k_*``."""

    stmt: int
    comp_dir: str
    names: list[str]
    cols: dict[str, npt.NDArray[Any]]  # <p>_<col>, <p>_rptr (local, from 0), <p>_rlo/_rhi
    unit_noreturn: list[str]
    noreturn: list[str]

    def near(self, near: tuple[list[int], list[int]] | None) -> tuple[I64, I64]:
        """The indices of the subprograms and inlined records that a walk limited to the
        sorted disjoint ranges ``near`` (None: all) finds, in order: all but those inside
        a skippable subtree whose ranges meet none of them."""
        c = self.cols
        ns, ni = len(c["s_off"]), len(c["i_sub"])
        if near is None or not len(c["k_slo"]):
            return np.arange(ns, dtype=np.int64), np.arange(ni, dtype=np.int64)
        lo = np.array(near[0], dtype=np.uint64)
        hi = np.array(near[1], dtype=np.uint64)
        rlo, rhi = c["k_rlo"], c["k_rhi"]
        j = np.searchsorted(lo, rhi, side="left").astype(np.int64) - 1
        hit = (j >= 0) & (hi[np.maximum(j, 0)] > rlo) if len(lo) else np.zeros(len(rlo), bool)
        cs = np.concatenate([[0], np.cumsum(hit)])
        rp = c["k_rptr"]
        gone = cs[rp[1:]] == cs[rp[:-1]]  # no range of the subtree meets them
        keep_s = _outside(ns, c["k_slo"][gone], c["k_shi"][gone])
        keep_i = _outside(ni, c["k_ilo"][gone], c["k_ihi"][gone])
        return np.flatnonzero(keep_s), np.flatnonzero(keep_i)

    def ranges(self, p: str, k: int) -> Ranges:
        rp = self.cols[p + "_rptr"]
        a, b = int(rp[k]), int(rp[k + 1])
        return list(zip(self.cols[p + "_rlo"][a:b].tolist(), self.cols[p + "_rhi"][a:b].tolist(),
                        strict=True))


def _outside(n: int, lo: I64, hi: I64) -> npt.NDArray[np.bool_]:
    """Which of ``n`` items lie in none of the spans ``[lo, hi)``."""
    d = np.zeros(n + 1, dtype=np.int64)
    np.add.at(d, lo, 1)
    np.add.at(d, hi, -1)
    out: npt.NDArray[np.bool_] = np.cumsum(d)[:n] == 0
    return out


def records_of(stmt: int, comp_dir: str, unit_noreturn: list[str], noreturn: list[str],
               subs: list[tuple[int, Ranges, str, str, int, int, bool]],
               inls: list[tuple[int, int, Ranges, int, int, str]],
               skips: list[tuple[Ranges, int, int, int, int]]) -> UnitRecords:
    """A walked unit's records as columns. ``subs``: (DIE offset, ranges, name, linkage
    name, decl file, decl line, noreturn); ``inls``: (subprogram, parent or -1, ranges, call
    file, call line, name); ``skips``: (ranges, subprogram span, inlined span)."""
    names: list[str] = []
    index: dict[str, int] = {}

    def name(s: str) -> int:
        got = index.get(s)
        if got is None:
            got = index[s] = len(names)
            names.append(s)
        return got

    cols: dict[str, npt.NDArray[Any]] = {}

    def put(p: str, rows: list[tuple[int, ...]], rngs: list[Ranges]) -> None:
        for k, col in enumerate(_COLS[p]):
            cols[f"{p}_{col}"] = np.array([r[k] for r in rows], dtype=np.int64)
        cols[p + "_rptr"] = np.concatenate([[0], np.cumsum([len(r) for r in rngs])]
                                           ).astype(np.int64)
        cols[p + "_rlo"] = np.array([a for r in rngs for a, _ in r], dtype=np.uint64)
        cols[p + "_rhi"] = np.array([b for r in rngs for _, b in r], dtype=np.uint64)

    put("s", [(off, name(nm), name(ln), f, line, int(nr))
              for off, _r, nm, ln, f, line, nr in subs], [s[1] for s in subs])
    put("i", [(sub, par, f, line, name(nm)) for sub, par, _r, f, line, nm in inls],
        [i[2] for i in inls])
    put("k", [(sa, sb, ia, ib) for _r, sa, sb, ia, ib in skips], [k[0] for k in skips])
    return UnitRecords(stmt, comp_dir, names, cols, unit_noreturn, noreturn)


class UnitCache:
    """The records of one module's units by unit offset, kept at ``path`` (None: in memory
    only). Entries depend only on the file's bytes; the structure cache's module key names
    the file."""

    FORMAT = "callpath dwarf units"
    VERSION = 1

    def __init__(self, path: os.PathLike[str] | None) -> None:
        self.path = path
        self._file: tuple[dict[str, npt.NDArray[Any]], list[str], dict[int, int]] | None = None
        self._got: dict[int, UnitRecords] = {}
        self._new: dict[int, UnitRecords] = {}

    def _expect(self) -> dict[str, object]:
        return {"format": self.FORMAT, "version": self.VERSION}

    def _read(self) -> tuple[dict[str, npt.NDArray[Any]], list[str], dict[int, int]]:
        """The file's columns, its names and its units' positions (empty when absent or
        damaged)."""
        empty: tuple[dict[str, npt.NDArray[Any]], list[str], dict[int, int]] = ({}, [], {})
        if self.path is None:
            return empty
        from callpath.structure import store
        got = store.load_arrays(self.path, self._expect())
        if got is None:
            return empty
        meta, a = got
        try:
            names = store.array_to_strings(a["names"], int(meta["n_names"]))
            offs = a["u_off"].tolist()
            ptrs = [f"u_{p}ptr" for p in (*_COLS, "n", "g")]
            if any(len(a[k]) != len(offs) + 1 for k in ptrs) or \
                    any(len(a[k]) != len(offs) for k in _UNIT_COLS):
                return empty
            for p, cols in _COLS.items():
                n = int(a[f"u_{p}ptr"][-1])
                if any(len(a[f"{p}_{c}"]) != n for c in cols) or len(a[p + "_rptr"]) != n + 1 \
                        or not len(a[p + "_rlo"]) == len(a[p + "_rhi"]) == int(a[p + "_rptr"][-1]):
                    return empty
        except (KeyError, ValueError, TypeError, UnicodeDecodeError):
            return empty
        return a, names, {off: k for k, off in enumerate(offs)}

    def get(self, off: int) -> UnitRecords | None:
        got = self._new.get(off) or self._got.get(off)
        if got is not None:
            return got
        if self._file is None:
            self._file = self._read()
        a, names, index = self._file
        k = index.get(off)
        if k is None:
            return None
        got = self._got[off] = _unit_of(a, names, k)
        return got

    def put(self, off: int, rec: UnitRecords) -> None:
        self._new[off] = rec

    def save(self) -> None:
        """Append the units walked by this run to what the file holds now (another process
        may have added to it since it was read); a file that cannot be written only costs
        the walk next time."""
        if not self._new or self.path is None:
            return
        from callpath.structure import store
        a, names, index = self._read()
        new = [(off, u) for off, u in sorted(self._new.items()) if off not in index]
        if new:
            arrays, pool = _append(a, names, new)
            store.save_arrays(self.path, {**self._expect(), "n_names": len(pool)}, arrays)
        self._new = {}
        self._file = None


def _unit_of(a: dict[str, npt.NDArray[Any]], names: list[str], k: int) -> UnitRecords:
    """Unit ``k`` of the file's columns: slices, the range pointers made local."""
    cols: dict[str, npt.NDArray[Any]] = {}
    for p, cs in _COLS.items():
        lo, hi = int(a[f"u_{p}ptr"][k]), int(a[f"u_{p}ptr"][k + 1])
        for c in cs:
            cols[f"{p}_{c}"] = a[f"{p}_{c}"][lo:hi]
        rp = a[p + "_rptr"][lo:hi + 1]
        r0, r1 = int(rp[0]), int(rp[-1])
        cols[p + "_rptr"] = rp - r0
        cols[p + "_rlo"], cols[p + "_rhi"] = a[p + "_rlo"][r0:r1], a[p + "_rhi"][r0:r1]
    n0, n1 = int(a["u_nptr"][k]), int(a["u_nptr"][k + 1])
    g0, g1 = int(a["u_gptr"][k]), int(a["u_gptr"][k + 1])
    return UnitRecords(int(a["u_stmt"][k]), names[int(a["u_dir"][k])], names, cols,
                       [names[x] for x in a["n_name"][n0:n1].tolist()],
                       [names[x] for x in a["g_name"][g0:g1].tolist()])


def _append(a: dict[str, npt.NDArray[Any]], names: list[str],
            new: list[tuple[int, UnitRecords]]) -> tuple[dict[str, npt.NDArray[Any]], list[str]]:
    """The file's columns (``a``, possibly empty) with the units ``new`` after them."""
    pool = list(names)
    parts: dict[str, list[npt.NDArray[Any]]] = {}

    def add(k: str, v: npt.NDArray[Any]) -> None:
        parts.setdefault(k, []).append(v)

    def total(k: str) -> int:
        return sum(len(v) for v in parts.get(k, []))

    if a:
        for k, v in a.items():
            if k != "names":
                add(k, np.asarray(v))
    else:
        for p in (*_COLS, "n", "g"):
            add(f"u_{p}ptr", np.zeros(1, dtype=np.int64))
        for p in _COLS:
            add(p + "_rptr", np.zeros(1, dtype=np.int64))
    for off, u in new:
        base = len(pool)
        pool.extend(u.names)
        add("u_off", np.array([off], dtype=np.int64))
        add("u_stmt", np.array([u.stmt], dtype=np.int64))
        add("u_dir", np.array([len(pool)], dtype=np.int64))
        pool.append(u.comp_dir)
        for p, cs in _COLS.items():
            n_before = total(f"{p}_{cs[0]}")
            r_before = total(p + "_rlo")
            for c in cs:
                v = u.cols[f"{p}_{c}"].astype(np.int64)
                add(f"{p}_{c}", v + base if c in ("name", "link") else v)
            add(p + "_rptr", u.cols[p + "_rptr"][1:].astype(np.int64) + r_before)
            add(p + "_rlo", u.cols[p + "_rlo"].astype(np.uint64))
            add(p + "_rhi", u.cols[p + "_rhi"].astype(np.uint64))
            add(f"u_{p}ptr", np.array([n_before + len(u.cols[f"{p}_{cs[0]}"])],
                                      dtype=np.int64))
        for p, lst in (("n", u.unit_noreturn), ("g", u.noreturn)):
            first = len(pool)
            pool.extend(lst)
            add(f"{p}_name", np.arange(first, first + len(lst), dtype=np.int64))
            add(f"u_{p}ptr", np.array([total(f"{p}_name")], dtype=np.int64))
    from callpath.structure import store
    out: dict[str, npt.NDArray[Any]] = {}
    for k, vs in parts.items():
        dt = np.uint64 if k.endswith(("_rlo", "_rhi")) else np.int64
        out[k] = np.concatenate(vs).astype(dt) if vs else np.zeros(0, dtype=dt)
    for k in (*_LISTS, *_UNIT_COLS):
        out.setdefault(k, np.zeros(0, dtype=np.int64))
    out["names"] = store.strings_to_array(pool)
    return out, pool
