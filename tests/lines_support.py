"""Databases for the Lines tests: the seed's Figure 1 (parsed from the seed text itself) and
generated programs of many lines, built with the model API and written as v4 databases."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.formats.v4.writer import write_v4
from callpath.model import (
    CCT,
    ExecutionContext,
    Function,
    Identifier,
    IdKind,
    LoadModule,
    NodeKind,
    ProfileBlock,
    SourceFile,
    build_experiment,
    propagate,
    standard_metric,
    standard_scopes,
)

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT.parent / "shared" / "seeds"
_FIG_ROW = re.compile(r"^(\d+)\t(\d+)\t(\d+)\t(\d+)\t(.*?)\t(.*)$")
_MINMAX = re.compile(r"min (\d+)\((\d+)\) max (\d+)\((\d+)\)")


def figure1() -> tuple[list[list[int]], list[str], list[tuple[int, int, int, int] | None]]:
    """Figure 1 of seeds/003 as printed: per source line the four processors' tick counts,
    the source text, and the seed's ``min V(P) max V(P)`` (None where it prints none)."""
    seed = sorted(SEEDS.glob("003_*.txt"))
    if not seed:
        raise FileNotFoundError(f"seed 003 not found under {SEEDS}")
    ticks, source, minmax = [], [], []
    lines = seed[0].read_text().splitlines()
    end = next(i for i, s in enumerate(lines) if s.startswith("Figure 1:"))
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    start = end
    while start > 0 and _FIG_ROW.match(lines[start - 1]):
        start -= 1
    for s in lines[start:end]:
        mt = _FIG_ROW.match(s)
        if mt is None:
            continue
        ticks.append([int(mt.group(k)) for k in range(1, 5)])
        source.append(mt.group(5).strip())
        mm = _MINMAX.search(mt.group(6))
        minmax.append(tuple(int(x) for x in mm.groups()) if mm else None)  # type: ignore[misc]
    return ticks, source, minmax


def lines_experiment(path: str, ticks: npt.NDArray[np.float64],
                     procedures: list[tuple[str, int, int]], *, rank_ids: bool = True,
                     threads_per_rank: int = 1):
    """An experiment of one source file whose line ``i + 1`` costs ``ticks[i, c]`` in context
    ``c``: a procedure frame per (name, first line, last line), each holding line scopes for
    its lines with cost. Contexts are RANK r THREAD t (``threads_per_rank`` threads each)."""
    n_lines, n_ctx = ticks.shape
    parent = [-1, 0]
    kind = [NodeKind.ROOT, NodeKind.ENTRY]
    fn = [-1, -1]
    line = [0, 0]
    fl = [-1, -1]
    node_of_line = np.full(n_lines, -1, dtype=np.int64)
    functions = []
    has = (ticks != 0).any(axis=1)
    for p, (name, a, b) in enumerate(procedures):
        functions.append(Function(name, 0, 0x1000 * (p + 1), 0, a))
        me = len(parent)
        parent.append(1)
        kind.append(NodeKind.FUNCTION)
        fn.append(p)
        fl.append(0)
        line.append(a)
        rows = np.nonzero(has[a - 1:b])[0] + a - 1
        for r in rows.tolist():
            node_of_line[r] = len(parent)
            parent.append(me)
            kind.append(NodeKind.LINE)
            fn.append(-1)
            fl.append(0)
            line.append(r + 1)
    n = len(parent)
    cct = CCT.from_columns(parent, kind, function=fn, file=fl, line=line,
                           module=[0 if k == NodeKind.FUNCTION else -1 for k in kind],
                           entry_point=[0, 1] + [0] * (n - 2), entry_names={1: "main thread"})
    scopes = standard_scopes()
    metrics = [standard_metric("ticks", 0, scopes)]
    blocks, contexts = [], []
    placed = node_of_line >= 0
    if np.any((ticks != 0).any(axis=1) & ~placed):
        raise ValueError("a line with cost lies outside every procedure")
    for c in range(n_ctx):
        col = ticks[:, c]
        nz = np.nonzero((col != 0) & placed)[0]
        blk = ProfileBlock.from_triples(node_of_line[nz], np.zeros(len(nz), np.int64), col[nz])
        blocks.append(propagate(cct, metrics, scopes, blk))
        r, t = divmod(c, threads_per_rank)
        if not rank_ids:
            ids: tuple[Identifier, ...] = (Identifier(IdKind.THREAD, c),)
        elif threads_per_rank == 1:
            ids = (Identifier(IdKind.RANK, r),)
        else:
            ids = (Identifier(IdKind.RANK, r), Identifier(IdKind.THREAD, t))
        contexts.append(ExecutionContext(c + 1, ids))
    return build_experiment(cct, metrics, scopes, contexts, blocks,
                            modules=[LoadModule("/opt/lines/a.out")],
                            files=[SourceFile(path)], functions=functions, title="lines")


def write_figure1_database(d: Path) -> tuple[Path, Path]:
    """Figure 1 as a database: the source as ``fig1.f90`` (with the figure's lines) and four
    processors RANK 0..3 with the printed tick counts; one procedure over all lines."""
    ticks, source, _ = figure1()
    d.mkdir(parents=True, exist_ok=True)
    src = d / "fig1.f90"
    src.write_text("\n".join(source) + "\n")
    arr = np.asarray(ticks, dtype=np.float64)
    exp = lines_experiment(str(src), arr, [("spike_test", 1, len(source))])
    db = d / "fig1.d"
    write_v4(exp, db, copy_sources=True)
    return db, src


FIG4_LINES = 94_824


def figure4_program(d: Path, n_ctx: int = 4, seed: int = 4) -> tuple[Path, npt.NDArray[np.float64],
                                                                     list[tuple[str, int, int]]]:
    """A generated program of 94,824 lines (the seed's "spike" program size) with 40
    procedures of 110 lines each, separated by long runs of lines without cost; inside a
    procedure, short runs (at most 50) of empty lines. Figure 4's parameters (skip > 50, bins
    of 4, strips of 80) then keep 4,400 lines: 1,100 overview rows, 14 strips as in the seed.
    Returns the database, the tick matrix (lines × contexts) and the procedures."""
    rng = np.random.default_rng(seed)
    n_proc, size = 40, 110
    gaps = rng.multinomial(FIG4_LINES - n_proc * size - 51 * (n_proc + 1),
                           np.ones(n_proc + 1) / (n_proc + 1)) + 51
    ticks = np.zeros((FIG4_LINES, n_ctx))
    procs = []
    at = 0
    for p in range(n_proc):
        at += int(gaps[p])
        a = at + 1  # 1-based first line
        body = rng.integers(1, 300, size=(size, n_ctx)).astype(np.float64)
        body[rng.random(size) < 0.5] = 0  # zero lines inside
        # short runs of empty lines (at most 50: kept) and the first and last line with cost
        body[20:60] = 0
        body[0] = rng.integers(1, 300, size=n_ctx)
        body[-1] = rng.integers(1, 300, size=n_ctx)
        ticks[at:at + size] = body
        procs.append((f"proc_{p:02d}", a, a + size - 1))
        at += size
    assert at + int(gaps[-1]) == FIG4_LINES
    d.mkdir(parents=True, exist_ok=True)
    src = d / "spike.f90"
    src.write_text("".join(f"      x({i}) = {i}\n" for i in range(1, FIG4_LINES + 1)))
    exp = lines_experiment(str(src), ticks, procs)
    db = d / "spike.d"
    write_v4(exp, db, copy_sources=False)
    return db, ticks, procs
