"""``%%callpath`` in a real Jupyter kernel, executed headless with nbclient: the cell's output
holds the Top-down table with the hot procedure, a flame graph and the viewer command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CELL = '''%%callpath -d 40
def hot_procedure(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total

import time
t0 = time.process_time()
while time.process_time() - t0 < 1.5:
    hot_procedure(20000)
'''


def test_cell_magic_in_a_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="jupyter packages (callpath[notebook]) "
                                   "are not installed")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src") + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    db = tmp_path / "db"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext callpath"),
                nbformat.v4.new_code_cell(CELL.replace("-d 40", f"-d 40 -o {db}")),
                nbformat.v4.new_code_cell(f"%callpath_view {db}")]
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = nb.cells[1].outputs
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    errors = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "hot_procedure" in html, (errors, outputs)
    assert "<svg" in html and "callpath view" in html
    assert (db / "meta.db").exists() or any(db.iterdir())
    view = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[2].outputs)
    assert "hot_procedure" in view


NATIVE_CELL = '''%%callpath --native -d 60
import time
import zlib

data = bytes(range(256)) * 4000
t0 = time.process_time()
while time.process_time() - t0 < 1.5:
    zlib.compress(data, 9)
'''


def test_native_cell_shows_the_c_code_below_the_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``%%callpath --native``: the cell's zlib.compress line with zlib's C function and
    libz's deflate below it, in the cell's output (the kernel is attached to with
    ``run --pid --native``)."""
    nbformat = pytest.importorskip("nbformat", reason="jupyter packages (callpath[notebook]) "
                                   "are not installed")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed")
    from conftest import perf_reason

    if perf_reason() is not None:
        pytest.skip(f"perf_event sampling is not available here: {perf_reason()}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src") + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    db = tmp_path / "db"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext callpath"),
                nbformat.v4.new_code_cell(NATIVE_CELL.replace("-d 60", f"-d 60 -o {db}"))]
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = nb.cells[1].outputs
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    errors = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "zlib_compress" in html and "deflate" in html, (errors, outputs)
    assert html.index("zlib_compress") < html.index("deflate")
