"""A statement's own source file through hpcstruct XML: ``S`` and ``C`` carry no file, so a
statement of another file than its procedure's (an included loop body here; glibc's
``__brk`` at ``brk.c`` inside ``brk_call.h`` in the field) goes out inside a guard alien and
comes back with its own file, the whole structure reading back as it was written; hpcstruct's
own guards at the procedure's file (its lines outside the procedure) stay aliens."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
from callpath.structure.binary import analyze_binary
from callpath.structure.model import Kind, Structure

PROGRAMS = Path(__file__).parent / "struct_programs"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hpctoolkit" / "struct"


@pytest.fixture(scope="module")
def included(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("struct-included") / "included"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(out), str(PROGRAMS / "included.c")],
                   check=True)
    return out


def _texts(s: Structure, col: str) -> list[str | None]:
    return [s.strings[i] if i >= 0 else None for i in getattr(s, col).tolist()]


def _assert_same(a: Structure, b: Structure) -> None:
    """Every column equal, strings compared as text (the reader numbers them its own way)."""
    for col in ("kind", "parent", "line", "call_line", "target", "range_ptr", "range_lo",
                "range_hi", "map_lo", "map_hi", "map_scope"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    for col in ("name", "link_name", "file", "call_file"):
        x, y = _texts(a, col), _texts(b, col)
        bad = [(i, x[i], y[i]) for i in range(len(x)) if x[i] != y[i]]
        assert not bad, (col, bad[:5])
    assert (a.path, a.has_calls) == (b.path, b.has_calls)


def _stmt_files(s: Structure, proc: str) -> set[tuple[str, int]]:
    """(file's base name, line) of the statements of procedure ``proc``."""
    out = set()
    procs = s.enclosing(range(len(s)), Kind.PROC)
    for i in np.flatnonzero(s.kind == Kind.STMT).tolist():
        p = int(procs[i])
        if p >= 0 and s.text(int(s.name[p])) == proc and s.file[i] >= 0:
            out.add((Path(s.text(int(s.file[i]))).name, int(s.line[i])))
    return out


def test_statements_of_another_file_read_back_with_their_file(included: Path,
                                                              tmp_path: Path) -> None:
    s = analyze_binary(included)
    body = {("included_body.h", line) for line in (2, 3, 4)}
    assert body <= _stmt_files(s, "work")  # what the binary's line table says
    out = tmp_path / "included.hpcstruct"
    write_hpcstruct_file([s], out)
    text = out.read_text(encoding="utf-8")
    assert 'n="&lt;inline&gt;"' in text and "included_body.h" in text
    back = read_hpcstruct(out, cache=False)[0]
    assert body <= _stmt_files(back, "work")
    assert not any(back.text(int(back.name[i])) == "<inline>"
                   for i in np.flatnonzero(back.kind == Kind.ALIEN).tolist())
    _assert_same(s, back)


def test_a_library_reads_back_as_written(tmp_path: Path) -> None:
    """libc's ~4,000 statements of another file than their procedure's (``__brk`` among
    them), and everything else, through the XML unchanged."""
    libc = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/libc.so.6"),
                             Path("/lib64/libc.so.6")) if p.is_file()), None)
    if libc is None:
        pytest.skip("no libc.so.6 at the usual paths")
    s = analyze_binary(libc)
    out = tmp_path / "libc.hpcstruct"
    write_hpcstruct_file([s], out)
    assert out.read_text(encoding="utf-8").count('n="&lt;inline&gt;"') > 100
    _assert_same(s, read_hpcstruct(out, cache=False)[0])


def test_hpcstructs_guards_at_the_procedures_file_stay_aliens() -> None:
    path = DATA / "inlines+loops-x86_64-gcc12-dr.hpcstruct"
    if not path.is_file():
        pytest.skip(f"{path} is not there (../shared/data)")
    guards = path.read_text(encoding="utf-8").count('n="&lt;inline&gt;"')
    s = read_hpcstruct(path, cache=False)[0]
    aliens = [i for i in np.flatnonzero(s.kind == Kind.ALIEN).tolist()
              if s.text(int(s.name[i])) == "<inline>"]
    assert guards > 0 and len(aliens) == guards
