"""Instruction decoding (iced-x86), basic blocks and the control flow graph of one procedure.

Decoding keeps four numbers per instruction (address, end, flow kind, direct target) in flat
lists; blocks start at the entry, at branch targets inside the procedure and after every
control transfer. Calls fall through unless the callee is known not to return; indirect jumps
get their successors from a jump table when :mod:`~callpath.structure.jump_tables` recognises
one, else they end the procedure's flow there.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from callpath.structure.elf import SectionBytes

# Flow kinds (a compact recoding of iced-x86's FlowControl).
NEXT, JUMP, COND, INDIRECT, RETURN, CALL, ICALL, STOP = range(8)
_FLOW = {0: NEXT, 1: JUMP, 2: INDIRECT, 3: COND, 4: RETURN, 5: CALL, 6: ICALL, 7: NEXT,
         8: NEXT, 9: STOP}


@dataclass
class Code:
    """Decoded instructions of one procedure, in address order."""

    ip: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)  # direct branch/call target, 0 if none
    #: Rows whose kind is not NEXT, in order: the CFG and the call scopes look only at these
    #: (about one instruction in seven).
    flow: list[int] = field(default_factory=list)
    #: For indirect jumps: index of the instruction -> resolved jump-table targets.
    tables: dict[int, list[int]] = field(default_factory=dict)


_c_decode: ModuleType | None
try:  # the C decoder (optional, like the sampler's C stack walk): iced-x86 rows, faster
    from callpath.structure import _callpath_decode as _c_decode
except ImportError:  # pragma: no cover - a build without a compiler
    _c_decode = None


def decode(data: SectionBytes, base: int, lo: int, hi: int, *, use_c: bool = True) -> Code:
    """Decode ``[lo, hi)`` of a section whose bytes ``data`` start at address ``base``.

    With the C extension (``_callpath_decode.c``) built, it decodes the instructions its table
    vouches for and iced-x86 each of the others (VEX/EVEX, LOCK, ...), one at a time, so the
    rows are always iced-x86's; ``use_c=False`` (or no extension) decodes all with iced-x86.
    """
    if hi <= lo:
        return Code()
    raw = data[lo - base:hi - base]
    if not use_c or _c_decode is None:
        return _decode_iced(raw, lo)
    import iced_x86

    code = Code()
    ips, ends, kinds, targets, flows = code.ip, code.end, code.kind, code.target, code.flow
    c_decode = _c_decode.decode
    n = len(raw)
    off = c_decode(raw, 0, lo, ips, ends, kinds, targets, flows)
    if off < n:
        dec = iced_x86.Decoder(64, raw, ip=lo)
        ins = iced_x86.Instruction()
        while off < n:
            dec.position = off
            dec.ip = lo + off
            dec.decode_out(ins)
            if _row(ins, ips, ends, kinds, targets):
                flows.append(len(ips) - 1)
            off = c_decode(raw, off + ins.len, lo, ips, ends, kinds, targets, flows)
    return code


def _row(ins: object, ips: list[int], ends: list[int], kinds: list[int],
         targets: list[int]) -> int:
    """Append iced-x86's instruction ``ins`` as a row; its kind."""
    import iced_x86

    fc = ins.flow_control  # type: ignore[attr-defined]
    k = _FLOW[fc]
    ips.append(ins.ip)  # type: ignore[attr-defined]
    ends.append(ins.next_ip)  # type: ignore[attr-defined]
    if k == NEXT:
        if fc == 0 and ins.mnemonic == iced_x86.Mnemonic.HLT:  # type: ignore[attr-defined]
            k = STOP
        targets.append(0)
    elif k in (JUMP, COND) or (k == CALL and ins.op0_kind in (  # type: ignore[attr-defined]
            iced_x86.OpKind.NEAR_BRANCH64, iced_x86.OpKind.NEAR_BRANCH32)):
        targets.append(ins.near_branch_target)  # type: ignore[attr-defined]
    else:
        targets.append(0)
    kinds.append(k)
    return k


def _decode_iced(raw: bytes, lo: int) -> Code:
    """Every instruction of ``raw`` (first byte at ``lo``) decoded by iced-x86."""
    import iced_x86

    code = Code()
    dec = iced_x86.Decoder(64, raw, ip=lo)
    ins = iced_x86.Instruction()
    ips, ends, kinds, targets, flows = code.ip, code.end, code.kind, code.target, code.flow
    flow = _FLOW
    hlt = iced_x86.Mnemonic.HLT
    while dec.can_decode:
        dec.decode_out(ins)
        fc = ins.flow_control
        k = flow[fc]
        ips.append(ins.ip)
        ends.append(ins.next_ip)
        if k == NEXT:
            if fc == 0 and ins.mnemonic == hlt:
                k = STOP
            targets.append(0)
        elif k in (JUMP, COND) or (k == CALL and ins.op0_kind in (
                iced_x86.OpKind.NEAR_BRANCH64, iced_x86.OpKind.NEAR_BRANCH32)):
            targets.append(ins.near_branch_target)
        else:
            targets.append(0)
        if k != NEXT:
            flows.append(len(kinds))
        kinds.append(k)
    return code


@dataclass
class Graph:
    """Basic blocks (``start``/``end`` addresses, first/last instruction) and successors."""

    start: list[int]
    end: list[int]
    first: list[int]
    last: list[int]
    succ: list[list[int]]


def build_cfg(code: Code, lo: int, hi: int,
              no_return: Callable[[int], bool] | None = None, *,
              memo: dict[int, bool] | None = None, use_c: bool = True) -> Graph:
    """Basic blocks and edges of the procedure ``[lo, hi)`` from its decoded ``code``.

    ``no_return(target)`` says whether a call to ``target`` never returns; ``memo``, if given,
    holds answers it already gave (looked up first). With the C extension built, its ``cfg``
    does the work (the same steps; ``use_c=False`` runs the Python below).
    """
    if use_c and _c_decode is not None:
        return Graph(*_c_decode.cfg(code.ip, code.end, code.kind, code.target, code.flow,
                                    code.tables, lo, hi, no_return, memo))
    ips, kinds, targets, ends = code.ip, code.kind, code.target, code.end
    n = len(ips)
    if n == 0:
        return Graph([], [], [], [], [])
    leaders = {ips[0]}
    stops: set[int] = set()
    for i in code.flow:
        k = kinds[i]
        if k in (JUMP, COND):
            t = targets[i]
            if lo <= t < hi:
                leaders.add(t)
        elif k == INDIRECT:
            for t in code.tables.get(i, ()):
                leaders.add(t)
        elif k == CALL:
            t = targets[i]
            if no_return is not None and t and no_return(t):
                stops.add(i)
            else:
                continue
        elif k == ICALL:
            continue
        if i + 1 < n:
            leaders.add(ips[i + 1])
    # Keep only leaders that are instruction boundaries (a target into the middle of an
    # instruction, from overlapping code or data, is ignored).
    starts: list[int] = []
    first: list[int] = []
    for a in sorted(leaders):
        j = bisect.bisect_left(ips, a)
        if j < n and ips[j] == a:
            starts.append(a)
            first.append(j)
    nb = len(starts)
    last = [(first[b + 1] if b + 1 < nb else n) - 1 for b in range(nb)]
    block_at = dict(zip(starts, range(nb), strict=True))
    succ: list[list[int]] = []
    for b in range(nb):
        i = last[b]
        k = kinds[i]
        s: list[int] = []
        fall = b + 1 if b + 1 < nb and ends[i] == starts[b + 1] else -1
        if k in (NEXT, CALL, ICALL):
            if i not in stops and fall >= 0:
                s.append(fall)
        elif k == COND:
            if fall >= 0:
                s.append(fall)
            tb = block_at.get(targets[i])
            if tb is not None and tb not in s:
                s.append(tb)
        elif k == JUMP:
            tb = block_at.get(targets[i])
            if tb is not None:
                s.append(tb)
        elif k == INDIRECT:
            for a in code.tables.get(i, ()):
                tb = block_at.get(a)
                if tb is not None and tb not in s:
                    s.append(tb)
        succ.append(s)
    return Graph(starts, [ends[x] for x in last], first, last, succ)
