"""The scopes of procedures without inlined code, assembled a batch of procedures at a time
as numpy columns.

``structure/binary.py``'s ``_build_proc`` builds a procedure's scope tree segment by segment
in Python (a trie of inlined-frame and loop paths, then one ``StructureBuilder.add`` per
scope): for libtorch_cpu.so (no DWARF: 385k procedures, ~14M segments, 5.1M scopes) that was
half of ``callpath struct``. Without inlined code a segment's scope path is just its loop's
chain, so the tree is the loop forest, and everything else is sorting:

- statements: runs of adjacent non-call segments of one loop, file and line are ranges; the
  ranges of one (loop, file, line) are one STMT scope, ordered by its first address;
- call sites: one CALL scope per call instruction's segment;
- order: a scope tree in preorder is a sort by (the preorder number of the loop or procedure
  a row belongs to, header row / statements / calls, address), the loops' preorder taken with
  siblings by their first address, as ``_build_proc`` emits them.

The segments themselves are cut for the whole batch at once: a batch's procedures come in
address order without overlapping, so one sort of all their bounds (ends, blocks, calls,
line-table rows) by procedure and address gives every procedure's segments, and a block's
first segment is found by one search over all of them. Per procedure only Python lists are
made (a numpy call costs ~1 us; ~15 per procedure were a third of the build).

The rows, their ranges, the address map and the string ids are exactly what ``_build_proc``
would have added (``tests/test_struct_batch.py`` compares every column; whole structure
files were compared byte for byte).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.structure.cfg import CALL, ICALL, Code, Graph
from callpath.structure.dwarf_lines import LineTable
from callpath.structure.havlak import Loop
from callpath.structure.model import Kind, StructureBuilder

_TOP = np.uint64(np.iinfo(np.uint64).max)


@dataclass
class PlainProc:
    """One procedure's blocks, calls and loops as Python lists, ready for
    :meth:`Batch.flush` (which cuts the segments of a whole batch at once)."""

    name: str  # display name
    link: str | None
    file: str | None
    line: int
    lo: int
    hi: int
    #: block starts, block ends, call instructions' addresses, their ends
    bounds: list[int]
    nb: int  # blocks
    nc: int  # calls
    targets: list[int]  # each call's direct target (0: none)
    inner: list[int]  # innermost loop of each block (-1: none); empty without loops
    parent: list[int]  # parent node of each node (0: the procedure, k + 1: loop k; -1 for 0)
    head: list[int]  # each loop's header address
    latch: list[int]  # the address of each loop's latest back-edge branch


def _lines_at(lines: LineTable, addrs: npt.NDArray[np.uint64]) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    if len(lines.address) == 0:
        return (np.full(len(addrs), -1, np.int32), np.zeros(len(addrs), np.int32))
    return lines.lookup(addrs)


def plain_proc(name: str, link: str | None, file: str | None, line: int, lo: int, hi: int,
               code: Code, graph: Graph, loops: list[Loop], innermost: list[int],
               lines: LineTable) -> PlainProc | None:
    """What :meth:`Batch.flush` needs of the procedure ``[lo, hi)`` (no inlined code) from
    its decoded code, control flow graph and loops; None where a loop holds no block
    (``_build_proc`` makes no scope for a loop without segments: left to it)."""
    ips, ends, kinds, targets = code.ip, code.end, code.kind, code.target
    calls = [i for i in code.flow if kinds[i] in (CALL, ICALL)]
    starts = graph.start
    nl = len(loops)
    if nl and len(set(innermost)) - (-1 in innermost) < nl:
        return None
    return PlainProc(
        name, link, file, line, lo, hi,
        [*starts, *graph.end, *[ips[i] for i in calls], *[ends[i] for i in calls]],
        len(starts), len(calls), [targets[i] for i in calls], innermost if nl else [],
        [-1, *[lp.parent + 1 for lp in loops]], [starts[lp.header] for lp in loops],
        # the branch at the end of the latest back-edge source block (_build_proc's loop
        # lines: that line, else the header's)
        [ips[graph.last[max(lp.back_sources or [lp.header], key=starts.__getitem__)]]
         for lp in loops])


class Batch:
    """Procedures of one FILE scope collected and then added to the builder together."""

    def __init__(self, b: StructureBuilder, lines: LineTable) -> None:
        self.b = b
        self.lines = lines
        self.files = files = lines.files
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
        plo = np.array([p.lo for p in procs], np.uint64)
        phi = np.array([p.hi for p in procs], np.uint64)
        if len(procs) > 1 and not (plo[1:] >= phi[:-1]).all():
            # the segments are cut for the whole batch by address: procedures must come in
            # address order without overlapping (as a run of the procedure table does)
            for p in procs:
                self.procs = [p]
                self.flush()
            return
        b = self.b
        base = len(b.kind)
        s_lo, s_hi, s_f, s_l, s_g, s_call, s_t, pre, npar, heads, loop_f, loop_l = \
            self._segments(procs, plo, phi)
        nn = np.array([len(p.parent) for p in procs], np.int64)
        nb = np.concatenate([[0], np.cumsum(nn)[:-1]])  # first global node of each procedure
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
        fidx = np.concatenate([np.full(nproc, -1, np.int64), loop_f, r_f[gfirst], s_f[ci]])
        line = np.concatenate([np.array([p.line for p in procs], np.int64), loop_l,
                               r_l[gfirst], s_l[ci]])
        target = np.concatenate([np.zeros(nproc + nloop + nstmt, np.uint64), s_t[ci]])
        # ranges, each with its row: the procedure's entry, a loop's header, statements',
        # calls'
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

    def _segments(self, procs: list[PlainProc], plo: npt.NDArray[np.uint64],
                  phi: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[Any], ...]:
        """The batch's segments (address, end, file, line, node, call or not, call target;
        the global node numbering), each node's preorder number and parent node, and each
        loop's header address, file and line, as ``_build_proc`` would cut them one
        procedure at a time: bounds at the procedure's ends, its blocks' ends, its calls'
        ends and line-table rows, inside ``[lo, hi]``."""
        n = len(procs)
        lines = self.lines
        cnt = np.array([2 + len(p.bounds) for p in procs], np.int64)
        a = np.array(list(chain.from_iterable([p.lo, p.hi, *p.bounds] for p in procs)),
                     np.uint64)
        pid = np.repeat(np.arange(n), cnt)
        la = lines.address
        if len(la):
            i0 = la.searchsorted(plo, side="left")
            nla = la.searchsorted(phi, side="left") - i0
            tot = int(nla.sum())
            at = np.repeat(i0 - (np.cumsum(nla) - nla), nla) + np.arange(tot)
            a = np.concatenate([a, la[at]])
            pid = np.concatenate([pid, np.repeat(np.arange(n), nla)])
        keep = (a >= plo[pid]) & (a <= phi[pid])
        a, pid = a[keep], pid[keep]
        o = np.lexsort((a, pid))
        a, pid = a[o], pid[o]
        first = np.ones(len(a), bool)
        first[1:] = (a[1:] != a[:-1]) | (pid[1:] != pid[:-1])
        a, pid = a[first], pid[first]
        sk = np.flatnonzero(pid[:-1] == pid[1:])
        s_lo, s_hi, s_p = a[sk], a[sk + 1], pid[sk]
        seg_end = np.cumsum(np.bincount(s_p, minlength=n))  # one past each one's last
        s_f, s_l = _lines_at(lines, s_lo)
        nn = np.array([len(p.parent) for p in procs], np.int64)
        nbase = np.concatenate([[0], np.cumsum(nn)[:-1]])
        # nodes: blocks painted with their innermost loop (blocks are disjoint, so a running
        # sum of +node at a block's first segment and -node after its last paints them)
        lp = [p for p in procs if p.inner]
        lpj = np.array([j for j, p in enumerate(procs) if p.inner], np.int64)
        s_g = nbase[s_p]
        total = int(nn.sum())
        fl = [int(_TOP)] * total
        if lp:
            nbk = np.array([p.nb for p in lp], np.int64)
            bst = np.array(list(chain.from_iterable(p.bounds[:p.nb] for p in lp)), np.uint64)
            ben = np.array(list(chain.from_iterable(p.bounds[p.nb:2 * p.nb] for p in lp)),
                           np.uint64)
            inner = np.array(list(chain.from_iterable(p.inner for p in lp)), np.int64)
            bj = np.repeat(lpj, nbk)
            sel = inner >= 0
            g = nbase[bj[sel]] + inner[sel] + 1
            bs = s_lo.searchsorted(bst[sel])
            be = np.minimum(s_lo.searchsorted(ben[sel]), seg_end[bj[sel]])
            diff = np.zeros(len(s_lo) + 1, np.int64)
            val = g - nbase[bj[sel]]
            np.add.at(diff, bs, val)
            np.add.at(diff, be, -val)
            s_g = s_g + np.cumsum(diff)[:-1]
            # a loop's first address: its first block's (blocks come by address), then the
            # least over the loops inside it (inner loops come first)
            u, idx = np.unique(g, return_index=True)
            first_at = np.full(total, _TOP, np.uint64)
            first_at[u] = bst[sel][idx]
            fl = first_at.tolist()
        pre = list(range(total))  # procedures without loops: their one node
        npar = np.full(total, -1, np.int64)
        for j, p in zip(lpj.tolist(), lp, strict=True):
            b0 = int(nbase[j])
            par = p.parent
            k = len(par)
            for x in range(1, k):
                px = b0 + par[x]
                if fl[b0 + x] < fl[px]:
                    fl[px] = fl[b0 + x]
            children: list[list[int]] = [[] for _ in range(k)]
            for x in range(1, k):
                children[par[x]].append(x)
            stack, m = [0], b0
            while stack:
                v = stack.pop()
                pre[b0 + v] = m
                m += 1
                kids = children[v]
                if kids:
                    stack.extend(sorted(kids, key=lambda y: fl[b0 + y], reverse=True))
            npar[b0 + 1:b0 + k] = np.array(par[1:], np.int64) + b0
        # call sites: segments that are exactly a call instruction
        ca = np.array(list(chain.from_iterable(p.bounds[2 * p.nb:2 * p.nb + p.nc]
                                               for p in procs)), np.uint64)
        if len(ca):
            ce = np.array(list(chain.from_iterable(p.bounds[2 * p.nb + p.nc:]
                                                   for p in procs)), np.uint64)
            ct = np.array(list(chain.from_iterable(p.targets for p in procs)), np.uint64)
            kc = ca.searchsorted(s_lo)
            kk = np.minimum(kc, len(ca) - 1)
            s_call = (kc < len(ca)) & (ca[kk] == s_lo) & (ce[kk] == s_hi)
            s_t = np.where(s_call, ct[kk], np.uint64(0))
        else:
            s_call = np.zeros(len(s_lo), bool)
            s_t = np.zeros(len(s_lo), np.uint64)
        heads = np.array(list(chain.from_iterable(p.head for p in procs)), np.uint64)
        latch = np.array(list(chain.from_iterable(p.latch for p in procs)), np.uint64)
        nl = len(heads)
        lf, ll = _lines_at(lines, np.concatenate([latch, heads]))
        use = ll[:nl] > 0
        loop_f = np.where(use, lf[:nl], lf[nl:]).astype(np.int64)
        loop_l = np.where(use, ll[:nl], ll[nl:]).astype(np.int64)
        return (s_lo, s_hi, s_f.astype(np.int64), s_l.astype(np.int64), s_g, s_call, s_t,
                np.array(pre, np.int64), npar, heads, loop_f, loop_l)
