"""``callpath report`` and ``callpath lines`` open on the metric the viewer opens on: the one
that holds the time (GPUOP, CPUTIME ...), not the first metric, which in a GPU database is a
kernel property's accumulator, zero everywhere; the report hides its default columns that are
zero at every node, as the viewer does (``--empty-columns`` keeps them)."""

from __future__ import annotations

import json
import re

import numpy as np

import callpath
from conftest import run_cli, shared_path
from view_support import get_json, serve


def heads(text: str) -> list[str]:
    """The column titles of a text report (before ``scope``)."""
    first = text.splitlines()[0]
    return [h.strip() for h in re.split(r"\s{2,}", first.strip()) if h.strip()][:-1]


def test_gpu_database_opens_on_gpuop_as_the_viewer_does() -> None:
    db = shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d")
    exp = callpath.open(db)
    assert not np.any(exp.inclusive(0)), "the first metric is zero everywhere"
    with serve([db]) as s:
        cols = get_json(s.url, "/api/db/0/columns")
        (opened,) = [c["name"] for c in cols if c["open"]]
        lines_metric = get_json(s.url, "/api/databases")[0]["open_metric"]
    text = run_cli("report", str(db), "-d", "2", check=True).stdout
    assert heads(text) == [opened, opened.replace("(I)", "(E)")], text
    root = text.splitlines()[1].split()[0]
    assert root == f"{exp.inclusive(opened.removesuffix(' (I)'))[0]:.2e}"
    # callpath lines: the metric of the viewer's Lines tab
    doc = json.loads(run_cli("lines", str(db), "-f", "json", check=True).stdout)
    assert doc["metric"] == exp.metrics[lines_metric].name == "GPUOP (sec)"


def test_all_zero_columns_are_hidden_unless_asked() -> None:
    """The GPU stream's own values: GPU time is charged to the launching thread, so in the
    stream's Thread view every column is zero; the report shows the time metric's inclusive
    column only, and both with --empty-columns."""
    db = shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d")
    text = run_cli("report", str(db), "--threads", "GPUSTREAM 7", "-d", "1", check=True).stdout
    assert heads(text) == ["GPUOP (sec) (I)"], text
    text = run_cli("report", str(db), "--threads", "GPUSTREAM 7", "-d", "1", "--empty-columns",
                   check=True).stdout
    assert heads(text) == ["GPUOP (sec) (I)", "GPUOP (sec) (E)"], text


def test_cpu_database_still_opens_on_its_time() -> None:
    db = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    text = run_cli("report", str(db), "-d", "1", check=True).stdout
    assert heads(text) == ["CPUTIME (sec) (I)", "CPUTIME (sec) (E)"], text
