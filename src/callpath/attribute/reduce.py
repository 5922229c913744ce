"""Parallel reduction: execution contexts are attributed in worker processes, each building a
partial tree, and the partial trees are merged into one.

Work units (profile files) are split into contiguous chunks, one per worker; workers are
forked, so the structures loaded once by the parent are shared copy-on-write instead of being
parsed again. Each worker seals its partial tree into one key array (cheap to send back),
the trees are merged one tree level at a time (:meth:`TreeBuilder.absorb`), and the samples
are renumbered through maps. Because
:func:`callpath.attribute.build.finish` orders tables, siblings and execution contexts by
content, the database does not depend on the number of workers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from callpath.attribute import samples
from callpath.attribute.build import Tables, ThreadData
from callpath.attribute.forked import STATE, map_chunks
from callpath.attribute.tree import TreeBuilder
from callpath.errors import CallpathError
from callpath.formats.v4.stream import Mapper, serial

U = TypeVar("U")


@dataclass
class Partial:
    """The reduction of some execution contexts: tree, tables, per-thread samples."""

    tables: Tables = field(default_factory=Tables)
    tb: TreeBuilder = field(default_factory=TreeBuilder)
    threads: list[ThreadData] = field(default_factory=list)
    metrics: list[tuple[str, str]] = field(default_factory=list)
    program: str = ""

    def metric(self, name: str, description: str) -> int:
        for k, (n, _) in enumerate(self.metrics):
            if n == name:
                return k
        self.metrics.append((name, description))
        return len(self.metrics) - 1


def workers_default() -> int:
    return os.cpu_count() or 1


def writer_mapper(workers: int, mpi: bool) -> Mapper:
    """How the database writer spreads its work (computing, spooling and transposing the
    per-context values): over ``workers`` forked processes; under MPI, in rank 0 alone
    (forking inside an MPI process is not safe with every MPI)."""
    if mpi or workers <= 1:
        return serial
    return functools.partial(map_chunks, workers=workers)


def reduce_units(fn: Callable[[Sequence[U]], Partial], units: Sequence[U], workers: int,
                 mpi: bool, shared: dict[str, Any]) -> Partial | None:
    """``fn`` over ``units`` across MPI ranks (``mpi``) or forked workers, with ``shared``
    (structures, metric tables) in :data:`STATE` for them to inherit while it runs; None on
    the MPI ranks other than 0."""
    STATE.update(shared)
    try:
        return run_units_mpi(fn, units) if mpi else run_units(fn, units, workers)
    finally:
        for k in shared:
            STATE.pop(k, None)


def run_units(fn: Callable[[Sequence[U]], Partial], units: Sequence[U],
              workers: int) -> Partial:
    """``fn`` over ``units`` in ``workers`` forked processes (contiguous chunks), merged;
    the threads' samples are spilled to files (``STATE["spill"]``) that this process keeps
    open (:mod:`callpath.attribute.samples`)."""
    d = samples.spill_directory()
    STATE["spill"] = d
    try:
        part = merge(map_chunks(_sealed(fn), units, workers))
        samples.adopt([th.samples for th in part.threads])
        return part
    finally:
        STATE.pop("spill", None)
        samples.remove_directory(d)


def run_units_mpi(fn: Callable[[Sequence[U]], Partial], units: Sequence[U]) -> Partial | None:
    """``fn`` over ``units`` split across the ranks of ``MPI.COMM_WORLD`` (mpi4py), merged on
    rank 0, which gets the result; the other ranks get None. Raises :class:`CallpathError`
    when mpi4py is not installed, and on rank 0 the first rank's error (after every rank
    has been heard, so that none is left waiting).

    Each rank spills its threads' samples as ``-j`` does; a rank other than 0 then sends its
    partial without them, and the samples one thread at a time, which rank 0 spills as they
    come: rank 0 never holds more than one thread's samples in memory (gathering whole
    partials held all of them: 946 MiB in rank 0 for the bench's 256 contexts)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise CallpathError(f"--mpi needs mpi4py ({e}); install the 'mpi' extra: "
                            "pip install 'callpath[mpi]'") from None
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    bounds = np.linspace(0, len(units), size + 1).round().astype(int)
    err: str | None = None
    part: Partial | None = None
    d = samples.spill_directory()
    STATE["spill"] = d
    try:
        try:
            part = _sealed(fn)(units[bounds[rank]:bounds[rank + 1]])
        except CallpathError as e:
            err = str(e)
        if rank != 0:
            _send_partial(comm, part, err)
            return None
        parts = [] if part is None else [part]
        errors = [] if err is None else [err]
        for source in range(1, size):
            got, message = _receive_partial(comm, source, d)
            if got is not None:
                parts.append(got)
            if message is not None:
                errors.append(message)
        if errors:
            raise CallpathError(errors[0])
        out = merge(parts)
        samples.adopt([th.samples for th in out.threads])
        return out
    finally:
        STATE.pop("spill", None)
        samples.remove_directory(d)


def _send_partial(comm: Any, part: Partial | None, err: str | None) -> None:
    """To rank 0: the partial with its threads' samples left out (or the error), then each
    thread's samples (node, metric and value arrays), read back from this rank's spill."""
    if part is None:
        comm.send(("error", err), dest=0)
        return
    held = [th.samples for th in part.threads]
    for th in part.threads:
        th.samples = samples.Samples(th.samples.n)  # filled in by rank 0
    comm.send(("ok", part), dest=0)
    try:
        for s in held:
            comm.send(s.arrays(), dest=0)
    finally:
        samples.release(held)


def _receive_partial(comm: Any, source: int, directory: str) -> tuple[Partial | None, str | None]:
    """From rank ``source``: its partial, each thread's samples spilled into ``directory`` as
    they arrive (:func:`_send_partial`), or its error."""
    kind, payload = comm.recv(source=source)
    if kind != "ok":
        return None, str(payload)
    part: Partial = payload
    for th in part.threads:
        th.samples = samples.spill(directory, *comm.recv(source=source))
    return part, None


def merge(parts: Sequence[Partial]) -> Partial:
    """One partial from several, in order (execution contexts keep their order)."""
    if len(parts) == 1:
        return parts[0]
    # the first partial's contexts keep their numbers; the others' trees are absorbed into
    # it one level at a time (TreeBuilder.absorb), their tables re-interned
    out = parts[0]
    for p in parts[1:]:
        out.program = out.program or p.program
        mods = [out.tables.module(path) for path in p.tables.modules]
        fls = [out.tables.file(path) for path in p.tables.files]
        fns = [out.tables.function(name, mods[m] if m >= 0 else -1, off,
                                   fls[f] if f >= 0 else -1, line, tag)
               for (name, m, off, f, line, tag) in p.tables.functions]
        mets = np.array([out.metric(n, d) for n, d in p.metrics], dtype=np.int64)
        cols = p.tb.columns()
        for c, new in ((3, fns), (4, fls), (6, mods)):
            cols[:, c] = np.array([*new, -1], dtype=np.int64)[cols[:, c]]  # -1 stays -1
        node_map = out.tb.absorb(cols)
        for old, name in p.tb.entry_names.items():
            new_node = int(node_map[old])
            out.tb.entry_names[new_node] = name
            out.tb.entry_points[new_node] = p.tb.entry_points[old]
        for th in p.threads:
            out.threads.append(ThreadData(
                th.ids, th.samples, th.trace_times, th.trace_nodes,
                _compose(th.node_map, node_map),
                _compose(th.metric_map, mets) if len(mets) else th.metric_map, th.name))
    return out


def _sealed(fn: Callable[[Sequence[U]], Partial]) -> Callable[[Sequence[U]], Partial]:
    """``fn``, its partial's tree sealed (:meth:`TreeBuilder.seal`) in the worker that built
    it, where it costs no one else's time: what travels back and what is merged."""
    def run(units: Sequence[U]) -> Partial:
        part = fn(units)
        part.tb.seal()
        return part
    return run


def _compose(inner: npt.NDArray[np.int64] | None, outer: npt.NDArray[np.int64]
             ) -> npt.NDArray[np.int64]:
    """The renumbering ``outer`` after ``inner`` (if any)."""
    return outer if inner is None else outer[inner]
