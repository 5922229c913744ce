"""How hpcprof turns the values stored in ``*.hpcrun`` files into metric values: one rule.

Every value hpcprof reads from a measurement is the stored value (a u64 for metrics whose value
format is *integer*, a double for *real*) times the metric descriptor's ``period``, converted
to double: ``(isInt ? (double)val.i : val.r) * factor`` with ``factor = period`` in
``src/hpcprof/sources/hpcrun4.cpp`` (hpcprof since 2020; ``src/lib/profile/sources/
hpcrun4.cpp`` in the releases before the 2024 move), and ``mval * (double)period`` in the older
hpcprof/hpcprof-mpi (``src/lib/prof/CallPath-Profile.cpp``). Nothing else about the metric
changes the value:

* perf events in **period mode** (``-e perf::task-clock@100000000``): hpcrun up to release
  2024.01 stores the period in the descriptor and one (multiplexing-scaled) count per sample,
  so the factor is what turns 9 samples into 9e8 ns;
* perf events in **frequency mode** (``@f80``, the default): the kernel chooses the period, so
  hpcrun stores ``period = 1`` and each sample's value is the kernel's period for that sample
  (``PERF_SAMPLE_PERIOD``, scaled for multiplexing); the descriptor's ``is_frequency`` flag,
  ``threshold_mean``, ``num_samples`` and ``is_multiplexed`` are reported (the old hpcprof put
  them in ``experiment.xml``), never applied: a frequency-mode value is already the event
  count. hpcrun after July 2024 (event groups) stores ``period = 1`` and counter deltas in both
  modes, which the same rule reads right;
* the itimer sources (``CPUTIME``, ``REALTIME``) store real seconds with ``period = 1`` (before
  2020: integer microseconds, also with ``period = 1``): the unit is in the metric's name and
  hpcprof does not convert it;
* PAPI events store integer counts (one per sample) with the threshold as period.

docs/prof.md ("HPCToolkit measurements: metric periods") has the file references.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from callpath.formats.hpcrun import HpcrunMetric, HpcrunProfile


def metric_factors(metrics: list[HpcrunMetric]) -> npt.NDArray[np.float64]:
    """Per metric, the factor hpcprof multiplies its stored values by: the period as a double
    (a u64 converted exactly as C converts it)."""
    return np.array([float(m.period) for m in metrics], dtype=np.float64)


def scaled_values(profile: HpcrunProfile) -> npt.NDArray[np.float64]:
    """The profile's values as hpcprof accumulates them (one multiplication per value, in the
    same IEEE double arithmetic, so sums match hpcprof's to the last bits of rounding)."""
    if not len(profile.value):
        return np.zeros(0, dtype=np.float64)
    return profile.value * metric_factors(profile.metrics)[profile.value_mid]
