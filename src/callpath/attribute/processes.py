"""Which measured processes become execution contexts, and names that tell them apart.

Why: under ``mpirun`` the launcher (``mpiexec``, Hydra's ``hydra_pmi_proxy``, Open MPI's
``prted``, a job script's shell) is measured along with the ranks, as every process below
``callpath run`` is. It has no rank, so it came out as a context labelled like the first rank's
threads (``0``) once per launcher process. A launcher is left out by default: a process without
a rank that is an ancestor of a ranked process (its time is waiting for the ranks), or whose
program is a known MPI launcher. ``--keep-launchers`` keeps them.

Processes that would still share an identifier tuple (several processes without ranks: fork
and exec chains, ``multiprocessing`` workers, kept launchers; or the same rank in two combined
measurements) each get a ``PROCESS n`` identifier after ``NODE``, numbered in file order (pid,
then generation), with the pid as its physical id: no two contexts share a label.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from callpath.formats import measdir as md
from callpath.model.contexts import Identifier, IdKind

PROCESS_KIND = len(IdKind)  # the first kind after HPCToolkit's own; named "PROCESS" in meta.db
PROCESS_NAME = "PROCESS"


@dataclass
class Selection:
    units: list[Path]                                  # process files to attribute
    launchers: list[tuple[Path, str]] = field(default_factory=list)  # left out: (file, name)
    process_ids: dict[str, Identifier] = field(default_factory=dict)  # file -> PROCESS n


def _name(info: dict[str, Any]) -> str:
    exe = str(info.get("exe") or "")
    return os.path.basename(exe) if exe else str(info.get("comm") or "?")


def _parent(info: dict[str, Any]) -> Any:
    """The pid a process came from: the one it forked from (no exec), else its parent."""
    return info.get("forked_from") or info.get("ppid")


def _is_launcher_program(info: dict[str, Any]) -> bool:
    names = {os.path.basename(str(info.get("exe") or "")), str(info.get("comm") or "")}
    return bool(names & md.LAUNCHER_PROGRAMS)


def select(units: Sequence[Path], keep_launchers: bool = False) -> Selection:
    """Decide which process files are contexts and which need a PROCESS identifier."""
    infos = [md.read_process_info(u) for u in units]
    rank = [r if isinstance(r := i.get("rank"), int) else None for i in infos]
    launcher = [False] * len(units)
    if any(r is not None for r in rank):
        by_pid: dict[int, list[int]] = {}
        for k, i in enumerate(infos):
            if isinstance(i.get("pid"), int):
                by_pid.setdefault(int(i["pid"]), []).append(k)
        # walk up from every ranked process: each rankless ancestor is part of the launch
        for k in range(len(units)):
            if rank[k] is None:
                continue
            seen: set[int] = set()
            parent = _parent(infos[k])
            while isinstance(parent, int) and parent not in seen and parent in by_pid:
                seen.add(parent)
                for j in by_pid[parent]:
                    if rank[j] is None:
                        launcher[j] = True
                parent = _parent(infos[by_pid[parent][0]])
        for k, i in enumerate(infos):
            if rank[k] is None and _is_launcher_program(i):
                launcher[k] = True
    sel = Selection([])
    kept: list[int] = []
    for k, u in enumerate(units):
        if launcher[k] and not keep_launchers:
            sel.launchers.append((u, _name(infos[k])))
        else:
            sel.units.append(u)
            kept.append(k)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for k in kept:
        groups.setdefault((infos[k].get("node_id"), rank[k]), []).append(k)
    n = 0
    for k in kept:
        if len(groups[(infos[k].get("node_id"), rank[k])]) > 1:
            pid = infos[k].get("pid")
            sel.process_ids[str(units[k])] = Identifier(PROCESS_KIND, n,
                                                        pid if isinstance(pid, int) else 0)
            n += 1
    return sel


def with_process(ids: tuple[Identifier, ...], proc: Identifier | None) -> tuple[Identifier, ...]:
    """``ids`` with ``proc`` after the NODE identifier (or first when there is none)."""
    if proc is None:
        return ids
    at = 1 if ids and ids[0].kind == IdKind.NODE else 0
    return (*ids[:at], proc, *ids[at:])
