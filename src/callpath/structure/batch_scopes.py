"""The scopes of procedures without inlined code, assembled a batch of procedures at a time
as numpy columns.

``structure/binary.py``'s ``_build_proc`` builds a procedure's scope tree segment by segment
in Python (a trie of inlined-frame and loop paths, then one ``StructureBuilder.add`` per
scope): for libtorch_cpu.so (no DWARF: 385k procedures, ~14M segments, ~6M scopes) that was
half of ``callpath struct``. Without inlined code a segment's scope path is just its loop's
chain, so the tree is the loop forest, and everything else is sorting:

- statements: runs of adjacent non-call segments of one loop, file and line are ranges; the
  ranges of one (loop, file, line) are one STMT scope, ordered by its first address;
- call sites: one CALL scope per call instruction's segment;
- order: a scope tree in preorder is a sort by (the preorder number of the loop or procedure
  a row belongs to, header row / statements / calls, address), the loops' preorder taken with
  siblings by their first address, as ``_build_proc`` emits them.

The rows, their ranges, the address map and the string ids are exactly what ``_build_proc``
would have added (tests compare whole structure files byte for byte).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.structure.cfg import CALL, ICALL, Code, Graph
from callpath.structure.dwarf_lines import LineTable
from callpath.structure.havlak import Loop
from callpath.structure.model import Kind, StructureBuilder

_TOP = np.uint64(np.iinfo(np.uint64).max)


@dataclass
class PlainProc:
    """One procedure's segments and loops, ready for :meth:`Batch.flush`."""

    name: str  # display name
    link: str | None
    file: str | None
    line: int
    lo: int
    seg_lo: npt.NDArray[np.uint64]
    seg_hi: npt.NDArray[np.uint64]
    seg_file: npt.NDArray[np.int32]
    seg_line: npt.NDArray[np.int32]
    seg_node: npt.NDArray[np.int64]  # 0: the procedure itself, k + 1: loop k
    seg_call: npt.NDArray[np.bool_]
    seg_target: npt.NDArray[np.uint64]
    pre: npt.NDArray[np.int64]  # preorder number of each node (0 the procedure)
    node_parent: npt.NDArray[np.int64]  # parent node of each node (-1 for 0)
    loop_head: npt.NDArray[np.uint64]  # address of each loop's header
    loop_file: npt.NDArray[np.int32]
    loop_line: npt.NDArray[np.int32]


def _lines_at(lines: LineTable, addrs: npt.NDArray[np.uint64]) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    if len(lines.address) == 0:
        return (np.full(len(addrs), -1, np.int32), np.zeros(len(addrs), np.int32))
    return lines.lookup(addrs)


def plain_proc(name: str, link: str | None, file: str | None, line: int, lo: int, hi: int,
               code: Code, graph: Graph, loops: list[Loop], innermost: list[int],
               lines: LineTable) -> PlainProc | None:
    """The segments of the procedure ``[lo, hi)`` (no inlined code) from its decoded code,
    control flow graph and loops, as ``_build_proc`` cuts them; None where a loop holds no
    segment (``_build_proc`` makes no scope for it: left to it)."""
    ips, ends, kinds, targets = code.ip, code.end, code.kind, code.target
    calls = [i for i in code.flow if kinds[i] in (CALL, ICALL)]
    nb, nc = len(graph.start), len(calls)
    # every bound in one array (one conversion: a numpy call costs ~1 us, and this runs for
    # each of libtorch_cpu.so's 385k procedures): the procedure's, its blocks', its calls'
    allb = np.array([lo, hi, *graph.start, *graph.end, *[ips[i] for i in calls],
                     *[ends[i] for i in calls]], np.uint64)
    b_start, b_end = allb[2:2 + nb], allb[2 + nb:2 + 2 * nb]
    ca, ce = allb[2 + 2 * nb:2 + 2 * nb + nc], allb[2 + 2 * nb + nc:]
    la = lines.address
    if len(la):
        i0 = int(la.searchsorted(np.uint64(lo), side="left"))
        i1 = int(la.searchsorted(np.uint64(hi), side="left"))
        bnd = np.concatenate((allb, la[i0:i1]))
    else:
        bnd = allb.copy()
    bnd.sort()
    bnd = bnd[bnd.searchsorted(np.uint64(lo)):bnd.searchsorted(np.uint64(hi), side="right")]
    if len(bnd) > 1:
        bnd = bnd[np.concatenate(([True], bnd[1:] != bnd[:-1]))]
    seg_lo = bnd[:-1]
    seg_hi = bnd[1:]
    nseg = len(seg_lo)
    seg_file, seg_line = _lines_at(lines, seg_lo)
    node = np.zeros(nseg, np.int64)
    nl = len(loops)
    if nl:
        bs = bnd.searchsorted(b_start).tolist()
        be = bnd.searchsorted(b_end).tolist()
        for blk, lp in enumerate(innermost):
            if lp >= 0:
                node[bs[blk]:be[blk]] = lp + 1
    # a segment is a call site where it is exactly a call instruction
    if nc:
        k = ca.searchsorted(seg_lo)
        kk = np.minimum(k, nc - 1)
        seg_call = (k < nc) & (ca[kk] == seg_lo) & (ce[kk] == seg_hi)
        ct = np.array([targets[i] for i in calls], np.uint64)
        seg_target = np.where(seg_call, ct[kk], np.uint64(0))
    else:
        seg_call = np.zeros(nseg, bool)
        seg_target = np.zeros(nseg, np.uint64)
    parent = [-1] + [lp.parent + 1 for lp in loops]
    pre = [0] * (nl + 1)
    if nl:
        # a loop's first address: of the first segment of its subtree (inner loops come
        # before the loops holding them)
        first = np.full(nl + 1, _TOP, np.uint64)
        u, idx = np.unique(node, return_index=True)
        first[u] = seg_lo[idx]
        fl = first.tolist()
        top = int(_TOP)
        for j in range(1, nl + 1):
            if fl[j] == top:
                return None
            pj = parent[j]
            if fl[j] < fl[pj]:
                fl[pj] = fl[j]
        children: list[list[int]] = [[] for _ in range(nl + 1)]
        for j in range(1, nl + 1):
            children[parent[j]].append(j)
        stack, n = [0], 0
        while stack:
            v = stack.pop()
            pre[v] = n
            n += 1
            kids = children[v]
            if kids:
                stack.extend(sorted(kids, key=fl.__getitem__, reverse=True))
        starts = graph.start
        head = np.array([starts[lp.header] for lp in loops], np.uint64)
        # the line of the branch at the end of the latest back-edge source block, else the
        # header's (_build_proc's loop lines)
        latch = [code.ip[graph.last[max(lp.back_sources or [lp.header],
                                        key=starts.__getitem__)]] for lp in loops]
        lf, ll = _lines_at(lines, np.concatenate([np.array(latch, np.uint64), head]))
        use = ll[:nl] > 0
        loop_file = np.where(use, lf[:nl], lf[nl:]).astype(np.int32)
        loop_line = np.where(use, ll[:nl], ll[nl:]).astype(np.int32)
    else:
        head = np.zeros(0, np.uint64)
        loop_file = loop_line = np.zeros(0, np.int32)
    return PlainProc(name, link, file, line, lo, seg_lo, seg_hi, seg_file, seg_line, node,
                     seg_call, seg_target, np.array(pre, np.int64),
                     np.array(parent, np.int64), head, loop_file, loop_line)


class Batch:
    """Procedures of one FILE scope collected and then added to the builder together."""

    def __init__(self, b: StructureBuilder, files: list[str]) -> None:
        self.b = b
        self.files = files
        #: builder string id of each source file (-1: not asked for yet), last entry for -1
        self.fsid = np.full(len(files) + 1, -1, np.int64)
        self.procs: list[PlainProc] = []
        self.fscope = 0

    def __len__(self) -> int:
        return len(self.procs)

    def add(self, p: PlainProc) -> None:
        self.procs.append(p)

    def flush(self) -> None:
        """Add the collected procedures' scopes under :attr:`fscope`, in order."""
        procs, self.procs = self.procs, []
        if not procs:
            return
        b = self.b
        base = len(b.kind)
        nn = np.array([len(p.pre) for p in procs], np.int64)
        nb = np.concatenate([[0], np.cumsum(nn)[:-1]])  # first global node of each procedure
        pre = np.concatenate([p.pre for p in procs]) + np.repeat(nb, nn)
        npar = np.concatenate([p.node_parent for p in procs])
        npar = np.where(npar >= 0, npar + np.repeat(nb, nn), -1)
        nseg = np.array([len(p.seg_lo) for p in procs], np.int64)
        s_lo = np.concatenate([p.seg_lo for p in procs])
        s_hi = np.concatenate([p.seg_hi for p in procs])
        s_f = np.concatenate([p.seg_file for p in procs]).astype(np.int64)
        s_l = np.concatenate([p.seg_line for p in procs]).astype(np.int64)
        s_g = np.concatenate([p.seg_node for p in procs]) + np.repeat(nb, nseg)
        s_call = np.concatenate([p.seg_call for p in procs])
        s_t = np.concatenate([p.seg_target for p in procs])
        # statement ranges: maximal runs of non-call segments of one node, file and line
        nc = ~s_call
        same = np.zeros(len(s_lo), bool)
        same[1:] = (nc[:-1] & nc[1:] & (s_g[1:] == s_g[:-1]) & (s_f[1:] == s_f[:-1])
                    & (s_l[1:] == s_l[:-1]))
        starts = np.flatnonzero(nc & ~same)
        nxt = np.zeros(len(s_lo), bool)
        nxt[:-1] = same[1:]
        stops = np.flatnonzero(nc & ~nxt)
        r_lo, r_hi = s_lo[starts], s_hi[stops]
        r_g, r_f, r_l = s_g[starts], s_f[starts], s_l[starts]
        # one STMT per (node, file, line), its ranges by address
        o = np.lexsort((r_lo, r_l, r_f, r_g))
        r_lo, r_hi, r_g, r_f, r_l = r_lo[o], r_hi[o], r_g[o], r_f[o], r_l[o]
        newg = np.ones(len(r_lo), bool)
        newg[1:] = (r_g[1:] != r_g[:-1]) | (r_f[1:] != r_f[:-1]) | (r_l[1:] != r_l[:-1])
        gfirst = np.flatnonzero(newg)
        r_stmt = np.cumsum(newg) - 1  # STMT row (among STMT rows) of each range
        ci = np.flatnonzero(s_call)
        nproc, nloop, nstmt, ncall = len(procs), int(nn.sum()) - len(procs), len(gfirst), \
            len(ci)
        loop_g = np.flatnonzero(npar >= 0)
        proc_g = nb
        # rows: procedures, loops, statements, calls (in that order before sorting)
        r_node = np.concatenate([proc_g, loop_g, r_g[gfirst], s_g[ci]])
        r_cls = np.concatenate([np.zeros(nproc + nloop, np.int8), np.ones(nstmt, np.int8),
                                np.full(ncall, 2, np.int8)])
        r_addr = np.concatenate([np.zeros(nproc + nloop, np.uint64), r_lo[gfirst], s_lo[ci]])
        order = np.lexsort((r_addr, r_cls, pre[r_node]))
        pos = np.empty(len(order), np.int64)
        pos[order] = np.arange(len(order))
        head_pos = np.empty(len(pre), np.int64)  # position of each node's own row
        head_pos[proc_g] = pos[:nproc]
        head_pos[loop_g] = pos[nproc:nproc + nloop]
        kind = np.concatenate([np.full(nproc, int(Kind.PROC), np.int8),
                               np.full(nloop, int(Kind.LOOP), np.int8),
                               np.full(nstmt, int(Kind.STMT), np.int8),
                               np.full(ncall, int(Kind.CALL), np.int8)])
        parent = np.concatenate([np.full(nproc, self.fscope, np.int64),
                                 base + head_pos[npar[loop_g]],
                                 base + head_pos[r_g[gfirst]], base + head_pos[s_g[ci]]])
        loop_f = np.concatenate([p.loop_file for p in procs]).astype(np.int64)
        loop_l = np.concatenate([p.loop_line for p in procs]).astype(np.int64)
        fidx = np.concatenate([np.full(nproc, -1, np.int64), loop_f, r_f[gfirst], s_f[ci]])
        line = np.concatenate([np.array([p.line for p in procs], np.int64), loop_l,
                               r_l[gfirst], s_l[ci]])
        target = np.concatenate([np.zeros(nproc + nloop + nstmt, np.uint64), s_t[ci]])
        # ranges, each with its row: the procedure's entry, a loop's header, statements',
        # calls'
        heads = np.concatenate([p.loop_head for p in procs])
        plo = np.array([p.lo for p in procs], np.uint64)
        x_row = np.concatenate([np.arange(nproc), nproc + np.arange(nloop),
                                nproc + nloop + r_stmt, nproc + nloop + nstmt + np.arange(ncall)])
        x_lo = np.concatenate([plo, heads, r_lo, s_lo[ci]])
        x_hi = np.concatenate([plo + np.uint64(1), heads + np.uint64(1), r_hi, s_hi[ci]])
        xo = np.lexsort((x_lo, pos[x_row]))
        nranges = np.bincount(pos[x_row], minlength=len(order))
        mapped = x_row >= nproc + nloop  # statements' and calls' ranges are in the map
        # string ids, asked for in the order the rows come (the builder numbers strings by
        # first use): each procedure's name, link name and file; each new source file
        fsorted = fidx[order]
        fs = self.fsid
        want = np.flatnonzero((fsorted >= 0) & (fs[fsorted] < 0))
        uf, ufirst = np.unique(fsorted[want], return_index=True)
        events = sorted([(int(pos[j]), 0, j) for j in range(nproc)]
                        + [(int(want[q]), 1, int(f)) for f, q in zip(uf.tolist(),
                                                                    ufirst.tolist(),
                                                                    strict=True)])
        names = np.full(len(order), -1, np.int64)
        links = np.full(len(order), -1, np.int64)
        pfile = np.full(nproc, -1, np.int64)
        files = self.files
        for _, what, j in events:
            if what == 0:
                p = procs[j]
                names[j] = b.sid(p.name)
                if p.link is not None and p.link != p.name:
                    links[j] = b.sid(p.link)
                pfile[j] = b.sid(p.file)
            elif fs[j] < 0:
                fs[j] = b.sid(files[j])
        file = fs[fidx]
        file[:nproc] = pfile
        b.extend(kind[order], parent[order], names[order], links[order], file[order],
                 line[order], target[order], nranges, x_lo[xo], x_hi[xo], x_lo[mapped],
                 x_hi[mapped], base + pos[x_row[mapped]])
