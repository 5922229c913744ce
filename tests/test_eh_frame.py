"""The unwinder's own reading of ``.eh_frame`` (``measure/eh_frame.py``) against pyelftools,
on every FDE of real libraries of this machine: the same code range, the same signal-frame
mark and the same rows (location, CFA rule, every register's rule), and the same errors."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from callpath.measure import eh_frame
from callpath.measure.elfinfo import ElfInfo


def _library(name: str) -> Path:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.strip().startswith(name + " ") and "x86-64" in line:
            return Path(line.rsplit("=> ", 1)[1].strip())
    pytest.skip(f"{name} not found by ldconfig")


def _pyelftools_rows(fde: Any) -> tuple[Any, ...]:
    fde.instructions = [i for i in fde.instructions if int(i.opcode) != 0x2E]
    rows = []
    for r in fde.get_decoded().table:
        c = r["cfa"]
        rules = {int(k): (str(v.type), bytes(v.arg) if isinstance(v.arg, list) else v.arg)
                 for k, v in r.items() if isinstance(k, int)}
        rows.append((int(r["pc"]), c.reg, 0 if c.expr is not None else int(c.offset),
                     None if c.expr is None else bytes(c.expr), rules))
    lo = int(fde.header["initial_location"])
    return (lo, lo + int(fde.header["address_range"]),
            b"S" in fde.cie.header["augmentation"], rows)


def _our_rows(fde: eh_frame.Fde) -> tuple[Any, ...]:
    rows = [(ln.pc, ln.cfa_reg, 0 if ln.cfa_expr is not None else ln.cfa_off, ln.cfa_expr,
             ln.rules) for ln in fde.lines()]
    return fde.lo, fde.hi, fde.signal, rows


@pytest.mark.parametrize("name", ["libc.so.6", "libstdc++.so.6", "libgcc_s.so.1"])
def test_every_fde_as_pyelftools_reads_it(name: str) -> None:
    from elftools.dwarf.callframe import CallFrameInfo
    from elftools.dwarf.structs import DWARFStructs

    elf = ElfInfo.get(str(_library(name)))
    hdr, eh = elf._section_data(".eh_frame_hdr"), elf._section_data(".eh_frame")
    assert hdr is not None and eh is not None
    (base, data), (eh_addr, eh_bytes) = hdr, eh
    count = int.from_bytes(data[8:12], "little")
    table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(-1, 2)
    offsets = (table[:, 1].astype(np.int64) + base - eh_addr).tolist()
    parser = CallFrameInfo(stream=io.BytesIO(eh_bytes), size=len(eh_bytes), address=eh_addr,
                           base_structs=DWARFStructs(little_endian=True, dwarf_format=32,
                                                     address_size=8), for_eh_frame=True)
    cies: dict[int, eh_frame.Cie] = {}
    with_expr = signal = 0
    for off in offsets:
        try:
            want: tuple[Any, ...] = _pyelftools_rows(parser._parse_entry_at(off))
        except Exception as e:  # any pyelftools failure must be ours too
            want = ("error", type(e).__name__)
        try:
            got: tuple[Any, ...] = _our_rows(eh_frame.parse_fde(eh_bytes, eh_addr, off, cies))
        except eh_frame.CfiError:
            got = ("error", want[1] if want[0] == "error" else "CfiError")
        assert got == want, f"{name}: FDE at .eh_frame+{off:#x}"
        if want[0] != "error":
            signal += bool(want[2])
            with_expr += any(r[3] is not None or any(t == "EXPRESSION" for t, _ in r[4].values())
                             for r in want[3])
    assert count > 200
    if name == "libc.so.6":  # glibc's __restore_rt is a signal frame; its CFI is expressions
        assert signal >= 1 and with_expr >= 1


def test_malformed_entries_are_errors_not_crashes() -> None:
    cies: dict[int, eh_frame.Cie] = {}
    with pytest.raises(eh_frame.CfiError):
        eh_frame.parse_fde(b"\x10\x00\x00\x00" + b"\x00" * 4, 0x1000, 0, cies)  # a CIE
    with pytest.raises(eh_frame.CfiError):
        eh_frame.parse_fde(b"\xff\xff\x00\x00" + b"\x04\x00\x00\x00", 0x1000, 0, cies)  # cut
    with pytest.raises(eh_frame.CfiError):
        eh_frame.parse_fde(b"", 0x1000, 8, cies)
