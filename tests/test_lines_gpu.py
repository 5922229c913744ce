"""The Lines view (``callpath lines`` and the viewer's Lines tab) of GPU databases: GPU time on
the source line that launched it.

A kernel, copy or synchronisation is measured on a procedure scope below its placeholder
(``<gpu kernel>`` > ``kernmain()``, ``<gpu copyin>``) and has no line of its own, so the Lines
view of a GPU database was empty for GPU time. Now each operation's cost is counted on the
nearest line scope above it (line 0, "no line", passed over): the call site the tree shows
above the placeholder. The databases are HPCToolkit's CUDA run (hpcprof's database) and
PyTorch training on an H100 measured by ``callpath run -e gpu=nvidia`` (tests/gpu_data,
attributed here by ``callpath prof``). Expected values are walked up the tree here, node by
node, from the database's own per-context values.
"""

from __future__ import annotations

import json
import tarfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.analysis import lines as L
from callpath.analysis.lines_view import calling_contexts
from callpath.model import NodeKind
from callpath.model.gpu_names import GPU_PLACEHOLDERS
from conftest import ROOT, run_cli, shared_path
from view_support import get_json, serve

GPU_DATA = ROOT / "tests" / "gpu_data"
TRAIN = ROOT / "tests" / "gpu_programs" / "train.py"


@pytest.fixture(scope="module")
def torch_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("torch-lines")
    with tarfile.open(GPU_DATA / "torch-h100.tgz") as t:
        t.extractall(d, filter="data")
    meas = next(p for p in d.iterdir() if p.is_dir())
    db = d / "torch.d"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    return db


@pytest.fixture(params=["hpctoolkit-cuda", "callpath-torch"])
def gpu_db(request: pytest.FixtureRequest, torch_db: Path) -> Path:
    if request.param == "hpctoolkit-cuda":
        return shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d")
    return torch_db


def expected_lines(exp: Any, values: np.ndarray) -> tuple[dict[tuple[str, int], float], set[
        tuple[str, int]]]:
    """(file, line) -> value, walking up from every node with a value: a line scope keeps
    its own; a node inside a GPU operation goes to the first line scope (of a line > 0) met
    on the way up; any other node has no line. Also the (file, line) reached from a
    placeholder (the launch lines)."""
    cct = exp.cct
    names = set(GPU_PLACEHOLDERS.values())
    out: dict[tuple[str, int], float] = defaultdict(float)
    launched: set[tuple[str, int]] = set()

    def is_line(n: int) -> bool:
        return int(cct.kind[n]) == NodeKind.LINE and int(cct.file[n]) >= 0

    def key(n: int) -> tuple[str, int]:
        return exp.files[int(cct.file[n])].path, int(cct.line[n])

    def placeholder(n: int) -> bool:
        f = int(cct.function[n])
        return int(cct.kind[n]) == NodeKind.FUNCTION and f >= 0 and \
            exp.functions[f].name in names

    for n in np.flatnonzero(values).tolist():
        if is_line(n):
            out[key(n)] += float(values[n])
            continue
        a, crossed, inside = n, False, False
        while a >= 0:
            if placeholder(a):
                crossed = inside = True
            if a != n and is_line(a) and int(cct.line[a]) > 0 and inside:
                out[key(a)] += float(values[n])
                if crossed:
                    launched.add(key(a))
                break
            a = int(cct.parent[a])
    return dict(out), launched


def matrix_lines(m: Any) -> dict[tuple[str, int], float]:
    return {(m.files[int(m.file_of_row[r])], int(m.line_of_row[r])): float(m.row_sum[r])
            for r in m.nz_rows.tolist()}


def test_gpu_time_is_on_the_launch_lines(gpu_db: Path) -> None:
    exp = callpath.open(gpu_db)
    gpuop = exp.metric("GPUOP (sec)")
    m = L.build_line_matrix(exp, gpuop)
    want, launched = expected_lines(exp, exp.exclusive(gpuop))
    got = matrix_lines(m)
    assert want, "the database has GPU time below a launch line"
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9), k
    # the rows flagged as launch lines are those reached from a placeholder
    flagged = {(m.files[int(m.file_of_row[r])], int(m.line_of_row[r]))
               for r in np.flatnonzero(m.launch).tolist()}
    assert flagged == launched and launched
    # per context: each column holds what that context's own values give
    for c, profs in enumerate(m.column_profiles):
        per: dict[tuple[str, int], float] = defaultdict(float)
        for p in profs:
            for k, v in expected_lines(exp, exp.values_in(p, gpuop, "function"))[0].items():
                per[k] += v
        col = {k: 0.0 for k in got}
        dense = L.rows_dense(m, m.nz_rows)
        for i, r in enumerate(m.nz_rows.tolist()):
            col[(m.files[int(m.file_of_row[r])], int(m.line_of_row[r]))] = float(dense[i, c])
        assert col == pytest.approx({k: per.get(k, 0.0) for k in col}, rel=1e-9), m.labels[c]
    # the calling contexts of a launch line hold its GPU time
    r = int(m.nz_rows[np.argmax(m.row_sum[m.nz_rows])])
    ctxs = calling_contexts(exp, m, r, exp.metrics.index(gpuop))
    assert sum(c["value"] for c in ctxs) == pytest.approx(float(m.row_sum[r]), rel=1e-9)
    assert ctxs[0]["value"] > 0


def test_hpctoolkit_cuda_kernel_time_is_all_on_lines() -> None:
    """Every second of HPCToolkit's CUDA run has a launch line (the whole run is one
    kernel launched in a loop): the Lines view's total is the run's GPU time."""
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d"))
    gpuop = exp.metric("GPUOP (sec)")
    m = L.build_line_matrix(exp, gpuop)
    assert m.total == pytest.approx(float(exp.inclusive(gpuop)[0]), rel=1e-9)
    assert m.total > 0


def test_torch_copies_are_on_the_line_that_moves_the_data(torch_db: Path) -> None:
    """PyTorch's host-to-device copies of the training step are launched by
    ``x.to(dev), y.to(dev)`` in train.py: that line of the program holds their time."""
    exp = callpath.open(torch_db)
    m = L.build_line_matrix(exp, "GXCOPY (sec)")
    src = TRAIN.read_text().splitlines()
    train = [r for r in m.nz_rows.tolist()
             if m.files[int(m.file_of_row[r])].endswith("train.py") and m.launch[r]]
    assert train
    texts = [src[int(m.line_of_row[r]) - 1] for r in train]
    assert any(".to(dev)" in t for t in texts), texts


def test_cli_and_viewer_say_launch_line(tmp_path: Path) -> None:
    db = shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d")
    exp = callpath.open(db)
    m = L.build_line_matrix(exp, "GPUOP")
    (row,) = np.flatnonzero(m.launch).tolist()
    line = int(m.line_of_row[row])
    text = run_cli("lines", str(db), "-m", "GPUOP", check=True).stdout
    hit = [t for t in text.splitlines() if t.endswith("(launch line)")]
    assert len(hit) == 1 and f" {line} " in hit[0], text
    assert "launched GPU kernels or copies" in text
    doc = json.loads(run_cli("lines", str(db), "-m", "GPUOP", "-f", "json", check=True).stdout)
    assert [(d["line"], d["launch"]) for d in doc["lines"]] == [(line, True)]
    assert doc["lines"][0]["sum"] == pytest.approx(float(m.total))
    with serve([db]) as s:
        w = get_json(s.url, "/api/db/0/lines/window", metric=exp.metrics.index(
            exp.metric("GPUOP")), start=max(row - 2, 0), count=5)
        flags = {r["row"]: r["launch"] for r in w["rows"]}
        assert flags[row] is True and sum(flags.values()) == 1


def test_a_gpu_kernel_scope_locates_its_launch_line() -> None:
    """Top-down → Lines on `<gpu kernel>` (which has no source file) lands on the line that
    launched it, the nearest scope above it with a file and a line."""
    db = shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d")
    names = set(GPU_PLACEHOLDERS.values())
    gpuop = callpath.open(db).metrics.index(callpath.open(db).metric("GPUOP"))
    with serve([db]) as s:
        frontier = [(get_json(s.url, "/api/db/0/children", view="top-down")["root"], None)]
        checked = 0
        for _ in range(40):
            nxt = []
            for r, above in frontier:
                here = (r["file"], r["line"]) if r.get("file") and r.get("line") else above
                if r["name"] in names:
                    assert above is not None
                    got = get_json(s.url, "/api/db/0/lines/locate", view="top-down",
                                   node=r["key"], metric=gpuop)
                    assert (got["file"], got["line"]) == above, r["name"]
                    checked += 1
                if r["has_children"]:
                    rows = get_json(s.url, "/api/db/0/children", view="top-down",
                                    node=r["key"], limit=1000)["rows"]
                    nxt += [(c, here) for c in rows]
            frontier = nxt
        assert checked > 0, "no GPU placeholder reached in the Top-down tree"
