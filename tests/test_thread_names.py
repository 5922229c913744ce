"""Threads keep their names in the database: a Python pool's ``worker_0``/``worker_1`` and a
``threading.Thread(name="arith")``, and a C program's threads named by
``pthread_setname_np``, label their execution contexts (``THREAD 2 (worker_1)``) and are
what ``report --threads``, ``lines --contexts`` and the selection API match. v4 has no string
per profile, so the names live in ``DB/callpath/context-names.json``; the four v4 files are
what they were, and a names file that does not fit the profiles is not applied."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import callpath
from callpath.analysis.source import select_contexts
from callpath.formats.v4.names import RELPATH
from callpath.formats.v4.writer import write_v4
from conftest import perf_reason, run_cli

PROGRAM = """\
import threading
from concurrent.futures import ThreadPoolExecutor

def busy(n):
    t = 0
    for i in range(n):
        t += i % 7
    return t

th = threading.Thread(target=busy, args=(1_500_000,), name="arith")
th.start()
with ThreadPoolExecutor(max_workers=2, thread_name_prefix="worker") as ex:
    list(ex.map(busy, [1_500_000, 1_500_000]))
th.join()
"""

NATIVE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
static volatile double sink;
static void *work(void *name) {
    pthread_setname_np(pthread_self(), (const char *)name);
    double t = 0;
    for (long i = 0; i < 100000000L; i++) t += (double)(i % 7);
    sink = t;
    return 0;
}
int main(void) {
    pthread_t a, b;
    pthread_create(&a, 0, work, "arith");
    pthread_create(&b, 0, work, "crunch");
    pthread_join(a, 0);
    pthread_join(b, 0);
    printf("%f\n", sink);
    return 0;
}
"""


@pytest.fixture(scope="module")
def pydb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # each thread computes ~0.1 s: ~100 samples at 1 kHz, so a thread missing from the
    # database for want of a sample has odds below e^-100. The pool's second task is
    # submitted while the first runs (no idle worker), so the pool starts worker_1 too.
    d = tmp_path_factory.mktemp("names")
    (d / "prog.py").write_text(PROGRAM)
    out = d / "p.d"
    r = run_cli("profile", "-m", str(d / "p.m"), "-o", str(out), "--", sys.executable,
                str(d / "prog.py"))
    assert r.returncode == 0, r.stderr
    return out


def test_python_thread_names_label_and_select(pydb: Path) -> None:
    exp = callpath.open(pydb)
    names = {c.name: c for c in exp.contexts}
    assert set(names) == {"MainThread", "arith", "worker_0", "worker_1"}, names
    w1 = names["worker_1"]
    assert w1.label(exp.id_names).endswith(" (worker_1)")
    assert select_contexts(exp, "worker_1") == [w1.index]
    assert select_contexts(exp, "worker") == []  # a plain pattern ends where a word ends
    assert sorted(select_contexts(exp, "^worker_", regex=True)) == sorted(
        [names["worker_0"].index, names["worker_1"].index])
    # the selection sums exactly that thread's values
    r = run_cli("report", str(pydb), "--threads", "worker_1", "--format", "json", "-d", "0")
    assert r.returncode == 0, r.stderr
    root = json.loads(r.stdout)[0]
    metric = exp.metrics[0]
    want = float(exp.values_in(w1.index, metric, "execution")[0])
    got = root["metrics"][f"{metric.name} (I)"]
    assert got == pytest.approx(want, rel=1e-9) and want > 0, (root, want)
    r = run_cli("lines", str(pydb), "--contexts", "arith", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["contexts"] == [exp.context_label(names["arith"])]
    r = run_cli("report", str(pydb), "--threads", "nosuch")
    assert r.returncode == 2 and "(worker_0)" in r.stderr, r.stderr


def test_names_live_beside_the_v4_files(pydb: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.d"
    shutil.copytree(pydb, copy)
    doc = json.loads((copy / RELPATH).read_text())
    assert doc["format"] == "callpath-context-names" and len(doc["contexts"]) == 4
    # without the file: the same database, its contexts named by identifiers only
    (copy / RELPATH).unlink()
    plain = callpath.open(copy)
    assert [c.name for c in plain.contexts] == [""] * 4
    assert [c.ids for c in plain.contexts] == [c.ids for c in callpath.open(pydb).contexts]
    # a file whose identifiers do not match a profile's names nothing there
    doc["contexts"][0]["ids"][-1] = [3, 99, 99]
    (copy / RELPATH).write_text(json.dumps(doc))
    got = [c.name for c in callpath.open(copy).contexts]
    assert got[0] == "" and sorted(got[1:]) == sorted(
        c.name for c in callpath.open(pydb).contexts[1:])
    # a malformed file is ignored; writing the database again carries the names
    (copy / RELPATH).write_text("{not json")
    assert [c.name for c in callpath.open(copy).contexts] == [""] * 4
    again = tmp_path / "again.d"
    write_v4(callpath.open(pydb), again)
    assert [c.name for c in callpath.open(again).contexts] == \
        [c.name for c in callpath.open(pydb).contexts]


def test_native_thread_names(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    (tmp_path / "named.c").write_text(NATIVE)
    exe = tmp_path / "named"
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-o", str(exe), str(tmp_path / "named.c")],
                   check=True)
    db = tmp_path / "n.d"
    r = run_cli("profile", "-m", str(tmp_path / "n.m"), "-o", str(db), "--", str(exe))
    assert r.returncode == 0, r.stderr
    assert "arith)" in r.stderr and "crunch)" in r.stderr, r.stderr  # the run summary
    exp = callpath.open(db)
    # the main thread keeps the program's name (the comm it was exec'd with)
    assert sorted(c.name for c in exp.contexts) == ["arith", "crunch", "named"]
    (crunch,) = [c for c in exp.contexts if c.name == "crunch"]
    assert select_contexts(exp, "crunch") == [crunch.index]
    r = run_cli("report", str(db), "--threads", "crunch", "-d", "0")
    assert r.returncode == 0, r.stderr


def test_comparisons_keep_thread_names(pydb: Path, tmp_path: Path) -> None:
    """diff and merge keep each input's thread names on its contexts (under INPUT i)."""
    names = sorted(c.name for c in callpath.open(pydb).contexts)
    for cmd in ("diff", "merge"):
        out = tmp_path / f"{cmd}.d"
        r = run_cli(cmd, str(pydb), str(pydb), "-o", str(out))
        assert r.returncode == 0, r.stderr
        exp = callpath.open(out)
        assert sorted(c.name for c in exp.contexts) == sorted(names * 2), cmd
        r = run_cli("report", str(out), "--threads", "worker_1", "-d", "0")
        assert r.returncode == 0, r.stderr
