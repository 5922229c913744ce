"""``measure.offcpu``: off-CPU intervals from switch records charged to switch samples, on
synthetic records (no perf_event needed): exact sums, pairing, the charge rule for switches
without a sample, duplicates of one switch, a new thread's wait for its first CPU."""

from __future__ import annotations

import numpy as np

from callpath.measure import offcpu
from callpath.measure.perf_records import Samples, Switches

CPU, SWITCH = 1, 2


def samples(rows: list[tuple[int, int, int]]) -> Samples:
    """(tid, time, metric) rows of one process (pid 10)."""
    n = len(rows)
    z = np.zeros(n, dtype=np.int64)
    return Samples(np.array([r[1] for r in rows], dtype=np.uint64), z + 10,
                   np.array([r[0] for r in rows], dtype=np.int64), z,
                   np.ones(n, dtype=np.uint64), np.array([r[2] for r in rows], dtype=np.int64),
                   np.zeros((n, 17), dtype=np.uint64), np.ones(n, dtype=bool), z, z, z, z)


def switches(rows: list[tuple[int, int, str]]) -> Switches:
    """(tid, time, kind) rows: kind 'in', 'out' (blocked) or 'pre' (preempted)."""
    return Switches(np.array([r[1] for r in rows], dtype=np.uint64),
                    np.full(len(rows), 10, dtype=np.int64),
                    np.array([r[0] for r in rows], dtype=np.int64),
                    np.array([r[2] != "in" for r in rows]),
                    np.array([r[2] == "pre" for r in rows]))


def test_every_switch_sampled() -> None:
    # thread 11 born at 0, first runs at 5 (5 ns waiting for a CPU), blocks at 100 until 400,
    # is preempted at 450 until 470, exits at 500
    s = samples([(11, 50, CPU), (11, 99, SWITCH), (11, 449, SWITCH)])
    sw = switches([(11, 5, "in"), (11, 100, "out"), (11, 400, "in"), (11, 450, "pre"),
                   (11, 470, "in")])
    life = offcpu.Life({(10, 11): 0}, {(10, 11): 500})
    oc = offcpu.compute(s, SWITCH, sw, life)
    assert oc.charged.tolist() == [0.0, 300.0, 20.0]
    assert oc.preempted.tolist() == [-1, 0, 1]
    assert oc.resume.tolist() == [50, 400, 470]
    t = oc.threads[(10, 11)]
    assert (t.wall, t.off, t.blocked, t.unattributed) == (500, 325.0, 300.0, 5.0)
    assert t.cpu == 500 - 325
    assert (t.switches, t.switch_samples) == (2, 2)


def test_unsampled_switch_goes_to_next_sampled_of_its_kind() -> None:
    # blocked at 100 (no sample) and 300 (sampled); preempted at 200 (sampled)
    s = samples([(11, 199, SWITCH), (11, 299, SWITCH)])
    sw = switches([(11, 0, "in"), (11, 100, "out"), (11, 150, "in"), (11, 200, "pre"),
                   (11, 210, "in"), (11, 300, "out"), (11, 380, "in")])
    oc = offcpu.compute(s, SWITCH, sw, offcpu.Life({(10, 11): 0}, {(10, 11): 400}))
    assert oc.charged.tolist() == [10.0, 50.0 + 80.0]
    assert oc.threads[(10, 11)].off == 140.0


def test_duplicate_samples_of_one_switch() -> None:
    s = samples([(11, 99, SWITCH), (11, 99, SWITCH)])
    sw = switches([(11, 0, "in"), (11, 100, "out"), (11, 200, "in")])
    oc = offcpu.compute(s, SWITCH, sw, offcpu.Life({(10, 11): 0}, {(10, 11): 300}))
    assert oc.duplicate.tolist().count(True) == 1
    assert sorted(oc.charged.tolist()) == [0.0, 100.0]


def test_threads_apart_and_no_records() -> None:
    s = samples([(11, 99, SWITCH), (12, 99, SWITCH)])
    sw = switches([(12, 100, "out"), (11, 100, "out"), (11, 160, "in"), (12, 130, "in")])
    oc = offcpu.compute(s, SWITCH, sw, offcpu.Life())
    assert oc.charged.tolist() == [60.0, 30.0]
    empty = offcpu.compute(s, SWITCH, switches([]), offcpu.Life())
    assert empty.charged.tolist() == [0.0, 0.0] and not empty.threads


def test_gap_without_records_is_estimated_from_cpu_samples() -> None:
    # records off in [200, 600): the interval from 180 is cut at 200; the thread's first
    # record after the gap is a switch-in at 650, so it was off from 600; in the gap its CPU
    # samples say 250 ns on CPU, so 150 ns off, charged to its gap's two switch samples by
    # their periods (1 and 2 switches)
    s = samples([(11, 99, SWITCH), (11, 300, CPU), (11, 400, SWITCH), (11, 500, CPU),
                 (11, 550, SWITCH), (11, 899, SWITCH)])
    s.period[:] = np.array([1, 125, 1, 125, 2, 1], dtype=np.uint64)
    sw = switches([(11, 0, "in"), (11, 100, "out"), (11, 150, "in"), (11, 180, "out"),
                   (11, 201, "in"), (11, 202, "out"),  # in the gap: ignored
                   (11, 650, "in"), (11, 900, "out")])
    gaps = np.array([[200, 600]], dtype=np.int64)
    oc = offcpu.compute(s, SWITCH, sw, offcpu.Life({(10, 11): 0}, {(10, 11): 1000}),
                        gaps, CPU)
    assert oc.charged.tolist() == [50.0, 0.0, 50.0, 0.0, 100.0, 100.0 + 20.0]
    assert oc.preempted.tolist() == [0, -1, -1, -1, -1, 0]
    t = oc.threads[(10, 11)]
    assert t.off == 50 + 20 + 150 + 50 + 100
    assert (t.estimated, t.estimated_from, t.estimated_off) == (400, 200, 150.0)
    assert t.unattributed == 50.0 and t.blocked == 50 + 20 + 100
    assert t.cpu == 1000 - t.off
    assert (t.switches, t.switch_samples) == (3 + 3, 2 + 2)
    # a gap without any switch sample of the thread: its estimate goes to its next switch
    # sample (899), else its previous one (99), else its root
    life = offcpu.Life({(10, 11): 0}, {(10, 11): 1000})
    oc = offcpu.compute(s.take(np.array([0, 1, 3, 5])), SWITCH, sw, life, gaps, CPU)
    assert oc.charged.tolist() == [50.0, 0.0, 0.0, 120.0 + 150.0]
    assert oc.threads[(10, 11)].unattributed == 50.0
    oc = offcpu.compute(s.take(np.array([0, 1, 3])), SWITCH, sw, life, gaps, CPU)
    assert oc.charged.tolist() == [50.0 + 20.0 + 100.0 + 150.0, 0.0, 0.0]
    oc = offcpu.compute(s.take(np.array([1, 3])), SWITCH, sw, life, gaps, CPU)
    assert oc.threads[(10, 11)].unattributed == 50 + 20 + 50 + 100 + 150
