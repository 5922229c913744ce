"""The unwinder's building blocks against independent oracles on real binaries of this machine:
compiled CFI rows against ``readelf --debug-dump=frames-interp``, the ``.eh_frame_hdr`` lookup
against a full parse of ``.eh_frame``, symbols against ``nm``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from callpath.measure import cfi
from callpath.measure.elfinfo import ElfInfo

ROOT = Path(__file__).resolve().parents[1]
REG_NAMES = {"rbx": cfi.RBX, "rbp": cfi.RBP, "r12": cfi.R12, "r13": cfi.R13, "r14": cfi.R14,
             "r15": cfi.R15, "ra": cfi.RA}
DWARF_REG = {name: i for i, name in enumerate(
    ["rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", *(f"r{n}" for n in range(8, 16))])}


def _libc() -> Path:
    for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6"):
        if Path(p).exists():
            return Path(p)
    pytest.skip("no x86-64 libc.so.6 found")


def _readelf_rows(path: Path) -> list[tuple[int, int, str, dict[str, str]]]:
    """(fde start, loc, cfa, {reg: rule}) from readelf's interpreted frame tables."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    # readelf may exit 1 over unrelated warnings (a missing .gnu_debuglink file): the tables
    # it printed are still complete
    text = subprocess.run(["readelf", "-wF", str(path)], capture_output=True, text=True,
                          check=False).stdout
    if "FDE" not in text:
        pytest.skip(f"readelf printed no frame tables for {path}")
    rows: list[tuple[int, int, str, dict[str, str]]] = []
    cols: list[str] = []
    fde = None
    in_eh = False
    for line in text.splitlines():
        if line.startswith("Contents of the"):
            in_eh = ".eh_frame section" in line
        if not in_eh:
            continue
        m = re.search(r" FDE cie=\w+ pc=([0-9a-f]+)\.\.", line)
        if m:
            fde = int(m.group(1), 16)
            cols = []
            continue
        if " CIE " in line:
            fde = None
            continue
        if line.strip().startswith("LOC"):
            cols = line.split()[2:]
            continue
        parts = line.split()
        if fde is not None and cols and len(parts) == len(cols) + 2 and \
                re.fullmatch(r"[0-9a-f]{8,16}", parts[0]):
            rows.append((fde, int(parts[0], 16), parts[1], dict(zip(cols, parts[2:],
                                                                    strict=True))))
    return rows


def test_compiled_rows_match_readelf_on_libc() -> None:
    libc = _libc()
    elf = ElfInfo.get(str(libc))
    rows = _readelf_rows(libc)
    assert len(rows) > 1000
    table = cfi.RowTable()
    comp = cfi.Compiler(table)
    checked = 0
    for _fde, loc, cfa_text, regs in rows[::7]:
        if elf.plt_section(loc) is not None:
            continue  # PLT stubs get computed rules instead of their DWARF expressions
        r = comp.row(elf, loc)
        kind, cfa_reg, cfa_off, rule, off = (a[r] for a in table.arrays())
        if cfa_text == "exp":
            assert kind in (cfi.KIND_NONE, cfi.KIND_SIGNAL), hex(loc)
            continue
        m = re.fullmatch(r"(\w+)\+(-?\d+)", cfa_text)
        assert m, cfa_text
        assert kind == cfi.KIND_CFA, hex(loc)
        assert (cfa_reg, cfa_off) == (DWARF_REG[m.group(1)], int(m.group(2))), hex(loc)
        for name, text in regs.items():
            if name not in REG_NAMES:
                continue
            col = cfi.TRACKED.index(REG_NAMES[name])
            if text.startswith("c"):
                assert rule[col] == cfi.RULE_OFFSET and off[col] == int(text[1:]), \
                    (hex(loc), name, text)
            elif text == "u":
                assert rule[col] in (cfi.RULE_SAME, cfi.RULE_UNDEF), (hex(loc), name)
            elif text == "exp" or text.startswith("r"):
                assert rule[col] == cfi.RULE_UNKNOWN, (hex(loc), name, text)
        checked += 1
    assert checked > 500


def test_eh_frame_hdr_lookup_matches_full_parse() -> None:
    """The fast FDE lookup through .eh_frame_hdr finds the same FDE as parsing everything
    with pyelftools, and reads the same rows from it."""
    libc = _libc()
    fast = ElfInfo(str(libc))
    fast._load()
    slow = ElfInfo(str(libc))
    slow._load()
    slow._fde_starts = []
    slow._load_all_cfi([slow])
    fast._load_cfi()
    assert fast._hdr_offsets is not None, "libc has no usable .eh_frame_hdr"
    starts = slow._fde_starts
    assert starts is not None and len(starts) > 1000
    probes = [*starts[::13], *(s + 1 for s in starts[::17]), 0, 1 << 40]
    for pc in probes:
        a, b = fast.fde_for(pc), slow.fde_for(pc)
        if b is None:
            # no FDE in the file: the fast path may only answer from a debug file
            assert a is None or fast.debug_file() is not None
            continue
        assert a is not None, hex(pc)
        assert (a.lo, a.hi, a.signal) == (b.lo, b.hi, b.signal), hex(pc)
        assert a.lines() == b.lines(), hex(pc)


def test_symbols_match_nm(tmp_path: Path) -> None:
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and nm (binutils) are needed")
    exe = tmp_path / "callchain"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe),
                    str(ROOT / "tests" / "programs" / "callchain.c")], check=True)
    nm = subprocess.run(["nm", "--defined-only", "-S", str(exe)], capture_output=True,
                        text=True, check=True).stdout
    elf = ElfInfo.get(str(exe))
    names = []
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT" and int(parts[1], 16) > 0:
            addr, size, name = int(parts[0], 16), int(parts[1], 16), parts[3]
            assert elf.symbolize(addr) == name
            assert elf.symbolize(addr + size - 1) == name
            names.append(name)
    assert len(names) >= 6  # kernel_loop, recurse, level1, level2, thread_main, main, ...
    assert elf.build_id and len(elf.build_id) == 40
    # the symbol arrays find procedures by name as nm names them
    t = elf.symbol_table()
    want = frozenset(names[:2])
    assert {t.name(i) for i in np.flatnonzero(t.named(want)).tolist()} == set(want)
