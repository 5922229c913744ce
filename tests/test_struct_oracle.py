"""Structure recovery against HPCToolkit's hpcstruct on its own test binaries (the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
from callpath.structure.binary import analyze_binary
from callpath.structure.canonical import CATEGORIES, canonical, compare
from callpath.structure.model import Kind
from conftest import shared_path

BINARIES = [f"{p}-x86_64-gcc12-{v}" for p in ("inlines+loops", "recursion")
            for v in ("0", "d", "dr", "r")]


@pytest.mark.parametrize("name", BINARIES)
def test_matches_hpcstruct(name: str, tmp_path: Path) -> None:
    binary = shared_path("hpctoolkit", "bin", name)
    oracle = read_hpcstruct(shared_path("hpctoolkit", "struct", f"{name}.hpcstruct"))[0]
    ours = analyze_binary(binary)
    # Through our own XML, so the writer and the reader are part of what is compared.
    out = tmp_path / f"{name}.hpcstruct"
    write_hpcstruct_file([ours], out)
    back = read_hpcstruct(out)[0]
    result = compare(back, oracle)
    for cat in CATEGORIES:
        m = result[cat]
        assert m.percent >= 95.0, (cat, m.percent, m.only_ours, m.only_theirs)
    # Not vacuous: every binary has procedures and statements, inlines+loops has loop nests.
    assert result["procedures"].theirs >= 12 and result["statements"].theirs >= 12
    if name.startswith("inlines"):
        assert result["loops"].theirs == 11
        assert max(len(p) for _, p in canonical(back).loops) >= 3


def test_lost_call_lines_are_ours_to_keep() -> None:
    """hpcstruct writes l="0" for inlined calls inside loops; DWARF (and we) know the line."""
    name = "inlines+loops-x86_64-gcc12-dr"
    ours = canonical(analyze_binary(shared_path("hpctoolkit", "bin", name)))
    theirs = canonical(read_hpcstruct(shared_path("hpctoolkit", "struct",
                                                  f"{name}.hpcstruct"))[0])
    assert sorted(ours.inlined) == [("f4_1", "f4_inline", 54), ("f4_2", "f4_inline", 60)]
    assert sorted(theirs.inlined) == [("f4_1", "f4_inline", 0), ("f4_2", "f4_inline", 0)]


def test_reader_loads_every_hpctoolkit_file() -> None:
    files = sorted(shared_path("hpctoolkit", "struct").glob("*.hpcstruct"))
    files += sorted(shared_path("hpctoolkit", "meas").glob("*/structs/*.hpcstruct"))
    assert len(files) >= 9
    for f in files:
        structs = read_hpcstruct(f)
        assert structs, f
        for s in structs:
            assert (s.kind == Kind.PROC).sum() > 0
            # Every statement range maps back to that statement through the lookup.
            stmts = [i for i in range(len(s)) if s.kind[i] == Kind.STMT and s.ranges(i)]
            addrs = [s.ranges(i)[0][0] for i in stmts]
            found = s.lookup(addrs)
            assert all(s.kind[j] in (Kind.STMT, Kind.CALL) for j in found), f


def test_lookup_is_vectorised_and_chains() -> None:
    s = analyze_binary(shared_path("hpctoolkit", "bin", "inlines+loops-x86_64-gcc12-dr"))
    import numpy as np
    offs = np.array([0x1348, 0x12D4, 0x1110, 0x10, 0x1395], dtype=np.uint64)
    got = s.lookup(offs)
    assert got[3] == -1 and got[4] == -1  # outside the code
    chain = [Kind(s.kind[i]).name for i in s.chain(int(got[0]))]
    assert chain == ["STMT", "LOOP", "ALIEN", "LOOP", "LOOP", "PROC", "FILE"]
    assert s.text(int(s.name[s.enclosing(got[:1], Kind.ALIEN)[0]])) == "f4_inline"
    proc = s.enclosing(got, Kind.PROC)
    assert [s.text(int(s.name[p])) if p >= 0 else None for p in proc] == [
        "f4_2", "f4_1", "f1", None, None]
