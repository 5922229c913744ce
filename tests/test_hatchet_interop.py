"""Interoperability: LLNL Hatchet reads the databases callpath writes as it reads HPCToolkit's.

Hatchet is not a dependency of callpath. The test builds (once, cached under the git-ignored
``.cache/hatchet-venv``) a separate virtual environment with a pinned ``llnl-hatchet``, runs a
small script there that loads databases with ``GraphFrame.from_hpctoolkit_latest`` and prints
every node's values as JSON, and compares: the written copies of the real databases must give
exactly what the originals give, and a database built with callpath's model must give
callpath's own values. Without network access to install Hatchet the tests are skipped.

Hatchet 2026.2.0's per-profile mode (``parallel_profiles_mode=True``) fails on HPCToolkit's own
databases: its binary search over a context's metrics reads one element past the end (any
context whose largest metric id is below a searched one, e.g. a context with no values). The
script therefore also runs that mode with a bounds-checked search swapped in, so per-profile
values can be compared too; the unpatched outcome must merely be the same for original and copy.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from callpath.formats.v4.reader import read_v4
from callpath.formats.v4.writer import write_v4
from compare import small_experiment
from conftest import DBASE, ROOT, V4_DATABASES

HATCHET = "llnl-hatchet==2026.2.0"  # works with Python 3.11, numpy 2 and pandas 2
VENV = ROOT / ".cache" / "hatchet-venv"
MARKER = VENV / ".callpath-installed"

DUMP_SCRIPT = r'''
import json, math, struct, sys, warnings
warnings.filterwarnings("ignore")
import hatchet
import hatchet.readers.hpctoolkit_reader_latest as reader

original_search = reader.binary_search

def bounded_search(fmt, data, low, high, target):
    """Binary search of (key, value) records that never reads past the buffer."""
    size = struct.calcsize(fmt)
    high = min(high, len(data) // size - 1)
    while low <= high:
        mid = (low + high) // 2
        key, value = struct.unpack_from(fmt, data, mid * size)
        if key == target:
            return (mid, key, value)
        if key > target:
            high = mid - 1
        else:
            low = mid + 1
    return -1

def clean(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.item() if hasattr(v, "item") else v

def load(path, parallel):
    try:
        gf = hatchet.GraphFrame.from_hpctoolkit_latest(path, parallel_profiles_mode=parallel)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    tree = []
    for node in gf.graph.traverse():
        par = node.parents[0]._hatchet_nid if node.parents else None
        tree.append([node._hatchet_nid, par, node.frame["name"], node.frame["type"]])
    tree.sort(key=lambda t: t[0])  # Hatchet orders equal-looking siblings by object identity
    df = gf.dataframe.reset_index()
    metrics = sorted(c for c in df.columns if c not in ("node", "profile", "name"))
    rows = {}
    for rec in df.to_dict("records"):
        key = f"{rec['node']._hatchet_nid}/{rec.get('profile', 0)}"
        rows[key] = {m: clean(rec[m]) for m in metrics}
    return {"tree": tree, "metrics": metrics, "rows": rows}

out = {}
for path in sys.argv[1:]:
    res = {"summary": load(path, False), "parallel": load(path, True)}
    reader.binary_search = bounded_search
    res["parallel_fixed"] = load(path, True)
    reader.binary_search = original_search
    out[path] = res
print(json.dumps(out))
'''


def _hatchet_python() -> Path:
    """The cached venv's interpreter, installing Hatchet first if needed (skip if impossible)."""
    py = VENV / "bin" / "python"
    if MARKER.exists() and MARKER.read_text().strip() == HATCHET and py.exists():
        return py
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "hatchet-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing right now
        if MARKER.exists() and MARKER.read_text().strip() == HATCHET and py.exists():
            return py
        shutil.rmtree(VENV, ignore_errors=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True,
                              text=True, check=False, timeout=300)
        if made.returncode != 0:
            pytest.skip(f"cannot create a virtual environment for Hatchet: {made.stderr[-300:]}")
        try:
            inst = subprocess.run(
                [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--prefer-binary",
                 "--retries", "1", "--timeout", "30", HATCHET],
                capture_output=True, text=True, check=False, timeout=1200)
        except subprocess.TimeoutExpired:
            shutil.rmtree(VENV, ignore_errors=True)
            pytest.skip(f"installing {HATCHET} took longer than 20 minutes")
        if inst.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            tail = (inst.stderr or inst.stdout).strip().splitlines()[-1:] or ["?"]
            pytest.skip(f"cannot install {HATCHET} (no network?): {tail[0]}")
        MARKER.write_text(HATCHET + "\n")
    return py


@pytest.fixture(scope="module")
def hatchet_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Hatchet's view of the originals, their copies written by callpath, and a model-built
    database: one subprocess for all of them."""
    originals = [DBASE / name for name in V4_DATABASES if (DBASE / name).is_dir()]
    if not originals:
        pytest.skip(f"{DBASE} is absent: the shared test data must sit beside the repository")
    py = _hatchet_python()
    tmp = tmp_path_factory.mktemp("hatchet")
    paths: dict[str, str] = {}
    for db in originals:
        paths[f"orig/{db.name}"] = str(db)
        paths[f"copy/{db.name}"] = str(write_v4(read_v4(db), tmp / db.name))
    paths["model"] = str(write_v4(small_experiment(), tmp / "model.d"))
    script = tmp / "dump_hatchet.py"
    script.write_text(DUMP_SCRIPT)
    run = subprocess.run([str(py), str(script), *paths.values()], capture_output=True,
                         text=True, check=False, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    raw = json.loads(run.stdout)
    return {key: raw[p] for key, p in paths.items()}


@pytest.mark.parametrize("name", V4_DATABASES)
def test_hatchet_reads_copies_like_originals(hatchet_results: dict[str, Any], name: str) -> None:
    if f"orig/{name}" not in hatchet_results:
        pytest.skip(f"{name} is absent from the shared data")
    orig, copy = hatchet_results[f"orig/{name}"], hatchet_results[f"copy/{name}"]
    # the summary view (Hatchet's default) works on both and gives the same values per node
    assert "error" not in orig["summary"], orig["summary"]
    assert copy["summary"] == orig["summary"]
    rows = orig["summary"]["rows"]
    assert len(rows) > 5 and any(v is not None for r in rows.values() for v in r.values())
    # per-profile values: the same outcome unpatched, the same values with the fixed search
    assert copy["parallel"] == orig["parallel"]
    assert "error" not in orig["parallel_fixed"], orig["parallel_fixed"]
    assert copy["parallel_fixed"] == orig["parallel_fixed"]
    profiles = {k.split("/")[1] for k in orig["parallel_fixed"]["rows"]}
    assert profiles and "0" not in profiles  # real execution contexts, not the summary


def test_hatchet_reads_model_built_database(hatchet_results: dict[str, Any]) -> None:
    """Hatchet's values for a database written from an in-memory experiment are callpath's."""
    exp = small_experiment()
    cpu = exp.metric("CPUTIME (sec)")
    ctx = exp.cct.ctx_id.tolist()
    inc = dict(zip(ctx, exp.inclusive(cpu).tolist(), strict=True))
    exc = dict(zip(ctx, exp.exclusive(cpu).tolist(), strict=True))
    res = hatchet_results["model"]
    summary = res["summary"]
    assert "error" not in summary, summary
    # Hatchet shows the main thread's subtree (it skips other entry points)
    main = int(exp.cct.ctx_id[1])
    shown = {int(k.split("/")[0]) for k in summary["rows"]}
    node_of = {c: i for i, c in enumerate(ctx)}
    expect = {c for c in ctx if node_of[c] >= 1 and node_of[c] < int(exp.cct.subtree_end[1])}
    assert shown == expect
    for key, rec in summary["rows"].items():
        c = int(key.split("/")[0])
        assert (rec["time (inc)"] or 0.0) == pytest.approx(inc[c]), c
        assert (rec["time"] or 0.0) == pytest.approx(exc[c]), c
    # same tree shape as callpath's: parent of every shown node
    for c, par, _, _ in summary["tree"]:
        if par is not None:
            assert int(exp.cct.ctx_id[exp.cct.parent[node_of[c]]]) == par
    # per-profile values (unpatched Hatchet works here: every context has values)
    for mode in ("parallel", "parallel_fixed"):
        par_rows = res[mode]["rows"]
        for p in (1, 2):
            vals = exp.values_in(p, cpu, "execution")
            for c in expect:
                rec = par_rows.get(f"{c}/{p}")
                got = (rec or {}).get("time (inc)") or 0.0
                assert got == pytest.approx(float(vals[node_of[c]])), (mode, c, p)
    assert np.isclose(sum((r["time (inc)"] or 0) for k, r in res["parallel"]["rows"].items()
                          if int(k.split("/")[0]) == main),
                      inc[main])  # summed over both threads
