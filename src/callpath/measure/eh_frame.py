"""One FDE of ``.eh_frame`` read and its row program run, without pyelftools.

The unwinder compiles the CFI of each function its stacks pass through. pyelftools parses an
entry through ``construct`` (about 0.2 ms per FDE, and its CIE again with it) and builds a
row object per instruction: on a warm post-mortem of a PyTorch loop, the 560 functions no
earlier run unwound cost 0.3 s that way, a fifth of the merge. Here an FDE is a few
``int.from_bytes`` and a loop over its instruction bytes.

The rows mean what pyelftools' decoded table means (DWARF 5 §6.4: a row per location, the
CIE's last row the FDE's first, ``remember_state``/``restore_state`` keeping the location);
``tests/test_eh_frame.py`` checks them against pyelftools on every FDE of several libraries.
``DW_CFA_def_cfa_sf`` scales its offset by the data alignment factor, as DWARF says
(pyelftools uses the code alignment factor; gcc and clang never emit it for x86-64).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from callpath.errors import CallpathError
from callpath.structure.dwarf_info import sleb, uleb

#: register rule kinds, by pyelftools' names (``RegisterRule``)
OFFSET, VAL_OFFSET, REGISTER, EXPRESSION, VAL_EXPRESSION = (
    "OFFSET", "VAL_OFFSET", "REGISTER", "EXPRESSION", "VAL_EXPRESSION")
UNDEFINED, SAME_VALUE = "UNDEFINED", "SAME_VALUE"

#: a register's rule: (kind, offset or register or expression bytes)
Rule = tuple[str, Any]


@dataclass
class Line:
    """One row: from ``pc`` on, CFA = ``cfa_reg`` + ``cfa_off`` (or the DWARF expression
    ``cfa_expr``), and each register in ``rules`` recovered by its rule (absent: unchanged)."""

    pc: int
    cfa_reg: int | None = None
    cfa_off: int = 0
    cfa_expr: bytes | None = None
    rules: dict[int, Rule] = field(default_factory=dict)

    def copy(self) -> Line:
        return Line(self.pc, self.cfa_reg, self.cfa_off, self.cfa_expr, dict(self.rules))


class CfiError(CallpathError):
    """Malformed or unsupported call-frame information in one entry."""


@dataclass
class Cie:
    code_align: int
    data_align: int
    ra_reg: int
    fde_encoding: int
    signal: bool
    #: whether its FDEs carry augmentation data (the ``z`` augmentation), skipped by size
    sized_augmentation: bool
    initial: bytes
    #: its initial instructions' rows (the last is every FDE's first), run once
    lines: list[Line] | None = None


@dataclass
class Fde:
    """An FDE's code range ``[lo, hi)``, whether its CIE marks a signal frame (``S``), and
    its rows, decoded on first use (:meth:`lines` raises :class:`CfiError` where the
    instructions are malformed)."""

    lo: int
    hi: int
    signal: bool
    cie: Cie | None = None
    code: bytes = b""
    #: a pyelftools FDE this one stands for (``.debug_frame``, ``.eh_frame`` without index)
    source: Any = None
    _lines: list[Line] | None = None

    def lines(self) -> list[Line]:
        if self._lines is None:
            if self.source is not None:
                self._lines = _pyelftools_lines(self.source)
            else:
                assert self.cie is not None
                try:
                    self._lines = _run(self.code, self.cie, self.lo)
                except IndexError:
                    raise CfiError("an instruction runs past its FDE") from None
        return self._lines


def _pointer(b: bytes, i: int, enc: int, here: int) -> tuple[int, int]:
    """A pointer encoded with ``DW_EH_PE_*`` ``enc`` at offset ``i`` of ``b``, whose address
    is ``here`` (for ``pcrel``); the value and the offset after it."""
    fmt, app = enc & 0x0F, enc & 0x70
    if enc == 0xFF:  # DW_EH_PE_omit
        return 0, i
    if fmt == 0x00:
        n, signed = 8, False
    elif fmt == 0x01:
        v, j = uleb(b, i)
        return v + (here if app == 0x10 else 0), j
    elif fmt == 0x09:
        v, j = sleb(b, i)
        return v + (here if app == 0x10 else 0), j
    else:
        size = {0x02: 2, 0x03: 4, 0x04: 8, 0x0A: 2, 0x0B: 4, 0x0C: 8}.get(fmt)
        if size is None:
            raise CfiError(f"pointer encoding {enc:#x} is not supported")
        n, signed = size, fmt >= 0x08
    if i + n > len(b):
        raise CfiError("a pointer runs past its entry")
    v = int.from_bytes(b[i:i + n], "little", signed=signed)
    if app == 0x10:  # DW_EH_PE_pcrel
        v += here
    elif app not in (0x00,):
        raise CfiError(f"pointer application {app:#x} is not supported")
    return v & 0xFFFFFFFFFFFFFFFF, i + n


def _cie_at(eh: bytes, off: int) -> Cie:
    length = int.from_bytes(eh[off:off + 4], "little")
    if length == 0xFFFFFFFF or length < 4 or off + 4 + length > len(eh):
        raise CfiError(f"CIE at {off:#x}: unsupported or cut length")
    end = off + 4 + length
    i = off + 8  # length, CIE id 0
    version = eh[i]
    i += 1
    z = eh.index(b"\0", i, end)
    aug = eh[i:z].decode("ascii", "replace")
    i = z + 1
    code_align, i = uleb(eh, i)
    data_align, i = sleb(eh, i)
    if version == 1:
        ra, i = eh[i], i + 1
    else:
        ra, i = uleb(eh, i)
    enc = 0x00
    if aug.startswith("z"):
        n, i = uleb(eh, i)
        j, stop = i, i + n
        for c in aug[1:]:
            if c == "R":
                enc, j = eh[j], j + 1
            elif c == "P":
                penc = eh[j]
                _v, j = _pointer(eh, j + 1, penc & 0x7F, 0)
            elif c == "L":
                j += 1
            elif c not in "SB":
                break  # an augmentation we do not know: its data is skipped by size
        i = stop
    elif aug:
        raise CfiError(f"CIE at {off:#x}: augmentation {aug!r} without 'z'")
    return Cie(code_align, data_align, ra, enc, "S" in aug, aug.startswith("z"),
               bytes(eh[i:end]))


def parse_fde(eh: bytes, eh_addr: int, off: int, cies: dict[int, Cie]) -> Fde:
    """The FDE at offset ``off`` of ``.eh_frame`` (``eh``, loaded at ``eh_addr``); its CIE is
    read once into ``cies`` (by offset). Raises :class:`CfiError` where it is malformed."""
    try:
        return _parse_fde(eh, eh_addr, off, cies)
    except (IndexError, ValueError) as e:  # a number or a string cut by the entry's end
        raise CfiError(f"FDE at {off:#x}: cut short ({e})") from None


def _parse_fde(eh: bytes, eh_addr: int, off: int, cies: dict[int, Cie]) -> Fde:
    if off < 0 or off + 8 > len(eh):
        raise CfiError(f"FDE offset {off:#x} is outside .eh_frame")
    length = int.from_bytes(eh[off:off + 4], "little")
    if length == 0xFFFFFFFF or length < 8 or off + 4 + length > len(eh):
        raise CfiError(f"FDE at {off:#x}: unsupported or cut length")
    end = off + 4 + length
    ptr = int.from_bytes(eh[off + 4:off + 8], "little")
    if ptr == 0:
        raise CfiError(f"entry at {off:#x} is a CIE")
    cie_off = off + 4 - ptr
    cie = cies.get(cie_off)
    if cie is None:
        cie = cies[cie_off] = _cie_at(eh, cie_off)
    i = off + 8
    lo, i = _pointer(eh, i, cie.fde_encoding, eh_addr + i)
    size, i = _pointer(eh, i, cie.fde_encoding & 0x0F, 0)
    if cie.sized_augmentation:  # the LSDA pointer: not needed to unwind
        n, i = uleb(eh, i)
        i += n
    if i > end:
        raise CfiError(f"FDE at {off:#x}: its header runs past its end")
    return Fde(lo, lo + size, cie.signal, cie, bytes(eh[i:end]))


def from_pyelftools(fde: Any) -> Fde:
    """An FDE that pyelftools parsed (``.debug_frame`` of a separate debug file, or an
    ``.eh_frame`` without its index); its rows are pyelftools' decoded table."""
    lo = int(fde.header["initial_location"])
    aug = fde.cie.header.get("augmentation", b"")
    signal = b"S" in aug if isinstance(aug, bytes) else "S" in str(aug)
    return Fde(lo, lo + int(fde.header["address_range"]), signal, source=fde)


def _pyelftools_lines(fde: Any) -> list[Line]:
    try:
        # DW_CFA_GNU_args_size (0x2e) only matters to landing pads; pyelftools' row decoder
        # rejects it
        fde.instructions = [i for i in fde.instructions if int(i.opcode) != 0x2E]
        table = fde.get_decoded().table
    except Exception as e:  # pyelftools raises many kinds on odd CFI
        raise CfiError(f"CFI rows not decoded: {e}") from None
    lines = []
    for r in table:
        cfa = r["cfa"]
        rules = {int(k): (str(v.type), bytes(v.arg) if isinstance(v.arg, list) else v.arg)
                 for k, v in r.items() if isinstance(k, int)}
        lines.append(Line(int(r["pc"]), None if cfa.reg is None else int(cfa.reg),
                          int(cfa.offset or 0),
                          None if cfa.expr is None else bytes(cfa.expr), rules))
    return lines


def _run(code: bytes, cie: Cie, pc: int) -> list[Line]:
    """The rows of an FDE: the CIE's initial instructions, then the FDE's own."""
    if cie.lines is None:
        cie.lines = _program(cie.initial, cie, Line(0), None)
    if cie.lines:
        start = cie.lines[-1].copy()
        start.pc = pc
        initial: Line | None = cie.lines[-1]
    else:
        start, initial = Line(pc), None
    return _program(code, cie, start, initial)


def _program(code: bytes, cie: Cie, cur: Line, initial: Line | None) -> list[Line]:
    """Run one row program from ``cur``; ``initial`` is the CIE's last row (None while
    running the CIE's own instructions, where ``restore`` is not allowed)."""
    table: list[Line] = []
    stack: list[Line] = []
    i, n = 0, len(code)
    da, ca = cie.data_align, cie.code_align
    while i < n:
        op = code[i]
        i += 1
        hi2 = op & 0xC0
        if hi2 == 0x40:  # DW_CFA_advance_loc
            table.append(cur.copy())
            cur.pc += (op & 0x3F) * ca
            continue
        if hi2 == 0x80:  # DW_CFA_offset
            off, i = uleb(code, i)
            cur.rules[op & 0x3F] = (OFFSET, off * da)
            continue
        if hi2 == 0xC0:  # DW_CFA_restore
            _restore(cur, op & 0x3F, initial)
            continue
        if op == 0x00:  # nop
            continue
        if op in (0x02, 0x03, 0x04):  # advance_loc1/2/4
            w = 1 << (op - 2)
            if i + w > n:
                raise CfiError("an advance runs past its FDE")
            table.append(cur.copy())
            cur.pc += int.from_bytes(code[i:i + w], "little") * ca
            i += w
        elif op == 0x01:  # set_loc
            table.append(cur.copy())
            cur.pc, i = _pointer(code, i, cie.fde_encoding & 0x0F, 0)
        elif op in (0x05, 0x11, 0x14, 0x15):  # offset_extended(_sf), val_offset(_sf)
            reg, i = uleb(code, i)
            if op in (0x05, 0x14):
                v, i = uleb(code, i)
            else:
                v, i = sleb(code, i)
            cur.rules[reg] = (OFFSET if op in (0x05, 0x11) else VAL_OFFSET, v * da)
        elif op == 0x2F:  # GNU_negative_offset_extended
            reg, i = uleb(code, i)
            v, i = uleb(code, i)
            cur.rules[reg] = (OFFSET, -v * da)
        elif op == 0x06:  # restore_extended
            reg, i = uleb(code, i)
            _restore(cur, reg, initial)
        elif op in (0x07, 0x08):  # undefined, same_value
            reg, i = uleb(code, i)
            cur.rules[reg] = (UNDEFINED if op == 0x07 else SAME_VALUE, None)
        elif op == 0x09:  # register
            reg, i = uleb(code, i)
            other, i = uleb(code, i)
            cur.rules[reg] = (REGISTER, other)
        elif op == 0x0A:  # remember_state
            stack.append(cur.copy())
        elif op == 0x0B:  # restore_state: the remembered rules, at the current location
            if not stack:
                raise CfiError("restore_state without remember_state")
            pc = cur.pc
            cur = stack.pop()
            cur.pc = pc
        elif op == 0x0C:  # def_cfa
            reg, i = uleb(code, i)
            off, i = uleb(code, i)
            cur.cfa_reg, cur.cfa_off, cur.cfa_expr = reg, off, None
        elif op == 0x12:  # def_cfa_sf
            reg, i = uleb(code, i)
            off, i = sleb(code, i)
            cur.cfa_reg, cur.cfa_off, cur.cfa_expr = reg, off * da, None
        elif op == 0x0D:  # def_cfa_register
            reg, i = uleb(code, i)
            cur.cfa_reg, cur.cfa_expr = reg, None
        elif op == 0x0E:  # def_cfa_offset
            cur.cfa_off, i = uleb(code, i)
            cur.cfa_expr = None
        elif op == 0x13:  # def_cfa_offset_sf
            off, i = sleb(code, i)
            cur.cfa_off, cur.cfa_expr = off * da, None
        elif op == 0x0F:  # def_cfa_expression
            k, i = uleb(code, i)
            cur.cfa_reg, cur.cfa_off, cur.cfa_expr = None, 0, bytes(code[i:i + k])
            i += k
        elif op in (0x10, 0x16):  # expression, val_expression
            reg, i = uleb(code, i)
            k, i = uleb(code, i)
            cur.rules[reg] = (EXPRESSION if op == 0x10 else VAL_EXPRESSION,
                              bytes(code[i:i + k]))
            i += k
        elif op == 0x2E:  # GNU_args_size: only landing pads need it
            _v, i = uleb(code, i)
        else:
            raise CfiError(f"unknown CFI opcode {op:#04x}")
        if i > n:
            raise CfiError("an instruction runs past its entry")
    if cur.cfa_reg is not None or cur.rules:  # (pyelftools' condition, kept)
        table.append(cur)
    return table


def _restore(cur: Line, reg: int, initial: Line | None) -> None:
    if initial is None:
        raise CfiError("restore outside an FDE")
    if reg in initial.rules:
        cur.rules[reg] = initial.rules[reg]
    else:
        cur.rules.pop(reg, None)
