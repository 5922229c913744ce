"""Python structure from cached bytecode (``structure/python_code.py``) against the ``ast``
reader, on the standard library of the interpreter running the tests (3.11, 3.12 and 3.13 in
CI's matrix): the location-table decoder against ``co_positions``, the structure against
``structure_of_python`` line by line, the ``.pyc`` checks that keep a stale file out."""

from __future__ import annotations

import os
import py_compile
import shutil
import sysconfig
from pathlib import Path
from types import CodeType

import numpy as np
import pytest

from callpath.model.structure import Kind, Structure
from callpath.structure.ondemand import python_structures
from callpath.structure.python_ast import structure_of_python
from callpath.structure.python_code import cached_code, locations, structure_from_bytecode

pytestmark = pytest.mark.core

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    files = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 2000)
    if len(files) < 50:
        pytest.skip(f"the standard library at {STDLIB} has {len(files)} modules (expected 50+)")
    return files


def _codes(top: CodeType) -> list[CodeType]:
    out, stack = [], [top]
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(reversed([x for x in c.co_consts if isinstance(x, CodeType)]))
    return out


def test_location_table_decoded_as_co_positions() -> None:
    """Every code unit of every code object of the standard library's modules: the line, end
    line and column that ``locations`` decodes from ``co_linetable`` are ``co_positions``'."""
    units = 0
    for f in _stdlib_files():
        codes = _codes(compile(f.read_bytes(), str(f), "exec"))
        loc = locations(codes)
        want = np.array([(k, p[0] or 0, p[1] or 0, -1 if p[2] is None else p[2])
                         for k, c in enumerate(codes) for p in c.co_positions()],
                        dtype=np.int64).reshape(-1, 4)
        n = np.diff(np.concatenate([loc.unit, [len(want)]]))
        got = np.stack([np.repeat(loc.code, n), np.repeat(loc.line, n),
                        np.repeat(loc.end_line, n), np.repeat(loc.col, n)], axis=1)
        assert got.shape == want.shape, f
        bad = np.flatnonzero((got != want).any(axis=1))
        assert len(bad) == 0, (f, got[bad[:3]].tolist(), want[bad[:3]].tolist())
        units += len(want)
    assert units > 100_000


def _facts(s: Structure, lines: list[int]) -> dict[int, tuple[int, tuple[int, ...], str] | None]:
    out: dict[int, tuple[int, tuple[int, ...], str] | None] = {}
    for ln, x in zip(lines, s.lookup(np.array(lines, dtype=np.uint64)).tolist(), strict=True):
        if x < 0:
            out[ln] = None
            continue
        chain = s.chain(x)
        out[ln] = (int(s.line[chain[0]]) if s.kind[chain[0]] == Kind.STMT else 0,
                   tuple(int(s.line[c]) for c in chain if s.kind[c] == Kind.LOOP),
                   next(s.text(int(s.name[c])) for c in chain if s.kind[c] == Kind.PROC))
    return out


def test_bytecode_structure_is_the_ast_structure(tmp_path: Path) -> None:
    """The standard library's modules, compiled as an import would (``__pycache__``): on every
    line that holds an instruction, the procedure, the loops around it and its statement's
    first line from the bytecode are those from the ``ast``, but for a handful of lines in
    70,000 (measured: 3.11: 12 statements, 2 procedures; 3.13: 39 and 4, a conditional
    expression over three lines, ``match`` cases, the functions of PEP 695's type parameters).
    Lines ``ast`` gives no statement (an ``except`` clause) are left out."""
    lines = differ_stmt = differ_proc = differ_loops = 0
    for f in _stdlib_files():
        src = tmp_path / f.name
        shutil.copyfile(f, src)
        py_compile.compile(str(src), doraise=True)
        b = structure_from_bytecode(src)
        assert b is not None, src
        try:
            a = structure_of_python(src)
        except Exception:  # a module in a syntax of another interpreter
            continue
        code = cached_code(str(src), src.read_bytes(), src.stat())
        assert code is not None
        loc = locations(_codes(code))
        have = sorted(set(loc.line[loc.line > 0].tolist()))
        fa, fb = _facts(a, have), _facts(b, have)
        for ln in have:
            x, y = fa[ln], fb[ln]
            if x is None:
                continue
            lines += 1
            assert y is not None, (src, ln)
            differ_stmt += x[0] != y[0]
            differ_loops += x[1] != y[1]
            differ_proc += x[2] != y[2]
    assert lines > 40_000
    assert differ_stmt <= lines * 0.002, (differ_stmt, lines)
    assert differ_loops <= lines * 0.0002, (differ_loops, lines)
    assert differ_proc <= lines * 0.0002, (differ_proc, lines)


def test_sampled_lines_only(tmp_path: Path) -> None:
    """Given the lines a measurement saw, the structure holds only their statements (with
    every procedure and loop), and maps those lines as the whole structure does."""
    src = tmp_path / "argparse_copy.py"
    shutil.copyfile(STDLIB / "argparse.py", src)
    py_compile.compile(str(src), doraise=True)
    whole = structure_from_bytecode(src)
    assert whole is not None
    sampled = [120, 121, 1500, 1501, 1502, 2000, 2400]
    part = structure_from_bytecode(src, np.array(sampled))
    assert part is not None
    n_stmt = int((part.kind == Kind.STMT).sum())
    assert 0 < n_stmt <= len(sampled) < int((whole.kind == Kind.STMT).sum())
    assert (part.kind == Kind.PROC).sum() == (whole.kind == Kind.PROC).sum()
    assert (part.kind == Kind.LOOP).sum() == (whole.kind == Kind.LOOP).sum()
    assert _facts(part, sampled) == _facts(whole, sampled)


def test_stale_or_foreign_pyc_is_not_used(tmp_path: Path) -> None:
    """A ``.pyc`` older than its source, or written by another interpreter, is never read:
    ``python_structures`` parses the source then, and the structure is the current file's."""
    src = tmp_path / "mod.py"
    src.write_text("def f(n):\n    t = 0\n    for i in range(n):\n        t += i\n    return t\n")
    written = py_compile.compile(str(src), doraise=True)
    assert written is not None
    pyc = Path(written)
    assert structure_from_bytecode(src) is not None
    src.write_text("def g(n):\n    t = 0\n    while n:\n        n -= 1\n        t += n\n"
                   "    return t\n")
    os.utime(src, (src.stat().st_atime, src.stat().st_mtime + 5))
    assert structure_from_bytecode(src) is None  # the .pyc is of the old source
    got = python_structures({str(src): np.array([4, 5])}, 1, user_cache=False)[str(src)]
    assert _facts(got, [4])[4] == (4, (3,), "g")
    py_compile.compile(str(src), doraise=True)
    data = bytearray(pyc.read_bytes())
    data[0] ^= 0xFF  # another interpreter's magic number
    pyc.write_bytes(bytes(data))
    assert structure_from_bytecode(src) is None


def test_profile_of_an_imported_module_from_its_bytecode(tmp_path: Path) -> None:
    """``callpath profile`` of a program whose module was imported from ``__pycache__`` (as
    installed packages are): the module's loops and statements in the report, from the
    bytecode structure, as the ``ast`` gives them for the main script beside it."""
    import subprocess
    import sys

    (tmp_path / "helper.py").write_text(
        "def spin(n):\n"
        "    total = 0\n"
        "    for i in range(n):\n"
        "        total += (i * i\n"
        "                  % 7)\n"
        "    return total\n")
    py_compile.compile(str(tmp_path / "helper.py"), doraise=True)
    (tmp_path / "main.py").write_text(
        "import helper\n"
        "t = 0\n"
        "while t < 40_000_000:\n"
        "    t += helper.spin(2_000_000)\n"
        "print(t)\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "callpath", "profile", "-o", str(tmp_path / "db"),
                        "--", sys.executable, "main.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = subprocess.run([sys.executable, "-m", "callpath", "report", str(tmp_path / "db"),
                          "-d", "12"], capture_output=True, text=True, timeout=120, env=env)
    assert rep.returncode == 0, rep.stderr
    assert "loop at main.py:3" in rep.stdout, rep.stdout
    assert "loop at helper.py:3" in rep.stdout, rep.stdout
    # the statement over lines 4-5 is one scope at its first line; no line 5 of its own
    assert "helper.py:4" in rep.stdout and "helper.py:5" not in rep.stdout, rep.stdout
