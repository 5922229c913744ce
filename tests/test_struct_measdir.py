"""``callpath struct MEASDIR`` on real measurement directories.

A C program is compiled here with gcc and really measured with ``callpath run`` (perf_event),
started twice by a shell;
a Python script is really measured with ``python -m callpath.measure.python``. ``callpath
struct`` must then analyse every load module the run used (the program, libc, the dynamic
loader, the vdso image the run saved), each once, in parallel, into ``MEASDIR/structs/``, and a
second run must take every module from the cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from callpath.formats import measdir
from callpath.formats.hpcstruct import read_hpcstruct
from callpath.structure.driver import measurement_structures
from callpath.structure.model import Kind, Structure
from conftest import ROOT, perf_reason, run_cli

PROGRAMS = ROOT / "tests" / "struct_programs"


def _marker(src: Path, name: str) -> int:
    for i, line in enumerate(src.read_text().splitlines(), 1):
        if f"/* {name} */" in line or f"# {name}" in line:
            return i
    raise AssertionError(name)


def _compile(src: Path, out: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", "-O2", "-g", *flags, "-o", str(out), str(src)], check=True)
    return out


def _measure(tmp: Path, exe: Path, name: str, twice: bool = False) -> Path:
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp / name
    cmd = [str(exe), "3000000"]
    if twice:  # three processes (the shell, two runs): libc is used by each
        cmd = ["/bin/sh", "-c", f"{exe} 3000000 && {exe} 3000000"]
    p = run_cli("run", "-o", str(d), "--", *cmd)
    assert p.returncode == 0, p.stderr
    return d


def _struct(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("struct", *args, env={"XDG_CACHE_HOME": str(cache)})


def _by_module(d: Path) -> dict[str, Structure]:
    out: dict[str, Structure] = {}
    for f in sorted((d / "structs").glob("*.hpcstruct")):
        (s,) = read_hpcstruct(f)
        assert s.path not in out, f"{s.path} analysed twice"
        out[s.path] = s
    return out


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A per-user cache that the first test fills, so later ones skip re-analysing libc."""
    return tmp_path_factory.mktemp("struct-cache")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("struct-measdir")
    exe = _compile(PROGRAMS / "calls.c", tmp / "calls")
    return exe, _measure(tmp, exe, "meas", twice=True)


def test_every_module_once_then_from_the_cache(measured: tuple[Path, Path], tmp_path: Path,
                                               warm_cache: Path) -> None:
    exe, d = measured
    m = measdir.read(d)
    used = {mod.path for p in m.processes for mod in p.modules}
    assert str(exe) in used and any("libc.so" in u for u in used), used
    with_libc = [p for p in m.processes if any("libc.so" in x.path for x in p.modules)]
    assert len(with_libc) >= 2  # the shell and the program: analysed once all the same
    cache = tmp_path / "cache"

    p = _struct(cache, "-v", "-j", "2", str(d))
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.endswith(": analysed")]
    got = _by_module(d)
    # Every module the run mapped, each once (one file per build-id), all analysed now.
    assert set(got) == used, (set(got) ^ used)
    assert len(lines) == len(used), p.stderr
    # The vdso has no file: its image was saved by the run and analysed from there.
    saved = [mod for q in m.processes for mod in q.modules if mod.saved]
    for mod in saved:
        assert (got[mod.path].kind == Kind.PROC).sum() >= 1, mod.path

    # The program's structure is the real thing: its loop, its call sites and their targets.
    src = PROGRAMS / "calls.c"
    prog = got[str(exe)]
    targets = prog.call_targets()
    calls = {(int(prog.line[i]), prog.text(int(prog.name[targets[i]])))
             for i in range(len(prog)) if prog.kind[i] == Kind.CALL and targets[i] >= 0}
    assert (_marker(src, "CALL_STEP"), "step") in calls
    assert _marker(src, "LOOP_RUN") in {int(prog.line[i]) for i in range(len(prog))
                                        if prog.kind[i] == Kind.LOOP}
    libc = next(s for path, s in got.items() if "libc.so" in path)
    # The index tells a consumer (callpath prof) which file holds which module.
    indexed = measurement_structures(d)
    assert set(indexed) == used
    assert len(indexed[str(exe)]) == len(prog)
    assert (libc.kind == Kind.PROC).sum() > 1000 and (libc.kind == Kind.LOOP).sum() > 100

    # Second run: every module comes from the cache, and MEASDIR/structs is left as it was.
    stamps = {f.name: f.stat().st_mtime_ns for f in (d / "structs").iterdir()}
    p = _struct(cache, "-v", str(d))
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(": from the cache") == len(used) and ": analysed" not in p.stderr
    assert {f.name: f.stat().st_mtime_ns for f in (d / "structs").iterdir()} == stamps

    # Without MEASDIR/structs, the per-user cache fills it again, without any analysis; -o
    # gathers every module into one file.
    shutil.rmtree(d / "structs")
    out = tmp_path / "all.hpcstruct"
    p = _struct(cache, "-v", str(d), "-o", str(out))
    assert p.returncode == 0 and ": analysed" not in p.stderr, p.stderr
    assert set(_by_module(d)) == used
    assert {s.path for s in read_hpcstruct(out)} == used
    shutil.copytree(cache, warm_cache, dirs_exist_ok=True)


def test_rebuilt_or_missing_module_is_reported(tmp_path: Path, warm_cache: Path) -> None:
    exe = _compile(PROGRAMS / "calls.c", tmp_path / "calls2")
    d = _measure(tmp_path, exe, "meas2")
    cache = warm_cache
    _compile(PROGRAMS / "calls.c", exe, "-O0")  # a new build-id at the same path
    p = _struct(cache, str(d))
    assert p.returncode == 2
    assert "calls2" in p.stderr and "differs from" in p.stderr and "rebuilt" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert any("libc.so" in s for s in _by_module(d))  # the other modules are still there
    assert str(exe) not in measurement_structures(d)
    exe.unlink()
    p = _struct(cache, str(d))
    assert p.returncode == 2 and "calls2: load module not found" in p.stderr


def test_python_measurement_sources(tmp_path: Path) -> None:
    script = ROOT / "tests" / "struct_programs" / "pyloops.py"
    d = tmp_path / "pymeas"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "callpath.measure.python", "-q", "-o", str(d),
                        str(script)], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    if p.returncode != 0 and "not available" in p.stderr:
        pytest.skip(f"Python sampling is not available here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    m = measdir.read(d)
    assert any(c.file == str(script) for q in m.processes for c in q.pycode)
    r = _struct(tmp_path / "cache", "-v", str(d))
    assert r.returncode == 0, r.stderr
    got = _by_module(d)
    s = got[str(script)]
    procs = {s.text(int(s.name[i])) for i in range(len(s)) if s.kind[i] == Kind.PROC}
    assert {"<module>", "work"} <= procs
    inner = int(s.lookup([_marker(script, "INNER")])[0])
    assert Kind(s.kind[s.parent[inner]]) == Kind.LOOP
    assert int(s.line[s.parent[inner]]) == _marker(script, "LOOP_WORK")
