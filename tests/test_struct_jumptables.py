"""Jump tables: a dense ``switch`` in a loop, compiled by gcc ``-O2`` into an indirect jump
through a table (position-independent offsets, and absolute addresses without PIE). The loop is
found only if the table is resolved: every case is a successor of the indirect jump, and the
cases' back edges to the loop header close the loop."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import callpath.structure.binary as binary_mod
from callpath.structure.binary import analyze_binary
from callpath.structure.model import Kind, Structure

SRC = Path(__file__).parent / "struct_programs" / "jumptab.c"


def _marker(name: str) -> int:
    for i, line in enumerate(SRC.read_text().splitlines(), 1):
        if f"/* {name} */" in line:
            return i
    raise AssertionError(name)


def _build(tmp: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp / "jumptab"
    subprocess.run(["gcc", "-O2", "-g", *flags, "-o", str(out), str(SRC)], check=True)
    return out


def _interpret(s: Structure) -> tuple[list[int], list[tuple[int, int]]]:
    """Loops of ``interpret`` (their lines), and (line, enclosing loop) of its statements."""
    procs = [i for i in range(len(s)) if s.kind[i] == Kind.PROC
             and s.text(int(s.name[i])) == "interpret"]
    assert len(procs) == 1
    inside = [i for i in range(len(s)) if int(s.enclosing([i], Kind.PROC)[0]) == procs[0]]
    loops = [int(s.line[i]) for i in inside if s.kind[i] == Kind.LOOP]
    stmts = [(int(s.line[i]), int(s.enclosing([i], Kind.LOOP)[0])) for i in inside
             if s.kind[i] == Kind.STMT]
    return loops, stmts


@pytest.mark.parametrize("flags", [[], ["-fno-pie", "-no-pie"]], ids=["pie", "no-pie"])
def test_switch_in_loop_at_O2(tmp_path: Path, flags: list[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _build(tmp_path, *flags)
    if shutil.which("objdump"):
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)],
                             capture_output=True, text=True, check=True).stdout
        body = dis.split("<interpret>:", 1)[1].split("\n\n", 1)[0]
        assert "jmp    *" in body or "notrack jmp" in body, "gcc emitted no jump table"
    loops, stmts = _interpret(analyze_binary(exe))
    assert loops == [_marker("LOOP_PC")]
    # The cases are inside the loop (they are reached only through the table).
    case_lines = {_marker("CASE_MUL"), _marker("CASE_SQUARE")}
    got = {ln for ln, lp in stmts if lp >= 0}
    assert case_lines <= got, (case_lines, stmts)

    # Control: without table resolution the indirect jump has no successors and the loop
    # disappears — so the loop above really depends on the resolved table.
    monkeypatch.setattr(binary_mod, "resolve_tables", lambda *a, **k: {})
    loops_off, _ = _interpret(analyze_binary(exe))
    assert _marker("LOOP_PC") not in loops_off
