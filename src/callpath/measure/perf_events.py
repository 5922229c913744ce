"""Event names → perf_event types and configs; ``EVENT[@PERIOD | @fFREQUENCY]`` parsing.

The default event is ``cpu-clock`` every 1,000,000 ns of CPU time (1 kHz per busy thread), the
software clock that works in virtual machines too. Clocks are sampled by period in nanoseconds
(so a sample stands for a fixed amount of CPU time); other events default to a frequency of
1000 samples/s, letting the kernel adapt the period to the event's rate.
"""

from __future__ import annotations

from callpath.errors import CallpathError
from callpath.measure.perf import EventSpec

TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_RAW = 0, 1, 4

SOFTWARE = {"cpu-clock": 0, "task-clock": 1, "page-faults": 2, "context-switches": 3,
            "cpu-migrations": 4, "minor-faults": 5, "major-faults": 6, "alignment-faults": 7,
            "emulation-faults": 8}
HARDWARE = {"cycles": 0, "instructions": 1, "cache-references": 2, "cache-misses": 3,
            "branch-instructions": 4, "branch-misses": 5, "bus-cycles": 6,
            "stalled-cycles-frontend": 7, "stalled-cycles-backend": 8, "ref-cycles": 9}
ALIASES = {"faults": "page-faults", "cs": "context-switches", "migrations": "cpu-migrations",
           "cpu-cycles": "cycles", "branches": "branch-instructions"}
CLOCKS = {"cpu-clock", "task-clock"}
DEFAULT_EVENT = "cpu-clock@1000000"
DEFAULT_FREQUENCY = 1000


def parse_event(text: str) -> EventSpec:
    """``cycles``, ``cpu-clock@500000``, ``instructions@f2000``, ``r01c2@100000``."""
    name, at, rate = text.partition("@")
    name = ALIASES.get(name.strip().lower(), name.strip().lower())
    if name in SOFTWARE:
        typ, config = TYPE_SOFTWARE, SOFTWARE[name]
    elif name in HARDWARE:
        typ, config = TYPE_HARDWARE, HARDWARE[name]
    elif len(name) > 1 and name[0] == "r" and _is_hex(name[1:]):
        typ, config = TYPE_RAW, int(name[1:], 16)
    else:
        known = ", ".join([*SOFTWARE, *HARDWARE])
        raise CallpathError(f"unknown event {text!r}: expected one of {known}, or rHEX "
                            f"for a raw code, optionally followed by @PERIOD or @fFREQUENCY")
    period = frequency = 0
    if at and not rate:
        raise CallpathError(f"event {text!r}: expected @PERIOD (an integer) or @fFREQUENCY "
                            f"after the @")
    if rate:
        try:
            if rate[0] in "fF":
                frequency = int(rate[1:])
            else:
                period = int(rate)
        except ValueError:
            raise CallpathError(f"event {text!r}: expected @PERIOD (an integer) or "
                                f"@fFREQUENCY (f then an integer in Hz)") from None
        if period <= 0 and frequency <= 0:
            raise CallpathError(f"event {text!r}: the period or frequency must be positive")
    elif name in CLOCKS:
        period = 1_000_000
    else:
        frequency = DEFAULT_FREQUENCY
    return EventSpec(name, typ, config, period, frequency)


#: ``-e REALTIME`` (HPCToolkit's name) or ``-e wall``: wall-clock and off-CPU time
REALTIME_NAMES = ("realtime", "wall")


def parse_realtime(text: str) -> EventSpec | None:
    """``REALTIME[@PERIOD | @fFREQUENCY]``: the CPU clock that measures its on-CPU part
    (period in ns of CPU time, as ``cpu-clock``; default 1 ms), or None for other events."""
    name, at, rate = text.partition("@")
    if name.strip().lower() not in REALTIME_NAMES:
        return None
    try:
        return parse_event("cpu-clock" + at + rate)
    except CallpathError:
        raise CallpathError(f"event {text!r}: expected REALTIME, REALTIME@PERIOD (ns of CPU "
                            "time between CPU samples) or REALTIME@fFREQUENCY") from None


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True


def unit_of(spec: EventSpec) -> str:
    return "ns" if spec.name in CLOCKS else "events"


def all_events() -> list[EventSpec]:
    return [parse_event(n) for n in [*SOFTWARE, *HARDWARE]]
