"""Corrupt, truncated and lying databases: one clear error, or a valid read. Never a crash.

Targeted cases check the message names the file and what was wrong, through the real command
(exit status 2, one line, no traceback). A property-based test mutates real databases at random
and asserts that everything callpath reads from them either works or raises CallpathError.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import callpath
from callpath.analysis.columns import ColumnSet
from callpath.analysis.navigate import expand
from callpath.analysis.source import tree_source
from callpath.analysis.view_by_name import make_view
from callpath.errors import CallpathError
from callpath.present.viewreport import records
from conftest import ROOT, V4_DATABASES, run_cli, shared_path


def _copy(name: str, tmp: Path) -> Path:
    src = shared_path("hpctoolkit", "dbase", name)
    dst = tmp / name
    shutil.copytree(src, dst)
    for f in dst.rglob("*"):
        f.chmod(0o644 if f.is_file() else 0o755)
    return dst


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _u64(path: Path, offset: int) -> int:
    return int(struct.unpack_from("<Q", path.read_bytes(), offset)[0])


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "missing profile.db": (lambda d: (d / "profile.db").unlink(), "profile.db",
                           "missing"),
    "wrong magic": (lambda d: _patch(d / "meta.db", 0, b"HPCTOOLKIX"), "meta.db", "bad magic"),
    "wrong format": (lambda d: _patch(d / "cct.db", 10, b"prof"), "cct.db", "format"),
    "unsupported major version": (lambda d: _patch(d / "trace.db", 14, b"\x05"), "trace.db",
                                  "major version 5"),
    "truncated file": (lambda d: (d / "profile.db").write_bytes(
        (d / "profile.db").read_bytes()[:700]), "profile.db", "truncated"),
    "section past the end": (lambda d: _patch(d / "meta.db", 0x40, struct.pack("<Q", 1 << 20)),
                             "meta.db", "past the end"),
    "pointer past the end": (lambda d: _patch(d / "meta.db", 0x48, struct.pack("<Q", 1 << 40)),
                             "meta.db", "past the end"),
    "size field that lies (profile count)": (
        lambda d: _patch(d / "profile.db", _u64(d / "profile.db", 0x18) + 8,
                         struct.pack("<I", 0x7FFFFFFF)), "profile.db", "implausible count"),
    "size field that lies (children)": (
        lambda d: _patch(d / "meta.db", _u64(d / "meta.db", 0x48),
                         struct.pack("<Q", _u64(d / "meta.db", _u64(d / "meta.db", 0x48)) + 8)),
        "meta.db", "context"),
    "empty file": (lambda d: (d / "meta.db").write_bytes(b""), "meta.db", "too short"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corruption_gives_one_clear_line(case: str, tmp_path: Path) -> None:
    db = _copy("small.d", tmp_path)
    corrupt, file_name, needle = CORRUPTIONS[case]
    corrupt(db)
    proc = run_cli("report", str(db))
    assert proc.returncode == 2, proc.stdout
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert file_name in err and needle in err, err


def test_malformed_xml_gives_one_clear_line(tmp_path: Path) -> None:
    src = shared_path("hatchet", "hpctoolkit-cpi-database")
    db = tmp_path / "cpi"
    shutil.copytree(src, db)
    xml = db / "experiment.xml"
    xml.chmod(0o644)
    text = xml.read_text()
    xml.write_text(text[: len(text) // 2])
    proc = run_cli("report", str(db))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "experiment.xml" in err and "Traceback" not in err


def _read_everything(path: Path) -> None:
    """Everything a user can ask of a database: tree, report, every block, traces."""
    exp = callpath.open(path)
    src = tree_source(exp)
    for name in ("top-down", "bottom-up", "flat"):
        view = make_view(name, src)
        cols = ColumnSet(src)
        for k in range(len(exp.metrics)):
            rows = expand(view, 0, lambda k=k, v=view: v.inclusive(k), depth=6, threshold=1.0)
            for _ in records(cols, view, cols.columns[2 * k: 2 * k + 2], rows):
                pass
    for p in range(len(exp.values)):
        blk = exp.values[p]
        blk.dense(0, exp.n_ctx_slots)
    store = exp.context_store()
    for c in range(min(len(store), 4096)):
        store[c].metric_of_values()
    if exp.traces:
        for line in exp.traces.lines:
            np.asarray(line.ctx_ids).sum()


@pytest.mark.parametrize("name", V4_DATABASES)
def test_pristine_databases_read_completely(name: str) -> None:
    _read_everything(shared_path("hpctoolkit", "dbase", name))


MUTATION = st.tuples(
    st.sampled_from(V4_DATABASES),
    st.sampled_from(["meta.db", "profile.db", "cct.db", "trace.db"]),
    st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1,
             max_size=8),
    st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(MUTATION)
def test_random_mutations_read_or_fail_cleanly(tmp_path_factory: pytest.TempPathFactory,
                                               mutation: tuple[str, str,
                                                               list[tuple[float, int]],
                                                               float | None]) -> None:
    name, file_name, edits, cut = mutation
    src = shared_path("hpctoolkit", "dbase", name)
    tmp = tmp_path_factory.mktemp("fuzz")
    db = tmp / name
    shutil.copytree(src, db)
    target = db / file_name
    target.chmod(0o644)
    raw = bytearray(target.read_bytes())
    for where, value in edits:
        raw[int(where * len(raw))] = value
    if cut is not None:
        raw = raw[: int(cut * len(raw))]
    target.write_bytes(bytes(raw))
    try:
        _read_everything(db)
    except CallpathError as e:
        msg = str(e)
        assert "\n" not in msg and msg
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("args", [
    ["report", "{db}", "--flame", "-o", "{db}/meta.db"],
    ["report", "{db}", "--plot", "0", "-o", "{db}/profile.db"],
    ["report", "{db}", "--flame", "-o", "{db}"],
    ["export", "{db}", "--to", "folded", "-o", "{db}/cct.db"],
    ["export", "{db}", "--to", "pprof", "-o", "{db}/trace.db"],
    ["lines", "{db}", "--overview", "--png", "{db}/meta.db"],
    ["report", "{xml}", "--flame", "-o", "{xml}/experiment.xml"],
])
def test_output_over_the_input_database_is_refused(args: list[str], tmp_path: Path) -> None:
    """An output named inside the database being read must not replace its files: the
    database is the user's data and a drawing of it is no substitute."""
    db = _copy("small.d", tmp_path)
    xml = tmp_path / "cpi"
    shutil.copytree(shared_path("hatchet", "hpctoolkit-cpi-database"), xml)
    before = {p: p.read_bytes() for d in (db, xml) for p in d.rglob("*") if p.is_file()}
    proc = run_cli(*[a.format(db=db, xml=xml) for a in args])
    assert proc.returncode == 2, proc.stdout
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "database being read" in err and "expected a path outside it" in err, err
    assert {p: p.read_bytes() for p in before} == before


def test_output_beside_the_database_files_is_allowed(tmp_path: Path) -> None:
    db = _copy("small.d", tmp_path)
    proc = run_cli("report", str(db), "--flame", "-o", str(db / "flame.svg"))
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in (db / "flame.svg").read_text()[:300]


@pytest.mark.parametrize("args, needle", [
    (["prof", "-o", "{meas}", "{meas}"], "{meas}: holds a measurement"),
    (["import", "{folded}", "-o", "{meas}"], "{meas}: holds a measurement"),
    (["merge", "-o", "{meas}", "{db}", "{db}"], "{meas}: holds a measurement"),
    (["diff", "-o", "{xml}", "{db}", "{db}"], "{xml}: holds an experiment.xml database"),
    (["prof", "-o", "", "{meas}"], "database directory '': expected a directory path"),
    (["import", "{folded}", "-o", ""], "database directory '': expected a directory path"),
    (["diff", "-o", "", "{db}", "{db}"], "database directory '': expected a directory path"),
    (["profile", "-m", "{tmp}/x", "-o", "{tmp}/x", "--", "true"],
     "-o {tmp}/x: is also the measurement directory (-m)"),
    (["profile", "-o", "{folded}", "--", "true"],
     "{folded}: cannot create the database directory: File exists"),
    (["run", "-o", "{db}", "--", "true"], "{db}: holds a database"),
    (["run", "-o", "{xml}", "--", "{py}"], "{xml}: holds a database"),
])
def test_database_written_over_other_data_is_refused(args: list[str], needle: str,
                                                     tmp_path: Path) -> None:
    """A database is never mixed into a measurement or an experiment.xml database, and ''
    is not taken for the current directory (it scattered a database among the user's
    files); nothing in those directories changes."""
    db = _copy("small.d", tmp_path)
    meas = tmp_path / "small.m"
    shutil.copytree(shared_path("hpctoolkit", "meas", "small.m"), meas)
    xml = tmp_path / "cpi"
    shutil.copytree(shared_path("hatchet", "hpctoolkit-cpi-database"), xml)
    folded = tmp_path / "stacks.folded"
    folded.write_text("main;work 10\nmain;idle 3\n")
    work = tmp_path / "cwd"
    work.mkdir()
    py = tmp_path / "x.py"
    py.write_text("print(1)\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    names = {"meas": meas, "db": db, "xml": xml, "folded": folded, "tmp": tmp_path, "py": py}
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "callpath", *[a.format(**names) for a in args]],
                          capture_output=True, text=True, cwd=work, timeout=120, env=env,
                          check=False)
    assert proc.returncode == 2, proc.stdout
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle.format(**names) in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_export_to_an_empty_file_name_is_one_line(tmp_path: Path) -> None:
    """-o '' raised ValueError from pathlib (a traceback) when the temporary name was made."""
    proc = run_cli("export", str(shared_path("hpctoolkit", "dbase", "small.d")), "--to",
                   "folded", "-o", "")
    assert proc.returncode == 2, proc.stdout
    err = proc.stderr.strip()
    assert err == "callpath: error: -o '': expected a file name ('-' for standard output)", err
