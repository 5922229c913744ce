"""Calling contexts inside GPU kernels for PC samples, as hpcprof reconstructs them.

hpcrun cannot unwind a GPU: a PC sample is one instruction of a GPU binary below the
``<gpu kernel>`` placeholder of its launch, flagged "not unwound". hpcprof places it on every
call path that can reach the instruction's function from a kernel entry in the binary's
call graph (from ``hpcstruct --gpucfg yes``: ``<C>`` call sites with targets) and splits
its values over those paths (``StructFile::resolve``, ``ContextFlowGraph``,
``ContextReconstruction`` and ``PerThreadTemporary::finalize`` in HPCToolkit's
``src/hpcprof``). The rules, per execution context and per ``<gpu kernel>`` context ``R``:

* **Call graph**: an edge per call site, callee ← (call-site address, caller). Recursion is
  cut: Tarjan's strongly connected components (functions visited in file order, callers in
  file order), edges inside a component dropped, and every remaining edge into a
  component's root (its first function visited) also made an edge into each other member
  ("any call into the component may reach all of it").
* **Templates** of an instruction in function ``f``: every path of call sites from a
  function without callers (an entry) down to ``f``.
* **Rescaling**: a template counts if its entry's context under ``R`` has values of its
  own (the kernel's ``GKER:COUNT`` lands there, ``move2proc``); its factor is then
  ``GKER:COUNT / GKER:SAMPLED_COUNT`` where both exist, else 1.
* **Interior factors**: the counted templates are split by their call sites from the
  nearest caller outwards, in proportion to the ``GINS`` samples at each call-site
  instruction under ``R`` (evenly when none), until each group is one template.
* The values of the samples at the instruction, times each template's factors, go to the
  instruction's context at the end of the template's path; every template's path is
  created in the tree (and those of the call sites it passes), valued or not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from callpath.structure.model import Kind, Structure


@dataclass(frozen=True)
class Template:
    """One way to reach a function: the entry function (a PROC scope) and the call-site
    addresses from it down to the function."""

    entry: int
    path: tuple[int, ...]


class GpuCallGraph:
    """hpcprof's reverse call graph of one GPU binary, recursion cut (module docstring)."""

    def __init__(self, s: Structure) -> None:
        self.s = s
        procs = [int(p) for p in np.flatnonzero(s.kind == Kind.PROC)
                 if s.range_ptr[p + 1] > s.range_ptr[p]]
        self.entry_addr = {p: int(s.range_lo[s.range_ptr[p]]) for p in procs}
        by_entry = {a: p for p, a in self.entry_addr.items()}
        self.valid = True
        calls = np.flatnonzero((s.kind == Kind.CALL) & (s.range_ptr[1:] > s.range_ptr[:-1])
                               & (s.target != 0))
        caller_of: list[int] = s.enclosing(calls.astype(np.int32), Kind.PROC).tolist() \
            if len(calls) else []
        rcg: dict[int, list[tuple[int, int]]] = {p: [] for p in procs}
        for c, caller in zip(calls.tolist(), caller_of, strict=True):
            callee = by_entry.get(int(s.target[c]))
            if callee is None or int(caller) < 0:
                self.valid = False  # hpcprof: a call to no function, the graph is unusable
                return
            rcg[callee].append((int(s.range_lo[s.range_ptr[c]]), int(caller)))
        self.rcg = _acyclic(procs, rcg)
        self._templates: dict[int, list[Template]] = {}

    def function_of(self, addr: int) -> int:
        """The PROC scope whose statements cover ``addr``; -1 if none (hpcprof then knows
        nothing of the instruction)."""
        sc = int(self.s.lookup(np.array([addr], dtype=np.uint64))[0])
        if sc < 0 or self.s.kind[sc] not in (Kind.STMT, Kind.CALL):
            return -1
        return int(self.s.enclosing(np.array([sc], dtype=np.int32), Kind.PROC)[0])

    def templates(self, func: int) -> list[Template]:
        """Every path from an entry to ``func``, sorted by their reversed call sites."""
        got = self._templates.get(func)
        if got is not None:
            return got
        out: list[Template] = []
        rpath: list[int] = []

        def dfs(callee: int) -> None:
            callers = self.rcg.get(callee, [])
            for site, caller in callers:
                rpath.append(site)
                dfs(caller)
                rpath.pop()
            if not callers:
                out.append(Template(callee, tuple(reversed(rpath))))

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10000))
        try:
            dfs(func)
        finally:
            sys.setrecursionlimit(limit)
        out.sort(key=lambda t: t.path[::-1])
        self._templates[func] = out
        return out


def _acyclic(procs: list[int], rcg: dict[int, list[tuple[int, int]]]
             ) -> dict[int, list[tuple[int, int]]]:
    """The reverse call graph without cycles, as hpcprof makes it (module docstring)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    active: list[int] = []
    on: set[int] = set()
    root_of: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    counter = [0]

    def visit(f: int) -> None:  # Tarjan, over callers
        index[f] = low[f] = counter[0]
        counter[0] += 1
        active.append(f)
        on.add(f)
        for _, caller in rcg.get(f, []):
            if caller not in index:
                visit(caller)
                low[f] = min(low[f], low[caller])
            elif caller in on:
                low[f] = min(low[f], index[caller])
        if low[f] == index[f]:
            while True:
                g = active.pop()
                on.discard(g)
                root_of[g] = f
                members.setdefault(f, []).append(g)
                if g == f:
                    break

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for f in procs:
            if f not in index:
                visit(f)
    finally:
        sys.setrecursionlimit(limit)
    out = {f: [(site, caller) for site, caller in edges if root_of[caller] != root_of[f]]
           for f, edges in rcg.items()}
    extra: dict[int, list[tuple[int, int]]] = {}
    for f, edges in out.items():
        for g in members.get(f, []):  # f is a component's root: edges into it reach all
            if g != f:
                extra.setdefault(g, []).extend(edges)
    for g, edges in extra.items():
        out[g] = out[g] + edges
    return out


def interior_factors(templates: list[Template], counted: list[bool],
                     weight: Callable[[int], float]) -> list[float]:
    """hpcprof's interior factors: the share of each counted template, split call site by
    call site from the nearest caller outwards in proportion to ``weight`` (the ``GINS``
    samples at a call-site address), evenly where all weights are 0."""
    n = len(templates)
    if n == 1:
        return [1.0 if counted[0] else 0.0]
    live = [i for i in range(n) if counted[i]]
    if len(live) <= 1:
        out = [0.0] * n
        for i in live:
            out[i] = 1.0
        return out
    factors = [0.0] * n
    groups: list[tuple[int, int, float]] = [(0, n, 1.0)]
    ridx = 0
    while groups:
        def at(i: int, r: int = ridx) -> int:
            p = templates[i].path
            return p[len(p) - r - 1]
        split: list[list[float]] = []  # [first, end, factor]
        for first, end, gf in groups:
            start = len(split)
            total = 0.0
            cur = last = -1
            for i in range(first, end):
                if not counted[i]:
                    continue
                if cur >= 0:
                    if at(cur) == at(i):
                        last = i
                        continue
                    v = weight(at(cur))
                    split.append([cur, last + 1, v])
                    total += v
                cur = last = i
            v = weight(at(cur))
            split.append([cur, last + 1, v])
            total += v
            k = len(split) - start
            for g in split[start:]:
                g[2] = gf * g[2] / total if total > 0 else gf / k
        groups = []
        for first_f, end_f, gf in split:
            first, end = int(first_f), int(end_f)
            if gf == 0 or len(templates[first].path) == ridx + 1 or end - first == 1:
                for i in range(first, end):
                    if counted[i]:
                        factors[i] = gf
            else:
                groups.append((first, end, gf))
        ridx += 1
    return factors


#: the metrics hpcprof's reconstruction reads: samples at call sites, and the kernel's
#: launch count (and sampled launch count) at its entry
GINS, GKER_COUNT, GKER_SAMPLED_COUNT = "GINS", "GKER:COUNT", "GKER:SAMPLED_COUNT"

Steps = Callable[[int, int], tuple[tuple[int, ...], ...]]


class Reconstructor:
    """The reconstruction of one reduction: ``node`` interns a context (TreeBuilder.node),
    ``steps(module, address)`` gives the contexts of a GPU binary's address (a function,
    its loops, its line), ``graph(module)`` the binary's call graph or None."""

    def __init__(self, node: Callable[..., int], steps: Steps,
                 graph: Callable[[int], GpuCallGraph | None]) -> None:
        self.node = node
        self.steps = steps
        self.graph = graph
        self._finals: dict[tuple[int, int, int], list[int]] = {}

    def _chain(self, at: int, lm: int, addr: int) -> int:
        for st in self.steps(lm, addr):
            at = self.node(at, *st)
        return at

    def entry_context(self, root: int, lm: int, proc: int) -> int:
        """The context of an entry function under ``root`` (a call of the function)."""
        g = self.graph(lm)
        assert g is not None
        first = self.steps(lm, g.entry_addr[proc])[:1]
        return self.node(root, *first[0]) if first else root

    def finals(self, root: int, lm: int, addr: int) -> list[int]:
        """The instruction's context at the end of each template's path under ``root``,
        created with those of the entries and of every call site on the paths."""
        key = (root, lm, addr)
        got = self._finals.get(key)
        if got is not None:
            return got
        g = self.graph(lm)
        assert g is not None
        func = g.function_of(addr)
        if func < 0:  # a call site outside every function's statements: nothing to place
            self._finals[key] = []
            return []
        temps = g.templates(func)
        out = []
        for t in temps:
            self.entry_context(root, lm, t.entry)
            at = root
            for site in t.path:
                at = self._chain(at, lm, site)
            out.append(self._chain(at, lm, addr))
        self._finals[key] = out
        for t in temps:
            for site in t.path:
                if (root, lm, site) not in self._finals:
                    self.finals(root, lm, site)
        return out

    def redistribute(self, root: np.ndarray, lm: np.ndarray, addr: np.ndarray,
                     metric: np.ndarray, value: np.ndarray, metric_names: list[str],
                     ctx_values: tuple[np.ndarray, np.ndarray, np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One execution context's samples of instructions to reconstruct (their ``<gpu
        kernel>`` context ``root``, module, address, metric, value), given its other
        values (context, metric, value: what the entries hold), as (context, metric,
        value) rows at the instructions' contexts."""
        names = {n: k for k, n in enumerate(metric_names)}
        c_ctx, c_met, c_val = ctx_values
        has_data = set(np.unique(c_ctx).tolist())

        def at_ctx(name: str) -> dict[int, float]:
            k = names.get(name, -1)
            sel = c_met == k
            out: dict[int, float] = {}
            for c, v in zip(c_ctx[sel].tolist(), c_val[sel].tolist(), strict=True):
                out[c] = out.get(c, 0.0) + v
            return out
        count, sampled = at_ctx(GKER_COUNT), at_ctx(GKER_SAMPLED_COUNT)
        rows = np.stack([root, lm, addr.astype(np.int64)], axis=1)
        keys, inverse = np.unique(rows, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        gins = names.get(GINS, -1)
        weights: dict[tuple[int, int, int], float] = {}
        sel = metric == gins
        for k, v in zip(inverse[sel].tolist(), value[sel].tolist(), strict=True):
            r, m, a = (int(x) for x in keys[k])
            weights[(r, m, a)] = weights.get((r, m, a), 0.0) + v
        out_ctx: list[np.ndarray] = []
        out_met: list[np.ndarray] = []
        out_val: list[np.ndarray] = []
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
        for k, (r, m, a) in enumerate(keys.tolist()):
            g = self.graph(m)
            assert g is not None
            temps = g.templates(g.function_of(a))
            finals = self.finals(r, m, a)
            rescale = []
            for t in temps:
                ec = self.entry_context(r, m, t.entry)
                if ec not in has_data:
                    rescale.append(0.0)
                elif ec in count and ec in sampled:
                    rescale.append(count[ec] / sampled[ec])
                else:
                    rescale.append(1.0)
            def weight(site: int, r: int = r, m: int = m) -> float:
                return weights.get((r, m, site), 0.0)
            inner = interior_factors(temps, [x != 0 for x in rescale], weight)
            mine = order[bounds[k]:bounds[k + 1]]
            met, val = metric[mine], value[mine]
            uniq, inv = np.unique(met, return_inverse=True)
            sums = np.bincount(inv.ravel(), weights=val, minlength=len(uniq))
            for fin, f in zip(finals, [x * y for x, y in zip(rescale, inner, strict=True)],
                              strict=True):
                v = f * sums
                nz = v != 0
                if nz.any():
                    out_ctx.append(np.full(int(nz.sum()), fin, dtype=np.int64))
                    out_met.append(uniq[nz].astype(np.int64))
                    out_val.append(v[nz])
        if not out_ctx:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        return np.concatenate(out_ctx), np.concatenate(out_met), np.concatenate(out_val)
