"""Calling context trees with known costs, built with the model API: the seed's recursive
example (file1.c / file2.c with m, f, g, h) and the filter figures' tree (A, B, C, D, E)."""

from __future__ import annotations

import numpy as np

from callpath.model import (
    CCT,
    ExecutionContext,
    Experiment,
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

F, L, E, R = NodeKind.FUNCTION, NodeKind.LINE, NodeKind.ENTRY, NodeKind.ROOT

# functions: 0 m, 1 f, 2 g, 3 h; files: 0 file1.c, 1 file2.c
SEED_FUNCTIONS = [Function("m", 0, 0x100, 0, 6), Function("f", 0, 0x200, 0, 1),
                  Function("g", 0, 0x300, 1, 2), Function("h", 0, 0x400, 1, 7)]

# (parent, kind, function, file, line, own cost); g_3 under f, g_1 under m, g_2 inside g_1
SEED_TREE = [
    (-1, R, -1, -1, 0, 0),   # 0 <program root>
    (0, E, -1, -1, 0, 0),    # 1 main thread
    (1, F, 0, 0, 6, 0),      # 2 m
    (2, L, -1, 0, 6, 1),     # 3   file1.c:6 (m's own work)
    (2, L, -1, 0, 7, 0),     # 4   file1.c:7 calls f
    (4, F, 1, 0, 1, 0),      # 5     f
    (5, L, -1, 0, 2, 1),     # 6       file1.c:2 (own work, and calls g)
    (6, F, 2, 1, 2, 0),      # 7         g_3
    (7, L, -1, 1, 3, 1),     # 8           file2.c:3
    (7, L, -1, 1, 4, 0),     # 9           file2.c:4 calls h
    (9, F, 3, 1, 7, 0),      # 10            h
    (10, L, -1, 1, 8, 2),    # 11              file2.c:8
    (2, L, -1, 0, 8, 0),     # 12  file1.c:8 calls g
    (12, F, 2, 1, 2, 0),     # 13    g_1
    (13, L, -1, 1, 3, 1),    # 14      file2.c:3 (own work, and calls g)
    (14, F, 2, 1, 2, 0),     # 15        g_2
    (15, L, -1, 1, 3, 1),    # 16          file2.c:3
    (15, L, -1, 1, 4, 0),    # 17          file2.c:4 calls h
    (17, F, 3, 1, 7, 0),     # 18            h
    (18, L, -1, 1, 8, 2),    # 19              file2.c:8
    (13, L, -1, 1, 4, 0),    # 20      file2.c:4 calls h
    (20, F, 3, 1, 7, 0),     # 21        h
    (21, L, -1, 1, 8, 2),    # 22          file2.c:8
]
G1, G2, G3 = 13, 15, 7

# the filter figures: A calls B and C, C calls D and E; costs 1..5
FILTER_NAMES = ["A", "B", "C", "D", "E"]
FILTER_TREE = [
    (-1, R, -1, -1, 0, 0),  # 0 root
    (0, E, -1, -1, 0, 0),   # 1 main thread
    (1, F, 0, 0, 1, 1),     # 2 A
    (2, F, 1, 0, 10, 2),    # 3   B
    (2, F, 2, 0, 20, 3),    # 4   C
    (4, F, 3, 0, 30, 4),    # 5     D
    (4, F, 4, 0, 40, 5),    # 6     E
]


def tree_experiment(tree: list[tuple[int, int, int, int, int, int]],
                    functions: list[Function], files: list[SourceFile],
                    thread_scale: tuple[float, ...] = (1.0, 2.0)) -> Experiment:
    """An experiment over ``tree`` with one thread per scale factor: each thread's point
    cost is ``own cost * scale``; metric 0 is seconds, metric 1 (``INSTRUCTIONS``) 1000x."""
    parent, kind, fn, fl, line, cost = (list(c) for c in zip(*tree, strict=True))
    n = len(parent)
    cct = CCT.from_columns(parent, kind, function=fn, file=fl, line=line,
                           module=[0 if k == F else -1 for k in kind],
                           entry_point=[0, 1] + [0] * (n - 2), entry_names={1: "main thread"})
    scopes = standard_scopes()
    metrics = [standard_metric("CPUTIME (sec)", 0, scopes),
               standard_metric("INSTRUCTIONS", 3, scopes)]
    blocks, contexts = [], []
    costs = np.asarray(cost, dtype=np.float64)
    nz = np.nonzero(costs)[0]
    for t, scale in enumerate(thread_scale):
        ctx = np.repeat(nz, 2)
        met = np.tile([0, 3], len(nz))
        val = np.stack([costs[nz] * scale, costs[nz] * scale * 1000.0], axis=1).ravel()
        blocks.append(propagate(cct, metrics, scopes, ProfileBlock.from_triples(ctx, met, val)))
        contexts.append(ExecutionContext(t + 1, (Identifier(IdKind.THREAD, t),)))
    return build_experiment(cct, metrics, scopes, contexts, blocks,
                            modules=[LoadModule("/opt/seed/a.out")], files=files,
                            functions=functions, title="seed example")


def seed_experiment() -> Experiment:
    return tree_experiment(SEED_TREE, SEED_FUNCTIONS,
                           [SourceFile("/src/file1.c"), SourceFile("/src/file2.c")])


def filter_experiment() -> Experiment:
    funcs = [Function(nm, 0, 0x100 * (i + 1), 0, 1) for i, nm in enumerate(FILTER_NAMES)]
    return tree_experiment(FILTER_TREE, funcs, [SourceFile("/src/abc.c")], (1.0,))
