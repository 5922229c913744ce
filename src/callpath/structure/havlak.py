"""Loop nesting forest by Havlak's interval analysis (reducible and irreducible loops).

Havlak ("Nesting of reducible and irreducible loops", TOPLAS 1997) extends Tarjan's interval
finding: nodes are visited in reverse DFS preorder; each node with incoming back edges heads a
loop made of the nodes that reach those back edges without leaving the header's DFS subtree
(union-find collapses inner loops into their headers); an entry from outside the subtree makes
the loop irreducible instead of being missed. Unlike dominator-based natural loops, this also
nests loops of irreducible control flow (gcc produces some from ``goto`` and jump threading).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

_c: ModuleType | None
try:  # the same analysis in C (_callpath_decode.c): libtorch_cpu.so has ~270k procedures
    # with loops, and this module's Python was a fifth of the whole-binary analysis
    from callpath.structure import _callpath_decode as _c
except ImportError:  # pragma: no cover - a build without a compiler
    _c = None


@dataclass
class Loop:
    header: int  # node index
    parent: int  # loop index, -1 for outermost
    reducible: bool
    nodes: list[int] = field(default_factory=list)  # own nodes (header first), not inner loops'
    back_sources: list[int] = field(default_factory=list)  # tails of back edges into the header


def find_loops(nsucc: list[list[int]], entry: int = 0, *, use_c: bool = True
               ) -> tuple[list[Loop], list[int]]:
    """Loops of the graph given by successor lists; returns (loops, innermost loop per node).

    Loops are listed with inner loops before the loops that contain them; nodes not reachable
    from ``entry`` belong to no loop (-1). With the C extension built, its ``loops`` does the
    work (the same steps; ``use_c=False`` runs the Python below, which tests compare it with).
    """
    if use_c and _c is not None and nsucc:
        raw, innermost = _c.loops(nsucc, entry)
        return [Loop(h, p, r, nd, bs) for h, p, r, nd, bs in raw], innermost
    n = len(nsucc)
    if n == 0:
        return [], []
    UNVISITED = -1
    number = [UNVISITED] * n
    order: list[int] = []  # preorder -> node
    last = [0] * n  # by preorder number: the last preorder number in the subtree
    # Iterative DFS computing preorder numbers and subtree ends.
    stack: list[tuple[int, int]] = [(entry, 0)]
    number[entry] = 0
    order.append(entry)
    while stack:
        v, i = stack[-1]
        succ = nsucc[v]
        if i < len(succ):
            stack[-1] = (v, i + 1)
            w = succ[i]
            if number[w] == UNVISITED:
                number[w] = len(order)
                order.append(w)
                stack.append((w, 0))
        else:
            stack.pop()
            last[number[v]] = len(order) - 1
    m = len(order)
    preds: list[list[int]] = [[] for _ in range(m)]
    for v in order:
        nv = number[v]
        for w in nsucc[v]:
            preds[number[w]].append(nv)
    back: list[list[int]] = [[] for _ in range(m)]
    nonback: list[list[int]] = [[] for _ in range(m)]
    for w in range(m):
        lw = last[w]
        for v in preds[w]:
            if w <= v <= lw:
                back[w].append(v)
            else:
                nonback[w].append(v)
    uf = list(range(m))

    def find(x: int) -> int:
        root = x
        while uf[root] != root:
            root = uf[root]
        while uf[x] != root:
            uf[x], x = root, uf[x]
        return root

    loop_of_header: dict[int, int] = {}
    loops: list[Loop] = []
    inner = [-1] * m  # by preorder number: innermost loop index
    for w in range(m - 1, -1, -1):
        pool: list[int] = []
        in_pool: set[int] = set()
        self_loop = False
        for v in back[w]:
            if v != w:
                r = find(v)
                if r not in in_pool:
                    in_pool.add(r)
                    pool.append(r)
            else:
                self_loop = True
        if not pool and not self_loop:
            continue
        reducible = True
        work = list(pool)
        lw = last[w]
        while work:
            x = work.pop()
            for y in nonback[x]:
                yd = find(y)
                if not (w <= yd <= lw):
                    reducible = False
                    nonback[w].append(yd)
                elif yd != w and yd not in in_pool:
                    in_pool.add(yd)
                    pool.append(yd)
                    work.append(yd)
        li = len(loops)
        loop = Loop(order[w], -1, reducible, [order[w]],
                    [order[v] for v in back[w]])
        loops.append(loop)
        loop_of_header[w] = li
        inner[w] = li
        for x in pool:
            uf[x] = w
            sub = loop_of_header.get(x)
            if sub is not None and loops[sub].parent < 0:
                loops[sub].parent = li
            elif sub is None:
                loop.nodes.append(order[x])
                inner[x] = li
    innermost = [-1] * n
    for pn in range(m):
        innermost[order[pn]] = inner[pn]
    return loops, innermost
