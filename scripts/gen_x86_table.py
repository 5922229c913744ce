"""Generate ``src/callpath/structure/_x86_table.h``: what the C decoder
(``_callpath_decode.c``) needs to know of each legacy-encoded x86-64 opcode, read off iced-x86.

For each opcode of the one-byte, ``0F``, ``0F 38`` and ``0F 3A`` maps, each mandatory-prefix
class (none, ``66``, ``F3``, ``F2``), REX.W off/on ModRM.reg value and form (register or memory operand), iced-x86 decodes sample
encodings (register and memory forms, several ModRM.rm values, two immediate fillers) and the
table keeps one byte: 0 where the samples disagree in any way the C decoder could not follow
(invalid in one form, a length that is not prefixes + opcode + ModRM/SIB/displacement +
immediate, a branch whose target is not next IP + the immediate), else the entry encoded as
``1 | modrm<<1 | kind<<2`` plus the immediate size in a second table. Kinds are callpath's
flow kinds (``cfg.py``), with ``HLT`` already made ``STOP`` and a direct-target flag.
An entry of 0 makes the C decoder hand the instruction to iced-x86, so the table only has to be
right where it says something; ``tests/test_cfg_decode.py`` checks the C decoder against
iced-x86 on every instruction of real libraries.

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
    head = cls + (b"\x48" if w else b"") + mp + bytes([op])
    n = len(head)
    a = one(head + bytes([0xC0 | reg << 3]) + FILL[0])
    b = one(head + bytes([0x05 | reg << 3]) + b"\0\0\0\0" + FILL[0])
    if a is None and b is None:
        return 0, 0
    if a is None or b is None:
        has_modrm = True
    elif b[0] == a[0] + 4:
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


def main() -> None:
    # opcodes never left to the table: prefixes, REX, VEX/EVEX/XOP escapes, 3DNow!, moffs
    # (their size follows the address-size prefix), mov to/from control/debug registers
    skip1 = {0x0F, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3,
             0xC4, 0xC5, 0x62, 0x8F, 0xA0, 0xA1, 0xA2, 0xA3, *range(0x40, 0x50)}
    skip2 = {0x0F, 0x38, 0x3A, 0x20, 0x21, 0x22, 0x23}
    flags = []
    imms = []
    for mi, mp in enumerate(MAPS):
        for ci, cls in enumerate(CLS):
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
    print("/* Generated by scripts/gen_x86_table.py from iced-x86 "
          f"{getattr(iced_x86, '__version__', '')}: do not edit. */")
    print("/* index: (((((map * 4 + cls) * 2 + rexw) * 256 + opcode) * 8 + modrm.reg) * 2 + memory form) */")
    print(f"static const unsigned char x86_flags[{len(flags)}] = {{")
    for i in range(0, len(flags), 32):
        print(",".join(str(x) for x in flags[i:i + 32]) + ",")
    print("};")
    print(f"static const unsigned char x86_imm[{len(imms)}] = {{")
    for i in range(0, len(imms), 32):
        print(",".join(str(x) for x in imms[i:i + 32]) + ",")
    print("};")


if __name__ == "__main__":
    main()
