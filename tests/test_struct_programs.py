"""A C program with known loop nests and inlining, compiled by the test at three levels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from callpath.structure.binary import analyze_binary
from callpath.structure.canonical import canonical

SRC = Path(__file__).parent / "struct_programs" / "nests.c"


def _marker(name: str) -> int:
    for i, line in enumerate(SRC.read_text().splitlines(), 1):
        if f"/* {name} */" in line:
            return i
    raise AssertionError(name)


def _build(tmp: Path, flags: list[str]) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp / ("nests" + "".join(flags).replace("-", "_"))
    subprocess.run(["gcc", *flags, "-o", str(out), str(SRC)], check=True)
    return out


@pytest.mark.parametrize("flags", [["-O0", "-g"], ["-O2", "-g"]])
def test_nests_with_debug_info(tmp_path: Path, flags: list[str]) -> None:
    c = canonical(analyze_binary(_build(tmp_path, flags)))
    i, j, k = (f"L:{_marker(m)}" for m in ("LOOP_I", "LOOP_J", "LOOP_K"))
    nest3 = sorted(p for proc, p in c.loops if proc == "nest3")
    assert nest3 == [(i,), (i, j), (i, j, "A:inner_sum", k)]
    assert [p for proc, p in c.loops if proc == "single"] == [(f"L:{_marker('LOOP_S')}",)]
    assert (f"L:{_marker('LOOP_MAIN')}",) in [p for proc, p in c.loops if proc == "main"]
    assert ("nest3", "inner_sum", _marker("CALL_INNER")) in c.inlined
    assert not [p for proc, p in c.loops if proc == "classify"]  # a switch is not a loop
    if flags[0] == "-O0":  # at -O2 gcc turns this switch into a table of values
        lines = {ln for proc, ln in c.statements if proc == "classify"}
        assert _marker("SWITCH") in lines


def test_nests_without_debug_info(tmp_path: Path) -> None:
    c = canonical(analyze_binary(_build(tmp_path, ["-O3"])))
    nest3 = sorted(p for proc, p in c.loops if proc == "nest3")
    assert nest3 == [("L:0",), ("L:0", "L:0"), ("L:0", "L:0", "L:0")]
    assert [p for proc, p in c.loops if proc == "single"] == [("L:0",)]
    assert not c.inlined
    assert {ln for _, ln in c.statements} == {0}
    assert any(proc == "main" for proc, _ in c.procedures)


def test_fully_stripped_binary(tmp_path: Path) -> None:
    """No symbols and no DWARF: procedures come from .eh_frame FDEs (named ``targ<addr>``, as
    hpcstruct names them), loops from the machine code, no lines."""
    if shutil.which("strip") is None:
        pytest.skip("strip is not installed")
    exe = _build(tmp_path, ["-O2", "-g"])
    ref = canonical(analyze_binary(exe))
    subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    c = canonical(analyze_binary(exe))
    names = [p for p, _ in c.procedures]
    assert any(n.startswith("targ") and not n.endswith("@plt") for n in names)
    # The same entries as with symbols for the program's own functions (crt's helpers such as
    # deregister_tm_clones have no FDE) ...
    ref_entries = {a for n, a in ref.procedures if n in ("nest3", "single", "classify", "main")}
    assert len(ref_entries) == 4
    assert ref_entries <= {a for _, a in c.procedures}
    # ... and the same loop nests, without lines.
    depth = sorted(len(p) for _, p in c.loops.elements())
    assert depth == sorted(len([x for x in p if x.startswith("L:")])
                           for _, p in ref.loops.elements())
    assert depth == [1, 1, 1, 1, 2, 3]
    assert {ln for _, ln in c.statements} == {0}
