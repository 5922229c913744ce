"""Comparing two experiments up to context ids and sibling order: every context is named by
its path of labels from the root, and values are compared by that name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from callpath.model import Experiment
from conftest import DATA

#: a clone's tests/data: HPCToolkit's test measurements not in the shared data
ENV = "CALLPATH_HPCTOOLKIT_TESTDATA"


def hpctk_data(*parts: str) -> Path:
    """A path of HPCToolkit's test data: the shared data first, then ``$ENV`` (skip if in
    neither)."""
    p = DATA.joinpath("hpctoolkit", *parts)
    if p.exists():
        return p
    if os.environ.get(ENV) and Path(os.environ[ENV], *parts).exists():
        return Path(os.environ[ENV], *parts)
    pytest.skip(f"{'/'.join(parts)} (HPCToolkit's test data) is neither in "
                f"{DATA / 'hpctoolkit'} nor under ${ENV}")

Label = tuple[object, ...]


def has_values(exp: Experiment, node: int) -> bool:
    """Whether any metric has an inclusive (``execution``) value at ``node`` in the summary:
    what tells apart hpcprof's two ``<gpu kernel>`` contexts under one launch (hpcrun's
    ``GPUKernl`` placeholder carries the kernel's metrics, ``GPUTrace`` only its stream's
    trace samples), which have the same label."""
    ctx = int(exp.cct.ctx_id[node])
    for m in exp.metrics:
        sid = m.stat_id(exp.scopes, "execution")
        if sid is not None and exp.summary(sid)[ctx] != 0:
            return True
    return False


def labels(exp: Experiment) -> list[tuple[Label, ...]]:
    """Per node (preorder), the path of labels from the root. Siblings with the same label
    (distinct function entries of one name) are told apart by :func:`has_values`."""
    c = exp.cct
    out: list[tuple[Label, ...]] = []
    raw: list[Label] = []
    for i in range(len(c)):
        fn = int(c.function[i])
        fl = int(c.file[i])
        md = int(c.module[i])
        lab: Label = (int(c.kind[i]), int(c.relation[i]),
                      exp.functions[fn].name if fn >= 0 else "",
                      exp.files[fl].path if fl >= 0 else "", int(c.line[i]),
                      exp.modules[md].path if md >= 0 else "",
                      int(c.offset[i]) if md >= 0 else 0,
                      c.entry_names.get(i, ""))
        raw.append(lab)
    seen: dict[tuple[int, Label], int] = {}
    for i, lab in enumerate(raw):
        key = (int(c.parent[i]), lab)
        seen[key] = seen.get(key, 0) + 1
    for i in range(len(c)):
        p = int(c.parent[i])
        lab = raw[i]
        if seen[(p, lab)] > 1:
            lab = (*lab, has_values(exp, i))
        out.append((*out[p], lab) if p >= 0 else (lab,))
    return out


def by_path(exp: Experiment) -> dict[tuple[Label, ...], int]:
    got: dict[tuple[Label, ...], int] = {}
    for i, path in enumerate(labels(exp)):
        assert path not in got, f"two contexts with the same path {path}"
        got[path] = i
    return got


def matched_nodes(ours: Experiment, ref: Experiment) -> tuple[np.ndarray, np.ndarray]:
    """The two trees have the same contexts (named by their paths): the node indices of each
    path in ``ours`` and in ``ref``, paths in sorted order."""
    a, b = by_path(ours), by_path(ref)
    assert set(a) == set(b), (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3])
    assert len(ours.cct) == len(ref.cct)
    common = sorted(a)
    return np.array([a[p] for p in common]), np.array([b[p] for p in common])


def scoped_values(exp: Experiment, profile: int, scope: str, metric: int = 0) -> np.ndarray:
    """Node-ordered values of a metric (default the first) in one scope of one profile
    (summary: sums)."""
    m = exp.metrics[metric]
    if profile == 0:
        sid = m.stat_id(exp.scopes, scope)
        assert sid is not None
        return exp.summary(sid)[exp.cct.ctx_id.astype(np.int64)]
    return exp.values_in(profile, m, scope)


def profile_by_ids(exp: Experiment) -> dict[tuple[object, ...], int]:
    return {tuple((x.kind, x.logical_id, x.physical_id) for x in p.ids): p.index
            for p in exp.profiles}
