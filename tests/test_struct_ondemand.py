"""Structure on demand (``callpath prof`` recovers only the procedures a measurement touched)
against the whole binary's structure (``callpath struct``): the same scopes for every procedure
built, the cache growing with later requests, and identical databases end to end on real
programs compiled and sampled here."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.structure import store
from callpath.structure.binary import Debug, PreparedModule, analyze_binary, read_debug
from callpath.structure.dwarf_lines import LineCache
from callpath.structure.dwarf_units import UnitCache
from callpath.structure.elf import ElfModule, open_elf
from callpath.structure.model import Kind, Structure
from callpath.structure.ondemand import ModuleRequest, structure_for
from callpath.structure.symbols import Procedure, procedures
from conftest import ROOT, perf_reason, run_cli
from prof_compare import matched_nodes, scoped_values

Subtree = tuple[tuple[object, ...], ...]


def _subtrees(s: Structure) -> dict[int, Subtree]:
    """Per procedure entry, its scopes in preorder, every field spelled out (strings as text,
    parents as offsets inside the subtree), so that two structures built separately compare."""
    kids: list[list[int]] = [[] for _ in range(len(s))]
    for i in range(1, len(s)):
        kids[int(s.parent[i])].append(i)
    out: dict[int, Subtree] = {}
    for p in np.flatnonzero(s.kind == Kind.PROC).tolist():
        rows: list[tuple[object, ...]] = []
        pos: dict[int, int] = {}
        stack = [p]
        while stack:
            i = stack.pop()
            pos[i] = len(rows)
            rows.append((int(s.kind[i]), pos.get(int(s.parent[i]), -1), s.text(int(s.name[i])),
                         s.text(int(s.link_name[i])), s.text(int(s.file[i])), int(s.line[i]),
                         s.text(int(s.call_file[i])), int(s.call_line[i]), int(s.target[i]),
                         tuple(s.ranges(i))))
            stack.extend(reversed(kids[i]))
        out[int(s.range_lo[s.range_ptr[p]])] = tuple(rows)
    return out


def _biggest_library() -> Path:
    """The biggest library the suite has: libpython (with DWARF where the interpreter ships
    it), else libstdc++."""
    cands = []
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and name and name.endswith(".so"):
        cands.append(Path(libdir) / name)
    found = ctypes.util.find_library("stdc++")
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64"):
        if found:
            cands.append(Path(d) / found)
    for c in cands:
        if c.is_file():
            return c.resolve()
    pytest.skip("neither libpython nor libstdc++ is installed as a shared library here")


@pytest.fixture(scope="module")
def library() -> tuple[Path, Structure]:
    lib = _biggest_library()
    return lib, analyze_binary(lib)


def test_on_demand_procedures_equal_whole_binary(library: tuple[Path, Structure],
                                                 tmp_path: Path) -> None:
    """Every procedure built on demand has exactly the scopes (lines, loops, inlined code,
    call sites, ranges) the whole binary's structure gives it, and only the procedures holding
    a requested address are built; a second request analyses only what the first did not, and
    the cache then holds the union."""
    lib, whole = library
    mod = open_elf(lib)
    try:
        procs = procedures(mod)
        # with symbols and DWARF, the DWARF is read around the addresses only, and no
        # module-wide state is kept (it would hold only what those addresses needed)
        partial = PreparedModule(mod, demangle_all=False,
                                 near=np.array([procs[0].entry], np.uint64)).partial
    finally:
        mod.close()
    whole_trees = _subtrees(whole)
    assert len(whole_trees) == len(procs)
    # addresses inside every 7th procedure (entry, middle), then every 5th in a second run
    first = procs[::7]
    addrs = np.array([a for p in first for a in (p.entry, (p.entry + p.end) // 2)], np.uint64)
    cache = [tmp_path / "meas" / "lib.cpstruct", tmp_path / "user" / "lib.cpstruct"]
    state = tmp_path / "user" / "lib.prep.cpstruct"
    r1 = structure_for(ModuleRequest(str(lib), str(lib), np.unique(addrs), list(cache),
                                     state=state))
    assert r1.error is None and r1.structure is not None
    assert r1.analysed == len(first) and r1.known == 0 and r1.procedures == len(procs)
    got = _subtrees(r1.structure)
    assert set(got) == {p.entry for p in first}
    for entry, tree in got.items():
        assert tree == whole_trees[entry], hex(entry)
    # every address maps to the same chain of scopes as in the whole structure
    for s_ in (r1.structure,):
        a = s_.lookup(addrs)
        b = whole.lookup(addrs)
        assert ((a >= 0) == (b >= 0)).all()
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            if x >= 0:
                assert ([(int(s_.kind[c]), int(s_.line[c])) for c in s_.chain(x)]
                        == [(int(whole.kind[c]), int(whole.line[c])) for c in whole.chain(y)])
    assert all(c.is_file() for c in cache) and state.is_file() != partial
    # a later run: more procedures; only the new ones are analysed, from the cache otherwise,
    # with the module-wide facts (procedures, lines, inlining) from the state entry
    second = procs[::5]
    addrs2 = np.array([p.entry for p in second], np.uint64)
    r2 = structure_for(ModuleRequest(str(lib), str(lib), addrs2, list(cache), state=state))
    assert r2.structure is not None
    new = {p.entry for p in second} - {p.entry for p in first}
    assert r2.known == len(first) and r2.analysed == len(new)
    got2 = _subtrees(r2.structure)
    assert set(got2) == {p.entry for p in first} | {p.entry for p in second}
    for entry, tree in got2.items():
        assert tree == whole_trees[entry], hex(entry)
    # the same from the file itself (a damaged state entry is read past)
    if not partial:
        state.write_bytes(state.read_bytes()[:100])
    shutil.rmtree(tmp_path / "meas")
    (tmp_path / "user" / "lib.cpstruct").unlink()
    r2b = structure_for(ModuleRequest(str(lib), str(lib), addrs2, list(cache), state=state))
    assert r2b.structure is not None and r2b.analysed == len(second)
    got2b = _subtrees(r2b.structure)
    assert got2b == {p.entry: whole_trees[p.entry] for p in second}
    assert partial or state.stat().st_size > 100  # written again, whole
    # a third run with nothing new reads the entry and analyses nothing
    r3 = structure_for(ModuleRequest(str(lib), str(lib), addrs2, list(cache)))
    assert r3.analysed == 0 and r3.structure is not None
    assert _subtrees(r3.structure) == got2b


def _read_around_one(mod: ElfModule, lib: Path) -> tuple[list[Procedure], PreparedModule]:
    """The library's procedures, and it prepared around one of them; skips the test where
    the library has no DWARF or no symbols (then there is nothing to read around)."""
    procs = procedures(mod)
    prep = PreparedModule(mod, demangle_all=False,
                          near=np.array([procs[len(procs) // 2].entry], np.uint64))
    if not prep.partial:
        pytest.skip(f"{lib.name} has no DWARF or no symbols here")
    return procs, prep


def test_dwarf_read_around_few_procedures_gives_whole_answer(
        library: tuple[Path, Structure], tmp_path: Path) -> None:
    """A few procedures of a library with symbols and DWARF: only the DWARF units (and in them
    only the subprograms) whose code lies between the symbols around the requested addresses
    are read, and every procedure built has the scopes of the whole binary's structure; a
    later run near other procedures adds theirs, again as the whole binary has them."""
    lib, whole = library
    mod = open_elf(lib)
    try:
        procs, prep = _read_around_one(mod, lib)
        full = read_debug(mod)
        part = read_debug(mod, (prep.span_lo, prep.span_hi))
    finally:
        mod.close()
    assert full is not None and part is not None
    assert len(part.info.units) < len(full.info.units)
    assert len(part.info.subprograms) < len(full.info.subprograms)
    whole_trees = _subtrees(whole)
    cache = [tmp_path / "lib.cpstruct"]
    # the per-user state path: its line programs are kept beside it (.lines.cpstruct), and
    # the second round reads the units the first decoded from there
    state = tmp_path / "lib.prep.cpstruct"
    seen: set[int] = set()
    for first in (procs[3::251], procs[100::163]):
        addrs = np.array([a for p in first for a in (p.entry, (p.entry + p.end) // 2)],
                         np.uint64)
        r = structure_for(ModuleRequest(str(lib), str(lib), np.unique(addrs), list(cache),
                                        state=state))
        assert (tmp_path / "lib.lines.cpstruct").is_file()
        assert r.error is None and r.structure is not None
        new = {p.entry for p in first} - seen
        assert r.analysed == len(new)
        seen |= new
        got = _subtrees(r.structure)
        assert set(got) == seen
        for entry, tree in got.items():
            assert tree == whole_trees[entry], hex(entry)
    # nothing new: the cache answers without reading the file
    r = structure_for(ModuleRequest(str(lib), str(lib), np.unique(addrs), list(cache)))
    assert r.analysed == 0
    # the kept line programs give the table that decoding gives, and hold only the units
    # read around the requested procedures
    mod = open_elf(lib)
    try:
        first_units = len(LineCache(tmp_path / "lib.lines.cpstruct")._read())
        assert first_units > 0
        decoded = read_debug(mod, (prep.span_lo, prep.span_hi))
        kept = LineCache(tmp_path / "lib.lines.cpstruct")
        assert read_debug(mod, (prep.span_lo, prep.span_hi), kept) is not None
        kept.save()
        kept = LineCache(tmp_path / "lib.lines.cpstruct")  # as the next run reads it
        cached = read_debug(mod, (prep.span_lo, prep.span_hi), kept)
    finally:
        mod.close()
    assert decoded is not None and cached is not None
    assert not kept._new, "a unit kept on disk was decoded again"
    for k in ("address", "file", "line"):
        assert np.array_equal(getattr(decoded.lines, k), getattr(cached.lines, k)), k
    assert decoded.lines.files == cached.lines.files
    assert decoded.lines.unit_files == cached.lines.unit_files
    assert len(kept._read()) < len(full.info.units)


def _debug_rows(dbg: Debug) -> tuple[object, ...]:
    """What a DWARF read found, field by field (an inlined record's origin is where its
    name came from, not kept by the unit cache)."""
    info = dbg.info
    return (info.units, sorted(info.noreturn_names),
            sorted((k, sorted(v)) for k, v in info.unit_noreturn.items()),
            [(x.offset, x.ranges, x.decl_file, x.decl_line, x.noreturn, x.name, x.link_name)
             for x in info.subprograms],
            [(x.sub, x.parent, x.ranges, x.call_file, x.call_line, x.name)
             for x in info.inlined])


def test_kept_dwarf_units_give_what_a_walk_gives(library: tuple[Path, Structure],
                                                 tmp_path: Path) -> None:
    """The records of DWARF units kept between runs (``dwarf_units.UnitCache``): walked
    whole the first time a unit is needed, a later read around other addresses takes from
    them exactly what a walk limited to those addresses finds (the subtrees such a walk
    skips left out), and a read of every unit through them equals the plain whole read."""
    lib, _whole = library
    mod = open_elf(lib)
    try:
        procs, _prep = _read_around_one(mod, lib)
        path = tmp_path / "lib.units.cpstruct"
        rounds = [procs[3::251], procs[100::163], procs[7::97]]
        for k, chosen in enumerate(rounds):
            addrs = np.unique(np.array([p.entry for p in chosen], np.uint64))
            prep = PreparedModule(mod, demangle_all=False, near=addrs)
            spans = (prep.span_lo, prep.span_hi)
            cache = UnitCache(path)
            kept = read_debug(mod, spans, None, cache)
            walked = cache._new  # the units this round walked (the others were kept)
            cache.save()
            plain = read_debug(mod, spans)
            assert kept is not None and plain is not None
            assert _debug_rows(kept) == _debug_rows(plain), k
            if k:
                assert len(walked) < len(plain.info.units), "every unit was walked again"
        everything = read_debug(mod, None, None, UnitCache(path))
        plain_all = read_debug(mod)
    finally:
        mod.close()
    assert everything is not None and plain_all is not None
    assert _debug_rows(everything) == _debug_rows(plain_all)


def test_damaged_cache_entry_is_recomputed(library: tuple[Path, Structure],
                                           tmp_path: Path) -> None:
    lib, whole = library
    trees = _subtrees(whole)
    entry = sorted(trees)[len(trees) // 2]
    c = tmp_path / "lib.cpstruct"
    r = structure_for(ModuleRequest(str(lib), str(lib), np.array([entry], np.uint64), [c]))
    assert r.analysed == 1
    data = c.read_bytes()
    c.write_bytes(data[: len(data) // 2])
    assert store.load(c) is None
    r = structure_for(ModuleRequest(str(lib), str(lib), np.array([entry], np.uint64), [c]))
    assert r.analysed == 1 and r.structure is not None
    assert _subtrees(r.structure)[entry] == trees[entry]
    assert store.load(c) is not None


# -- end to end: the same database from on-demand and from whole-binary structure ----------

C_PROGRAMS = [
    ("hotloop", ROOT / "tests" / "prof_programs" / "hotloop.c", ["30000"], ["-O2", "-g"]),
    ("nests", ROOT / "tests" / "struct_programs" / "nests.c", ["700"], ["-O2", "-g"]),
    ("calls", ROOT / "tests" / "struct_programs" / "calls.c", ["100000000"], ["-O2", "-g"]),
    ("nests-O3", ROOT / "tests" / "struct_programs" / "nests.c", ["700"], ["-O3"]),
]


def _same_database(a: Path, b: Path) -> None:
    ea, eb = callpath.open(a), callpath.open(b)
    ia, ib = matched_nodes(ea, eb)
    for scope in ("execution", "function"):
        np.testing.assert_array_equal(scoped_values(ea, 0, scope)[ia],
                                      scoped_values(eb, 0, scope)[ib])


@pytest.mark.parametrize("name,src,args,flags", C_PROGRAMS, ids=[p[0] for p in C_PROGRAMS])
def test_on_demand_attributes_as_whole_binary(name: str, src: Path, args: list[str],
                                              flags: list[str], tmp_path: Path) -> None:
    """A real program sampled by ``callpath run``: ``callpath prof`` with structure on demand
    writes the same tree with the same values as with ``callpath struct MEASDIR`` first."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    exe = tmp_path / name
    subprocess.run(["gcc", *flags, "-o", str(exe), str(src)], check=True)
    meas = tmp_path / f"{name}.m"
    run_cli("run", "-o", str(meas), "--top", "0", "--", str(exe), *args, check=True)
    lean = tmp_path / "lean.m"
    shutil.copytree(meas, lean)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run_cli("prof", str(lean), "-o", str(tmp_path / "lean.d"), env=env)
    assert r.returncode == 0, r.stderr
    assert not list((lean / "structs").glob("*.hpcstruct"))  # nothing whole was written
    assert list((lean / "structs").glob("*.cpstruct"))
    run_cli("struct", str(meas), "--no-cache", check=True)
    r = run_cli("prof", str(meas), "-o", str(tmp_path / "whole.d"), env=env)
    assert r.returncode == 0, r.stderr
    _same_database(tmp_path / "lean.d", tmp_path / "whole.d")
    # the second run takes everything from the cache, and still agrees
    r = run_cli("prof", str(lean), "-o", str(tmp_path / "again.d"), env=env)
    assert r.returncode == 0, r.stderr
    _same_database(tmp_path / "again.d", tmp_path / "whole.d")
