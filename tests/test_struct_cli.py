"""``callpath struct`` through the real command line: outputs, bad input, Python sources."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.errors import CallpathError
from callpath.formats.hpcstruct import read_hpcstruct
from callpath.structure.dwarf_lines import decode_line_tables
from callpath.structure.model import Kind
from callpath.structure.python_ast import structure_of_python
from conftest import ROOT, run_cli, shared_path

DR = "inlines+loops-x86_64-gcc12-dr"


def _env_cli(tmp: Path, *args: str) -> tuple[int, str, str]:
    p = run_cli("struct", *args, env={"XDG_CACHE_HOME": str(tmp / "cache")})
    return p.returncode, p.stdout, p.stderr


def test_struct_writes_readable_xml(tmp_path: Path) -> None:
    binary = shared_path("hpctoolkit", "bin", DR)
    out = tmp_path / "x.hpcstruct"
    rc, _, err = _env_cli(tmp_path, str(binary), "-o", str(out))
    assert rc == 0, err
    text = out.read_text()
    assert '<A i="' in text and 'n="f4_inline"' in text and "<L " in text
    s = read_hpcstruct(out)[0]
    assert s.path.endswith(DR)
    assert (s.kind == Kind.LOOP).sum() == 11
    # The second run comes from the per-user cache and gives the same file.
    out2 = tmp_path / "y.hpcstruct"
    rc, _, _ = _env_cli(tmp_path, str(binary), "-o", str(out2))
    assert rc == 0 and list((tmp_path / "cache").rglob("*.hpcstruct"))
    assert read_hpcstruct(out2)[0].line.tolist() == s.line.tolist()


def test_bad_modules_are_reported_and_the_rest_written(tmp_path: Path) -> None:
    good = shared_path("hpctoolkit", "bin", "recursion-x86_64-gcc12-0")
    data = good.read_bytes()
    (tmp_path / "notelf").write_bytes(b"#!/bin/sh\necho hello\n")
    (tmp_path / "trunc.so").write_bytes(data[:3000])
    arm = bytearray(data)
    arm[18:20] = (183).to_bytes(2, "little")  # e_machine = EM_AARCH64
    (tmp_path / "arm.so").write_bytes(bytes(arm))
    out = tmp_path / "all.hpcstruct"
    rc, _, err = _env_cli(tmp_path, str(good), str(tmp_path / "notelf"),
                          str(tmp_path / "trunc.so"), str(tmp_path / "arm.so"),
                          str(tmp_path / "missing"), "-o", str(out), "--no-cache")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 4 and "Traceback" not in err
    assert "notelf" in err and "not an ELF file" in err
    assert "trunc.so" in err and "arm.so" in err and "unsupported architecture" in err
    assert "missing" in err and "cannot open" in err
    assert len(read_hpcstruct(out)) == 1


def test_corrupt_dwarf_is_one_line(tmp_path: Path) -> None:
    data = bytearray(shared_path("hpctoolkit", "bin", DR).read_bytes())
    from elftools.elf.elffile import ELFFile
    with open(shared_path("hpctoolkit", "bin", DR), "rb") as f:
        sec = ELFFile(f).get_section_by_name(".debug_line")
        off, size = sec["sh_offset"], sec["sh_size"]
    data[off + 4:off + 6] = (77).to_bytes(2, "little")  # line table version 77
    bad = tmp_path / "badline.so"
    bad.write_bytes(bytes(data))
    rc, _, err = _env_cli(tmp_path, str(bad), "-o", str(tmp_path / "o"), "--no-cache")
    assert rc == 2 and "badline.so" in err and ".debug_line version 77" in err
    assert size > 0


def test_malformed_xml_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.hpcstruct"
    p.write_text("<HPCToolkitStructure><LM n='x' has-calls='0'><S l='1'/></LM>"
                 "</HPCToolkitStructure>")
    try:
        read_hpcstruct(p)
    except CallpathError as e:
        assert "bad.hpcstruct" in str(e) and "<S> inside <LM>" in str(e)
    else:
        raise AssertionError("accepted an S directly inside an LM")
    p.write_text("<HPCToolkitStructure><LM")
    try:
        read_hpcstruct(p)
    except CallpathError as e:
        assert "malformed XML" in str(e)
    else:
        raise AssertionError("accepted truncated XML")


def test_python_source_structure(tmp_path: Path) -> None:
    src = tmp_path / "prog.py"
    src.write_text(
        "import math\n"                       # 1
        "def f(n):\n"                         # 2
        "    t = 0\n"                         # 3
        "    for i in range(n):\n"            # 4
        "        t += sum(\n"                 # 5
        "            j for j in range(i))\n"  # 6
        "    return t\n"                      # 7
        "class C:\n"                          # 8
        "    def m(self):\n"                  # 9
        "        def g():\n"                  # 10
        "            while True:\n"           # 11
        "                break\n"             # 12
        "        return g\n")                 # 13
    s = structure_of_python(src)
    procs = {s.text(int(s.name[i])) for i in range(len(s)) if s.kind[i] == Kind.PROC}
    assert procs == {"<module>", "f", "C.m", "C.m.<locals>.g"}
    got = s.lookup([1, 3, 6, 12, 13])
    assert [int(s.line[i]) for i in got] == [1, 3, 5, 12, 13]
    assert [Kind(s.kind[s.parent[i]]).name for i in got] == ["PROC", "PROC", "LOOP", "LOOP",
                                                           "PROC"]
    loop6 = int(s.parent[got[2]])
    assert Kind(s.kind[s.parent[loop6]]) == Kind.LOOP  # the generator inside the for loop
    # And through the command line, into the same XML.
    rc, out, err = _env_cli(tmp_path, str(src), "-o", "-", "--no-cache")
    assert rc == 0, err and "C.m.&lt;locals&gt;.g" in out
    (tmp_path / "bad.py").write_text("def f(:\n")
    rc, _, err = _env_cli(tmp_path, str(tmp_path / "bad.py"), "-o", "-", "--no-cache")
    assert rc == 2 and "not valid Python at line 1" in err


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(min_value=0, max_value=60))
def test_line_decoder_fuzz(blob: bytes, cut: int) -> None:
    """Arbitrary or truncated bytes give a FormatError or a table, never another exception."""
    real = _real_debug_line()
    data = real[:cut] + blob if cut else blob
    try:
        t = decode_line_tables(data, [(0, "/x")], path="fuzz")
    except CallpathError:
        return
    assert len(t.address) == len(t.line)


_CACHE: dict[str, bytes] = {}


def _real_debug_line() -> bytes:
    if "d" not in _CACHE:
        from callpath.structure.elf import open_elf
        m = open_elf(shared_path("hpctoolkit", "bin", DR))
        _CACHE["d"] = m.section_bytes(".debug_line") or b""
        m.close()
    return _CACHE["d"]


def test_progress_bar_only_on_a_terminal() -> None:
    import io

    from callpath.structure.driver import Job, ProgressBar, Result

    r = Result(Job("/lib/libfoo.so", "/lib/libfoo.so", []), None, None)
    quiet = io.StringIO()
    bar = ProgressBar(quiet)  # a StringIO is not a terminal
    bar(1, 2, r)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    bar = ProgressBar(shown, enabled=True)
    bar(1, 2, r)
    bar(2, 2, r)
    text = shown.getvalue()
    assert "1/2 libfoo.so" in text and "2/2" in text and text.endswith("\n")
    assert "[" + "#" * 30 + "]" in text


def test_cache_entries_of_another_analysis_version_are_recomputed(tmp_path: Path) -> None:
    binary = shared_path("hpctoolkit", "bin", "recursion-x86_64-gcc12-0")
    rc, _, err = _env_cli(tmp_path, str(binary), "-v", "-o", str(tmp_path / "a.hpcstruct"))
    assert rc == 0 and ": analysed" in err
    rc, _, err = _env_cli(tmp_path, str(binary), "-v", "-o", str(tmp_path / "b.hpcstruct"))
    assert rc == 0 and ": from the cache" in err
    (entry,) = (tmp_path / "cache").rglob("*.hpcstruct")
    text = entry.read_text()
    assert "<!-- callpath struct analysis " in text
    entry.write_text(text.replace("callpath struct analysis", "callpath struct analysis 0 was"))
    rc, _, err = _env_cli(tmp_path, str(binary), "-v", "-o", str(tmp_path / "c.hpcstruct"))
    assert rc == 0 and ": analysed" in err
    assert read_hpcstruct(tmp_path / "c.hpcstruct")[0].has_calls


def test_measdir_and_option_mistakes_are_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-measurement"
    empty.mkdir()
    rc, _, err = _env_cli(tmp_path, str(empty))
    assert rc == 2 and "measurement.json" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    binary = shared_path("hpctoolkit", "bin", "recursion-x86_64-gcc12-0")
    rc, _, err = _env_cli(tmp_path, str(empty), str(binary))
    assert rc == 2 and "must be the only input" in err
    rc, _, err = _env_cli(tmp_path, str(binary), "-j", "0")
    assert rc == 2 and "-j 0" in err
    # an output in a directory that does not exist names that file and directory, not the
    # temporary file written beside it, and leaves nothing behind
    out = tmp_path / "no-such-dir" / "x.hpcstruct"
    rc, _, err = _env_cli(tmp_path, str(binary), "-o", str(out))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{out}: cannot write the structure file: the directory {out.parent} does not " \
           "exist" in err and ".tmp" not in err


def test_unreadable_input_names_the_file(tmp_path: Path) -> None:
    """A file that opens but cannot be read (EIO from /proc/self/mem at offset 0) said only
    'callpath: error: Input/output error', naming no file."""
    rc, _, err = _env_cli(tmp_path, "/proc/self/mem", "-o", "-", "--no-cache")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "/proc/self/mem: cannot read: Input/output error" in err, err


def test_output_over_an_input_is_refused(tmp_path: Path) -> None:
    """'struct -o prog prog' replaced the binary it analysed with XML; an output at the top
    of the input measurement directory would replace measurement files the same way."""
    binary = tmp_path / "prog"
    binary.write_bytes(shared_path("hpctoolkit", "bin", "recursion-x86_64-gcc12-0").read_bytes())
    before = binary.read_bytes()
    for out in (str(binary), str(tmp_path / "." / "prog")):
        rc, _, err = _env_cli(tmp_path, str(binary), "-o", out)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"-o {out}: is the input {binary}" in err, err
    assert binary.read_bytes() == before
    meas = tmp_path / "meas"
    meas.mkdir()
    (meas / "measurement.json").write_text("{}")
    rc, _, err = _env_cli(tmp_path, str(meas), "-o", str(meas / "measurement.json"))
    assert rc == 2 and "would overwrite a file of the measurement directory" in err, err
    assert (meas / "measurement.json").read_text() == "{}"
    rc, _, err = _env_cli(tmp_path, str(binary), "-o", "")
    assert rc == 2 and "-o '': expected a file name" in err, err


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def test_struct_worker_killed_is_one_line(tmp_path: Path) -> None:
    """A worker process that dies (as under the out-of-memory killer) ends ``struct -j 2``
    with a one-line error; a multiprocessing pool used to wait for it forever."""
    libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    ld = next((p for p in (Path("/lib64/ld-linux-x86-64.so.2"),
                           Path("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")) if p.exists()),
              None)
    if not libc.exists() or ld is None:
        pytest.skip("libc.so.6 and the dynamic loader are needed at their Debian paths")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT / "src"))
    p = subprocess.Popen([sys.executable, "-m", "callpath", "struct", "-j", "2", "--no-cache",
                          str(libc), str(ld), "-o", str(tmp_path / "out.hpcstruct")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        workers: list[int] = []
        while not workers and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
            workers = _children(p.pid)
        assert workers, "no worker process appeared"
        os.kill(workers[0], signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2, err
    assert err.strip().splitlines() == [
        "callpath: error: a worker process of the structure analysis died (killed by a "
        "signal; out of memory?)"], err


def test_symbol_names_are_demangled(tmp_path: Path) -> None:
    """A C++ program without debug information: procedures named from the symbol table are
    shown demangled (hpcstruct's n=), the linkage name kept in ln=, as hpcstruct does."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    src = ROOT / "tests" / "field_programs"
    exe = tmp_path / "throw"
    subprocess.run(["g++", "-O2", "-I", str(src), "-o", str(exe), str(src / "throw.cpp")],
                   check=True)
    out = tmp_path / "throw.hpcstruct"
    rc, _, err = _env_cli(tmp_path, str(exe), "-o", str(out))
    assert rc == 0, err
    text = out.read_text()
    assert 'n="level3(double) [throw]" ln="_Z6level3d"' in text, text[:2000]
    assert 'n="main [throw]" ln="main"' in text
