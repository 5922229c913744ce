"""PerfVisS's source-line × execution-context views as a library (seeds/003, issue 18).

The viewer's Lines tab and ``callpath lines`` both call these functions; nothing here knows
about HTTP or terminals. Everything is computed from one :class:`LineMatrix` per (database,
metric, grouping, context selection), built once and cached on the experiment object.

API (names are a contract with the viewer)::

    m = build_line_matrix(exp, metric, group="none"|"rank"|"node", contexts=None)
        m.files, m.file_start, m.readable          axis files (Flat view order)
        m.file_of_row, m.line_of_row, m.known, m.gap_before   one per axis row
        m.labels, m.short_labels                   one per column (context or group)
        m.nz_rows / m.indptr / m.cols / m.vals     the sparse values (rows with cost)
        m.row_sum, m.total, m.row_proc, m.procedures
    window(m, start_row, count) -> ndarray (count × contexts), dense
    line_stats(m, rows) -> {sum, min, min_context, max, max_context, mean, stdev}
    overview(m, skip=50, bin=4, reduce="max"|"sum", strip_lines=80,
             context_bins=None, top_contexts=None) -> Overview
        ov.values (overview rows × columns), ov.strips(), ov.fwd_orow / fwd_strip / fwd_row,
        ov.kept, ov.inv_first / inv_last, ov.locate(strip, row) -> axis row,
        ov.rectangles(start_row, end_row) -> [(strip, first_row, rows), ...]
    ranked_procedures(m, n) -> [{rank, procedure, index, file, sum, percent, first_row,
                                 last_row}, ...]
    procedure_at(m, row) -> the same dict (its rank among all) or None
    segment(m, proc) -> (first_row, last_row);  segments(m) -> (first[], last[]) of all
    row_of(m, file, line) -> axis row;  file_index(m, file);  source_text(m, file)
    rows_of_node(exp, m, node) -> axis rows of a tree scope (node of exp.cct)
    line_instructions(exp, file, line, around) -> InstructionListing (a list of dicts
        with .reason: why it is empty, e.g. the binary cannot be read)

Axis rows are 0-based positions on the line axis; ``line_of_row`` holds the 1-based source
line numbers. Column indices (``min_context`` ...) index ``m.labels``.
"""

from __future__ import annotations

from callpath.analysis.lines_asm import InstructionListing, line_instructions
from callpath.analysis.lines_matrix import (
    GROUPS,
    LineMatrix,
    build_line_matrix,
    file_index,
    line_stats,
    row_of,
    rows_dense,
    rows_of_node,
    source_text,
    window,
)
from callpath.analysis.lines_overview import REDUCERS, Overview, overview
from callpath.analysis.lines_procs import procedure_at, ranked_procedures, segment, segments

__all__ = [
    "GROUPS", "REDUCERS", "InstructionListing", "LineMatrix", "Overview", "build_line_matrix",
    "file_index", "line_instructions", "line_stats", "overview", "procedure_at",
    "ranked_procedures", "row_of", "rows_dense", "rows_of_node", "segment", "segments",
    "source_text",
    "window",
]
