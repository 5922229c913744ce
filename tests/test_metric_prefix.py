"""A metric named by a prefix means the same in every command: a Python profile has
``REALTIME (sec)`` and ``REALTIME (samples)``, so ``-m REALTIME`` fits two metrics and must say
so (one line naming both, exit status 2) in ``report``, ``lines`` and ``export`` alike, rather
than 'unknown metric' or a silent pick; a prefix that fits one metric selects it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import callpath
from callpath.analysis.columns import ColumnSet
from callpath.analysis.derived import DerivedMetric
from callpath.analysis.source import tree_source
from callpath.errors import CallpathError
from conftest import run_cli

PROGRAM = "def busy(n):\n    t = 0\n    for i in range(n):\n        t += i % 7\n    return t\n\n" \
          "busy(2_000_000)\n"
AMBIGUOUS = "callpath: error: ambiguous metric 'REALTIME': matches 'REALTIME (sec)', " \
            "'REALTIME (samples)'\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("prefix")
    (d / "busy.py").write_text(PROGRAM)
    out = d / "busy.d"
    r = run_cli("profile", "-m", str(d / "busy.m"), "-o", str(out), "--", sys.executable,
                str(d / "busy.py"))
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("args", [
    ["report", "{db}", "-m", "REALTIME"],
    ["lines", "{db}", "-m", "REALTIME"],
    ["export", "{db}", "--to", "folded", "--metric", "REALTIME", "-o", "-"],
])
def test_ambiguous_prefix_names_the_candidates(db: Path, args: list[str]) -> None:
    r = run_cli(*(a.format(db=db) for a in args))
    assert r.returncode == 2 and r.stderr == AMBIGUOUS, r.stderr


def test_prefixes_that_fit_one_metric(db: Path) -> None:
    exp = callpath.open(db)
    names = [m.name for m in exp.metrics]
    assert {"REALTIME (sec)", "REALTIME (samples)", "CPUTIME (sec)"} <= set(names), names
    assert exp.metric("realtime (sa").name == "REALTIME (samples)"
    assert exp.metric("REALTIME (sec)").name == "REALTIME (sec)"
    assert exp.metric(str(names.index("CPUTIME (sec)"))).name == "CPUTIME (sec)"
    with pytest.raises(CallpathError, match="unknown metric 'cycles': expected one of"):
        exp.metric("cycles")
    r = run_cli("report", str(db), "-m", "REALTIME (sa", "-d", "0")
    assert r.returncode == 0 and "REALTIME (samples) (I)" in r.stdout, r.stderr
    r = run_cli("lines", str(db), "-m", "cputime (se", "--format", "json")
    assert r.returncode == 0 and '"metric": "CPUTIME (sec)"' in r.stdout, r.stderr
    # the report's columns (derived metrics among them) go through the same resolver
    cols = ColumnSet(tree_source(exp), [DerivedMetric("REALTIME share", "$0/@0")])
    with pytest.raises(CallpathError, match=r"matches 'REALTIME \(sec\)', 'REALTIME "
                                            r"\(samples\)', 'REALTIME share'$"):
        cols.for_metric("REALTIME")
    assert [c.title for c in cols.for_metric("realtime s")] == ["REALTIME share"]
