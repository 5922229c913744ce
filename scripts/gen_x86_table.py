"""Generate ``src/callpath/structure/_x86_table.h``: what the C decoder
(``_callpath_decode.c``) needs to know of each legacy- or VEX-encoded x86-64 opcode, read off
iced-x86.

For each opcode of the one-byte, ``0F``, ``0F 38`` and ``0F 3A`` maps, each mandatory-prefix
class (none, ``66``, ``F3``, ``F2``), REX.W off/on, ModRM.reg value and form (register or
memory operand), iced-x86 decodes sample encodings (several ModRM.rm values, SIB and
displacement sizes, two immediate fillers) and the table keeps one byte: 0 where the samples
disagree in any way the C decoder could not follow (invalid in one form, a length that is not
prefixes + opcode + ModRM/SIB/displacement + immediate, a branch whose target is not next IP +
the immediate), else ``1 | modrm<<1 | kind<<2 | direct<<5`` and the immediate size in a second
table. Kinds are callpath's flow kinds (``cfg.py``), with ``HLT`` already made ``STOP``. VEX
opcodes get the same by map, VEX.pp, VEX.L and VEX.W, checked in the two- and three-byte forms
with and without register extension, bit 6 marking those iced-x86 takes only with VEX.vvvv
unused. An entry of 0 makes the C decoder hand the instruction to iced-x86, so the tables only
have to be right where they say something; ``tests/test_cfg_decode.py`` checks the C decoder
against iced-x86 on every instruction of real libraries.

    python scripts/gen_x86_table.py > src/callpath/structure/_x86_table.h
"""

from __future__ import annotations

import iced_x86

# callpath's kinds (structure/cfg.py)
NEXT, JUMP, COND, INDIRECT, RETURN, CALL, ICALL, STOP = range(8)
FLOW = {0: NEXT, 1: JUMP, 2: INDIRECT, 3: COND, 4: RETURN, 5: CALL, 6: ICALL, 7: NEXT,
        8: NEXT, 9: STOP}
NEAR = (iced_x86.OpKind.NEAR_BRANCH64, iced_x86.OpKind.NEAR_BRANCH32,
        iced_x86.OpKind.NEAR_BRANCH16)
IP = 0x1000_0000
CLS = (b"", b"\x66", b"\xf3", b"\xf2")
MAPS = (b"", b"\x0f", b"\x0f\x38", b"\x0f\x3a")
# ModRM samples: (bytes, size of ModRM + SIB + displacement, is register form)
REG_RM = [(0xC0 | rm, 1) for rm in range(8)]
MEM_RM = [(0x05, 5), (0x00, 1), (0x44, 3), (0x84, 6), (0x40, 2)]
SIB = {0x44: b"\x24\x10", 0x84: b"\x24\x00\x01\x00\x00"}
FILL = (b"\x11" * 16, b"\x7f\xfe" * 8)


def one(raw: bytes) -> tuple[int, int, int, int] | None:
    """(length, kind, has direct target, target) of the first instruction of ``raw``."""
    d = iced_x86.Decoder(64, raw, ip=IP)
    ins = d.decode()
    if ins.code == iced_x86.Code.INVALID or ins.len == 0:
        return None
    fc = ins.flow_control
    k = FLOW[fc]
    if k == NEXT and fc == 0 and ins.mnemonic == iced_x86.Mnemonic.HLT:
        k = STOP
    direct = 0
    tgt = 0
    if k in (JUMP, COND):
        if ins.op0_kind not in NEAR:
            return (ins.len, -1, 0, 0)
        direct, tgt = 1, ins.near_branch_target
    elif k == CALL and ins.op0_kind in NEAR:
        direct, tgt = 1, ins.near_branch_target
    elif k == CALL:
        return (ins.len, -1, 0, 0)  # a CALL the C side could not tell apart: leave to iced
    return (ins.len, k, direct, tgt)


def entry(cls: bytes, w: int, mp: bytes, op: int, reg: int, mem: int) -> tuple[int, int]:
    """(table byte, immediate size) of one opcode/prefix/REX.W/reg/form combination (0: leave
    the instruction to iced-x86)."""
    return entry_of([cls + (b"\x48" if w else b"") + mp + bytes([op])], reg, mem)


def entry_of(heads: list[bytes], reg: int, mem: int) -> tuple[int, int]:
    """The entry of instructions starting with any of ``heads`` (prefixes through opcode, all
    of one length), which must all decode alike."""
    got = {_entry(h, reg, mem) for h in heads}
    return got.pop() if len(got) == 1 else (0, 0)


def _entry(head: bytes, reg: int, mem: int) -> tuple[int, int]:
    n = len(head)
    a = one(head + bytes([0xC0 | reg << 3]) + FILL[0])
    b = one(head + bytes([0x05 | reg << 3]) + b"\0\0\0\0" + FILL[0])
    if a is None and b is None:
        return 0, 0
    if a is None or b is None or b[0] == a[0] + 4:
        has_modrm = True
    elif b[0] == a[0]:
        has_modrm = False
    else:
        return 0, 0
    samples = (MEM_RM if mem else REG_RM) if has_modrm else [(-1, 0)]
    kinds: set[tuple[int, int, int]] = set()
    for mb, extra in samples:
        if mb < 0:
            body = b""
        else:
            m = (mb & ~0x38) | (reg << 3)
            body = bytes([m]) + SIB.get(mb, b"\x00" * (extra - 1))
        for fill in FILL:
            r = one(head + body + fill)
            if r is None:
                return 0, 0
            ln, k, direct, tgt = r
            if k < 0:
                return 0, 0
            imm = ln - n - extra
            if imm < 0:
                return 0, 0
            if direct:
                raw = (head + body + fill)[ln - imm:ln]
                if tgt != ((IP + ln + int.from_bytes(raw, "little", signed=True))
                           & 0xFFFF_FFFF_FFFF_FFFF):
                    return 0, 0
            kinds.add((k, direct, imm))
    if len(kinds) != 1:
        return 0, 0
    (k, direct, imm), = kinds
    if imm > 8 or (direct and imm not in (1, 4)):
        return 0, 0
    return 1 | (int(has_modrm) << 1) | (k << 2) | (direct << 5), imm


def vex_heads(mp: int, pp: int, lbit: int, w: int, vvvv: int, op: int) -> list[bytes]:
    """Three-byte VEX encodings of one opcode, without and with REX-like register extension
    (VEX.R/X/B, stored inverted), plus the two-byte form where it exists (map 0F, W0)."""
    out = []
    for rxb in (0b111, 0b000):
        out.append(bytes([0xC4, rxb << 5 | mp, w << 7 | vvvv << 3 | lbit << 2 | pp, op]))
    if mp == 1 and w == 0:
        for r in (1, 0):
            out.append(bytes([0xC5, r << 7 | vvvv << 3 | lbit << 2 | pp, op]))
    return out


def vex_entry(mp: int, pp: int, lbit: int, w: int, op: int, reg: int, mem: int
              ) -> tuple[int, int]:
    """A VEX entry: bit 6 set where iced-x86 takes the instruction only with VEX.vvvv unused
    (1111); the two- and three-byte forms differ in length, so each is checked on its own."""
    def of(vvvv: int) -> tuple[int, int]:
        heads = vex_heads(mp, pp, lbit, w, vvvv, op)
        three = entry_of([h for h in heads if h[0] == 0xC4], reg, mem)
        two = [h for h in heads if h[0] == 0xC5]
        if two and entry_of(two, reg, mem) != three:
            return 0, 0
        return three
    free, used = of(0b1111), of(0b0110)
    if free == used:
        return free
    if free[0] and not used[0]:
        return free[0] | 0x40, free[1]
    return 0, 0


def main() -> None:
    # opcodes never left to the table: prefixes, REX, VEX/EVEX/XOP escapes, 3DNow!, moffs
    # (their size follows the address-size prefix), mov to/from control/debug registers
    skip1 = {0x0F, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3,
             0xC4, 0xC5, 0x62, 0x8F, 0xA0, 0xA1, 0xA2, 0xA3, *range(0x40, 0x50)}
    skip2 = {0x0F, 0x38, 0x3A, 0x20, 0x21, 0x22, 0x23}
    flags = []
    imms = []
    for mi, mp in enumerate(MAPS):
        for cls in CLS:
            for w in (0, 1):
                for op in range(256):
                    for reg in range(8):
                        for mem in (0, 1):
                            if (mi == 0 and op in skip1) or (mi == 1 and op in skip2):
                                f, imm = 0, 0
                            else:
                                f, imm = entry(cls, w, mp, op, reg, mem)
                            flags.append(f)
                            imms.append(imm)
    vflags = []
    vimms = []
    for mp in (1, 2, 3):
        for pp in range(4):
            for lbit in (0, 1):
                for w in (0, 1):
                    for op in range(256):
                        for reg in range(8):
                            for mem in (0, 1):
                                f, imm = vex_entry(mp, pp, lbit, w, op, reg, mem)
                                vflags.append(f)
                                vimms.append(imm)
    print("/* Generated by scripts/gen_x86_table.py from iced-x86 "
          f"{getattr(iced_x86, '__version__', '')}: do not edit. */")
    print("/* Each table is run-length encoded: (value, repeat) byte pairs, repeats up to 255;")
    print(" * _callpath_decode.c expands them once. */")
    emit("x86_flags", flags, "((((map * 4 + cls) * 2 + rexw) * 256 + opcode) * 8 + modrm.reg)"
         " * 2 + memory form")
    emit("x86_imm", imms, "immediate bytes, same index")
    emit("vex_flags", vflags, "((((((map - 1) * 4 + pp) * 2 + L) * 2 + W) * 256 + opcode) * 8"
         " + modrm.reg) * 2 + memory form; bit 6: only with VEX.vvvv = 1111")
    emit("vex_imm", vimms, "immediate bytes, same index")


def emit(name: str, values: list[int], what: str) -> None:
    """One table as C: its size and its run-length encoding."""
    runs: list[int] = []
    for v in values:
        if runs and runs[-2] == v and runs[-1] < 255:
            runs[-1] += 1
        else:
            runs += [v, 1]
    print(f"/* {name}: {what} */")
    print(f"#define {name.upper()}_N {len(values)}")
    print(f"static const unsigned char {name}_rle[{len(runs)}] = {{")
    for i in range(0, len(runs), 32):
        print(",".join(str(x) for x in runs[i:i + 32]) + ",")
    print("};")

if __name__ == "__main__":
    main()
