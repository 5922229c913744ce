"""The load map over time (``measure.loadmap``) and the build-ids it is checked against.

The cases are the kernel's records as real programs produce them: UCX's memory hooks patching
four pages of libc (each reported as a 4 KiB mapping of libc at its own offset), a library
unloaded and another loaded at its address, code mapped later at new addresses, anonymous and
memfd code. Real runs of those programs are in test_field_matrix.py.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.measure.loadmap import Mapping, epoch_of, epochs, module_name, pieces

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
PAGE = 4096


def _resolve(ms: list[Mapping], addr: int) -> tuple[str, int] | None:
    """(file, file offset) of ``addr``, the last record covering it winning: the kernel's
    view, computed the slow way as the oracle."""
    best = None
    for m in sorted(ms, key=lambda m: m.time):
        if m.start <= addr < m.end:
            best = (m.path, m.pgoff + addr - m.start)
    return best


def test_patched_pages_keep_the_library_whole() -> None:
    base = 0x7F0000000000
    libc = Mapping(1, base, base + 0x160000, 0x28000, LIBC, "abc")
    patched = [Mapping(10 + i, base + off, base + off + PAGE, 0x28000 + off, LIBC, "abc")
               for i, off in enumerate((0xD5000, 0xD9000, 0xE1000, 0xE3000))]
    (one,) = pieces([libc, *patched])
    assert (one.start, one.end, one.pgoff, one.path) == (base, base + 0x160000, 0x28000, LIBC)
    assert len(epochs([libc, *patched])) == 1  # the same code: no new epoch


def test_reused_address_starts_an_epoch() -> None:
    base = 0x7F1000000000
    a = Mapping(5, base, base + 0x2000, 0x1000, "/lib/liba.so", "")
    exe = Mapping(1, 0x400000, 0x401000, 0x1000, "/bin/app", "")
    later = Mapping(20, 0x7F2000000000, 0x7F2000001000, 0, "/lib/libc.so", "")  # new addresses
    b = Mapping(30, base, base + 0x2000, 0x1000, "/lib/libb.so", "")
    eps = epochs([exe, a, later, b])
    assert [t for t, _ in eps] == [0, 30]
    assert [m.path for m in eps[0][1]] == ["/bin/app", "/lib/liba.so", "/lib/libc.so"]
    assert [m.path for m in eps[1][1]] == ["/bin/app", "/lib/libb.so", "/lib/libc.so"]
    which = epoch_of([t for t, _ in eps], np.array([2, 29, 30, 99], dtype=np.uint64))
    assert which.tolist() == [0, 0, 1, 1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(1, 6), st.integers(0, 3),
                          st.integers(0, 2)), min_size=1, max_size=12))
def test_pieces_resolve_like_the_kernel(recs: list[tuple[int, int, int, int]]) -> None:
    """Any sequence of mappings (pages 0..21, three files, shifted offsets): every address
    resolves through ``pieces`` to what the last record covering it says, and pieces never
    overlap."""
    ms = [Mapping(t, p * PAGE, (p + n) * PAGE, (p + shift) * PAGE, f"/lib/f{f}.so", "")
          for t, (p, n, shift, f) in enumerate(recs)]
    got = pieces(ms)
    assert all(a.end <= b.start for a, b in itertools.pairwise(got))
    for page in range(23):
        addr = page * PAGE + 123
        hit = [m for m in got if m.start <= addr < m.end]
        want = _resolve(ms, addr)
        if want is None:
            assert not hit
        else:
            (m,) = hit
            assert (m.path, m.pgoff + addr - m.start) == want


def test_code_without_a_file_is_named_jit() -> None:
    assert module_name("//anon") == "[jit]"
    assert module_name("[anon:v8 code]") == "[jit:v8 code]"
    assert module_name("/memfd:jit-cache (deleted)") == "[jit:memfd:jit-cache]"
    assert module_name(LIBC) == LIBC


@pytest.mark.parametrize("lib", ["libstdc++.so.6", "libc.so.6"])
def test_build_id_is_the_gnu_note(lib: str) -> None:
    """libstdc++ (and libc) carry SystemTap probe notes of type 3 besides the GNU build-id
    note: only the latter is the build-id (readelf is the oracle). The probe note once
    replaced libstdc++'s build-id, every sample in it lost its ELF and C++ programs came out
    partial in the C++ runtime."""
    from callpath.measure.elfinfo import ElfInfo
    from callpath.structure.elf import open_elf

    path = next((os.path.join(d, lib) for d in ("/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib")
                 if os.path.exists(os.path.join(d, lib))), None)
    if path is None or shutil.which("readelf") is None:
        pytest.skip(f"no {lib} or no readelf here")
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"Build ID: ([0-9a-f]+)", out)
    if found is None:
        pytest.skip(f"{path} has no build-id")
    ElfInfo._cache.pop(path, None)
    assert ElfInfo.get(path).build_id == found.group(1)
    mod = open_elf(path)
    try:
        assert mod.build_id == found.group(1)
    finally:
        mod.close()


def test_code_segment_link_addresses() -> None:
    """A code segment whose file offset is not page-aligned (lld's layout: OpenBLAS's code at
    offset 0x288800, vaddr 0x289800, right after a read-only segment ending at 0x2887dc): the
    page-aligned offset of its mapping lies inside the read-only segment too, and must still
    get the code segment's link address (checked against readelf's segments)."""
    from callpath.measure.elfinfo import ElfInfo

    blas = sorted(Path(np.__file__).parent.parent.glob("numpy.libs/libscipy_openblas*.so"))
    if not blas or shutil.which("readelf") is None:
        pytest.skip("numpy's bundled OpenBLAS or readelf is not here")
    out = subprocess.run(["readelf", "-lW", str(blas[0])], capture_output=True, text=True,
                         check=True).stdout
    segs = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["LOAD"]]
    code = next(s for s in segs if "E" in s[6:-1])
    off, vaddr = int(code[1], 16), int(code[2], 16)
    info = ElfInfo.get(str(blas[0]))
    page = off & ~0xFFF
    assert info.link_address(page, executable=True) == vaddr - (off - page)
