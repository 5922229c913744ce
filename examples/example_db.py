"""Build the bundled example database: a small MPI stencil code measured on 4 ranks.

Until ``callpath profile`` exists, this stands in for a measurement: it constructs the calling
context tree and per-rank sample counts of a typical time-stepping stencil program (grid set-up,
a compute kernel with an inlined index helper inside a loop nest, a halo exchange whose wait time
grows with load imbalance, output) through callpath's public model API, and writes it as an
HPCToolkit v4 database with the same writer ``callpath prof`` will use. The sources are written
into the database's ``src/`` folder so that viewers can show them.

Usage: python examples/example_db.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

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
    Relation,
    SourceFile,
    TraceLine,
    Traces,
    build_experiment,
    propagate,
    standard_metric,
    standard_scopes,
)

APP_C = """\
#include <mpi.h>
#include "grid.h"

static void init_grid(double *u, int n) {
  for (int i = 0; i < n * n; i++)
    u[i] = (double)(i % 7);
}

static void compute_stencil(double *v, const double *u, int n) {
  for (int i = 1; i < n - 1; i++)
    for (int j = 1; j < n - 1; j++)
      v[idx(i, j, n)] = 0.25 * (u[idx(i - 1, j, n)] + u[idx(i + 1, j, n)]
                               + u[idx(i, j - 1, n)] + u[idx(i, j + 1, n)]);
}

static void exchange_halos(double *u, int n, MPI_Comm comm) {
  MPI_Request req[4];
  post_halo_requests(u, n, comm, req);
  MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
}

static void write_output(const double *u, int n) {
  fwrite(u, sizeof(double), (size_t)n * n, stdout);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int n = 4096;
  double *u = malloc(sizeof(double) * n * n), *v = malloc(sizeof(double) * n * n);
  init_grid(u, n);
  for (int step = 0; step < 100; step++) {
    compute_stencil(v, u, n);
    exchange_halos(v, n, MPI_COMM_WORLD);
    double *t = u; u = v; v = t;
  }
  write_output(u, n);
  MPI_Finalize();
  return 0;
}
"""

GRID_H = """\
static inline int idx(int i, int j, int n) {
  return i * n + j;
}
"""

# (parent, kind, relation, function, file, line); functions and files index the tables below.
F, LP, LN, INS = NodeKind.FUNCTION, NodeKind.LOOP, NodeKind.LINE, NodeKind.INSTRUCTION
CALL, INL, LEX = Relation.CALL, Relation.INLINED_CALL, Relation.LEXICAL
TREE = [
    (-1, NodeKind.ROOT, Relation.NONE, -1, -1, 0),  # 0 global context
    (0, NodeKind.ENTRY, Relation.NONE, -1, -1, 0),  # 1 main thread
    (1, F, CALL, 0, -1, 0),  # 2 main
    (2, LN, LEX, -1, 0, 30),  # 3 init_grid(u, n) call site
    (3, F, CALL, 1, -1, 0),  # 4 init_grid
    (4, LP, LEX, -1, 0, 5),  # 5 loop
    (5, LN, LEX, -1, 0, 6),  # 6 u[i] = ...
    (2, LP, LEX, -1, 0, 31),  # 7 time-step loop
    (7, LN, LEX, -1, 0, 32),  # 8 compute_stencil call site
    (8, F, CALL, 2, -1, 0),  # 9 compute_stencil
    (9, LP, LEX, -1, 0, 10),  # 10 loop i
    (10, LP, LEX, -1, 0, 11),  # 11 loop j
    (11, LN, LEX, -1, 0, 12),  # 12 the stencil statement
    (12, F, INL, 3, -1, 0),  # 13 idx, inlined
    (13, LN, LEX, -1, 1, 2),  # 14 return i * n + j
    (7, LN, LEX, -1, 0, 33),  # 15 exchange_halos call site
    (15, F, CALL, 4, -1, 0),  # 16 exchange_halos
    (16, LN, LEX, -1, 0, 19),  # 17 MPI_Waitall call site
    (17, F, CALL, 5, -1, 0),  # 18 MPI_Waitall
    (18, INS, LEX, -1, -1, 0),  # 19 an instruction in libmpi
    (16, LN, LEX, -1, 0, 18),  # 20 post_halo_requests
    (2, LN, LEX, -1, 0, 36),  # 21 write_output call site
    (21, F, CALL, 6, -1, 0),  # 22 write_output
    (22, LN, LEX, -1, 0, 23),  # 23 fwrite
]
# Seconds of CPU time per rank at the leaves: rank r computes a little more than rank r-1,
# and the ranks that finish first wait for the slowest in MPI_Waitall.
LEAF_COST = {
    6: lambda r: 0.40,
    12: lambda r: 6.0 * (1 + 0.08 * r),
    14: lambda r: 1.5 * (1 + 0.08 * r),
    19: lambda r: 0.2 + 7.5 * 0.08 * (3 - r),
    20: lambda r: 0.15,
    23: lambda r: 0.6 if r == 0 else 0.05,
}
RANKS = 4
PERIOD = 0.005  # seconds per sample (200 Hz)


def build(out: Path) -> Path:
    parent, kind, rel, fn, fl, line = (list(c) for c in zip(*TREE, strict=True))
    module = [-1] * len(TREE)
    offset = [0] * len(TREE)
    module[19], offset[19] = 1, 0x2F1C0
    cct = CCT.from_columns(parent, kind, relation=rel, function=fn, file=fl, line=line,
                           module=module, offset=offset, entry_point=[0, 1] + [0] * 22,
                           entry_names={1: "main thread"})
    scopes = standard_scopes()
    metrics = [standard_metric("CPUTIME (sec)", 0, scopes, "CPU time", "seconds", PERIOD),
               standard_metric("CYCLES", 3, scopes, "CPU cycles (estimated at 2.4 GHz)",
                               "cycles")]
    rng = np.random.default_rng(7)
    contexts, blocks, lines = [], [], []
    t0 = 1_700_000_000_000_000_000
    for r in range(RANKS):
        ctx, met, val = [], [], []
        samples = []
        for node, cost in LEAF_COST.items():
            seconds = round(cost(r) / PERIOD) * PERIOD  # whole samples
            ctx += [node, node]
            met += [0, 3]
            val += [seconds, seconds * 2.4e9 * rng.uniform(0.97, 1.03)]
            samples += [node] * round(seconds / PERIOD)
        blocks.append(propagate(cct, metrics, scopes, ProfileBlock.from_triples(ctx, met, val)))
        contexts.append(ExecutionContext(r + 1, (Identifier(IdKind.NODE, 0, 0x7F000001, 1),
                                                 Identifier(IdKind.RANK, r),
                                                 Identifier(IdKind.THREAD, 0))))
        order = rng.permutation(len(samples))
        stamps = t0 + np.arange(len(samples), dtype=np.uint64) * np.uint64(PERIOD * 1e9)
        lines.append(TraceLine(r + 1, stamps, np.asarray(samples, np.uint32)[order]))
    tmin = min(int(t.timestamps[0]) for t in lines)
    tmax = max(int(t.timestamps[-1]) for t in lines)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        (src / "app.c").write_text(APP_C)
        (src / "grid.h").write_text(GRID_H)
        exp = build_experiment(
            cct, metrics, scopes, contexts, blocks,
            modules=[LoadModule("/opt/example/bin/stencil"), LoadModule("/usr/lib/libmpi.so.40")],
            files=[SourceFile(str(src / "app.c")), SourceFile(str(src / "grid.h"))],
            functions=[Function("main", 0, 0x1320, 0, 26), Function("init_grid", 0, 0x11A0, 0, 4),
                       Function("compute_stencil", 0, 0x1210, 0, 9), Function("idx", 0, 0, 1, 1),
                       Function("exchange_halos", 0, 0x12B0, 0, 17),
                       Function("MPI_Waitall", 1, 0x2F100, -1, 0),
                       Function("write_output", 0, 0x1300, 0, 22)],
            title="stencil (example)", description="A synthetic 4-rank MPI stencil run.",
            traces=Traces(tmin, tmax, lines))
        if out.exists():
            shutil.rmtree(out)
        return write_v4(exp, out, copy_sources=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python examples/example_db.py OUT_DIR\n")
        sys.exit(2)
    print(f"example database written to {build(Path(sys.argv[1]))}")
