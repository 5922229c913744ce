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
