"""Text, JSON and CSV renderings of the line × context views (``callpath lines``).

The detail table is the seed's Figure 1: one column per context, the source line, then
``min V(CTX) max V(CTX)`` for lines with cost; the ranked table is Figure 5; the overview is
printed as shade characters, strips side by side.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from callpath.analysis.lines import (
    LineMatrix,
    Overview,
    line_stats,
    rows_dense,
    source_text,
)

SHADES = " .:-=+*#%@"
LAUNCH_NOTE = ("(launch line): a line that launched GPU kernels or copies; their GPU time, which "
               "has no source line of its own, is counted on it")


def fmt_value(v: float) -> str:
    """Integers (tick counts, samples) as integers, other values with 4 significant digits."""
    if not math.isfinite(v):
        return str(v)
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def csv_value(v: float) -> str:
    """Full precision for CSV (integers without a fraction): scripts re-read these."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


def line_records(m: LineMatrix, rows: npt.NDArray[np.int64]) -> list[dict[str, Any]]:
    """The JSON ``lines`` entries of ``rows`` (the issue's shape), with ``"launch": true``
    on a line that launched GPU operations (their time is counted on it)."""
    st = line_stats(m, rows)
    dense = rows_dense(m, rows)
    out = []
    for i, r in enumerate(rows.tolist()):
        rec: dict[str, Any] = {
            "file": m.file_labels[int(m.file_of_row[r])], "line": int(m.line_of_row[r]),
            "values": [float(x) for x in dense[i]], "sum": float(st["sum"][i]),
            "min": float(st["min"][i]), "min_context": m.labels[int(st["min_context"][i])],
            "max": float(st["max"][i]), "max_context": m.labels[int(st["max_context"][i])],
            "mean": float(st["mean"][i]), "stdev": float(st["stdev"][i])}
        if len(m.launch) and m.launch[r]:  # only there: the shape of other lines is unchanged
            rec["launch"] = True
        out.append(rec)
    return out


def write_json_lines(m: LineMatrix, rows: npt.NDArray[np.int64], out: TextIO) -> None:
    doc = {"metric": m.metric, "contexts": list(m.labels), "lines": line_records(m, rows)}
    json.dump(doc, out, indent=1)
    out.write("\n")


def write_csv_lines(m: LineMatrix, rows: npt.NDArray[np.int64], out: TextIO) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["file", "line", *m.labels, "sum", "min", "min_context", "max", "max_context",
                "mean", "stdev"])
    for rec in line_records(m, rows):
        w.writerow([rec["file"], rec["line"], *(csv_value(v) for v in rec["values"]),
                    csv_value(rec["sum"]), csv_value(rec["min"]), rec["min_context"],
                    csv_value(rec["max"]), rec["max_context"], csv_value(rec["mean"]),
                    csv_value(rec["stdev"])])


def write_text_lines(m: LineMatrix, rows: npt.NDArray[np.int64], out: TextIO, *,
                     source_width: int = 48) -> None:
    """Figure 1: a column per context, the line number and source, then min/max."""
    if not len(rows):
        out.write("(no line)\n")
        return
    dense = rows_dense(m, rows)
    st = line_stats(m, rows)
    cells = [[fmt_value(v) for v in row] for row in dense]
    widths = [max(len(m.short_labels[c]), *(len(r[c]) for r in cells))
              for c in range(m.n_cols)]
    texts: dict[int, list[str] | None] = {}
    srcs: list[str] = []
    for r in rows.tolist():
        f = int(m.file_of_row[r])
        if f not in texts:
            texts[f] = source_text(m, f)
        src_lines = texts[f]
        line = int(m.line_of_row[r])
        src = ""
        if src_lines is not None and 1 <= line <= len(src_lines):
            src = src_lines[line - 1].expandtabs(4).strip()
        srcs.append(src[:source_width])
    width = max((len(s) for s in srcs), default=0)
    cur_file = -1
    launches = False
    header = "  ".join(lab.rjust(w) for lab, w in zip(m.short_labels, widths, strict=True))
    for i, r in enumerate(rows.tolist()):
        f = int(m.file_of_row[r])
        if f != cur_file:
            cur_file = f
            note = "" if m.readable[f] else "  (source not available: known lines only)"
            out.write(f"== {m.file_labels[f]}{note}\n{header}  {'line':>5}  source\n")
        elif m.gap_before[r] > 0:
            out.write(f"{'':{len(header)}}  {'...':>5}\n")
        line = int(m.line_of_row[r])
        src = srcs[i].ljust(width)
        vals = "  ".join(cells[i][c].rjust(widths[c]) for c in range(m.n_cols))
        tail = ""
        if st["max"][i] != 0 or st["min"][i] != 0:
            tail = (f"min {fmt_value(st['min'][i])}({m.short_labels[int(st['min_context'][i])]})"
                    f" max {fmt_value(st['max'][i])}"
                    f"({m.short_labels[int(st['max_context'][i])]})")
        if len(m.launch) and m.launch[r]:
            tail += "  (launch line)"
            launches = True
        out.write(f"{vals}  {line:>5}  {src}  {tail}".rstrip() + "\n")
    if launches:
        out.write(LAUNCH_NOTE + "\n")


def write_ranked(ranked: list[dict[str, Any]], fmt: str, out: TextIO) -> None:
    """Figure 5: rank, procedure name, file name, sum, percent."""
    keys = ("rank", "procedure", "file", "sum", "percent")
    if fmt == "json":
        json.dump([{k: r[k] for k in keys} for r in ranked], out, indent=1)
        out.write("\n")
        return
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(keys)
        for r in ranked:
            w.writerow([r["rank"], r["procedure"], r["file"], csv_value(r["sum"]),
                        csv_value(r["percent"])])
        return
    rows = [("rank", "procedure name", "filename", "sum", "percent")]
    for r in ranked:
        rows.append((str(r["rank"]), r["procedure"], Path(r["file"]).name if r["file"] else "",
                     fmt_value(r["sum"]), f"{r['percent']:.2f}"))
    wd = [max(len(row[k]) for row in rows) for k in range(5)]
    for row in rows:
        out.write(f"{row[0]:>{wd[0]}}  {row[1]:<{wd[1]}}  {row[2]:<{wd[2]}}  "
                  f"{row[3]:>{wd[3]}}  {row[4]:>{wd[4]}}".rstrip() + "\n")


def overview_records(m: LineMatrix, ov: Overview) -> dict[str, Any]:
    """The overview as JSON: parameters, the display columns, and one entry per overview row
    with its strip, row, the axis rows it stands for and its first (file, line)."""
    if ov.top_index is not None:
        columns = [f"top {k + 1}" for k in range(ov.values.shape[1])]
    else:
        g = [*ov.column_groups.tolist(), m.n_cols]
        columns = [m.labels[a] if b - a == 1 else f"{m.labels[a]} .. {m.labels[b - 1]}"
                   for a, b in itertools.pairwise(g)]
    rows = []
    for o in range(ov.n_orows):
        a = int(ov.inv_first[o])
        rec: dict[str, Any] = {
            "strip": o // ov.strip_lines, "row": o % ov.strip_lines, "first_row": a,
            "last_row": int(ov.inv_last[o]), "file": m.file_labels[int(m.file_of_row[a])],
            "line": int(m.line_of_row[a]), "values": [float(x) for x in ov.values[o]]}
        if ov.top_index is not None:
            rec["contexts"] = [m.labels[int(k)] for k in ov.top_index[o]]
        rows.append(rec)
    return {"metric": m.metric, "skip": ov.skip, "bin": ov.bin, "reduce": ov.reduce,
            "strip_lines": ov.strip_lines, "strips": ov.n_strips, "columns": columns,
            "axis_rows": m.n_rows, "kept_rows": int(ov.kept.sum()), "rows": rows}


def write_overview_text(m: LineMatrix, ov: Overview, out: TextIO) -> None:
    """Shade characters (`` .:-=+*#%@``, hottest cell = ``@``), strips side by side."""
    out.write(f"overview of {m.metric}: {m.n_rows} lines, {int(ov.kept.sum())} kept "
              f"(runs of more than {ov.skip} empty lines skipped), bins of {ov.bin} by "
              f"{ov.reduce}, {ov.n_orows} rows in {ov.n_strips} strips of {ov.strip_lines}\n")
    if not ov.n_orows:
        return
    top = float(ov.values.max()) or 1.0
    grid = ov.strips()
    ncol = grid.shape[2]
    for row in range(ov.strip_lines):
        parts = []
        for s in range(ov.n_strips):
            cells = grid[s, row]
            if np.isnan(cells[0]):
                parts.append(" " * ncol)
                continue
            idx = np.clip(np.ceil(cells / top * (len(SHADES) - 1)), 0, len(SHADES) - 1)
            parts.append("".join(SHADES[int(k)] for k in idx))
        out.write("|" + "|".join(parts) + "|\n")
