"""The scopes of procedures without inlined code assembled in batches as numpy columns
(``structure/batch_scopes.py``) are exactly those the per-procedure assembly of
``structure/binary.py`` gives: every column, the string table (ids in first-use order) and
the address map, on real libraries with and without line tables; and the structure file
written by two processes (``formats/hpcstruct.py``'s split writer) is byte for byte the one
written by one."""

from __future__ import annotations

import ctypes.util
import io
import os
import sysconfig
from pathlib import Path

import pytest

import callpath.structure.binary as binary_mod
from callpath.formats import hpcstruct
from callpath.structure.binary import analyze_binary
from callpath.structure.model import Kind
from struct_compare import assert_identical


def _libs() -> list[Path]:
    out: list[Path] = []
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and name and name.endswith(".so") and (Path(libdir) / name).is_file():
        out.append(Path(libdir) / name)  # DWARF: lines, inlined code, files
    found = ctypes.util.find_library("stdc++")
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64"):
        if found and (Path(d) / found).is_file():
            out.append(Path(d) / found)  # symbols only
            break
    return out


LIBS = _libs()


@pytest.mark.parametrize("lib", LIBS, ids=lambda p: p.name)
def test_batched_scopes_are_the_per_procedure_ones(lib: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    batched = analyze_binary(lib)
    used = []

    def never(*args: object) -> None:
        used.append(1)
        return None

    monkeypatch.setattr(binary_mod, "plain_proc", never)  # every procedure the old way
    single = analyze_binary(lib)
    assert len(used) > 1000  # procedures without inlined code were there to batch
    assert (single.kind == Kind.LOOP).sum() > 100 and (single.kind == Kind.CALL).sum() > 1000
    assert_identical(batched, single)


@pytest.mark.parametrize("lib", LIBS, ids=lambda p: p.name)
def test_split_writer_writes_the_same_file(lib: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    s = analyze_binary(lib)
    one = io.StringIO()
    hpcstruct.write_hpcstruct([s, s], one, "stamp")
    monkeypatch.setattr(hpcstruct, "_SPLIT_MIN", 0)  # split even this module
    two = tmp_path / "two.hpcstruct"
    hpcstruct.write_hpcstruct_file([s, s], two, "stamp", jobs=2)
    assert two.read_text(encoding="utf-8") == one.getvalue()
    # a text stream without a file behind it is written by this process alone
    mem = io.StringIO()
    hpcstruct.write_hpcstruct([s, s], mem, "stamp", jobs=2)
    assert mem.getvalue() == one.getvalue()


def test_split_writer_without_fork_writes_the_same_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if not LIBS:
        pytest.skip("no library to analyse")
    s = analyze_binary(LIBS[-1])
    one = tmp_path / "one.hpcstruct"
    hpcstruct.write_hpcstruct_file([s], one)
    monkeypatch.setattr(hpcstruct, "_SPLIT_MIN", 0)

    def no_fork() -> int:
        raise OSError("no fork here")

    monkeypatch.setattr(os, "fork", no_fork)
    two = tmp_path / "two.hpcstruct"
    hpcstruct.write_hpcstruct_file([s], two, jobs=2)
    assert two.read_bytes() == one.read_bytes()


def test_batches_out_of_address_order_are_the_per_procedure_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose procedures are not in address order (the segments of a batch are cut
    together by address) still gives the per-procedure scopes."""
    if not LIBS:
        pytest.skip("no library to analyse")
    from callpath.structure.binary import PreparedModule
    from callpath.structure.elf import open_elf

    mod = open_elf(LIBS[-1])
    try:
        prep = PreparedModule(mod, demangle_all=False)
        ids = list(range(0, len(prep.procs), 3))[::-1][:2000]
        batched = prep.build_runs([("a.cc", ids[:700]), ("b.cc", ids[700:])])
        monkeypatch.setattr(binary_mod, "plain_proc", lambda *a: None)
        single = prep.build_runs([("a.cc", ids[:700]), ("b.cc", ids[700:])])
    finally:
        mod.close()
    assert (single.kind == Kind.PROC).sum() == len(ids) > 700
    assert_identical(batched, single)
