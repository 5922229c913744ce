"""Record what ``callpath report``, ``lines``, ``export`` and ``diff`` print and write for a
set of databases, so that a refactoring can be shown to leave every output byte-for-byte the
same: run it on the old tree and on the new one into two directories, then ``diff -r`` them.

    python scripts/compare_outputs.py OUTDIR [DB ...]

With no DB, the HPCToolkit and Hatchet databases of ``../shared/data`` are used. Commands
run in one fixed scratch directory (``$TMPDIR/callpath-compare-outputs.work``, moved to OUTDIR
at the end) with relative output paths, so that no path of the run shows up in what is
compared (a comparison database records its own absolute path); two runs must therefore not
overlap. The user's saved filters and derived metrics are kept out with an empty
``XDG_CONFIG_HOME``. Each command's stdout, stderr and exit status go to
``OUTDIR/<db>/<n>.txt``; files written by ``export`` and ``diff`` are kept beside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_DBS = [
    SHARED / "hpctoolkit" / "dbase" / "small.d",
    SHARED / "hpctoolkit" / "dbase" / "small.nostruct.d",
    SHARED / "hpctoolkit" / "dbase" / "loops-cputime-t.d",
    SHARED / "hpctoolkit" / "dbase" / "loops-cuda-nvidia-t.d",
    SHARED / "hatchet" / "hpctoolkit-cpi-database",
]

REPORTS = [
    [],
    ["-d", "3"],
    ["-v", "bottom-up", "-d", "3"],
    ["-v", "flat", "-t", "2"],
    ["-v", "flat", "--flatten", "1", "-d", "2"],
    ["--hot-path"],
    ["-v", "bottom-up", "--hot-path"],
    ["-f", "json", "-d", "2"],
    ["-f", "csv", "-v", "bottom-up", "-d", "2"],
    ["--threads", "0"],
    ["--threads", "THREAD", "-v", "flat", "-d", "2"],
    ["--list-metrics"],
    ["--contexts"],
    ["--find", "main"],
    ["--filter", "*libc*:all", "-d", "4"],
    ["--derived", "twice=2*$0", "-d", "2"],
    ["--stats", "0"],
    ["--unsorted", "-d", "2", "--ascending"],
    ["--list-view-configs"],
]
LINES = [[], ["--ranked", "5"], ["-f", "json", "--ranked", "3"], ["--overview"],
         ["--group", "rank", "--ranked", "3"]]
EXPORTS = ["speedscope", "pprof", "chrome", "folded"]


def run(out: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
    p = subprocess.run([sys.executable, "-m", "callpath", *argv], cwd=out, env=env,
                       capture_output=True, text=True, timeout=600)
    (out / f"{name}.txt").write_text(f"$ callpath {' '.join(argv)}\nrc={p.returncode}\n"
                                     f"--- stdout\n{p.stdout}--- stderr\n{p.stderr}")


def record(outdir: Path, dbs: list[Path]) -> None:
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = str(outdir / "config")
    env["COLUMNS"] = "100"
    (outdir / "config").mkdir(parents=True, exist_ok=True)
    for db in dbs:
        out = outdir / db.name
        out.mkdir(parents=True, exist_ok=True)
        d = str(db)
        for i, opts in enumerate(REPORTS):
            run(out, f"report-{i:02d}", ["report", d, *opts], env)
        for i, opts in enumerate(LINES):
            run(out, f"lines-{i:02d}", ["lines", d, *opts], env)
        for fmt in EXPORTS:
            run(out, f"export-{fmt}", ["export", d, "--to", fmt, "-o", f"export.{fmt}"], env)
    if len(dbs) >= 2:  # a comparison database, and what report prints of it
        out = outdir / "diff"
        out.mkdir(parents=True, exist_ok=True)
        for i, (a, b) in enumerate(zip(dbs, dbs[1:] + dbs[:1], strict=True)):
            run(out, f"diff-{i}", ["diff", "-o", f"cmp{i}.d", str(a), str(b)], env)
            for j, opts in enumerate([[], ["-d", "3"], ["-v", "flat", "-d", "2"],
                                      ["-f", "json", "-d", "2"], ["--list-metrics"]]):
                run(out, f"diff-{i}-report-{j}", ["report", f"cmp{i}.d", *opts], env)
            run(out, f"diff-{i}-lines", ["lines", f"cmp{i}.d", "--ranked", "5"], env)


def main() -> int:
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__ or "")
        return 2
    dbs = [Path(a).resolve() for a in sys.argv[2:]] or DEFAULT_DBS
    outdir = Path(sys.argv[1]).resolve()
    if outdir.exists():
        sys.stderr.write(f"{outdir}: exists; expected a new directory\n")
        return 2
    work = Path(tempfile.gettempdir()) / "callpath-compare-outputs.work"
    shutil.rmtree(work, ignore_errors=True)
    record(work, dbs)
    shutil.move(work, outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
