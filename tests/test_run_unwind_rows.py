"""What post-mortem unwinding keeps between runs and reads without pyelftools, on real
binaries of this machine: rows cached per module give the rows the CFI gives (and a run that
finds them opens no CFI), the ELF headers read directly agree with ``readelf``, and symbols
read as arrays name addresses as ``nm`` does."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from callpath.measure import cfi
from callpath.measure.elfinfo import ElfInfo
from callpath.structure import store
from callpath.structure.elfheaders import read_headers

ROOT = Path(__file__).resolve().parents[1]


def _libc() -> Path:
    for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6"):
        if Path(p).exists():
            return Path(p)
    pytest.skip("no x86-64 libc.so.6 found")


def _pcs(elf: ElfInfo) -> list[int]:
    """Every 5th FDE start, a pc inside each of them, the PLT, and pcs outside any FDE."""
    elf._load_cfi()
    starts = elf._fde_starts or []
    assert len(starts) > 1000
    pcs = [*starts[::5], *(s + 3 for s in starts[::5])]
    pcs += [lo + 4 for lo, _hi, _n in elf.plt]
    text = max(elf.segments, key=lambda s: s.filesz if s.flags & 1 else 0)
    pcs += list(range(text.vaddr, text.vaddr + 64, 8))  # before the first FDE: no CFI
    return pcs


def test_cached_rows_are_the_compiled_rows(tmp_path: Path) -> None:
    libc = str(_libc())
    plain = ElfInfo(libc)
    plain._load()
    pcs = _pcs(plain)
    ref = cfi.Compiler(cfi.RowTable())
    expect = [(ref.table.key(r), s) for r, s in (ref.row_source(plain, pc) for pc in pcs)]
    # first run: compiles and fills the cache
    first = ElfInfo(libc)
    first._load()
    c1 = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi"))
    got1 = [(c1.table.key(r), s) for r, s in (c1.row_source(first, pc) for pc in pcs)]
    assert got1 == expect
    assert c1.cache is not None
    c1.cache.save()
    files = list(tmp_path.glob("libc.so.6-*.rows"))
    assert len(files) == 1
    # a later run: the same rows, and the module's CFI is never opened
    later = ElfInfo(libc)
    later._load()
    c2 = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi"))
    got2 = [(c2.table.key(r), s) for r, s in (c2.row_source(later, pc) for pc in pcs)]
    assert got2 == expect
    assert later._fde_starts is None, "a cached pc made the unwinder read the CFI"
    # pcs no run has seen in functions a run has seen: the rows kept by address range
    assert plain._fde_starts is not None
    others = []
    for start in plain._fde_starts[::5]:
        fde = plain.fde_for(start)
        end = fde.hi if fde is not None else start
        others += [start + d for d in (1, 6, 11, 17) if start + d < end]
    # those whose rows come from CFI (not a PLT stub's, a signal frame's or a recipe)
    others = [pc for pc in others if (got := ref.row_source(plain, pc))[1] == cfi.SRC_CFI
              and got[0] != 0]
    assert len(others) > 1000
    want = [(ref.table.key(r), s) for r, s in (ref.row_source(plain, pc) for pc in others)]
    c4 = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi"))
    got4 = [(c4.table.key(r), s) for r, s in (c4.row_source(later, pc) for pc in others)]
    assert got4 == want
    assert later._fde_starts is None, "a pc in a cached function made the unwinder read CFI"
    # another unwinding mode does not take these rows
    c3 = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi-only"))
    assert c3.cache is not None and c3.cache.source(later, pcs[0]) is None
    assert c3.cache.interval(later, pcs[0]) is None


def test_rows_of_two_processes_are_merged(tmp_path: Path) -> None:
    """Two runs that add different pcs (forked unwinding workers do) leave both in the file."""
    libc = str(_libc())
    elf = ElfInfo.get(libc)
    pcs = _pcs(elf)
    a = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi"))
    b = cfi.Compiler(cfi.RowTable(), cache=cfi.RowCache(tmp_path, "cfi"))
    for pc in pcs[0::2]:
        a.row_source(elf, pc)
    for pc in pcs[1::2]:
        b.row_source(elf, pc)
    assert a.cache is not None and b.cache is not None
    a.cache.save()
    b.cache.save()
    fresh = cfi.RowCache(tmp_path, "cfi")
    assert all(fresh.source(elf, pc) is not None or fresh.interval(elf, pc) is not None
               for pc in pcs)


def _readelf(args: list[str], path: str) -> str:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run(["readelf", *args, path], capture_output=True, text=True,
                          check=False).stdout


@pytest.mark.parametrize("name", ["libc", "python", "ls"])
def test_headers_match_readelf(name: str) -> None:
    import sys
    path = {"libc": str(_libc()), "python": str(Path(sys.executable).resolve()),
            "ls": shutil.which("ls") or "/bin/ls"}[name]
    h = read_headers(path)
    assert h is not None
    text = _readelf(["-W", "-S", "-n"], path)
    secs = re.findall(r"\]\s+(\S+)\s+(\w+)\s+([0-9a-f]{16})\s+([0-9a-f]{6,})\s+([0-9a-f]{6,})",
                      text)
    assert len(secs) > 10
    got = {s.name: (s.addr, s.offset, s.size) for s in h.sections if s.name}
    for sname, _type, addr, off, size in secs:
        assert got[sname] == (int(addr, 16), int(off, 16), int(size, 16)), sname
    m = re.search(r"Build ID: ([0-9a-f]+)", text)
    assert h.build_id == (m.group(1) if m else "")
    loads = re.findall(r"LOAD\s+0x([0-9a-f]+) 0x([0-9a-f]+) 0x[0-9a-f]+ 0x([0-9a-f]+) "
                       r"0x([0-9a-f]+)", _readelf(["-W", "-l"], path))
    mine = [(g.offset, g.vaddr, g.filesz, g.memsz) for g in h.segments if g.type == 1]
    assert mine == [tuple(int(x, 16) for x in row) for row in loads]


def test_not_elf_has_no_headers(tmp_path: Path) -> None:
    f = tmp_path / "x.so"
    f.write_bytes(b"\x7fELF" + b"\0" * 10)  # truncated
    assert read_headers(str(f)) is None
    assert read_headers(str(tmp_path / "missing")) is None
    assert read_headers(__file__) is None


def test_store_narrows_and_widens(tmp_path: Path) -> None:
    arrays = {"small": (np.arange(10000) % 256).astype(np.uint64),
              "neg": np.array([-1, 5, -30000], dtype=np.int64),
              "big": np.array([0, 1 << 40], dtype=np.uint64),
              "lines": np.arange(70000, dtype=np.int32),
              "empty": np.zeros(0, dtype=np.int64),
              "f": np.array([0.5, 2.0])}
    f = tmp_path / "e.cpstruct"
    assert store.save_arrays(f, {"k": 1}, arrays)
    got = store.load_arrays(f, {"k": 1})
    assert got is not None
    for k, v in arrays.items():
        assert got[1][k].dtype == v.dtype, k
        assert np.array_equal(got[1][k], v), k
    # 80 kB of uint64 bytes that fit in one byte each: stored as 10 kB
    assert f.stat().st_size < sum(v.nbytes for v in arrays.values()) - 60000
