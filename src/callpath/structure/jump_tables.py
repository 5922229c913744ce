"""Recognising the jump tables gcc emits for ``switch`` on x86-64.

Two shapes cover gcc's output: position-independent tables of 32-bit offsets relative to the
table (``lea rT,[rip+T]; movsxd rX,[rT+rI*4]; add rX,rT; jmp rX``) and absolute tables of
64-bit addresses (``jmp [T+rI*8]``, non-PIC). The number of entries comes from the bounds
check (``cmp rI,N; ja default``) or the mask (``and rI,2^k-1``, a switch on ``x & 15`` whose
every value is a case) just before; without either, entries are read while they land inside
the procedure. An unresolved indirect jump simply has no successors, which can hide a loop but
never invents one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callpath.structure.elf import SectionBytes

MAX_ENTRIES = 4096


def resolve_tables(data: SectionBytes, base: int, lo: int, hi: int, ips: list[int],
                   kinds: list[int], read: Callable[[int, int], bytes | None],
                   indirect_kind: int) -> dict[int, list[int]]:
    """Targets of each indirect jump of ``[lo, hi)`` whose table is recognised."""
    import iced_x86

    out: dict[int, list[int]] = {}
    for i, k in enumerate(kinds):
        if k != indirect_kind:
            continue
        start = ips[max(0, i - 12)]
        dec = iced_x86.Decoder(64, data[start - base:ips[i] + 16 - base], ip=start)
        window = []
        for ins in dec:
            window.append(ins)
            if ins.ip == ips[i]:
                break
        if not window or window[-1].ip != ips[i]:
            continue
        targets = _match(window, lo, hi, read)
        if targets:
            out[i] = targets
    return out


def _bound(window: list[Any]) -> int | None:
    import iced_x86

    imm = (iced_x86.OpKind.IMMEDIATE8TO32, iced_x86.OpKind.IMMEDIATE8TO64,
           iced_x86.OpKind.IMMEDIATE32, iced_x86.OpKind.IMMEDIATE32TO64,
           iced_x86.OpKind.IMMEDIATE8)
    for ins in reversed(window[:-1]):
        if ins.op1_kind not in imm:
            continue
        v = int(ins.immediate(1))
        if ins.mnemonic == iced_x86.Mnemonic.CMP and 0 <= v < MAX_ENTRIES:
            return v + 1
        # ``switch (x & 15)`` with every value a case: the mask is the only bound.
        if ins.mnemonic == iced_x86.Mnemonic.AND and 0 <= v < MAX_ENTRIES and v & (v + 1) == 0:
            return v + 1
    return None


def _match(window: list[Any], lo: int, hi: int,
           read: Callable[[int, int], bytes | None]) -> list[int]:
    import iced_x86

    jmp = window[-1]
    bound = _bound(window)
    n = bound if bound is not None else MAX_ENTRIES
    if jmp.op0_kind == iced_x86.OpKind.MEMORY:
        # jmp [T + rI*8]: absolute 64-bit entries.
        if jmp.memory_index_scale != 8 or jmp.memory_base != iced_x86.Register.NONE:
            return []
        table: int | None = int(jmp.memory_displacement)
        assert table is not None
        raw = read(table, 8 * n)
        if raw is None:
            return []
        out = []
        for j in range(len(raw) // 8):
            t = int.from_bytes(raw[8 * j:8 * j + 8], "little")
            if not lo <= t < hi:
                if bound is None:
                    break
                return []
            out.append(t)
        return out
    # jmp rX: look for the lea of a rip-relative table feeding it.
    table = None
    for ins in reversed(window[:-1]):
        if ins.mnemonic == iced_x86.Mnemonic.LEA and ins.is_ip_rel_memory_operand:
            table = int(ins.ip_rel_memory_address)
            break
    if table is None:
        return []
    raw = read(table, 4 * n)
    if raw is None:
        return []
    out4: list[int] = []
    for j in range(len(raw) // 4):
        off = int.from_bytes(raw[4 * j:4 * j + 4], "little", signed=True)
        t = table + off
        if not lo <= t < hi:
            if bound is None:
                break
            return []
        out4.append(t)
    return out4
