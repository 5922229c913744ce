"""Call sites (hpcstruct's ``C`` scopes): line, target procedure, nesting, and the XML round trip,
on a C program compiled here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
from callpath.structure.binary import analyze_binary
from callpath.structure.canonical import canonical, compare
from callpath.structure.model import Kind, Structure

SRC = Path(__file__).parent / "struct_programs" / "calls.c"


def _marker(name: str) -> int:
    for i, line in enumerate(SRC.read_text().splitlines(), 1):
        if f"/* {name} */" in line:
            return i
    raise AssertionError(name)


@pytest.fixture(scope="module")
def calls_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("struct-calls") / "calls"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(out), str(SRC)], check=True)
    return out


def _sites(s: Structure) -> list[tuple[str, int, str, str]]:
    """(procedure, line, target procedure or '' if indirect/unknown, parent kind) per call."""
    targets = s.call_targets()
    out = []
    for i in range(len(s)):
        if s.kind[i] != Kind.CALL:
            continue
        proc = int(s.enclosing([i], Kind.PROC)[0])
        t = int(targets[i])
        out.append((s.text(int(s.name[proc])), int(s.line[i]),
                    s.text(int(s.name[t])) if t >= 0 else "", Kind(s.kind[s.parent[i]]).name))
    return out


def test_call_sites_have_lines_and_targets(calls_binary: Path, tmp_path: Path) -> None:
    s = analyze_binary(calls_binary)
    assert s.has_calls
    sites = _sites(s)
    # Direct calls: the line of the call and the procedure at the target address.
    assert ("run", _marker("CALL_STEP"), "step", "LOOP") in sites
    assert ("main", _marker("CALL_RUN"), "run", "PROC") in sites
    assert ("main", _marker("CALL_PRINTF"), "printf@plt", "PROC") in sites
    # The call through a function pointer has no static target, inside the same loop.
    assert ("run", _marker("CALL_INDIRECT"), "", "LOOP") in sites
    loop = int(s.enclosing([next(i for i in range(len(s)) if s.kind[i] == Kind.CALL
                                 and s.line[i] == _marker("CALL_STEP"))], Kind.LOOP)[0])
    assert int(s.line[loop]) == _marker("LOOP_RUN")
    # atoi is inlined from stdlib.h: its strtol call sits in the ALIEN called at CALL_ATOI.
    strtol = [i for i in range(len(s)) if s.kind[i] == Kind.CALL
              and s.call_targets()[i] >= 0
              and s.text(int(s.name[s.call_targets()[i]])) == "strtol@plt"]
    assert strtol
    alien = int(s.enclosing(strtol[:1], Kind.ALIEN)[0])
    assert s.text(int(s.name[alien])) == "atoi" and int(s.call_line[alien]) == _marker(
        "CALL_ATOI")
    # A return address minus one lands in the call scope.
    rng = s.ranges(strtol[0])[0]
    assert int(s.lookup([rng[1] - 1])[0]) == strtol[0]

    # Written as <C l= v= t=> and read back with the same sites.
    out = tmp_path / "calls.hpcstruct"
    write_hpcstruct_file([s], out)
    text = out.read_text()
    assert 'has-calls="1"' in text and "<C " in text and ' t="0x' in text
    back = read_hpcstruct(out)[0]
    assert back.has_calls
    assert sorted(_sites(back)) == sorted(sites)
    res = compare(back, s)
    assert res["calls"].percent == 100.0 and res["calls"].ours == len(sites)
    # Every call instruction of the program is a call site, at the address objdump shows.
    if shutil.which("objdump"):
        dis = subprocess.run(["objdump", "-d", str(calls_binary)], capture_output=True,
                             text=True, check=True).stdout
        theirs = sorted(int(ln.split(":")[0], 16) for ln in dis.splitlines()
                        if "\tcall" in ln and ln.startswith(" "))
        ours = sorted(s.ranges(i)[0][0] for i in range(len(s)) if s.kind[i] == Kind.CALL)
        assert ours == theirs
    assert sum(canonical(back).calls.values()) == len(sites)


def test_hpcstruct_files_without_calls_compare_without_them(calls_binary: Path) -> None:
    s = analyze_binary(calls_binary)
    other = analyze_binary(calls_binary)
    other.has_calls = False  # like hpcstruct's CPU files: has-calls="0"
    assert "calls" not in compare(s, other)
    assert "calls" in compare(other, s)
