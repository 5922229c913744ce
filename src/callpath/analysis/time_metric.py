"""Which metric a database opens on: the one that holds the time of the run.

A GPU database lists ~50 metrics whose first (``GKER:BLK_SM_ACUMU``, a kernel property's
accumulator) is zero everywhere; opened on it, the viewer's tree order, its Lines tab and
``callpath report`` meant nothing. The viewer (:mod:`callpath.view.rows`), ``callpath report``
and ``callpath lines`` therefore open on the same metric: HPCToolkit's GPU operation time
(GPUOP: kernels, copies and synchronisation together), else CPU time and its kin, else the
first time metric, each only where it is non-zero; else the first non-zero metric; else (all
zero) the same choice by name alone; else the first metric.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: the metrics that hold the time of a run, best first (by the name before any " (unit)" or
#: ":subkind")
TIME_FIRST = ("GPUOP", "CPUTIME", "REALTIME", "cpu-clock", "task-clock", "time")


def base_name(name: str) -> str:
    """``GPUOP`` for ``GPUOP (sec)``, ``GKER`` for ``GKER:COUNT``."""
    return name.split(" ")[0].split(":")[0]


def is_time(name: str) -> bool:
    n = name.lower()
    return "(sec)" in n or "time" in n or "clock" in n or n.startswith("(s)")


def time_metric(names: Sequence[str], nonzero: Callable[[int], bool] | None = None) -> int:
    """The index of the metric to open on among ``names``. ``nonzero(i)``, when given, says
    whether metric ``i`` has a value somewhere (asked lazily, best candidates first); without
    it the choice is by name alone (the list of databases must stay cheap)."""
    def ok(i: int) -> bool:
        return nonzero is None or nonzero(i)

    base = [base_name(n) for n in names]
    for want in TIME_FIRST:
        for i, b in enumerate(base):
            if b == want and ok(i):
                return i
    for i, n in enumerate(names):
        if is_time(n) and ok(i):
            return i
    if nonzero is not None:
        for i in range(len(names)):
            if nonzero(i):
                return i
        return time_metric(names)  # zero everywhere (a GPU stream's view): by name
    return 0
