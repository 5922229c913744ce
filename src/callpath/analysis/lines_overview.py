"""The compressed overview of the whole line axis (PerfVisS Figure 4), a pure function of a
:class:`~callpath.analysis.lines_matrix.LineMatrix`.

Three steps, as in the seed: (1) runs of more than ``skip`` consecutive rows without cost are
dropped; (2) the kept rows, in order, are cut into bins of ``bin`` rows, each reduced to one
overview row by the maximum (peaks stay visible) or the sum; (3) the overview rows are cut
into strips of ``strip_lines`` shown side by side. Overview row ``o`` is strip
``o // strip_lines``, row ``o % strip_lines``.

The maps are arrays: ``fwd_orow[r]`` is the overview row of axis row ``r`` (for a dropped
row: the overview row where the skip happened, i.e. that of the next kept row, or the last
one at the end), ``kept[r]`` whether it was kept; ``inv_first[o]`` / ``inv_last[o]`` the
first / last axis row that overview row ``o`` stands for. :meth:`Overview.rectangles` pushes an
axis range through the same map and splits it at strip boundaries, and :meth:`Overview.locate`
maps a (strip, row) position back to its first axis row.

The context axis compresses too, for thousands of contexts (the seed left it open):
``context_bins=K`` reduces the columns into K bins by their maximum; ``top_contexts=N`` keeps,
per overview row, the N contexts with the highest values (and which they are). Each stored value
goes straight to its overview cell (one ``np.maximum.at`` or ``bincount`` per chunk of overview
rows); only the top-N selection (and sums binned over contexts) goes through a dense chunk
of at most ~4M cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.lines_matrix import LineMatrix
from callpath.errors import CallpathError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]

REDUCERS = ("max", "sum")
_CHUNK_CELLS = 1 << 22


@dataclass
class Overview:
    """The compressed line axis. ``values``: (n_orows, n_display_columns); with
    ``top_contexts`` the columns are ranks (0 = highest) and ``top_index`` names the context
    column of each cell. ``column_groups[k]``: the first matrix column of display column ``k``
    (``column_groups[k]:column_groups[k+1]`` are its columns; identity without binning)."""

    skip: int
    bin: int
    reduce: str
    strip_lines: int
    n_rows: int  # axis rows
    kept: Bool
    kept_index: I64  # per axis row: index among kept rows of the last kept row at or before
    fwd_orow: I64
    inv_first: I64
    inv_last: I64
    values: F64
    column_groups: I64
    top_index: I64 | None = None

    @property
    def n_orows(self) -> int:
        return len(self.inv_first)

    @property
    def n_strips(self) -> int:
        return -(-self.n_orows // self.strip_lines) if self.n_orows else 0

    @property
    def fwd_strip(self) -> I64:
        """Strip of every axis row."""
        out: I64 = self.fwd_orow // self.strip_lines
        return out

    @property
    def fwd_row(self) -> I64:
        """Row within its strip of every axis row."""
        out: I64 = self.fwd_orow % self.strip_lines
        return out

    def strips(self) -> F64:
        """The values as (strips, strip_lines, columns), the last strip padded with NaN."""
        n = self.n_strips * self.strip_lines
        pad = np.full((n, self.values.shape[1]), np.nan)
        pad[:self.n_orows] = self.values
        return pad.reshape(self.n_strips, self.strip_lines, self.values.shape[1])

    def locate(self, strip: int, row: int) -> int:
        """The first axis row of the overview position (strip, row) (a click)."""
        o = int(strip) * self.strip_lines + int(row)
        if not 0 <= row < self.strip_lines or not 0 <= o < self.n_orows:
            raise CallpathError(f"overview position strip {strip} row {row} is outside the "
                                f"overview ({self.n_strips} strips of {self.strip_lines})")
        return int(self.inv_first[o])

    def compress_range(self, start_row: int, end_row: int) -> tuple[int, int]:
        """Overview rows (first, last, inclusive) covered by axis rows start..end (inclusive)."""
        if not self.n_orows:
            raise CallpathError("the overview is empty (no line has a cost)")
        a = max(0, min(int(start_row), self.n_rows - 1))
        b = max(0, min(int(end_row), self.n_rows - 1))
        if b < a:
            a, b = b, a
        first = int(self.fwd_orow[a])
        k_last = int(self.kept_index[b])  # last kept row at or before b
        if k_last < 0 or k_last // self.bin < first:
            return first, first  # the range lies inside a skipped run: a marker there
        return first, k_last // self.bin

    def rectangles(self, start_row: int, end_row: int) -> list[tuple[int, int, int]]:
        """The axis range start..end (inclusive) as rectangles ``(strip, first_row, rows)``
        on the overview, compressed and split across strips exactly as the data is."""
        first, last = self.compress_range(start_row, end_row)
        out = []
        L = self.strip_lines
        for s in range(first // L, last // L + 1):
            a = max(first, s * L)
            b = min(last, s * L + L - 1)
            out.append((s, a - s * L, b - a + 1))
        return out


def overview(m: LineMatrix, skip: int = 50, bin: int = 4, reduce: str = "max",
             strip_lines: int = 80, context_bins: int | None = None,
             top_contexts: int | None = None) -> Overview:
    """The overview of ``m`` (see the module docstring)."""
    if skip < 0 or bin < 1 or strip_lines < 1:
        raise CallpathError(f"overview parameters skip={skip} bin={bin} "
                            f"strip_lines={strip_lines}: expected skip >= 0, bin >= 1 and "
                            "strip lines >= 1")
    if reduce not in REDUCERS:
        raise CallpathError(f"overview reduction {reduce!r}: expected max or sum")
    if context_bins is not None and context_bins < 1:
        raise CallpathError(f"context bins {context_bins}: expected at least 1")
    if top_contexts is not None and top_contexts < 1:
        raise CallpathError(f"top contexts {top_contexts}: expected at least 1")
    n = m.n_rows
    kept = _kept_rows(m.has_cost(), skip)
    kidx = np.cumsum(kept) - 1  # index among kept rows (of the last kept row at or before)
    n_kept = int(kept.sum())
    n_orows = -(-n_kept // bin)
    # a dropped row maps where the skip is: the bin of the next kept row (last bin at end)
    nxt = np.where(kept, kidx, kidx + 1)
    fwd = np.minimum(nxt // bin, max(n_orows - 1, 0)).astype(np.int64)
    kept_rows = np.nonzero(kept)[0]
    inv_first = kept_rows[::bin].astype(np.int64)
    inv_last = kept_rows[np.minimum(np.arange(n_orows) * bin + bin - 1, n_kept - 1)] \
        if n_orows else np.zeros(0, np.int64)

    nc = m.n_cols
    if context_bins is not None and context_bins < nc:
        groups = (np.arange(context_bins, dtype=np.int64) * nc) // context_bins
        groups = np.unique(groups)
    else:
        groups = np.arange(nc, dtype=np.int64)
    ncols_out = len(groups) if top_contexts is None else min(top_contexts, nc)
    values = np.zeros((n_orows, ncols_out), dtype=np.float64)
    top = np.zeros((n_orows, ncols_out), dtype=np.int64) if top_contexts is not None else None
    direct = top is None and (reduce == "max" or len(groups) == nc)
    # direct: each stored entry goes straight to its output cell (one ufunc.at or bincount
    # per chunk, no dense intermediate); else a dense chunk over all columns first
    step = max(1, (_CHUNK_CELLS if not direct else 1 << 24) // max(nc, 1))
    col_group = np.repeat(np.arange(len(groups)), np.diff(np.append(groups, nc)))
    for a in range(0, n_orows, step):
        b = min(n_orows, a + step)
        lo_row = int(inv_first[a])
        hi_row = int(inv_last[b - 1]) + 1
        if direct:
            r, c, v = m.entries(lo_row, hi_row)  # rows with entries have cost: all kept
            o = kidx[r] // bin - a
            cc = c if len(groups) == nc else col_group[c]
            part = values[a:b].reshape(-1)
            key = o * len(groups) + cc
            if reduce == "sum":
                part += np.bincount(key, weights=v, minlength=len(part))
            else:
                np.maximum.at(part, key, v)
            continue
        dense = _dense_bins(m, lo_row, hi_row, kidx, a, b - a, bin, reduce)
        if top is not None:
            k = ncols_out
            sel = np.argpartition(-dense, k - 1, axis=1)[:, :k] if k < nc else \
                np.tile(np.arange(nc), (len(dense), 1))
            pv = np.take_along_axis(dense, sel, axis=1)
            o2 = np.argsort(-pv, axis=1, kind="stable")
            values[a:b] = np.take_along_axis(pv, o2, axis=1)
            top[a:b] = np.take_along_axis(sel, o2, axis=1)
        else:
            values[a:b] = np.maximum.reduceat(dense, groups, axis=1)
    return Overview(skip=skip, bin=bin, reduce=reduce, strip_lines=strip_lines, n_rows=n,
                    kept=kept, kept_index=kidx.astype(np.int64), fwd_orow=fwd, inv_first=inv_first,
                    inv_last=np.asarray(inv_last, dtype=np.int64), values=values,
                    column_groups=groups, top_index=top)


def _kept_rows(has: Bool, skip: int) -> Bool:
    """Rows kept: all but those in runs of more than ``skip`` consecutive rows without cost."""
    n = len(has)
    kept = np.ones(n, dtype=bool)
    if not n:
        return kept
    empty = ~has
    # starts and ends of runs of empty rows
    d = np.diff(np.concatenate(([0], empty.astype(np.int8), [0])))
    starts = np.nonzero(d == 1)[0]
    ends = np.nonzero(d == -1)[0]
    long = (ends - starts) > skip
    mark = np.zeros(n + 1, dtype=np.int64)
    np.add.at(mark, starts[long], 1)
    np.add.at(mark, ends[long], -1)
    out: Bool = np.cumsum(mark)[:-1] == 0
    return out


def _dense_bins(m: LineMatrix, lo_row: int, hi_row: int, kidx: I64, o0: int, count: int,
                bin: int, reduce: str) -> F64:
    """Overview rows ``o0 .. o0+count-1`` dense over all columns: each stored entry lands on
    (kept index // bin, column), reduced by one ``np.maximum.at`` or one bincount."""
    nc = m.n_cols
    r, c, v = m.entries(lo_row, hi_row)
    key = (kidx[r] // bin - o0) * nc + c
    if reduce == "sum":
        flat = np.bincount(key, weights=v, minlength=count * nc)
        summed: F64 = flat.reshape(count, nc).astype(np.float64, copy=False)
        return summed
    out: F64 = np.zeros(count * nc, dtype=np.float64)
    np.maximum.at(out, key, v)
    return out.reshape(count, nc)
