"""Test helpers: whole-experiment equality, and a small experiment built with the model API."""

from __future__ import annotations

from pathlib import Path

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
    Relation,
    SourceFile,
    TraceLine,
    Traces,
    build_experiment,
    propagate,
    standard_metric,
    standard_scopes,
)

TREE_FIELDS = ("ctx_id", "parent", "kind", "relation", "flags", "function", "file", "line",
               "module", "offset", "propagation", "entry_point", "depth", "subtree_end")


def _same_array(a: object, b: object, what: str) -> None:
    x, y = np.asarray(a), np.asarray(b)
    assert x.shape == y.shape, f"{what}: shape {x.shape} != {y.shape}"
    # bit-exact for floats (NaN == NaN, -0.0 != 0.0): compare the bytes of equal dtypes
    if x.dtype.kind == "f" or y.dtype.kind == "f":
        assert x.dtype == y.dtype, f"{what}: dtype {x.dtype} != {y.dtype}"
        assert x.tobytes() == y.tobytes(), f"{what}: values differ"
    else:
        assert np.array_equal(x, y), f"{what}: {x[:20]} != {y[:20]}"


def assert_same_experiment(a: Experiment, b: Experiment, *, metric_details: bool = False,
                           files: bool = True) -> None:
    """Everything a v4 database holds is equal in ``a`` and ``b``: tree arrays and entry
    names, tables, metrics and scopes, identifier names, title and description, profiles,
    every profile block, every context block (cct.db, or the transpose when absent), traces.

    ``metric_details`` also compares description / unit / period, which meta.db does not
    store; ``files=False`` skips the source file table (copying sources rewrites it)."""
    for name in TREE_FIELDS:
        _same_array(getattr(a.cct, name), getattr(b.cct, name), f"cct.{name}")
    assert a.cct.entry_names == b.cct.entry_names
    assert a.title == b.title
    assert a.description == b.description
    assert a.id_names == b.id_names
    assert a.scopes == b.scopes
    if metric_details:
        assert a.metrics == b.metrics
    else:
        assert [(m.name, m.scope_insts, m.summaries) for m in a.metrics] == \
            [(m.name, m.scope_insts, m.summaries) for m in b.metrics]
    assert a.modules == b.modules
    if files:
        assert a.files == b.files
    assert a.functions == b.functions
    assert a.profiles == b.profiles
    assert a.n_ctx_slots == b.n_ctx_slots
    assert len(a.values) == len(b.values)
    for i in range(len(a.values)):
        pa, pb = a.values[i], b.values[i]
        for f in ("ctx_ids", "starts", "metric_ids", "values"):
            _same_array(getattr(pa, f), getattr(pb, f), f"profile {i} {f}")
    ca, cb = a.context_store(), b.context_store()
    assert len(ca) == len(cb), f"cct.db context count {len(ca)} != {len(cb)}"
    for c in range(len(ca)):
        xa, xb = ca[c], cb[c]
        for f in ("metric_ids", "starts", "prof_indices", "values"):
            _same_array(getattr(xa, f), getattr(xb, f), f"context {c} {f}")
    assert (a.traces is None) == (b.traces is None)
    if a.traces is not None and b.traces is not None:
        assert a.traces.min_timestamp == b.traces.min_timestamp
        assert a.traces.max_timestamp == b.traces.max_timestamp
        assert len(a.traces.lines) == len(b.traces.lines)
        for k, (la, lb) in enumerate(zip(a.traces.lines, b.traces.lines, strict=True)):
            assert la.prof_index == lb.prof_index
            _same_array(la.timestamps, lb.timestamps, f"trace {k} timestamps")
            _same_array(la.ctx_ids, lb.ctx_ids, f"trace {k} contexts")


# ---- a small experiment built through the model API -------------------------------------

F, LP, LN, INS = NodeKind.FUNCTION, NodeKind.LOOP, NodeKind.LINE, NodeKind.INSTRUCTION
#  (parent, kind, relation, function, file, line, module, offset)
SMALL_TREE = [
    (-1, NodeKind.ROOT, Relation.NONE, -1, -1, 0, -1, 0),  # 0 global context
    (0, NodeKind.ENTRY, Relation.NONE, -1, -1, 0, -1, 0),  # 1 main thread
    (1, F, Relation.CALL, 0, -1, 0, -1, 0),  # 2 main
    (2, LP, Relation.LEXICAL, -1, 0, 5, 0, 0x1040),  # 3 loop at a.c:5 (srcloc + point)
    (3, LN, Relation.LEXICAL, -1, 0, 6, -1, 0),  # 4 a.c:6
    (4, F, Relation.CALL, 1, -1, 0, -1, 0),  # 5 work
    (5, LN, Relation.LEXICAL, -1, 0, 12, -1, 0),  # 6 a.c:12
    (6, F, Relation.INLINED_CALL, 2, -1, 0, -1, 0),  # 7 helper, inlined
    (7, INS, Relation.LEXICAL, -1, -1, 0, 1, 0x2F1C0),  # 8 an instruction in libm
    (2, LN, Relation.LEXICAL, -1, 0, 9, -1, 0),  # 9 a.c:9
    (0, NodeKind.ENTRY, Relation.NONE, -1, -1, 0, -1, 0),  # 10 application thread
    (10, F, Relation.CALL, 1, -1, 0, -1, 0),  # 11 work
    (11, LN, Relation.LEXICAL, -1, 0, 12, -1, 0),  # 12 a.c:12
]
SMALL_COST = {4: (0.5, 0.25), 6: (1.5, 3.0), 8: (0.75, 0.0), 9: (0.125, 0.5), 12: (0.0, 2.0)}


def small_experiment(source_dir: Path | None = None) -> Experiment:
    """13 contexts, two threads with different costs, a second metric, traces. Files that
    exist when ``source_dir`` is given (a.c there; b.h never exists)."""
    cols = list(zip(*SMALL_TREE, strict=True))
    parent, kind, rel, fn, fl, line, mod, off = ([int(v) for v in c] for c in cols)
    # ctx ids are not node indices, as in real databases (and leave a gap: id 14 unused)
    ctx_id = [0, 1, 7, 3, 13, 5, 6, 2, 8, 9, 10, 11, 12]
    cct = CCT.from_columns(parent, kind, ctx_id=ctx_id, relation=rel, function=fn, file=fl,
                           line=line, module=mod, offset=off,
                           entry_point=[0, 1] + [0] * 8 + [2, 0, 0],
                           entry_names={1: "main thread", 10: "application thread"})
    scopes = standard_scopes()
    metrics = [standard_metric("CPUTIME (sec)", 0, scopes),
               standard_metric("INSTRUCTIONS", 3, scopes)]
    blocks, contexts, lines = [], [], []
    node_ctx = np.asarray(ctx_id, dtype=np.int64)
    for t in range(2):
        ctx, met, val = [], [], []
        for node, costs in SMALL_COST.items():
            if costs[t]:
                ctx += [node_ctx[node], node_ctx[node]]
                met += [0, 3]
                val += [costs[t], costs[t] * 2.5e9]
        blocks.append(propagate(cct, metrics, scopes, ProfileBlock.from_triples(ctx, met, val)))
        contexts.append(ExecutionContext(t + 1, (Identifier(IdKind.NODE, 0, 0xC0FFEE, 1),
                                                 Identifier(IdKind.THREAD, t))))
        stamps = np.uint64(1_700_000_000_000_000_000) + np.arange(6, dtype=np.uint64) * 1000
        lines.append(TraceLine(t + 1, stamps + np.uint64(t),
                               np.array([0, 13, 6, 6, 8, 12 if t else 9], dtype=np.uint32)))
    src = source_dir if source_dir is not None else Path("/nonexistent-callpath-test")
    return build_experiment(
        cct, metrics, scopes, contexts, blocks,
        modules=[LoadModule("/opt/app/bin/a.out"), LoadModule("/usr/lib/libm.so.6", 0)],
        files=[SourceFile(str(src / "a.c")), SourceFile(str(src / "b.h"))],
        functions=[Function("main", 0, 0x1000, 0, 3), Function("work", 0, 0x1100, 0, 11),
                   Function("", 1, 0x2F100, 1, 1, has_name=False)],
        title="model-built", description="An experiment built with callpath.model.",
        traces=Traces(int(lines[0].timestamps[0]), int(lines[1].timestamps[-1]), lines))
