"""Execution contexts (HPCToolkit's "profiles"): the threads, ranks and GPU streams measured.

Each is named by a hierarchical identifier tuple, e.g. ``(NODE 0x11ac0300, RANK 1, THREAD 0)``.
Labels follow hpcviewer: ``RANK 1 THREAD 0`` in full, ``1.0`` in short form (logical ids of the
kinds other than NODE and CORE, which are physical placements rather than logical names).
"""

from __future__ import annotations

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

    def label(self, id_names: list[str]) -> str:
        """``NODE 0 CORE 0 THREAD 0``-style label, then the thread's name in parentheses when
        it has one (``THREAD 2 (worker_1)``); ``summary`` for summary profiles."""
        if self.is_summary and not self.ids:
            return "summary"
        parts = []
        for ident in self.ids:
            name = id_names[ident.kind] if ident.kind < len(id_names) else f"KIND{ident.kind}"
            parts.append(f"{name} {ident.logical_id}")
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
