"""IPython magics: ``%load_ext callpath``, then ``%%callpath [options]`` profiles a cell.

Why a sampler outside the kernel: the cell runs in the kernel process, which callpath did not
start. ``%%callpath`` starts ``callpath run --pid KERNEL`` (the attaching sampler of
``run --pid``: Python call paths with lines read from the kernel's memory, and with
``--native`` the native frames below them, from perf_event samples of its threads) in a child
process, runs the cell
once it is sampling, stops it, builds the database (``callpath prof``), and shows the top of
the Top-down view as an HTML table with the hot path open, a flame graph, and the command that
opens the full viewer. Nothing is imported into or changed in the kernel but this module, and a
cell that raises is still profiled (the exception is shown after the profile).

IPython is an optional dependency (``pip install 'callpath[notebook]'``).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from callpath.errors import CallpathError

ROWS = 25  # rows of the Top-down table shown under the cell


def _callpath_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "callpath", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%callpath", add_help=False)
    p.add_argument("--native", action="store_true",
                   help="native frames too, below the Python lines that called them "
                   "(perf_event sampling of the kernel's threads)")
    p.add_argument("-o", "--output", default=None, help="database directory")
    p.add_argument("-d", "--depth", type=int, default=12, help="rows' depth in the table")
    return p


class CellProfile:
    """Measure one cell: start the sampler on this process, run, stop, build the database."""

    def __init__(self, native: bool, db: Path | None) -> None:
        self.native = native
        base = Path(tempfile.mkdtemp(prefix="callpath-cell-"))
        self.meas = base / "measurements"
        self.db = db if db is not None else base / "database"

    def start(self, timeout: float = 120) -> subprocess.Popen[bytes]:
        argv = _callpath_cmd("run", "--pid", str(os.getpid()), "-o", str(self.meas),
                             "--top", "0")
        if self.native:
            argv += ["--native"]
        proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        # sampling starts right after the header is written (the native events are open
        # by then): wait for it, so that the cell's start is measured
        ready = self.meas / "measurement.json"
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise CallpathError(err.strip().splitlines()[-1] if err.strip() else
                                    "the sampler stopped before the cell ran")
            if time.monotonic() > deadline:
                proc.kill()
                raise CallpathError("the sampler did not start within "
                                    f"{timeout:.0f} s")
            time.sleep(0.02)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise CallpathError(lines[-1] if lines else "the sampler failed")
        r = subprocess.run(_callpath_cmd("prof", str(self.meas), "-o", str(self.db)),
                           env=_env(), capture_output=True, text=True, check=False)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            raise CallpathError(lines[-1] if lines else "callpath prof failed")


def top_down(db: Path, depth: int) -> list[dict[str, Any]]:
    """Rows of the Top-down view (hot path open to ``depth``), from ``report --format json``."""
    r = subprocess.run(_callpath_cmd("report", str(db), "-f", "json", "-d", str(depth),
                                     "-t", "1"), env=_env(), capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise CallpathError(r.stderr.strip() or "callpath report failed")
    doc = json.loads(r.stdout)
    rows: list[dict[str, Any]] = []
    for node in doc if isinstance(doc, list) else []:
        if len(rows) >= ROWS:
            break
        metrics = node.get("metrics", {})
        # inclusive and exclusive time, not the sample counts beside them
        values = {k: v for k, v in metrics.items() if "(samples)" not in k}
        rows.append({"level": int(node.get("depth", 0)),
                     "name": node.get("label") or node.get("name", ""), "values": values})
    return rows


def flame_svg(db: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flame.svg"
        r = subprocess.run(_callpath_cmd("report", str(db), "--flame", "-o", str(out)),
                           env=_env(), capture_output=True, text=True, check=False)
        if r.returncode != 0 or not out.exists():
            return ""
        return out.read_text()


def render(db: Path, depth: int) -> str:
    """The HTML shown under a profiled cell."""
    rows = top_down(db, depth)
    head = ""
    body = []
    for row in rows:
        vals = row["values"]
        if isinstance(vals, dict):
            if not head:
                head = "".join(f"<th>{html.escape(str(k))}</th>" for k in vals)
            cells = "".join(f"<td style='text-align:right'>{html.escape(_fmt(v))}</td>"
                            for v in vals.values())
        else:
            cells = ""
        pad = "&nbsp;" * (2 * int(row["level"]))
        body.append(f"<tr>{cells}<td style='text-align:left;font-family:monospace'>{pad}"
                    f"{html.escape(str(row['name']))}</td></tr>")
    q = shlex.quote(str(db))
    return (f"<div class='callpath'><b>callpath</b>: Top-down view (hot path open)"
            f"<table><tr>{head}<th style='text-align:left'>scope</th></tr>{''.join(body)}"
            f"</table>{flame_svg(db)}<p>Database: <code>{html.escape(str(db))}</code>. Full "
            f"viewer: <code>callpath view {html.escape(q)}</code> (or "
            f"<code>%callpath_view {html.escape(q)}</code>)</p></div>")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return " ".join(_fmt(x) for x in v.values())
    return str(v)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext callpath``: register ``%%callpath`` and ``%callpath_view``. IPython is
    reached through ``Any`` (it is an optional, not always installed, dependency)."""
    import importlib

    disp: Any = importlib.import_module("IPython.display")

    def show(db: Path, depth: int) -> None:
        try:
            disp.display(disp.HTML(render(db, depth)))
        except CallpathError as e:
            print(f"callpath: {e}", file=sys.stderr)

    def callpath_cell(line: str, cell: str) -> None:
        """Profile the cell: ``%%callpath [--native] [-o DB] [-d DEPTH]``."""
        try:
            opts = _parser().parse_args(shlex.split(line))
        except SystemExit:
            print(f"%%callpath: expected [--native] [-o DB] [-d DEPTH], got {line!r}",
                  file=sys.stderr)
            return
        prof = CellProfile(opts.native, Path(opts.output) if opts.output else None)
        try:
            proc = prof.start()
        except CallpathError as e:
            print(f"callpath: {e}", file=sys.stderr)
            return
        try:
            ipython.run_cell(cell)  # a cell that raises shows its error and is still profiled
        finally:
            try:
                prof.stop(proc)
            except CallpathError as e:
                print(f"callpath: {e}", file=sys.stderr)
            else:
                show(prof.db, opts.depth)

    def callpath_view(line: str) -> None:
        """``%callpath_view DB``: the top of DB and the command that opens the viewer."""
        db = Path(line.strip())
        if not db.exists():
            print(f"callpath: {db}: no such database", file=sys.stderr)
            return
        show(db, 12)

    ipython.register_magic_function(callpath_cell, magic_kind="cell", magic_name="callpath")
    ipython.register_magic_function(callpath_view, magic_kind="line",
                                    magic_name="callpath_view")
