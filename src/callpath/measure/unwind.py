"""Post-mortem call-stack unwinding of all samples of one address space at once.

Why vectorised: a Python loop per frame costs microseconds, and a run has 10^5 samples of 10–50
frames each. Instead every sample advances one frame per step, in numpy: the rows of the pcs
(few distinct pcs per step, memoised in ``cfi.Compiler``) give each sample its CFA rule, and the
return address and saved registers are gathered from the stack copies in place. Steps continue
while any sample is still unwinding.

A sample ends *complete* when its return-address rule is "undefined" (glibc marks ``_start``
and the thread entry in ``clone3`` that way) or the return address is 0; it ends *partial* when
a frame has no unwind information, needs a register or a stack word that was not captured (the
stack copy is too short), leaves every known module, or makes no progress. Frames are never
guessed: a partial path holds exactly the frames that were recovered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.measure import cfi
from callpath.measure.elfinfo import ElfInfo

MAX_DEPTH = 2048
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


@dataclass
class ModuleMap:
    """The executable mappings of an address space, sorted by start."""

    starts: U64
    ends: U64
    bias: I64           # link-time address = pc + bias (per mapping)
    elves: list[ElfInfo | None]
    file_ids: I64       # a small integer per distinct file (memo key)


@dataclass
class Frames:
    """Unwound frames, leaf first within each sample: parallel arrays over all frames."""

    sample: I64
    depth: I64
    module: I64         # mapping index in the ModuleMap, -1 if in none
    address: U64        # link-time address (raw pc when module is -1)
    exact: npt.NDArray[np.bool_]
    complete: npt.NDArray[np.bool_]  # per sample
    nframes: I64                     # per sample
    reason: I64                      # per sample: 0 complete, else a PARTIAL_* code
    source: I64 | None = None        # per frame: cfi.SRC_* of the rule that found it


PARTIAL_NO_INFO, PARTIAL_STACK, PARTIAL_NO_MODULE, PARTIAL_LOOP, PARTIAL_REGISTER = 1, 2, 3, 4, 5
PARTIAL_DEPTH = 6
REASONS = {PARTIAL_NO_INFO: "no unwind information", PARTIAL_STACK: "stack copy too short",
           PARTIAL_NO_MODULE: "pc outside every module", PARTIAL_LOOP: "no progress",
           PARTIAL_REGISTER: "register not recoverable", PARTIAL_DEPTH: "too deep"}


def unwind(words: U64, pc0: U64, sp0: U64, saved0: U64, stack0: I64, nwords: I64,
           mm: ModuleMap, compiler: cfi.Compiler,
           high: tuple[I64, I64, I64] | None = None) -> Frames:
    """Unwind every sample (arguments as :func:`unwind_numpy`): in C where the extension
    ``_callpath_unwind`` is built for this interpreter (:func:`unwind_c`), else in numpy; the
    two give the same frames, field by field, and the same ``compiler.frame_sources``."""
    if len(pc0) and _extension() is not None:
        return unwind_c(words, pc0, sp0, saved0, stack0, nwords, mm, compiler, high=high)
    return unwind_numpy(words, pc0, sp0, saved0, stack0, nwords, mm, compiler, high=high)


_EXT: list[Any] = []


def _extension() -> Any:
    """The C level loop (``_callpath_unwind.c``), or None where it is not built for this
    interpreter (no compiler at install time; the merge runs in the measured program's
    interpreter, which may not be the one callpath was installed with). Imported on first
    use, so that it is loaded only by a post-mortem, never into a program being measured."""
    if not _EXT:
        try:
            from callpath.measure import _callpath_unwind
            _EXT.append(_callpath_unwind)
        except ImportError:
            _EXT.append(None)
    return _EXT[0]


def implementation() -> str:
    """Which unwinder :func:`unwind` runs here: ``"c"`` or ``"numpy"``."""
    return "c" if _extension() is not None else "numpy"


# a sample's status in the C walk (``_callpath_unwind.c``): ended, or parked for Python
_ST_DONE, _ST_NEED_ROW, _ST_NEED_RECIPE, _ST_FILELESS = 1, 2, 3, 4
_KEY_MASK = (1 << 48) - 1


def unwind_c(words: U64, pc0: U64, sp0: U64, saved0: U64, stack0: I64, nwords: I64,
             mm: ModuleMap, compiler: cfi.Compiler,
             high: tuple[I64, I64, I64] | None = None) -> Frames:
    """:func:`unwind_numpy`'s frames from the C extension, which unwinds each sample to its
    end in one call instead of a hundred numpy calls per stack level (a PyTorch run's stacks
    are 278 levels deep: that overhead was the whole cost).

    Rows stay compiled here, in Python: C parks a sample whose (file, pc) it has no row for
    (or no recipe row, where CFI fails), this asks ``compiler`` for the rows of every parked
    key at once, hands their contents to C and resumes the parked samples; each distinct key
    is asked for once, as the numpy loop asks once per key and level. Frames in code without
    a file come back here too, for :func:`_leave_fileless_code`."""
    ext = _extension()
    if ext is None:
        raise RuntimeError("the C unwinder (_callpath_unwind) is not built for this interpreter")
    n = len(pc0)

    def i64(x: Any) -> I64:
        return np.ascontiguousarray(x, dtype=np.int64)

    def u64(x: Any) -> U64:
        return np.ascontiguousarray(x, dtype=np.uint64)

    words_c = u64(words)  # the memory-mapped words are not copied
    stack0_c, nwords_c, sp_start = i64(stack0), i64(nwords), u64(sp0)
    hi = (i64(high[0]), i64(high[1]), i64(high[2])) if high is not None else \
        (np.zeros(0, np.int64),) * 3
    noelf = np.array([e is None for e in mm.elves], dtype=np.uint8)
    ro = (words_c, stack0_c, nwords_c, sp_start, *hi, u64(mm.starts), u64(mm.ends),
          i64(mm.bias), i64(mm.file_ids), noelf)
    pc = pc0.astype(np.uint64)
    sp = sp0.astype(np.uint64)
    saved = np.ascontiguousarray(saved0, dtype=np.uint64).reshape(n, len(cfi.SAVED)).copy()
    valid = np.ones((n, len(cfi.SAVED)), dtype=bool)
    exact = np.ones(n, dtype=bool)
    complete = np.zeros(n, dtype=bool)
    found = np.zeros(n, dtype=np.int64)
    reason = np.zeros(n, dtype=np.int64)
    nframes = np.zeros(n, dtype=np.int64)
    want_m = np.zeros(n, dtype=np.int64)
    want_lk = np.zeros(n, dtype=np.int64)
    status = np.zeros(n, dtype=np.int8)
    parked = np.zeros(n, dtype=np.int64)
    rw = (pc, sp, saved, valid, exact, complete, found, reason, nframes, want_m, want_lk,
          status, parked)
    load = _loader(words_c, sp_start.astype(np.int64), stack0_c, nwords_c,
                   None if high is None else hi)
    session = ext.new_session()
    todo = np.arange(n, dtype=np.int64)
    while len(todo):
        k = ext.walk(session, todo, ro, rw, high is not None, compiler.recipes is not None)
        p = parked[:k].copy()
        st = status[p]
        need_row, need_recipe = p[st == _ST_NEED_ROW], p[st == _ST_NEED_RECIPE]
        for which, ask in ((0, need_row), (1, need_recipe)):
            if len(ask):
                keys, vals = _rows_for(ask, want_m, want_lk, mm, compiler, which == 1)
                ext.add_rows(session, which, (keys, vals))
        fileless = p[st == _ST_FILELESS]
        go_on = [need_row, need_recipe]
        for at_top in (True, False):
            a = fileless[(nframes[fileless] == 1) == at_top]
            if len(a):
                go_on.append(_fileless_c(a, 0 if at_top else 1, want_m, reason, status, pc, sp,
                                         saved, valid, exact, found, nframes, load, mm))
        todo = np.sort(np.concatenate(go_on))
    total = int(nframes.sum())
    out_s, out_d, out_m = (np.empty(total, dtype=np.int64) for _ in range(3))
    out_a = np.empty(total, dtype=np.uint64)
    out_x = np.empty(total, dtype=bool)
    out_src = np.empty(total, dtype=np.int64)
    ext.finish(session, (nframes, out_s, out_d, out_m, out_a, out_x, out_src))
    fr = Frames(out_s, out_d, out_m, out_a, out_x, complete, nframes, reason, out_src)
    count_sources(compiler, fr)
    return fr


def _rows_for(ask: I64, want_m: I64, want_lk: I64, mm: ModuleMap, compiler: cfi.Compiler,
              recipe: bool) -> tuple[I64, I64]:
    """The keys the parked samples ``ask`` wait for and their rows' contents (kind, CFA rule,
    rules, offsets, source), as ``_callpath_unwind.add_rows`` takes them: the row
    ``compiler.row_source`` gives, or with ``recipe`` the recipe row (0 where none)."""
    m, lk = want_m[ask], want_lk[ask]
    key = (mm.file_ids[m].astype(np.int64) << 48) | (lk & _KEY_MASK)
    uk, first = np.unique(key, return_index=True)
    fm, flk = m[first], lk[first]
    vals: list[tuple[int, ...]] = [()] * len(uk)
    for mi in np.unique(fm).tolist():  # per mapping, its pcs at once
        at = np.flatnonzero(fm == mi)
        elf = mm.elves[mi]
        assert elf is not None  # C asks only for modules with a file
        pcs = flk[at].tolist()
        got = ([(compiler.procedure_recipe_row(elf, v), 0) for v in pcs] if recipe
               else [compiler.row_source(elf, v) for v in pcs])
        key_of = compiler.table.key
        for j, (row, src) in zip(at.tolist(), got, strict=True):
            vals[j] = (*key_of(row), src)
    return uk.astype(np.int64), np.array(vals, dtype=np.int64).reshape(len(uk), -1)


def _fileless_c(a: I64, depth: int, want_m: I64, reason: I64, status: npt.NDArray[np.int8],
                pc: U64, sp: U64, saved: U64, valid: npt.NDArray[np.bool_],
                exact: npt.NDArray[np.bool_], found: I64, nframes: I64, load: Any,
                mm: ModuleMap) -> I64:
    """The samples ``a`` that C parked after a frame in code without a file (its stop code
    in ``reason``): the numpy loop's :func:`_leave_fileless_code` on them, its callers set as
    the numpy loop sets them; the samples that go on (to resume in C)."""
    m = want_m[a]
    inmod = m >= 0
    stop = reason[a].copy()
    new_pc = np.zeros(len(a), dtype=np.uint64)
    new_sp, new_saved, new_valid = sp[a].copy(), saved[a].copy(), valid[a].copy()
    src = np.zeros(len(a), dtype=np.int64)
    _leave_fileless_code(a, m, inmod, stop, depth, sp, saved, valid, load, mm, new_pc, new_sp,
                         new_saved, new_valid, src)
    cont = stop == 0
    ac = a[cont]
    pc[ac], sp[ac], saved[ac], valid[ac] = new_pc[cont], new_sp[cont], new_saved[cont], \
        new_valid[cont]
    exact[ac] = False
    found[ac] = src[cont]
    reason[a] = stop
    status[a] = _ST_DONE
    deep = ac[nframes[ac] >= MAX_DEPTH]
    reason[deep] = PARTIAL_DEPTH
    go_on: I64 = ac[nframes[ac] < MAX_DEPTH]
    return go_on


def unwind_numpy(words: U64, pc0: U64, sp0: U64, saved0: U64, stack0: I64, nwords: I64,
                 mm: ModuleMap, compiler: cfi.Compiler,
                 high: tuple[I64, I64, I64] | None = None) -> Frames:
    """Unwind every sample (numpy, one step per stack level: ``unwind`` without the C
    extension). ``saved0`` is (n, 6): rbx rbp r12 r13 r14 r15 at the sample.

    Each sample's stack copy is ``nwords`` words from its sp, at ``words[stack0]``; ``high``,
    when given, is a second window per sample (its start in words above sp, its length in
    words, its first word in ``words``): the outer end of a stack too deep to copy whole
    (``run --native`` copies the frames near sp and those near the outermost evaluation
    frame, with a native frame of hundreds of KiB, such as OpenBLAS's gemm driver, between)."""
    n = len(pc0)
    pc = pc0.astype(np.uint64).copy()
    sp = sp0.astype(np.uint64).copy()
    saved = saved0.astype(np.uint64).copy()
    valid = np.ones((n, len(cfi.SAVED)), dtype=bool)
    exact = np.ones(n, dtype=bool)
    active = np.arange(n, dtype=np.int64)
    complete = np.zeros(n, dtype=bool)
    reason = np.zeros(n, dtype=np.int64)
    nframes = np.zeros(n, dtype=np.int64)
    out_s: list[I64] = []
    out_d: list[I64] = []
    out_m: list[I64] = []
    out_a: list[U64] = []
    out_x: list[npt.NDArray[np.bool_]] = []
    sp_start = sp0.astype(np.uint64)
    sp_start_i = sp_start.astype(np.int64)

    load = _loader(words, sp_start_i, stack0, nwords, high)

    def in_module(p: U64) -> npt.NDArray[np.bool_]:
        """Whether return addresses fall in a mapped module (the call before them does)."""
        if not len(mm.starts):
            return np.zeros(len(p), dtype=bool)
        q = p - np.uint64(1)
        k = np.searchsorted(mm.starts, q, side="right").astype(np.int64) - 1
        return (k >= 0) & (q < mm.ends[np.maximum(k, 0)]) & (p > 0)

    def step(ai: I64, r: I64) -> tuple[Any, ...]:
        """One frame up for the samples ``ai`` by the (KIND_CFA, KIND_CFA_DEREF) rows ``r``:
        stop code, outermost, and the caller's pc, sp, saved registers and their validity."""
        kind, cfa_reg, cfa_off, rule, off = compiler.table.arrays()
        creg = cfa_reg[r]
        base = sp[ai].copy()
        base_ok = creg == cfi.RSP
        for col, reg in enumerate(cfi.SAVED):
            sel = creg == reg
            if np.any(sel):
                base = np.where(sel, saved[ai, col], base)
                base_ok |= sel & valid[ai, col]
        cfa = (base.astype(np.int64) + cfa_off[r]).astype(np.uint64)
        deref = np.flatnonzero(kind[r] == cfi.KIND_CFA_DEREF)
        if len(deref):  # the CFA is kept in memory (a prologue that realigns the stack)
            v, ok = load(ai[deref], cfa[deref])
            cfa[deref] = v
            base_ok[deref] &= ok
        ru, ro = rule[r], off[r]
        ra_rule = ru[:, -1]
        ra, ra_ok = load(ai, (cfa.astype(np.int64) + ro[:, -1]).astype(np.uint64))
        bad_reg = ~base_ok
        root = (ra_rule == cfi.RULE_UNDEF) & base_ok
        st = np.where(bad_reg, PARTIAL_REGISTER, 0)
        st = np.where(~root & ~bad_reg & ((ra_rule != cfi.RULE_OFFSET) | ~ra_ok),
                      PARTIAL_STACK, st)
        st = np.where((st == 0) & ~root & (cfa <= sp[ai]), PARTIAL_LOOP, st)
        root |= (st == 0) & (ra == 0)
        ns = len(cfi.SAVED)
        addr2 = cfa.astype(np.int64)[:, None] + ro[:, :ns]
        v2, ok2 = load(ai, addr2)
        is_off = ru[:, :ns] == cfi.RULE_OFFSET
        at_rbp = ru[:, :ns] == cfi.RULE_AT_RBP
        old_s, old_v = saved[ai], valid[ai]
        if at_rbp.any():  # saved relative to the frame's own rbp, not to the CFA
            rbp = cfi.SAVED.index(cfi.RBP)
            addr3 = old_s[:, rbp].astype(np.int64)[:, None] + ro[:, :ns]
            v3, ok3 = load(ai, addr3)
            addr2 = np.where(at_rbp, addr3, addr2)
            v2 = np.where(at_rbp, v3, v2)
            ok2 = np.where(at_rbp, ok3 & old_v[:, rbp][:, None], ok2)
            is_off = is_off | at_rbp
        # a save slot below the stack pointer (epilogue rows) is stale: keep the value
        stale = is_off & (addr2 < sp[ai].astype(np.int64)[:, None])
        take = is_off & ~stale
        nsv = np.where(take, v2, old_s)
        nvl = np.where(take, ok2, ((ru[:, :ns] == cfi.RULE_SAME) | stale) & old_v)
        return st, root, np.where(root, np.uint64(0), ra), cfa, nsv, nvl

    found = np.zeros(n, dtype=np.int64)  # SRC_* of the rule that found each current frame
    out_src: list[I64] = []
    depth = 0
    while len(active):
        a = active
        p = pc[a]
        look = p - (~exact[a]).astype(np.uint64)
        m = np.searchsorted(mm.starts, look, side="right").astype(np.int64) - 1
        inmod = (m >= 0) & (look < mm.ends[np.maximum(m, 0)]) if len(mm.starts) else \
            np.zeros(len(a), dtype=bool)
        m = np.where(inmod, m, -1)
        bias = mm.bias[np.maximum(m, 0)] if len(mm.starts) else np.zeros(len(a), np.int64)
        link = np.where(inmod, (p.astype(np.int64) + bias).astype(np.uint64), p)
        out_s.append(a)
        out_d.append(np.full(len(a), depth, dtype=np.int64))
        out_m.append(m)
        out_a.append(link)
        out_x.append(exact[a].copy())
        out_src.append(found[a].copy())
        nframes[a] += 1
        # rows for the distinct (module, pc) of this step
        lk = np.where(inmod, (look.astype(np.int64) + bias), -1)
        fid = (np.where(inmod, mm.file_ids[np.maximum(m, 0)], -1) if len(mm.starts)
               else np.full(len(a), -1, dtype=np.int64))
        key = np.where(inmod, (fid << 48) | (lk & ((1 << 48) - 1)), -1)
        uk, first, inv = np.unique(key, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        urow = np.zeros(len(uk), dtype=np.int64)
        usrc = np.zeros(len(uk), dtype=np.int64)
        for j, (k, f0) in enumerate(zip(uk.tolist(), first.tolist(), strict=True)):
            if k < 0:
                continue
            elf = mm.elves[int(m[f0])]
            if elf is not None:
                urow[j], usrc[j] = compiler.row_source(elf, int(lk[f0]))

        def recipe_of(u: int, m: Any = m, lk: Any = lk, first: Any = first) -> int:
            elf = mm.elves[int(m[first[u]])]
            return (compiler.procedure_recipe_row(elf, int(lk[first[u]])) if elf is not None
                    else 0)

        row = urow[inv]
        src = usrc[inv]
        rk = compiler.table.arrays()[0][row]
        stop = np.zeros(len(a), dtype=np.int64)
        stop[~inmod] = PARTIAL_NO_MODULE
        stop[inmod & (rk == cfi.KIND_NONE)] = PARTIAL_NO_INFO
        new_pc = np.zeros(len(a), dtype=np.uint64)
        new_sp = sp[a].copy()
        new_saved = saved[a].copy()
        new_valid = valid[a].copy()
        new_exact = np.zeros(len(a), dtype=bool)
        done_ok = np.zeros(len(a), dtype=bool)
        # ordinary frames
        c = np.nonzero(((rk == cfi.KIND_CFA) | (rk == cfi.KIND_CFA_DEREF)) & (stop == 0))[0]
        if len(c):
            st, root, npc, nsp, nsv, nvl = step(a[c], row[c])
            if compiler.recipes is not None:
                # CFI that finds no return address in any module where a recipe does is
                # demonstrably wrong there: the recipe's frame is taken instead (a stack copy
                # too short is not the CFI's fault: the recipe is not computed for it)
                bad = np.nonzero((src[c] == cfi.SRC_CFI) & (st != PARTIAL_STACK)
                                 & ((st != 0) | (~root & ~in_module(npc))))[0]
                if len(bad):
                    rr = np.zeros(len(bad), dtype=np.int64)
                    for j, u in enumerate(inv[c[bad]].tolist()):
                        rr[j] = recipe_of(u)
                    try_ = np.nonzero(rr > 0)[0]
                    if len(try_):
                        b = bad[try_]
                        st2, root2, npc2, nsp2, nsv2, nvl2 = step(a[c[b]], rr[try_])
                        good = (st2 == 0) & (root2 | in_module(npc2))
                        g = b[good]
                        st[g], root[g], npc[g], nsp[g] = st2[good], root2[good], npc2[good], \
                            nsp2[good]
                        nsv[g], nvl[g] = nsv2[good], nvl2[good]
                        src[c[g]] = cfi.SRC_RECIPE_FIX
            new_saved[c] = nsv
            new_valid[c] = nvl
            new_pc[c] = npc
            new_sp[c] = nsp
            stop[c] = st
            done_ok[c] = root & (st == 0)
        # signal frames: registers come from the ucontext the kernel pushed at sp
        sgi = np.nonzero((rk == cfi.KIND_SIGNAL) & (stop == 0))[0]
        if len(sgi):
            ai = a[sgi]
            base = sp[ai]
            vals = {}
            oks = np.ones(len(sgi), dtype=bool)
            for reg, g in cfi.GREG.items():
                v, ok = load(ai, base + np.uint64(cfi.UC_GREGS + 8 * g))
                vals[reg] = v
                oks &= ok
            for col, reg in enumerate(cfi.SAVED):
                new_saved[sgi, col] = vals[reg]
                new_valid[sgi, col] = oks
            new_pc[sgi] = vals[cfi.RA]
            new_sp[sgi] = vals[cfi.RSP]
            new_exact[sgi] = True
            stop[sgi] = np.where(oks, 0, PARTIAL_STACK)
        _leave_fileless_code(a, m, inmod, stop, depth, sp, saved, valid, load, mm,
                             new_pc, new_sp, new_saved, new_valid, src)
        finished = (stop != 0) | done_ok
        reason[a[stop != 0]] = stop[stop != 0]
        complete[a[done_ok]] = True
        cont = ~finished
        ac = a[cont]
        pc[ac] = new_pc[cont]
        sp[ac] = new_sp[cont]
        saved[ac] = new_saved[cont]
        valid[ac] = new_valid[cont]
        exact[ac] = new_exact[cont]
        src = np.where(rk == cfi.KIND_SIGNAL, cfi.SRC_SIGNAL, src)
        found[ac] = src[cont]
        active = ac
        depth += 1
        if depth >= MAX_DEPTH and len(active):
            reason[active] = PARTIAL_DEPTH
            break
    cat: Any = np.concatenate
    if out_s:
        fr = Frames(cat(out_s), cat(out_d), cat(out_m), cat(out_a), cat(out_x), complete,
                    nframes, reason, cat(out_src))
    else:
        z = np.zeros(0, dtype=np.int64)
        fr = Frames(z, z, z, z.astype(np.uint64), z.astype(bool), complete, nframes, reason,
                    z.copy())
    count_sources(compiler, fr)
    return fr


def _loader(words: U64, sp_start_i: I64, stack0: I64, nwords: I64,
            high: tuple[I64, I64, I64] | None) -> Any:
    """``load(idx, addr)``: the words at ``addr`` (shape (n,) or (n, k)) in the stack copies
    of the samples ``idx``, and whether each is there (a word not there reads as ``words[0]``,
    and the C unwinder reads it the same way)."""
    nw = len(words)

    def load(idx: I64, addr: Any) -> tuple[Any, Any]:
        a = addr.astype(np.int64)
        base, lim, first = sp_start_i[idx], nwords[idx], stack0[idx]
        if a.ndim == 2:
            base, lim, first = base[:, None], lim[:, None], first[:, None]
        k = a - base
        ok = (k >= 0) & ((k & 7) == 0) & ((k >> 3) < lim)
        w = np.where(ok, first + (k >> 3), 0)
        if high is not None:
            at, hn, hfirst = high[0][idx], high[1][idx], high[2][idx]
            if a.ndim == 2:
                at, hn, hfirst = at[:, None], hn[:, None], hfirst[:, None]
            kh = (k >> 3) - at
            okh = ~ok & (k >= 0) & ((k & 7) == 0) & (kh >= 0) & (kh < hn)
            w = np.where(okh, hfirst + kh, w)
            ok = ok | okh
        if not nw:
            return np.zeros(a.shape, dtype=np.uint64), ok & False
        return words[w], ok
    return load


def _leave_fileless_code(a: I64, m: I64, inmod: npt.NDArray[np.bool_], stop: I64, depth: int,
                         sp: U64, saved: U64, valid: npt.NDArray[np.bool_], load: Any,
                         mm: ModuleMap, new_pc: U64, new_sp: U64, new_saved: U64,
                         new_valid: npt.NDArray[np.bool_], src: I64) -> None:
    """Frames in code without a file (JIT code; at depth 0 also a pc in no reported mapping):
    the caller by a return address proved to follow a call (``jitframes``), else partial."""
    noelf = np.array([e is None for e in mm.elves] + [True], dtype=bool)
    cand = (((stop == PARTIAL_NO_INFO) & inmod & noelf[np.where(inmod, m, -1)])
            | ((stop == PARTIAL_NO_MODULE) & (depth == 0)))
    j = np.nonzero(cand)[0]
    if not len(j):
        return
    from callpath.measure import jitframes
    ai = a[j]
    col = cfi.SAVED.index(cfi.RBP)
    hyps = jitframes.return_candidates(sp[ai], saved[ai, col], valid[ai, col],
                                       lambda addr: load(ai, addr))
    todo = np.ones(len(j), dtype=bool)
    for ra, loaded, nsp, nrbp, nrbp_ok in hyps:
        ok = todo & jitframes.proved(ra, loaded, mm.starts, mm.ends, mm.bias, mm.elves)
        t = j[ok]
        new_pc[t] = ra[ok]
        new_sp[t] = nsp[ok]
        new_saved[t] = saved[ai[ok]]
        new_valid[t] = valid[ai[ok]]
        new_saved[t, col] = nrbp[ok]
        new_valid[t, col] = nrbp_ok[ok]
        stop[t] = 0
        src[t] = cfi.SRC_JIT
        todo &= ~ok


def count_sources(compiler: cfi.Compiler, fr: Frames) -> None:
    """Add the frames' sources to the compiler's per-source totals (the run's summary)."""
    if fr.source is not None and len(fr.source):
        got = np.bincount(fr.source, minlength=len(cfi.SOURCES)).tolist()
        for i, v in enumerate(got[:len(cfi.SOURCES)]):
            compiler.frame_sources[i] += int(v)


_SHARED: dict[str, Any] = {}
PARALLEL_MIN = 65536  # below this, forking a worker cost more than it saved (measured)


def _unwind_part(lo: int, hi: int, save: bool = True) -> Frames:
    a = _SHARED
    h = a["high"]
    fr = unwind(a["words"], a["pc0"][lo:hi], a["sp0"][lo:hi], a["saved0"][lo:hi],
                a["stack0"][lo:hi], a["nwords"][lo:hi], a["mm"], a["compiler"],
                high=None if h is None else (h[0][lo:hi], h[1][lo:hi], h[2][lo:hi]))
    if save and a["compiler"].cache is not None:  # a worker's rows would die with it
        a["compiler"].cache.save()
    return fr


def unwind_parallel(words: U64, pc0: U64, sp0: U64, saved0: U64, stack0: I64, nwords: I64,
                    mm: ModuleMap, compiler: cfi.Compiler, workers: int = 2,
                    high: tuple[I64, I64, I64] | None = None,
                    min_samples: int = PARALLEL_MIN) -> Frames:
    """``unwind`` with the samples split between this process and forked workers (which see
    the memory-mapped raw data and the compiled rows without copying them), in consecutive
    runs of about equal stack words (a run's depth follows what the program was doing: the
    first half of a PyTorch loop's samples held three quarters of its frames)."""
    n = len(pc0)
    workers = min(workers, os.cpu_count() or 1)
    if workers < 2 or n < max(min_samples, workers):
        return unwind(words, pc0, sp0, saved0, stack0, nwords, mm, compiler, high=high)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    _SHARED.update(words=words, pc0=pc0, sp0=sp0, saved0=saved0, stack0=stack0,
                   nwords=nwords, mm=mm, compiler=compiler, high=high)
    work = np.cumsum(nwords.astype(np.int64) + 1)
    cuts = np.searchsorted(work, work[-1] * np.arange(1, workers) / workers).tolist()
    bounds = [0, *(min(max(int(c), 1), n - 1) for c in cuts), n]
    try:
        with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork")) \
                as pool:
            futures = [pool.submit(_unwind_part, bounds[i], bounds[i + 1])
                       for i in range(1, workers)]
            # this process's rows are saved by the caller, after the workers saved theirs
            # (two saves at once would each keep only what they read and added)
            parts = [_unwind_part(bounds[0], bounds[1], save=False)] + \
                [f.result() for f in futures]
    finally:
        _SHARED.clear()
    for p in parts[1:]:  # the workers' counts stayed in their processes
        count_sources(compiler, p)
    cat: Any = np.concatenate
    return Frames(cat([p.sample + bounds[i] for i, p in enumerate(parts)]),
                  cat([p.depth for p in parts]), cat([p.module for p in parts]),
                  cat([p.address for p in parts]), cat([p.exact for p in parts]),
                  cat([p.complete for p in parts]), cat([p.nframes for p in parts]),
                  cat([p.reason for p in parts]),
                  cat([p.source if p.source is not None else np.zeros(len(p.sample), np.int64)
                       for p in parts]))
