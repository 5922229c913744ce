"""Unwind recipes computed from machine code alone (hpcrun's binary analysis, PLDI 2009).

For code without call-frame information (``-fno-asynchronous-unwind-tables``, hand-written
assembly, stripped JIT-free binaries) the caller's frame is still recoverable from the
instructions: every procedure starts with its return address at the stack pointer, and the
few instructions that move the stack pointer or set up a frame pointer (push, pop, sub/add
rsp, lea rsp, ``mov rbp, rsp``, ``and rsp, -N``, leave, enter) say where it is afterwards.

Per procedure, the instructions are interpreted in address order over an abstract state: where
the canonical frame address (CFA, the stack pointer before the call) is (``rsp + k`` or, once a
frame pointer is set up, ``rbp + f``), and where rbx, rbp, r12–r15 were pushed (CFA-relative).
Control flow decides the state where straight-line order cannot: after a ret, a tail-call jmp or
any other instruction that does not fall through, the next instruction takes the state recorded
at a direct branch to it (epilogues of multiple exits, cold blocks behind the ret), else the
state at the procedure's last indirect jump (jump-table targets), else the state at its last
conditional branch (the body's state). The passes repeat until no such state changes (two
passes for almost every procedure). Code that gcc splits off (``foo.cold``, entered by a jmp
from the hot part) starts in the state of that jmp instead of the entry state.

Procedure bounds come from function symbols (and a separate debug file's), ``.eh_frame_hdr``
entries, direct call targets, the ELF entry point and section starts, and — where no sized
symbol covers the code, as in a stripped binary — the gaps after a ret/jmp (padding skipped)
that no direct jump reaches, as the paper finds them.

The result is a struct of arrays: sorted range starts and a row index per range into a small
table of distinct rows (kind, CFA register, CFA offset, save offsets of rbx rbp r12–r15), so
a lookup is one ``searchsorted``. Rows use DWARF register numbers like ``measure.cfi``.
"""

from __future__ import annotations

import bisect
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.structure.elf import ElfModule, find_debug_file, open_elf
from callpath.structure.symbols import function_symbols

#: Bumped when the analysis changes: cached recipes of another version are recomputed.
VERSION = 4
DW_RBP, DW_RSP = 6, 7
#: columns of ``Recipes.rows``
KIND, CFA_REG, CFA_OFF = 0, 1, 2
SAVE_COLS = 3  # then one column per register of SAVED_NAMES: CFA-relative slot, 0 = not saved
SAVED_NAMES = ("rbx", "rbp", "r12", "r13", "r14", "r15")
#: last column: CFA - rsp where it is known also in a frame-pointer row (else UNKNOWN_SP), so
#: that rows can be compared with CFI that expresses the same CFA from rsp
SP_COL = SAVE_COLS + len(SAVED_NAMES)
UNKNOWN_SP = -(1 << 40)
NCOLS = SP_COL + 1

# abstract operations (one per instruction)
(OP_NONE, OP_SP_ADD, OP_PUSH, OP_POP, OP_SP_LOST, OP_AND_SP, OP_FP_FROM_SP, OP_SP_FROM_FP,
 OP_SP_FROM_FP_D, OP_LEAVE, OP_FP_LOST, OP_RET, OP_JMP, OP_IJMP, OP_JCC, OP_STOP, OP_ENTER,
 OP_CALL) = range(18)
_NO_FALL = (OP_RET, OP_JMP, OP_IJMP, OP_STOP)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_TABLES: dict[str, Any] = {}


def _tables() -> dict[str, Any]:
    """iced-x86 constants, looked up once (attribute access on the module costs)."""
    if _TABLES:
        return _TABLES
    import iced_x86 as ix
    R, M, K = ix.Register, ix.Mnemonic, ix.OpKind
    saved = {R.RBX: 0, R.RBP: 1, R.R12: 2, R.R13: 3, R.R14: 4, R.R15: 5}
    _TABLES.update(
        ix=ix, RSP=R.RSP, RBP=R.RBP, saved=saved,
        fp_regs={R.RBP, R.EBP, R.BP, R.BPL}, sp_regs={R.RSP, R.ESP, R.SP, R.SPL},
        REG=K.REGISTER, MEM=K.MEMORY,
        IMM={K.IMMEDIATE8, K.IMMEDIATE8TO64, K.IMMEDIATE32TO64, K.IMMEDIATE32, K.IMMEDIATE16},
        PUSH=M.PUSH, POP=M.POP, SUB=M.SUB, ADD=M.ADD, LEA=M.LEA, MOV=M.MOV, AND=M.AND,
        LEAVE=M.LEAVE, ENTER=M.ENTER, PUSHF=M.PUSHFQ, POPF=M.POPFQ, HLT=M.HLT, UD2=M.UD2,
        INT3=M.INT3, NOP=M.NOP, CMP=M.CMP, TEST=M.TEST,
        no_write={M.PUSH, M.CMP, M.TEST, M.BT},
        pad={M.NOP, M.INT3})
    return _TABLES


@dataclass
class Decoded:
    """Abstract operations of a code range: parallel lists in address order."""

    ip: list[int]
    nxt: list[int]
    op: list[int]
    arg: list[int]
    pad: list[bool]
    branches: list[int]  # indices of direct calls and jumps


def decode_ops(data: bytes, base: int) -> Decoded:
    """One linear sweep: each instruction reduced to the operation that matters for unwinding
    (most are ``OP_NONE``: they neither move the stack pointer nor touch the frame pointer)."""
    t = _tables()
    ix = t["ix"]
    dec = ix.Decoder(64, data, ip=base)
    ins = ix.Instruction()
    ips: list[int] = []
    nxts: list[int] = []
    ops: list[int] = []
    args: list[int] = []
    pads: list[bool] = []
    branches: list[int] = []
    REG, RSP, RBP = t["REG"], t["RSP"], t["RBP"]
    fp_regs, sp_regs, saved, no_write = t["fp_regs"], t["sp_regs"], t["saved"], t["no_write"]
    IMM, MEM = t["IMM"], t["MEM"]
    PUSH, POP, SUB, ADD, LEA, MOV, AND = (t[k] for k in ("PUSH", "POP", "SUB", "ADD", "LEA",
                                                         "MOV", "AND"))
    LEAVE, ENTER, PUSHF, POPF, HLT, UD2, INT3 = (t[k] for k in ("LEAVE", "ENTER", "PUSHF",
                                                               "POPF", "HLT", "UD2", "INT3"))
    pad = t["pad"]
    frame_regs = sp_regs | fp_regs
    special = {PUSH, POP, PUSHF, POPF, LEAVE, ENTER, HLT, UD2, INT3}
    while dec.can_decode:
        dec.decode_out(ins)
        fc = ins.flow_control
        mn = ins.mnemonic
        op, arg = OP_NONE, 0
        if fc == 0:  # Next
            r0 = ins.op0_register  # Register.NONE (0) unless operand 0 is a register
            if r0 in frame_regs or mn in special:
                if mn == PUSH:
                    op, arg = OP_PUSH, saved.get(r0, -1)
                elif mn == POP:
                    op, arg = OP_POP, saved.get(r0, -1)
                    if r0 == RSP:
                        op = OP_SP_LOST
                elif mn == PUSHF:
                    op, arg = OP_SP_ADD, 8
                elif mn == POPF:
                    op, arg = OP_SP_ADD, -8
                elif mn == LEAVE:
                    op = OP_LEAVE
                elif mn == ENTER:
                    op, arg = OP_ENTER, ins.immediate(0)
                elif mn in (HLT, UD2, INT3):
                    op = OP_STOP
                elif r0 == RSP:
                    k1 = ins.op1_kind
                    if mn in (SUB, ADD) and k1 in IMM:
                        v = _signed(ins.immediate(1))
                        op, arg = OP_SP_ADD, (v if mn == SUB else -v)
                    elif mn == AND and k1 in IMM:
                        op = OP_AND_SP
                    elif mn == MOV and k1 == REG and ins.op1_register == RBP:
                        op = OP_SP_FROM_FP
                    elif mn == LEA and k1 == MEM and ins.memory_index == 0:
                        mb = ins.memory_base
                        d = _signed(ins.memory_displacement)
                        if mb == RSP:
                            op, arg = OP_SP_ADD, -d
                        elif mb == RBP:
                            op, arg = OP_SP_FROM_FP_D, d
                        else:
                            op = OP_SP_LOST
                    elif mn not in no_write:
                        op = OP_SP_LOST
                elif r0 in sp_regs:
                    if mn not in no_write:
                        op = OP_SP_LOST
                elif r0 == RBP and mn == MOV and ins.op1_kind == REG and \
                        ins.op1_register == RSP:
                    op = OP_FP_FROM_SP
                elif r0 in fp_regs and mn not in no_write:
                    op = OP_FP_LOST
        elif fc == 1:  # unconditional direct jump
            op, arg = OP_JMP, ins.near_branch_target
            branches.append(len(ips))
        elif fc == 2:  # indirect jump
            op = OP_IJMP
        elif fc == 3:
            op, arg = OP_JCC, ins.near_branch_target
            branches.append(len(ips))
        elif fc == 4:
            op = OP_RET
        elif fc == 5 or fc == 6:
            op = OP_CALL
            if fc == 5 and ins.op0_kind != MEM:
                arg = ins.near_branch_target
                branches.append(len(ips))
        elif fc == 9:  # exception (ud2 and the like)
            op = OP_STOP
        ips.append(ins.ip)
        nxts.append(ins.next_ip)
        ops.append(op)
        args.append(arg)
        pads.append(mn in pad or (mn == 0))  # 0: INVALID (padding bytes, data)
    return Decoded(ips, nxts, ops, args, pads, branches)


# An abstract state: (k, f, saves) with CFA = rsp + k (k None: unknown) and, when f is not
# None, CFA = rbp + f (the frame pointer is set up); saves: CFA-relative slots of rbx rbp
# r12-r15 (0: not saved).
State = tuple[int | None, int | None, tuple[int, ...]]
ENTRY: State = (8, None, (0,) * len(SAVED_NAMES))
#: rows of the procedure at the ELF entry point (no caller) and of signal trampolines
OUTERMOST = (2, DW_RSP, 8, *ENTRY[2], 8)
TRAMPOLINE = (3, DW_RSP, 0, *ENTRY[2], 0)


def _row(s: State) -> tuple[int, ...]:
    k, f, saves = s
    sp = k if k is not None else UNKNOWN_SP
    if f is not None:
        return (1, DW_RBP, f, *saves, sp)
    if k is not None:
        return (1, DW_RSP, k, *saves, sp)
    return (0, 0, 0, *saves, sp)


def _step(s: State, op: int, arg: int) -> State:
    """The state after one instruction."""
    k, f, saves = s
    if op == OP_SP_ADD:
        return (k + arg if k is not None else None, f, saves)
    if op == OP_PUSH:
        if k is None:
            return s
        k += 8
        if arg >= 0 and not saves[arg]:
            saves = (*saves[:arg], -k, *saves[arg + 1:])
        return (k, f, saves)
    if op == OP_POP:
        if arg >= 0 and k is not None and saves[arg] == -k:
            saves = (*saves[:arg], 0, *saves[arg + 1:])
        if arg == 1:  # pop rbp: the frame pointer is gone
            f = None
        return (k - 8 if k is not None else None, f, saves)
    if op == OP_FP_FROM_SP:
        return (k, k, saves)
    if op == OP_SP_FROM_FP:
        return (f if f is not None else None, f, saves)
    if op == OP_SP_FROM_FP_D:
        return (f - arg if f is not None else None, f, saves)
    if op == OP_LEAVE:
        if f is None:
            return (None, None, saves)
        k = f - 8
        if saves[1] == -f:
            saves = (*saves[:1], 0, *saves[2:])
        return (k, None, saves)
    if op == OP_ENTER:
        if k is None:
            return s
        k += 8
        if not saves[1]:
            saves = (*saves[:1], -k, *saves[2:])
        return (k + arg, k, saves)
    if op in (OP_AND_SP, OP_SP_LOST):
        return (None, f, saves)
    if op == OP_FP_LOST:
        return (k, None, saves)
    return s


def analyze_procedure(d: Decoded, i0: int, i1: int, entry: State = ENTRY,
                      xjumps: dict[int, State] | None = None) -> list[tuple[int, State]]:
    """States of the instructions ``d[i0:i1]`` (one procedure): (address, state) at every
    change. ``xjumps`` collects the states of jumps that leave the procedure."""
    ip, op, arg, pad = d.ip, d.op, d.arg, d.pad
    lo = ip[i0]
    hi = d.nxt[i1 - 1]
    known: dict[int, State] = {}
    out: list[tuple[int, State]] = []
    for _pass in range(4):
        changed = False
        guessed: list[int] = []
        out = []
        s = entry
        fall = True
        last_ijmp: State | None = None
        last_jcc: State | None = None
        prev: State | None = None
        guess = False  # the state is a guess until a fall-through or a known target
        after_call: list[tuple[int, State]] = []
        called = False
        for i in range(i0, i1):
            a = ip[i]
            if called:
                # a branch target right after a call whose fall-through state differs: the
                # callee does not return (``sub rsp, 8; call __chk_fail``), the branch wins
                got = known.get(a)
                if got is not None and got != s:
                    s = got
                elif got is None and not guess:
                    after_call.append((a, s))
                called = pad[i]  # padding after the call: the next instruction decides
            if not fall or guess:
                got = known.get(a)
                if got is not None:
                    s, guess = got, False
                elif not fall:
                    s, guess = last_ijmp or last_jcc or entry, True
                # else: still a guess, carried on by fall-through
                if guess:
                    guessed.append(a)
            if s is not prev:
                out.append((a, s))
                prev = s
            o = op[i]
            if o in (OP_NONE, OP_CALL):
                fall = True
                if o == OP_CALL:
                    called = True
                continue
            if o in (OP_JCC, OP_JMP):
                t = arg[i]
                if guess:
                    pass  # a guessed state is not passed on to the target
                elif lo <= t < hi:
                    if t not in known:
                        known[t] = s
                        changed = True
                elif xjumps is not None and t not in xjumps:
                    xjumps[t] = s
                if not guess:
                    last_jcc = s  # the body's state, for code only an indirect jump reaches
                fall = o == OP_JCC
                continue
            if o == OP_IJMP:
                last_ijmp = s if not guess else last_ijmp
                fall = False
                continue
            if o in (OP_RET, OP_STOP):
                fall = False
                continue
            s = _step(s, o, arg[i])
            fall = True
        if not changed or not (any(g in known for g in guessed)
                               or any(known.get(a, st) != st for a, st in after_call)):
            break
    return out


@dataclass
class Recipes:
    """Unwind recipes of one load module (link-time addresses)."""

    path: str
    build_id: str
    starts: npt.NDArray[np.uint64]   # sorted range starts
    rid: npt.NDArray[np.int32]       # row per range, -1: no recipe (outside every procedure)
    rows: npt.NDArray[np.int64]      # (m, NCOLS) distinct rows
    text_bytes: int
    procedures: int
    seconds: float                   # time the analysis took (not the cache read)

    def lookup(self, addrs: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Row index of each address, -1 where there is no recipe."""
        i = np.searchsorted(self.starts, np.asarray(addrs, dtype=np.uint64), side="right") - 1
        r = np.where(i >= 0, self.rid[np.maximum(i, 0)], -1).astype(np.int64)
        return np.where((r >= 0) & (self.rows[np.maximum(r, 0), KIND] >= 1), r, -1)

    # KIND values: 0 none, 1 a frame (CFA rule), 2 the outermost frame (the entry point),
    # 3 a signal trampoline (registers in the kernel's signal frame)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, starts=self.starts, rid=self.rid, rows=self.rows,
                     meta=np.array([VERSION, self.text_bytes, self.procedures], np.int64),
                     seconds=np.array([self.seconds]),
                     ident=np.array([self.path, self.build_id]))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Recipes | None:
        """A cached analysis, or None if it is unreadable or of another version."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = z["meta"]
                if int(meta[0]) != VERSION:
                    return None
                ident = [str(x) for x in z["ident"]]
                return cls(ident[0], ident[1], z["starts"], z["rid"], z["rows"],
                           int(meta[1]), int(meta[2]), float(z["seconds"][0]))
        except (OSError, ValueError, KeyError, IndexError, EOFError):
            return None


def _eh_frame_ranges(mod: ElfModule) -> list[tuple[int, int]]:
    """(start, size) of every FDE (:func:`_eh_frame_arrays`) as a list."""
    starts, sizes = _eh_frame_arrays(mod)
    return list(zip(starts.tolist(), sizes.tolist(), strict=True))


def _section(mod: ElfModule, name: str) -> tuple[int, bytes] | None:
    """(address, file bytes) of a section: through the headers read directly where they
    were (pyelftools parses every GNU hash table to find a section by name: 0.2 s in
    libtorch_cpu.so), else through pyelftools."""
    h = mod.headers
    if h is not None:
        c = h.section(name)
        data = mod.header_bytes(c) if c is not None else None
        return (c.addr, data) if c is not None and data is not None else None
    sec = mod.elf.get_section_by_name(name)
    return None if sec is None else (int(sec["sh_addr"]), bytes(sec.data()))


def _eh_frame_arrays(mod: ElfModule) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and size of every FDE, from the sorted table of ``.eh_frame_hdr`` (its usual
    encoding) and each FDE's own pc range (read where it is encoded as 4 bytes, pc-relative
    start then size, as ld and gcc write it: checked against the table's start; 0 where
    not)."""
    none = np.zeros(0, dtype=np.int64)
    hdr, eh = _section(mod, ".eh_frame_hdr"), _section(mod, ".eh_frame")
    if hdr is None or eh is None:
        return none, none
    base, data = hdr
    eh_addr, eh_data = eh
    if len(data) < 12 or data[0] != 1 or data[3] != 0x3B or data[2] != 0x03:
        return none, none
    count = int.from_bytes(data[8:12], "little")
    if len(data) < 12 + 8 * count:
        return none, none
    table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(-1, 2)
    starts = table[:, 0].astype(np.int64) + base
    fde_at = table[:, 1].astype(np.int64) + base - eh_addr
    ehd = np.frombuffer(eh_data, dtype=np.uint8)
    sizes = np.zeros(count, dtype=np.int64)
    ok = (fde_at >= 0) & (fde_at + 16 <= len(ehd))
    at = np.where(ok, fde_at, 0)

    def i32(off: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        b = ehd[off[:, None] + np.arange(4)].astype(np.int64)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
        signed: npt.NDArray[np.int64] = np.where(v >= 1 << 31, v - (1 << 32), v)
        return signed

    pc_begin = i32(at + 8) + at + 8 + eh_addr
    good = ok & (pc_begin == starts)
    sizes[good] = i32(at + 12)[good]
    return starts, sizes


def _symbols(mod: ElfModule) -> list[tuple[int, int]]:
    """(entry, size) of function symbols of the module and of its separate debug file."""
    out = [(c.entry, c.size) for c in function_symbols(mod.elf, mod.path)]
    dbg = find_debug_file(mod)
    if dbg:
        try:
            dm = open_elf(dbg, require_code=False)
        except Exception:  # an unreadable debug file only loses its symbols
            return out
        try:
            out += [(c.entry, c.size) for c in function_symbols(dm.elf, mod.path)]
        finally:
            dm.close()
    return out


def _bounds(d: Decoded, lo: int, hi: int, starts: set[int], sized: list[tuple[int, int]],
            jump_src: dict[int, list[int]]) -> list[int]:
    """Procedure entries in one section: the known ``starts`` plus, in code no sized symbol
    covers, the first instruction after a ret/jmp/hlt and its padding when no direct jump from
    the code between the previous entry and the next one reaches it."""
    entries = sorted(a for a in starts if lo <= a < hi)
    cover_lo = [a for a, _ in sized]
    cover_hi = [a + n for a, n in sized]

    def covered(a: int) -> bool:
        j = bisect.bisect_right(cover_lo, a) - 1
        return j >= 0 and a < cover_hi[j]

    extra: list[int] = []
    ip, op, pad = d.ip, d.op, d.pad
    n = len(ip)
    i = 0
    while i < n:
        if op[i] in _NO_FALL:
            j = i + 1
            while j < n and pad[j]:
                j += 1
            if j < n and ip[j] not in starts and not covered(ip[j]):
                a = ip[j]
                e = bisect.bisect_right(entries, a)
                prev_e = entries[e - 1] if e else lo
                next_e = entries[e] if e < len(entries) else hi
                if not any(prev_e <= s < next_e for s in jump_src.get(a, ())):
                    extra.append(a)
            i = j
        else:
            i += 1
    return sorted(set(entries) | set(extra))


@dataclass
class _Sweep:
    """What one linear decode of a module's code yields."""

    decoded: list[tuple[int, int, Decoded]]  # (section start, size, operations)
    call_targets: set[int]
    jump_src: dict[int, list[int]]           # direct jump target -> jump addresses
    sigreturns: list[int]
    text_bytes: int


def _sweep(mod: ElfModule) -> _Sweep:
    sw = _Sweep([], set(), {}, [], 0)
    for sec in mod.text_sections:
        if sec.name.startswith(".plt"):
            continue  # PLT stubs have rules of their own (measure.cfi)
        data = mod.elf.get_section_by_name(sec.name).data()
        d = decode_ops(data, sec.addr)
        sw.decoded.append((sec.addr, sec.size, d))
        sw.text_bytes += sec.size
        at = data.find(SIGRETURN)
        while at >= 0:
            sw.sigreturns.append(sec.addr + at)
            at = data.find(SIGRETURN, at + 1)
        for i in d.branches:
            o, a = d.op[i], d.arg[i]
            if o == OP_CALL:
                if a:
                    sw.call_targets.add(a)
            else:
                sw.jump_src.setdefault(a, []).append(d.ip[i])
    return sw


def compute(path: str | os.PathLike[str]) -> Recipes:
    """Analyse every executable section of the ELF file at ``path``."""
    t0 = time.perf_counter()
    mod = open_elf(path)
    try:
        syms = _symbols(mod)
        fdes = _eh_frame_ranges(mod)
        entry_point = int(mod.elf.header["e_entry"])
        sw = _sweep(mod)
    finally:
        mod.close()
    sized = sorted({(a, n) for a, n in syms + fdes if n > 0})
    starts = {a for a, _ in syms} | {a for a, _ in fdes} | sw.call_targets | {entry_point}
    starts |= {lo for lo, _n, _d in sw.decoded}
    procs: list[tuple[Decoded, int, int]] = []
    for lo, size, d in sw.decoded:
        entries = _bounds(d, lo, lo + size, starts, sized, sw.jump_src)
        idx = [bisect.bisect_left(d.ip, e) for e in entries] + [len(d.ip)]
        for e, i0, i1 in zip(entries, idx, idx[1:], strict=False):
            if i0 < i1 and d.ip[i0] == e:
                procs.append((d, i0, i1))
    xjumps: dict[int, State] = {}
    results = [analyze_procedure(d, i0, i1, ENTRY, xjumps) for d, i0, i1 in procs]
    # parts entered by a jmp in another frame's state (gcc's foo.cold): redo from there
    for n, (d, i0, i1) in enumerate(procs):
        e = d.ip[i0]
        st = xjumps.get(e)
        if st is not None and st != ENTRY and e not in sw.call_targets:
            results[n] = analyze_procedure(d, i0, i1, st)
    out_a: list[int] = []
    out_r: list[int] = []
    index: dict[tuple[int, ...], int] = {}
    for (d, i0, i1), res in zip(procs, results, strict=True):
        outermost = d.ip[i0] == entry_point  # _start: no caller to find
        for a, s in res:
            row = _row(s) if not outermost else OUTERMOST
            r = index.setdefault(row, len(index))
            if out_r and out_r[-1] == r and out_a[-1] < a:
                continue
            out_a.append(a)
            out_r.append(r)
        out_a.append(d.nxt[i1 - 1])  # the end of the procedure: no recipe up to the next
        out_r.append(-1)
    starts_a, rid = _sorted_ranges(out_a, out_r)
    if sw.sigreturns:
        starts_a, rid = _with_trampolines(starts_a, rid, sw.sigreturns,
                                          index.setdefault(TRAMPOLINE, len(index)))
    rows = (np.array(sorted(index, key=index.__getitem__), dtype=np.int64).reshape(-1, NCOLS)
            if index else np.zeros((0, NCOLS), dtype=np.int64))
    return Recipes(str(path), mod.build_id or "", starts_a, rid, rows, sw.text_bytes,
                   len(procs), time.perf_counter() - t0)


def _with_trampolines(starts: npt.NDArray[np.uint64], rid: npt.NDArray[np.int32],
                      sigreturns: list[int], sig: int
                      ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32]]:
    """Signal trampolines: from the byte before (the unwinder looks up return address - 1)
    to the end of the syscall, the registers are in the kernel's signal frame."""
    n = len(SIGRETURN)
    ext_a, ext_r = [], []
    inside = np.zeros(len(starts), dtype=bool)
    for a in sigreturns:
        j = int(np.searchsorted(starts, a + n, side="right")) - 1
        ext_a += [a - 1, a + n]
        ext_r += [sig, int(rid[j]) if j >= 0 else -1]
        inside |= (starts >= a - 1) & (starts < a + n)  # earlier range starts give way
    return _sorted_ranges(starts[~inside].tolist() + ext_a, rid[~inside].tolist() + ext_r)


def procedure_rows(code: bytes, lo: int, outermost: bool = False
                   ) -> list[tuple[int, tuple[int, ...]]]:
    """Recipes of one procedure whose bounds are known (an FDE's or a symbol's range) in a
    module that CFI otherwise describes: ``(start, row)`` per range, the row as in
    ``Recipes.rows``. Milliseconds, where the whole module would take seconds."""
    d = decode_ops(code, lo)
    if not d.ip:
        return []
    if outermost:
        return [(lo, OUTERMOST)]
    return [(a, _row(st)) for a, st in analyze_procedure(d, 0, len(d.ip))]


def cfi_coverage(path: str | os.PathLike[str]) -> float:
    """Share of a module's code (PLT stubs aside) that its ``.eh_frame`` FDEs cover: near 1
    for ordinary libraries, near 0 for a program built without CFI."""
    mod = open_elf(path)
    try:
        code = sum(s.size for s in mod.text_sections if not s.name.startswith(".plt"))
        covered = int(_eh_frame_arrays(mod)[1].sum())
    finally:
        mod.close()
    return covered / code if code else 0.0


#: ``mov rax, 15; syscall``: rt_sigreturn, the body of glibc's signal trampoline __restore_rt
SIGRETURN = bytes.fromhex("48c7c00f0000000f05")


def _sorted_ranges(starts: list[int], rids: list[int]
                   ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32]]:
    """Sorted ranges; of several starting at one address, the last one given wins (a
    procedure's start replaces the end marker of the one before it)."""
    a = np.array(starts, dtype=np.uint64)
    r = np.array(rids, dtype=np.int32)
    order = np.argsort(a, kind="stable")
    a, r = a[order], r[order]
    keep = np.ones(len(a), dtype=bool)
    if len(a) > 1:
        keep[:-1] = a[1:] != a[:-1]
    return a[keep], r[keep]
