"""GPU operations attributed to the calling context that launched them (``-e gpu=nvidia``).

Each operation recorded in a companion file (:mod:`callpath.formats.measdir_gpu`) names the
node of its launching API call in its thread's tree; that node's *anchor* (the statement or
line context the frame walk made of it) gets a placeholder procedure below it, as hpcprof
makes of hpcrun's GPU measurements: ``<gpu kernel>`` with the kernel (demangled) below,
``<gpu copyin>`` / ``<gpu copyout>`` / ``<gpu copy>``, ``<gpu memset>``, ``<gpu sync>``,
``<gpu alloc>`` / ``<gpu delete>`` (GMEM: an allocation's or free's API call). Its
metrics (GKER, GXCOPY, ... :data:`callpath.model.gpu_names.METRICS`) are values of the launching
thread, as in hpcprof's databases, where the GPU stream contexts hold the traces only: each
stream (``GPUCONTEXT c GPUSTREAM s``) gets a trace line with every operation as an interval
(its node at the start, the root, i.e. idle, at the end).

Everything here is a handful of vectorised passes over the operations plus one interning per
distinct (anchor, placeholder, kernel) triple; a training loop's 10^5 launches share a few
hundred of those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.attribute.build import Tables
from callpath.attribute.hpctk import CALL, F
from callpath.attribute.tree import TreeBuilder
from callpath.model import gpu_names as gpu
from callpath.model.contexts import Identifier, IdKind
from callpath.structure.demangle import demangle

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
#: ``(GPU binary's path, kernel address) ->`` the structure steps of the kernel's entry
#: (its procedure, with file and line, and the line of its first instruction), or None
#: where the binary has no structure
KernelSteps = Callable[[str, int], "tuple[tuple[int, ...], ...] | None"]

# placeholder codes (an index into _PLACEHOLDERS) per operation
_PLACEHOLDERS = [gpu.PLACEHOLDER_KERNEL, gpu.PLACEHOLDER_COPYIN, gpu.PLACEHOLDER_COPYOUT,
                 gpu.PLACEHOLDER_COPY, gpu.PLACEHOLDER_MEMSET, gpu.PLACEHOLDER_SYNC,
                 gpu.PLACEHOLDER_ALLOC, gpu.PLACEHOLDER_FREE]
#: operations on the host's side (it waits in the API call), not work on a GPU stream
_HOST_SIDE = (gpu.OP_SYNC, gpu.OP_ALLOC, gpu.OP_FREE)


@dataclass
class Attributed:
    """What a thread's GPU operations add: samples (anchor, metric index among the GPU
    metrics, value) and, per stream, the trace line's (times, nodes)."""

    anchor: I64
    metric: I64
    value: F64
    streams: dict[tuple[int, int, int], tuple[npt.NDArray[np.uint64], I64]]


def placeholder_codes(ops: npt.NDArray[Any]) -> I64:
    """Which placeholder each operation goes under (an index into the placeholder list)."""
    kind = ops["kind"].astype(np.int64)
    sub = ops["sub"].astype(np.int64)
    code = np.full(len(ops), 3, dtype=np.int64)  # <gpu copy>
    code[kind == gpu.OP_KERNEL] = 0
    code[(kind == gpu.OP_MEMCPY) & (sub == 1)] = 1
    code[(kind == gpu.OP_MEMCPY) & (sub == 2)] = 2
    code[kind == gpu.OP_MEMSET] = 4
    code[kind == gpu.OP_SYNC] = 5
    code[kind == gpu.OP_ALLOC] = 6
    code[kind == gpu.OP_FREE] = 7
    return code


def attribute_ops(ops: npt.NDArray[Any], names: list[str], anchor_of_node: I64,
                  tb: TreeBuilder, tables: Tables, demangled: dict[str, str],
                  binaries: dict[int, tuple[str, int]] | None = None,
                  kernel_steps: KernelSteps | None = None) -> Attributed:
    """Intern the placeholder and kernel contexts of ``ops`` under their launch's anchor and
    compute the GPU metrics of each (see the module docstring). ``demangled`` caches
    kernel-name demangling across threads; ``binaries`` gives a kernel (by name index) its
    GPU binary and address, which become its function's load module and offset, as hpcprof
    has them (else the kernel has no module); where ``kernel_steps`` knows the binary's
    structure, the kernel's entry is mapped through it as hpcprof maps the kernel entry
    that hpcrun records: the kernel's procedure with its source file and line, and the line
    of its first instruction below it."""
    n = len(ops)
    anchors = anchor_of_node[ops["node"].astype(np.int64)]
    code = placeholder_codes(ops)
    is_kernel = ops["kind"] == gpu.OP_KERNEL
    name_ix = np.where(is_kernel & (ops["name"] != 0xFFFFFFFF), ops["name"].astype(np.int64), -1)
    # one interning per distinct (anchor, placeholder, kernel name)
    key = np.stack([anchors, code, name_ix], axis=1)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    ph_fn = [tables.function(p, -1, 0, -1, 0) for p in _PLACEHOLDERS]
    leaf = np.zeros(len(uniq), dtype=np.int64)
    for u, (a, c, k) in enumerate(uniq.tolist()):
        node = tb.node(int(a), F, CALL, ph_fn[c])
        if c == 0:
            raw = names[k] if k >= 0 else "<unknown kernel>"
            nice = demangled.get(raw)
            if nice is None:
                nice = demangled[raw] = demangle(raw)
            binary = (binaries or {}).get(k)
            steps = kernel_steps(*binary) if binary and kernel_steps is not None else None
            if steps:
                for st in steps:
                    node = tb.node(node, *st)
            else:
                fn = tables.function(nice, tables.module(binary[0]), binary[1], -1, 0) \
                    if binary else tables.function(nice, -1, 0, -1, 0)
                node = tb.node(node, F, CALL, fn)
        leaf[u] = node
    where = leaf[inverse]
    # subtract as integers: a float64 of a ~1.8e18 ns timestamp is only good to 256 ns
    dur = np.maximum(ops["end"].astype(np.int64) - ops["start"].astype(np.int64), 0) * 1e-9
    cols: list[tuple[I64, int | I64, F64]] = []
    M = gpu.METRIC_INDEX
    ones = np.ones(n)
    kind = ops["kind"]
    sub = ops["sub"].astype(np.int64)

    def add(mask: npt.NDArray[np.bool_], metric: int | I64, value: F64) -> None:
        if mask.any():
            m = metric if isinstance(metric, int) else metric[mask]
            cols.append((where[mask], m, value[mask]))

    add(np.ones(n, dtype=bool), M["GPUOP (sec)"], dur)
    k = kind == gpu.OP_KERNEL
    add(k, M["GKER (sec)"], dur)
    add(k, M["GKER:COUNT"], ones)
    add(k, M["GKER:BLKS_ACUMU"], ops["grid"].astype(np.float64))
    add(k, M["GKER:BLK_THR_ACUMU"], ops["block"].astype(np.float64))
    add(k, M["GKER:THR_REG_ACUMU"], ops["regs"].astype(np.float64))
    add(k, M["GKER:STMEM_ACUMU (B)"], ops["smem_static"].astype(np.float64))
    add(k, M["GKER:DYMEM_ACUMU (B)"], ops["smem_dynamic"].astype(np.float64))
    add(k, M["GKER:BLK_SM_ACUMU"], (ops["smem_static"].astype(np.float64)
                                    + ops["smem_dynamic"].astype(np.float64)))
    add(k, M["GKER:LMEM_ACUMU (B)"], ops["lmem"].astype(np.float64))
    nbytes = ops["bytes"].astype(np.float64)
    c = kind == gpu.OP_MEMCPY
    add(c, M["GXCOPY (sec)"], dur)
    add(c, M["GXCOPY:COUNT"], ones)
    add(c, _suffix_metrics("GXCOPY", "(B)", gpu.COPY_KINDS, sub), nbytes)
    s = kind == gpu.OP_MEMSET
    add(s, M["GMSET (sec)"], dur)
    add(s, M["GMSET:COUNT"], ones)
    add(s, _suffix_metrics("GMSET", "(B)", gpu.MEMORY_KINDS, sub), nbytes)
    y = kind == gpu.OP_SYNC
    add(y, M["GSYNC (sec)"], dur)
    add(y, M["GSYNC:COUNT"], ones)
    add(y, _suffix_metrics("GSYNC", "(sec)", gpu.SYNC_KINDS, sub), dur)
    a = (kind == gpu.OP_ALLOC) | (kind == gpu.OP_FREE)
    add(a, M["GMEM (sec)"], dur)
    add(a, M["GMEM:COUNT"], ones)
    add(a, _suffix_metrics("GMEM", "(B)", gpu.MEMORY_KINDS, sub), nbytes)
    if cols:
        anchor = np.concatenate([a for a, _, _ in cols])
        metric = np.concatenate([np.full(len(a), m, np.int64) if isinstance(m, int) else m
                                 for a, m, _ in cols])
        value = np.concatenate([v for _, _, v in cols])
    else:
        anchor = metric = np.zeros(0, np.int64)
        value = np.zeros(0)
    return Attributed(anchor, metric, value, _stream_traces(ops, where))


def _suffix_metrics(prefix: str, unit: str, kinds: dict[int, str], sub: I64) -> I64:
    """Per operation, the index of ``PREFIX:KIND (unit)`` for its CUPTI kind number (unknown
    numbers count as UNK)."""
    table = np.array([gpu.METRIC_INDEX[f"{prefix}:{kinds.get(i, 'UNK')} {unit}"]
                      for i in range(256)], dtype=np.int64)
    return table[np.clip(sub, 0, 255)]


def _stream_traces(ops: npt.NDArray[Any], where: I64
                   ) -> dict[tuple[int, int, int], tuple[npt.NDArray[np.uint64], I64]]:
    """Per (device, context, stream): each kernel, copy and memset as an interval, in time
    order. Synchronizations, allocations and frees are the host waiting, not work on a stream
    (a context-wide one has no stream): they are metrics of the launching thread only."""
    out: dict[tuple[int, int, int], tuple[npt.NDArray[np.uint64], I64]] = {}
    streams = np.stack([ops["device"].astype(np.int64), ops["context"].astype(np.int64),
                        ops["stream"].astype(np.int64)], axis=1)
    work = ~np.isin(ops["kind"], _HOST_SIDE)
    ops, where, streams = ops[work], where[work], streams[work]
    if not len(ops):
        return out
    uniq, inv = np.unique(streams, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for u, (dev, ctx, st) in enumerate(uniq.tolist()):
        sel = np.flatnonzero(inv == u)
        sel = sel[np.argsort(ops["start"][sel], kind="stable")]
        times = np.empty(2 * len(sel), dtype=np.uint64)
        nodes = np.empty(2 * len(sel), dtype=np.int64)
        times[0::2] = ops["start"][sel]
        times[1::2] = np.maximum(ops["end"][sel], ops["start"][sel])
        nodes[0::2] = where[sel]
        nodes[1::2] = 0
        order = np.argsort(times, kind="stable")
        out[(int(dev), int(ctx), int(st))] = (times[order], nodes[order])
    return out


def metrics_yaml_of(cpu: list[tuple[str, str]], measured: list[str]) -> str:
    """``metrics/default.yaml`` of a database of a callpath measurement with GPU metrics, as
    hpcprof writes it for hpcrun's (:func:`callpath.attribute.hpcrun_yaml.metrics_yaml`):
    the sampled metrics as they are, hpcrun's GPU descriptors (show flags, integer values)
    and its kernel properties (``GKER:THR_REG = GKER:THR_REG_ACUMU / GKER:COUNT`` ...) as
    derived roots."""
    from callpath.attribute.hpcrun_yaml import metrics_yaml
    from callpath.formats.hpcrun import HpcrunMetric

    descs = [HpcrunMetric(name, desc, False, 1) for name, desc in cpu]
    descs += [HpcrunMetric(name, desc, is_int, 1, show=show, move2proc=m2p)
              for name, desc, is_int, show, m2p in gpu.GPU_METRICS]
    index = {d.name: k for k, d in enumerate(descs)}
    for name, desc, formula, fmt in gpu.GPU_DERIVED:
        for ref in sorted(index, key=len, reverse=True):  # "GKER:COUNT" after longer names
            formula = formula.replace(ref, f"#{index[ref]}")
        descs.append(HpcrunMetric(name, desc, False, 1, show=gpu.SHOW_EXCLUSIVE,
                                  show_percent=False, formula=formula, format=fmt))
    return metrics_yaml(descs, measured)


def metric_names() -> list[tuple[str, str]]:
    """(name, description) of the GPU metrics, in the order of their indices."""
    return list(gpu.METRICS)


@dataclass
class Pending:
    """One thread of a process file or of its GPU companion, before its samples are spilled:
    the GPU operations of a launching thread join the CPU thread of the same tid."""

    ids: tuple[Identifier, ...]
    tid: int
    name: str
    index: int
    parts: list[tuple[I64, I64, F64]] = field(default_factory=list)
    trace_times: npt.NDArray[np.uint64] | None = None
    trace_nodes: I64 | None = None
    #: companion threads: the builder node of every node of the launching thread's tree
    anchor_of_node: I64 | None = None
    slot: int = -1
    merged: bool = False  # a companion thread whose values went to a CPU thread

    def add(self, anchor: I64, metric: I64, value: F64) -> None:
        self.parts.append((anchor, metric, value))

    def arrays(self) -> tuple[I64, I64, F64]:
        if not self.parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return (np.concatenate([a for a, _, _ in self.parts]),
                np.concatenate([m for _, m, _ in self.parts]),
                np.concatenate([v for _, _, v in self.parts]))


def attribute_companion(ops_of_slot: dict[int, npt.NDArray[Any]], names: list[str],
                        pending: list[Pending], offset: int, tb: TreeBuilder, tables: Tables,
                        demangled: dict[str, str], trace: bool,
                        binaries: dict[int, tuple[str, int]] | None = None,
                        kernel_steps: KernelSteps | None = None
                        ) -> list[tuple[tuple[Identifier, ...], npt.NDArray[np.uint64], I64]]:
    """Attribute a companion's operations (:func:`attribute_ops`) to the pending threads of
    its process: to the CPU thread of the same tid where there is one, else to the launching
    thread itself, numbered after the process's CPU threads. Returns the stream contexts'
    (ids, trace times, trace nodes) when ``trace``."""
    cpu = [p for p in pending if p.anchor_of_node is None]
    by_tid = {p.tid: p for p in cpu if p.tid >= 0}
    next_index = max((p.index for p in cpu), default=-1) + 1
    streams: dict[tuple[Identifier, ...], list[tuple[npt.NDArray[np.uint64], I64]]] = {}
    for p in pending:
        if p.anchor_of_node is None:
            continue
        ops = ops_of_slot.get(p.slot)
        if ops is None or not len(ops):
            p.merged = True
            continue
        got = attribute_ops(ops, names, p.anchor_of_node, tb, tables, demangled, binaries,
                            kernel_steps)
        target = by_tid.get(p.tid)
        if target is not None:
            p.merged = True
        else:
            target = p
            if cpu:  # a thread the CPU sampler never saw (a native thread of a Python program)
                p.ids = tuple(Identifier(i.kind, next_index, next_index, i.flags)
                              if i.kind == IdKind.THREAD else i for i in p.ids)
                next_index += 1
        target.add(got.anchor, got.metric + offset, got.value)
        if trace:
            prefix = tuple(i for i in target.ids if i.kind != IdKind.THREAD)
            for (_dev, ctx, st), line in got.streams.items():
                ids = (*prefix[:1], *prefix[1:], Identifier(int(IdKind.GPUCONTEXT), ctx, ctx),
                       Identifier(int(IdKind.GPUSTREAM), st, st))
                streams.setdefault(ids, []).append(line)
    out = []
    for ids, lines in streams.items():
        times = np.concatenate([t for t, _ in lines])
        nodes = np.concatenate([n for _, n in lines])
        order = np.argsort(times, kind="stable")
        out.append((ids, times[order], nodes[order]))
    return out
