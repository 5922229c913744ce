"""Hardware event codes of CodeAnalyst view configurations, mapped to measured metric names.

A CodeAnalyst view names its events by processor codes (``select`` = event select, ``mask`` =
unit mask, as in AMD's BIOS and Kernel Developer's Guide). A callpath or HPCToolkit database names
its metrics by what the measurement called them: Linux perf names (``cycles``), PAPI presets
(``PAPI_TOT_CYC``), libpfm/HPCToolkit names (``perf::CYCLES``) or timers (``CPUTIME (sec)``).
This table joins the two. Every code is one the Linux kernel itself uses to implement the
corresponding generic perf event (``arch/x86/events/amd/core.c``: ``amd_perfmon_event_map`` and
the hardware-cache table for AMD K7 to family 16h; ``intel/core.c`` for the Intel architectural
events), so a view asking for ``select="76"`` is offered on data measured as ``cycles``.

Codes are looked up by select and unit mask; an entry whose mask is ``None`` matches any mask
(CodeAnalyst itself "may choose to ignore the mask"). Where AMD and Intel give one select code
different meanings, AMD's wins (these are CodeAnalyst files): Intel's 0xC4/0xC5 (all branches /
branch misses) are AMD's *taken* branches, so the table maps them as AMD does; name Intel's
events by metric instead (the ``metric=`` extension, see :mod:`callpath.analysis.viewconfig`).

Metric names match case-insensitively, ignoring a ``perf::`` (or ``perf:``) prefix and a trailing
unit in parentheses, so ``CPUTIME (sec)`` matches the alias ``cputime``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class EventFamily:
    """One kind of measured quantity and every metric name it goes by."""

    name: str  # the canonical (Linux perf) name
    description: str
    aliases: tuple[str, ...]  # other metric names, matched after :func:`normalize`

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class EventCode:
    vendor: str
    select: int
    mask: int | None  # None: any unit mask
    family: str
    description: str


FAMILIES: dict[str, EventFamily] = {f.name: f for f in [
    EventFamily("cycles", "CPU clocks not halted",
                ("cpu-cycles", "PAPI_TOT_CYC", "CYCLES", "CPU_CLK_UNHALTED",
                 "CPU_CLK_UNHALTED.THREAD", "CPU_CLOCKS_NOT_HALTED")),
    EventFamily("instructions", "retired instructions",
                ("PAPI_TOT_INS", "INSTRUCTIONS", "INSTRUCTIONS_RETIRED", "INST_RETIRED.ANY",
                 "RETIRED_INSTRUCTIONS")),
    EventFamily("ref-cycles", "reference cycles (constant rate, not halted)",
                ("PAPI_REF_CYC", "REF_CYCLES", "CPU_CLK_UNHALTED.REF_TSC")),
    EventFamily("cache-references", "last-level cache accesses (L2 on AMD K7-16h)",
                ("PAPI_L2_TCA", "CACHE_REFERENCES", "LLC_REFERENCES")),
    EventFamily("cache-misses", "last-level cache misses (L2 on AMD K7-16h)",
                ("PAPI_L2_TCM", "CACHE_MISSES", "LLC_MISSES")),
    EventFamily("branches", "retired branch instructions",
                ("branch-instructions", "PAPI_BR_INS", "BRANCHES", "BRANCH_INSTRUCTIONS",
                 "RETIRED_BRANCH_INSTRUCTIONS")),
    EventFamily("branch-misses", "retired mispredicted branch instructions",
                ("PAPI_BR_MSP", "BRANCH_MISSES", "RETIRED_MISPREDICTED_BRANCH_INSTRUCTIONS")),
    EventFamily("taken-branches", "retired taken branch instructions",
                ("PAPI_BR_TKN", "RETIRED_TAKEN_BRANCH_INSTRUCTIONS")),
    EventFamily("stalled-cycles-frontend", "decoder empty (front-end stall) cycles",
                ("idle-cycles-frontend", "STALLED_CYCLES_FRONTEND")),
    EventFamily("stalled-cycles-backend", "dispatch stall (back-end stall) cycles",
                ("idle-cycles-backend", "STALLED_CYCLES_BACKEND")),
    EventFamily("L1-dcache-loads", "L1 data cache accesses",
                ("PAPI_L1_DCA", "DATA_CACHE_ACCESSES", "L1D_CACHE_LD")),
    EventFamily("L1-dcache-load-misses", "L1 data cache misses",
                ("PAPI_L1_DCM", "DATA_CACHE_MISSES", "L1D_CACHE_REFILL")),
    EventFamily("L1-icache-loads", "L1 instruction cache fetches",
                ("PAPI_L1_ICA", "INSTRUCTION_CACHE_FETCHES")),
    EventFamily("L1-icache-load-misses", "L1 instruction cache misses",
                ("PAPI_L1_ICM", "INSTRUCTION_CACHE_MISSES")),
    EventFamily("dTLB-load-misses", "data TLB misses (L1 and L2 DTLB)",
                ("PAPI_TLB_DM", "DTLB_MISSES", "L1_DTLB_AND_L2_DTLB_MISS")),
    EventFamily("iTLB-load-misses", "instruction TLB misses (L1 and L2 ITLB)",
                ("PAPI_TLB_IM", "ITLB_MISSES", "L1_ITLB_MISS_AND_L2_ITLB_MISS")),
    # Not a hardware event: CPU time from timers. No select code; name it with metric="cpu-time".
    EventFamily("cpu-time", "CPU time from timer or software-clock sampling",
                ("cputime", "cpu-clock", "task-clock", "CPUTIME", "ITIMER_PROF")),
]}

CODES: tuple[EventCode, ...] = (
    # AMD K7 .. family 16h: amd_perfmon_event_map and the hardware-cache event table
    EventCode("AMD", 0x76, None, "cycles", "CPU clocks not halted"),
    EventCode("AMD", 0xC0, None, "instructions", "retired instructions"),
    EventCode("AMD", 0x7D, None, "cache-references", "requests to L2 cache"),
    EventCode("AMD", 0x7E, None, "cache-misses", "L2 cache misses"),
    EventCode("AMD", 0xC2, None, "branches", "retired branch instructions"),
    EventCode("AMD", 0xC3, None, "branch-misses", "retired mispredicted branch instructions"),
    EventCode("AMD", 0xC4, None, "taken-branches", "retired taken branch instructions"),
    EventCode("AMD", 0xD0, None, "stalled-cycles-frontend", "decoder empty"),
    EventCode("AMD", 0xD1, None, "stalled-cycles-backend", "dispatch stalls"),
    EventCode("AMD", 0x40, None, "L1-dcache-loads", "data cache accesses"),
    EventCode("AMD", 0x41, None, "L1-dcache-load-misses", "data cache misses"),
    EventCode("AMD", 0x80, None, "L1-icache-loads", "instruction cache fetches"),
    EventCode("AMD", 0x81, None, "L1-icache-load-misses", "instruction cache misses"),
    EventCode("AMD", 0x46, None, "dTLB-load-misses", "L1 DTLB and L2 DTLB miss"),
    EventCode("AMD", 0x85, None, "iTLB-load-misses", "L1 ITLB miss and L2 ITLB miss"),
    # Intel architectural performance events (where AMD does not use the select code)
    EventCode("Intel", 0x3C, 0x00, "cycles", "UnHalted Core Cycles"),
    EventCode("Intel", 0x3C, 0x01, "ref-cycles", "UnHalted Reference Cycles"),
    EventCode("Intel", 0x2E, 0x4F, "cache-references", "LLC Reference"),
    EventCode("Intel", 0x2E, 0x41, "cache-misses", "LLC Misses"),
)

_UNIT = re.compile(r"\s*\([^()]*\)\s*$")


def normalize(name: str) -> str:
    """Key for matching metric names: case, a ``perf::`` prefix and a unit suffix ignored."""
    s = name.strip()
    low = s.lower()
    for prefix in ("perf::", "perf:"):
        if low.startswith(prefix):
            s = s[len(prefix):]
            break
    s = _UNIT.sub("", s)
    return s.strip().lower()


def lookup_code(select: int, mask: int | None) -> EventCode | None:
    """The table entry for an event code: exact unit mask first, then any-mask entries."""
    if mask is not None:
        for c in CODES:
            if c.select == select and c.mask == mask:
                return c
    for c in CODES:
        if c.select == select and c.mask is None:
            return c
    return None


def family_of(name: str) -> EventFamily | None:
    """The family whose canonical name or alias matches a metric name."""
    key = normalize(name)
    for fam in FAMILIES.values():
        if any(normalize(n) == key for n in fam.names()):
            return fam
    return None


def find_metric(wanted: str, metric_names: Iterable[str]) -> str | None:
    """The data set's metric for a wanted name: itself, else any name of the same family."""
    names = list(metric_names)
    key = normalize(wanted)
    for n in names:
        if n == wanted:
            return n
    for n in names:
        if normalize(n) == key:
            return n
    fam = family_of(wanted)
    if fam is None:
        return None
    keys = {normalize(a) for a in fam.names()}
    for n in names:
        if normalize(n) in keys:
            return n
    return None
