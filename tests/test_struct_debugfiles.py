"""Where the DWARF lives: separate debug files (by build-id, by ``.gnu_debuglink``), compressed
sections (``-gz``, ``-gz=zlib-gnu``) and DWARF 4 vs 5 — every form gives the same structure.

The reference is ``nests.c`` compiled at ``-O2 -g`` with the DWARF in the binary; each variant
is built here with gcc and split with binutils as distributions do (``objcopy
--only-keep-debug``, ``strip``, ``objcopy --add-gnu-debuglink``), the debug file placed under a
temporary debug root instead of ``/usr/lib/debug``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from callpath.formats.hpcstruct import read_hpcstruct
from callpath.structure.binary import analyze_binary
from callpath.structure.canonical import Canonical, canonical
from callpath.structure.elf import open_elf
from conftest import run_cli

SRC = Path(__file__).parent / "struct_programs" / "nests.c"


def _need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} is not installed")


def _gcc(out: Path, *flags: str) -> Path:
    _need("gcc")
    subprocess.run(["gcc", "-O2", "-g", *flags, "-o", str(out), str(SRC)], check=True)
    return out


def _split(exe: Path, debug: Path, *strip_flags: str) -> None:
    """Move the DWARF of ``exe`` into ``debug`` and link the two, as Debian's dh_strip does."""
    _need("objcopy", "strip")
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True)
    subprocess.run(["strip", *(strip_flags or ("--strip-debug",)), str(exe)], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(exe)], check=True)


def _analyze(path: Path, root: Path | None) -> Canonical:
    old = os.environ.get("CALLPATH_DEBUG_ROOT")
    if root is not None:
        os.environ["CALLPATH_DEBUG_ROOT"] = str(root)
    else:
        os.environ.pop("CALLPATH_DEBUG_ROOT", None)
    try:
        return canonical(analyze_binary(path))
    finally:
        if old is None:
            os.environ.pop("CALLPATH_DEBUG_ROOT", None)
        else:
            os.environ["CALLPATH_DEBUG_ROOT"] = old


def _same(got: Canonical, ref: Canonical) -> None:
    assert got.procedures == ref.procedures
    assert got.loops == ref.loops
    assert got.inlined == ref.inlined
    assert got.statements == ref.statements
    assert got.calls == ref.calls


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Canonical:
    ref = _analyze(_gcc(tmp_path_factory.mktemp("struct-ref") / "nests"), None)
    # Not vacuous: the reference has lines, the inlined call and the three-deep nest.
    assert ("nest3", "inner_sum") in {(p, c) for p, c, _ in ref.inlined}
    assert max(len(p) for _, p in ref.loops) == 4
    assert len({ln for _, ln in ref.statements}) > 15
    return ref


def _build_id(path: Path) -> str:
    m = open_elf(path)
    try:
        assert m.build_id
        return m.build_id
    finally:
        m.close()


def test_separate_debug_file_by_build_id(tmp_path: Path, reference: Canonical) -> None:
    exe = _gcc(tmp_path / "nests")
    bid = _build_id(exe)
    _split(exe, tmp_path / "nests.debug")
    root = tmp_path / "debugroot"
    where = root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    where.parent.mkdir(parents=True)
    (tmp_path / "nests.debug").rename(where)  # the debuglink name no longer finds it
    m = open_elf(exe)
    assert not m.has_dwarf() and m.debuglink == "nests.debug"
    m.close()
    # Without the debug root: no lines, no inlining (so the lines below come from the file).
    bare = _analyze(exe, None)
    assert {ln for _, ln in bare.statements} == {0} and not bare.inlined
    _same(_analyze(exe, root), reference)
    # The same through the command line's --debug-root.
    out = tmp_path / "out.hpcstruct"
    p = run_cli("struct", str(exe), "--debug-root", str(root), "-o", str(out), "--no-cache")
    assert p.returncode == 0, p.stderr
    _same(canonical(read_hpcstruct(out)[0]), reference)
    p = run_cli("struct", str(exe), "--debug-root", str(tmp_path / "nowhere"), "-o", "-")
    assert p.returncode == 2 and "--debug-root" in p.stderr and "not a directory" in p.stderr


def test_fully_stripped_binary_takes_symbols_from_debug_file(tmp_path: Path,
                                                             reference: Canonical) -> None:
    exe = _gcc(tmp_path / "nests")
    bid = _build_id(exe)
    root = tmp_path / "debugroot"
    (root / ".build-id" / bid[:2]).mkdir(parents=True)
    _split(exe, root / ".build-id" / bid[:2] / f"{bid[2:]}.debug", "--strip-all")
    m = open_elf(exe)
    assert m.elf.get_section_by_name(".symtab") is None
    m.close()
    _same(_analyze(exe, root), reference)


@pytest.mark.parametrize("place", ["beside", "dot-debug", "root-dir"])
def test_separate_debug_file_by_debuglink(tmp_path: Path, reference: Canonical,
                                          place: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = _gcc(bindir / "nests", "-Wl,--build-id=none")
    m = open_elf(exe)
    assert m.build_id is None
    m.close()
    _split(exe, tmp_path / "nests.dbg")
    root = tmp_path / "debugroot"
    dest = {"beside": bindir / "nests.dbg",
            "dot-debug": bindir / ".debug" / "nests.dbg",
            "root-dir": root / str(bindir.resolve()).lstrip("/") / "nests.dbg"}[place]
    dest.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "nests.dbg").rename(dest)
    root.mkdir(exist_ok=True)
    _same(_analyze(exe, root), reference)


@pytest.mark.parametrize("flags", [["-gz"], ["-gz=zlib"], ["-gz=zlib-gnu"]])
def test_compressed_debug_sections(tmp_path: Path, reference: Canonical,
                                   flags: list[str]) -> None:
    exe = _gcc(tmp_path / "nests", *flags)
    m = open_elf(exe)
    try:
        gnu = m.elf.get_section_by_name(".zdebug_info")
        info = m.elf.get_section_by_name(".debug_info")
        # Really compressed: SHF_COMPRESSED (0x800), or the GNU .zdebug_ form.
        assert gnu is not None or (info is not None and int(info["sh_flags"]) & 0x800)
    finally:
        m.close()
    _same(_analyze(exe, None), reference)


def test_compressed_separate_debug_file(tmp_path: Path, reference: Canonical) -> None:
    exe = _gcc(tmp_path / "nests", "-gz")
    bid = _build_id(exe)
    root = tmp_path / "debugroot"
    (root / ".build-id" / bid[:2]).mkdir(parents=True)
    _split(exe, root / ".build-id" / bid[:2] / f"{bid[2:]}.debug")
    _same(_analyze(exe, root), reference)


@pytest.mark.parametrize("version", [4, 5])
def test_dwarf_versions(tmp_path: Path, reference: Canonical, version: int) -> None:
    exe = _gcc(tmp_path / "nests", f"-gdwarf-{version}")
    m = open_elf(exe)
    try:
        info = m.section_bytes(".debug_info") or b""
        line = m.section_bytes(".debug_line") or b""
    finally:
        m.close()
    # The unit and line-table headers really carry that version (after the 32-bit length).
    assert int.from_bytes(info[4:6], "little") == version
    assert int.from_bytes(line[4:6], "little") == version
    _same(_analyze(exe, None), reference)


@pytest.mark.parametrize("version", [4, 5])
def test_split_dwarf_dwo(tmp_path: Path, reference: Canonical, version: int) -> None:
    """``-gsplit-dwarf``: the binary keeps the line table and skeleton units, the inlining
    trees are in a ``.dwo`` file beside the objects (found by name and compilation directory,
    or beside the binary after both moved)."""
    _need("gcc")
    build = tmp_path / "build"
    build.mkdir()
    exe = build / "nests"
    subprocess.run(["gcc", "-O2", "-g", f"-gdwarf-{version}", "-gsplit-dwarf", "-o", str(exe),
                    str(SRC)], check=True, cwd=build)
    dwos = list(build.glob("*.dwo"))
    assert len(dwos) == 1
    _same(_analyze(exe, None), reference)
    # Moved together to another folder: the compilation directory no longer holds the .dwo.
    moved = tmp_path / "moved"
    build.rename(moved)
    _same(_analyze(moved / "nests", None), reference)
    # Without the .dwo: lines and loops from the binary, no inlining.
    next(moved.glob("*.dwo")).unlink()
    bare = _analyze(moved / "nests", None)
    assert not bare.inlined and bare.statements == reference.statements
    assert sorted(len(p) for _, p in bare.loops.elements()) == [1, 1, 1, 1, 2, 3]
