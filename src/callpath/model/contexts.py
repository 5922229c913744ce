"""Execution contexts (HPCToolkit's "profiles"): the threads, ranks and GPU streams measured.

Each is named by a hierarchical identifier tuple, e.g. ``(NODE 0x11ac0300, RANK 1, THREAD 0)``.
Labels follow hpcviewer: ``RANK 1 THREAD 0`` in full, ``1.0`` in short form (logical ids of the
kinds other than NODE and CORE, which are physical placements rather than logical names).

A NODE identifier is the host's ``gethostid()``, as HPCToolkit records it: ``NODE 8323328``
says nothing to a reader. What a person reads (:func:`node_texts`, used by
:meth:`Experiment.context_label <callpath.model.experiment.Experiment.context_label>` for the
viewer's trace rows, Threads dialog and graphs, and the CLI's context columns) leaves the node
out when every context ran on one node, and prints a host id in hex (``NODE 0x7f0100``) when
there are several; :meth:`ExecutionContext.label` without ``nodes`` keeps the identifiers as
stored (``--threads`` patterns match either).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum


class IdKind(IntEnum):
    """Identifier kinds in the order HPCToolkit's ``hpcprof`` writes their names."""

    SUMMARY = 0
    NODE = 1
    RANK = 2
    THREAD = 3
    GPUDEVICE = 4
    GPUCONTEXT = 5
    GPUSTREAM = 6
    CORE = 7


DEFAULT_ID_NAMES = [k.name for k in IdKind]
IS_PHYSICAL = 1  # bit 0 of an identifier's flags


@dataclass(frozen=True)
class Identifier:
    kind: int
    logical_id: int
    physical_id: int = 0
    flags: int = 0

    @property
    def is_physical(self) -> bool:
        return bool(self.flags & IS_PHYSICAL)


@dataclass(frozen=True)
class ExecutionContext:
    """One profile. ``index`` is its position in ``profile.db`` (0 is the summary profile)."""

    index: int
    ids: tuple[Identifier, ...] = ()
    is_summary: bool = False
    flags: int = 0  # all bits of the v4 profile flags, bit 0 being ``is_summary``
    #: the thread's own name where the measurement recorded one (Python's Thread.name,
    #: ``thread_name_prefix`` workers, a native thread's comm set by pthread_setname_np);
    #: v4 has no string per profile, so databases keep it beside them (formats.v4.names)
    name: str = ""

    def label(self, id_names: list[str], nodes: Mapping[int, str] | None = None) -> str:
        """``NODE 0 CORE 0 THREAD 0``-style label, then the thread's name in parentheses when
        it has one (``THREAD 2 (worker_1)``); ``summary`` for summary profiles. ``nodes``
        (:func:`node_texts`): how a NODE identifier reads, by its id; "" leaves it out."""
        if self.is_summary and not self.ids:
            return "summary"
        parts = []
        for ident in self.ids:
            name = id_names[ident.kind] if ident.kind < len(id_names) else f"KIND{ident.kind}"
            value = str(ident.logical_id)
            if nodes is not None and name == "NODE" and ident.logical_id in nodes:
                value = nodes[ident.logical_id]
                if not value:
                    continue
            parts.append(f"{name} {value}")
        if not parts and nodes is not None:  # nothing but the node: keep it
            return self.label(id_names)
        if self.name:
            parts.append(f"({self.name})")
        return " ".join(parts)

    def short_label(self, id_names: list[str]) -> str:
        """Dotted logical ids of the non-placement kinds, e.g. ``1.0`` for RANK 1 THREAD 0."""
        if self.is_summary and not self.ids:
            return "summary"
        skip = {"NODE", "CORE"}
        # a process without an MPI rank (callpath's PROCESS kind) reads p0, p1, ... so that
        # it never shares a short label with a rank
        vals = [("p" if name == "PROCESS" else "") + str(i.logical_id) for i in self.ids
                if (name := id_names[i.kind] if i.kind < len(id_names) else "") not in skip]
        return ".".join(vals) if vals else self.label(id_names)


HOST_ID_MIN = 1 << 16  # a NODE id from here on is a host id (gethostid()), printed in hex


def node_texts(contexts: Iterable[ExecutionContext], id_names: list[str],
               omit_single: bool = True) -> dict[int, str]:
    """How each NODE identifier of ``contexts`` reads in a label: "" (left out) when they all
    ran on one node and ``omit_single``; otherwise a host id (``gethostid()``, 32 bits) in
    hex, ``0x7f0100``, and a small logical node number as it is."""
    ids = sorted({i.logical_id for c in contexts for i in c.ids
                  if i.kind < len(id_names) and id_names[i.kind] == "NODE"})
    if len(ids) <= 1 and omit_single:
        return dict.fromkeys(ids, "")
    return {v: f"{v:#x}" if v >= HOST_ID_MIN else str(v) for v in ids}
