"""``callpath run -e REALTIME``: wall-clock time on and off CPU, at the call paths where threads
wait, on real C programs compiled here (tests/wait_programs/).

Each program reports, per thread, its CPU time (``CLOCK_THREAD_CPUTIME_ID``) and the time it
spent in the call that blocks (a contended mutex, ``read`` on a pipe, ``pthread_join``, an
OpenMP barrier, ``MPI_Recv``). The measurement must agree with them, and with itself: per
thread, wall = CPUTIME + OFFCPU within 2% of the run's wall time.

Margins (false failures below 1 in 10^4): the time off CPU is not sampled but read from the
kernel's clocks at each sample (exact to microseconds); only CPUTIME is sampled, by a CPU
clock that fires every 1 ms of the thread's CPU time, so a thread's CPU time is short by less
than one period per CPU it ran on (2 ms here). The margins are 2% of the run's wall time
(>= 14 ms for these runs) plus 5 ms for what the program's own clocks cannot see (the
instructions between its clock read and the call, a preemption in between on a loaded
machine, thread start and exit), 3 to 10 times the largest difference seen in development.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import mpi_launch
from callpath.formats import measdir
from callpath.measure.elfinfo import ElfInfo
from test_run_native import callpath, perf_ok  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
WAIT = ROOT / "tests" / "wait_programs"
REALTIME, CPUTIME, OFFCPU = 0, 1, 2
SLACK_S = 0.005

Path_ = tuple[str, ...]


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return tmp_path_factory.mktemp("waits")


def build(out: Path, cc: str, source: str, *flags: str) -> Path:
    exe = out / Path(source).stem
    if not exe.exists():
        subprocess.run([cc, "-O2", "-g", *flags, "-o", str(exe), str(WAIT / source)],
                       check=True, capture_output=True)
    return exe


def measure(out: Path, *argv: str, env: dict[str, str] | None = None,
            trace: bool = False) -> tuple[measdir.Measurement, str, str]:
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + full.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "callpath", "run", "-e", "REALTIME",
                           *(["-t"] if trace else []), "-o", str(out), "--", *argv],
                          capture_output=True, text=True, env=full, timeout=300, check=False)
    if proc.returncode != 0 and "perf_event_paranoid at 1" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    return measdir.read(out), proc.stdout, proc.stderr


def reported(stdout: str) -> dict[int, dict[str, int]]:
    """``TID WHAT key=value...`` lines of the programs: tid -> {key: ns}."""
    out: dict[int, dict[str, int]] = {}
    for line in stdout.splitlines():
        m = re.match(r"(\d+) (\w+) (.*)", line)
        if m:
            out[int(m[1])] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[3])}
    return out


def node_paths(m: measdir.Measurement, p: measdir.ProcessProfile,
               t: measdir.ThreadProfile) -> list[Path_]:
    """Every node's path of procedure names (placeholders by their names, e.g. <blocked>)."""
    names: list[Path_] = []
    for i, nd in enumerate(t.nodes):
        parent = int(nd["parent"])
        here: Path_ = names[parent] if parent >= 0 else ()
        kind = int(nd["kind"])
        if kind == measdir.NodeKind.NATIVE:
            mod = p.modules[int(nd["module"])]
            file = str(m.path / mod.saved) if mod.saved else mod.path
            addr = int(nd["address"]) - (0 if nd["flags"] & measdir.NodeFlag.EXACT_PC else 1)
            here = (*here, ElfInfo.get(file).symbolize(addr) or hex(addr))
        elif kind == measdir.NodeKind.PLACEHOLDER:
            here = (*here, measdir.PLACEHOLDER_NAMES[measdir.Placeholder(int(nd["address"]))])
        elif kind == measdir.NodeKind.PARTIAL:
            here = (*here, "PARTIAL")
        names.append(here if i else ())
    return names


def under(paths: list[Path_], values: list[float], *chain: str) -> float:
    """Inclusive value of the nodes whose path holds frames matching the regular expressions
    ``chain`` in this order (not necessarily adjacent: library frames may come between;
    glibc's symbol for an address may be an alias, e.g. __pthread_clockjoin_ex)."""
    total = 0.0
    for path, v in zip(paths, values, strict=True):
        it = iter(path)
        if v and all(any(re.fullmatch(c, f) for f in it) for c in chain):
            total += v
    return total


def threads_of(m: measdir.Measurement) -> dict[int, tuple[measdir.ProcessProfile,
                                                         measdir.ThreadProfile]]:
    return {int(t.info["tid"]): (p, t) for p in m.processes for t in p.threads}


def check_wall_identity(m: measdir.Measurement, run_wall_s: float) -> None:
    """Per thread REALTIME = CPUTIME + OFFCPU; and the threads' wall times (from the kernel's
    records) = CPUTIME + OFFCPU within 2% of the run's wall time x threads, summed over the
    threads (the issue's criterion). CPUTIME is sampled: a thread's share of the difference
    is usually under 4 ms, but once in a while one thread is 20-30 ms apart on this
    overloaded VM (CPU-clock samples coming late when the host deschedules the vCPU), which
    the sum over threads absorbs."""
    total = 0.0
    ths = list(threads_of(m).values())
    for p, t in ths:
        wall = t.stats["wall_ns"] * 1e-9
        cpu, off, real = (float(t.values[:, k].sum()) * 1e-9 for k in (CPUTIME, OFFCPU,
                                                                       REALTIME))
        assert real == pytest.approx(cpu + off, abs=1e-6)
        total += abs(wall - (cpu + off))
        assert abs(wall - (cpu + off)) <= 0.05 * run_wall_s, (p.info["pid"], t.info["tid"],
                                                              wall, cpu, off)
    assert total <= 0.02 * run_wall_s * len(ths), total


def test_mutex_pipe_join(perf_ok: None, bindir: Path, tmp_path: Path) -> None:  # noqa: F811
    exe = build(bindir, "gcc", "waits.c", "-pthread")
    m, stdout, stderr = measure(tmp_path / "m", str(exe), trace=True)
    rep = reported(stdout)
    assert len(rep) == 4, stdout
    ths = threads_of(m)
    assert set(rep) <= set(ths)
    main_tid = next(tid for tid, r in rep.items() if "wall" in r and tid in ths
                    and int(ths[tid][1].info["index"]) == 0)
    run_wall = ths[main_tid][1].stats["wall_ns"] * 1e-9
    margin = 0.02 * run_wall + SLACK_S
    check_wall_identity(m, run_wall)
    assert "wall" in stderr and "blocked" in stderr  # the summary's per-thread lines
    for tid, r in rep.items():
        p, t = ths[tid]
        paths = node_paths(m, p, t)
        real = t.values[:, REALTIME].tolist()
        off = t.values[:, OFFCPU].tolist()
        # the program's own CPU clock against the sampled CPU time
        assert abs(float(t.values[:, CPUTIME].sum()) - r["cpu"]) * 1e-9 <= margin, (tid, r)
        # the program's own wall-clock time of the thread fits in the measured life
        assert t.stats["wall_ns"] >= r["wall"] - 1_000_000
        wait = r["wait"] * 1e-9
        if wait < 0.002:
            continue  # the contender that never waited
        if int(t.info["index"]) == 0:
            chain: tuple[str, ...] = ("main", r".*pthread\w*join\w*")
        elif r.get("cpu", 0) < 10_000_000:
            chain = ("wait_for_data", r"(__libc_)?read")
        else:
            chain = ("contend", r"_*pthread_mutex_lock\w*")
        got = under(paths, real, *chain) * 1e-9
        assert abs(got - wait) <= margin, (tid, chain, got, wait)
        # ... mostly blocked in the system call its libc wrapper made
        blocked = under(paths, off, *chain, "<blocked>") * 1e-9
        assert blocked >= 0.9 * wait - margin, (tid, chain, blocked, wait)
    # the trace: the reader's blocked interval is one state, from its switch-out in read
    # until it ran again
    reader = next(tid for tid, r in rep.items() if r["cpu"] < 10_000_000
                  and int(ths[tid][1].info["index"]) != 0)
    p, t = ths[reader]
    paths = node_paths(m, p, t)
    tr = t.trace
    spans = [(int(tr["time"][i + 1]) - int(tr["time"][i])) * 1e-9 for i in range(len(tr) - 1)
             if paths[int(tr["node"][i])][-1:] == ("<blocked>",)
             and "wait_for_data" in paths[int(tr["node"][i])]]
    assert spans and abs(max(spans) - rep[reader]["wait"] * 1e-9) <= margin, spans


def test_openmp_barrier(perf_ok: None, bindir: Path, tmp_path: Path) -> None:  # noqa: F811
    exe = build(bindir, "gcc", "omp_wait.c", "-fopenmp")
    m, stdout, _ = measure(tmp_path / "m", str(exe), "60000000",
                           env={"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "passive"})
    rep = reported(stdout)
    assert len(rep) == 3, stdout
    ths = threads_of(m)
    run_wall = max(t.stats["wall_ns"] for _p, t in ths.values()) * 1e-9
    margin = 0.02 * run_wall + SLACK_S
    check_wall_identity(m, run_wall)
    longest = max(rep, key=lambda tid: rep[tid]["wait"])
    for tid, r in rep.items():
        p, t = ths[tid]
        paths = node_paths(m, p, t)
        got = under(paths, t.values[:, REALTIME].tolist(), "meet") * 1e-9
        assert abs(got - r["wait"] * 1e-9) <= margin, (tid, got, r)
        assert abs(float(t.values[:, CPUTIME].sum()) - r["cpu"]) * 1e-9 <= margin
    # the thread that waited longest slept in the barrier (passive wait policy)
    p, t = ths[longest]
    paths = node_paths(m, p, t)
    blocked = under(paths, t.values[:, OFFCPU].tolist(), "meet", "<blocked>") * 1e-9
    assert rep[longest]["wait"] * 1e-9 >= 0.05
    assert blocked >= 0.5 * rep[longest]["wait"] * 1e-9, (blocked, rep[longest])


def test_above_the_cap_estimates(perf_ok: None, bindir: Path,  # noqa: F811
                                 tmp_path: Path) -> None:
    """A program switching about 10^5 times a second (two threads passing a token through
    pipes, no work between passes) is above the cap: the launcher turns the switch records
    off and each thread's time off CPU there is its life less its sampled CPU time. The
    estimate is as good as CPUTIME: a CPU clock sample every 1 ms of a thread's CPU time
    (short by under one period), plus what the rings lose in the first tens of ms, before
    the launcher turns the every-switch stacks off on a loaded machine (2-43 ms over runs of
    0.76-1.17 s in nine development runs); the margin is 15% of the run's wall time + 10 ms,
    about 3x that. A wrong estimate is 0.3-0.8 s off here (a switch-out inside a gap that ran
    to the thread's exit, in development)."""
    exe = build(bindir, "gcc", "pingpong.c", "-pthread")
    m, stdout, stderr = measure(tmp_path / "m", str(exe), "100000", "0")
    own = {int(w[1]): int(w[2]) * 1e-9 for w in (line.split() for line in stdout.splitlines())
           if w[:1] == ["thread"]}
    assert len(own) == 2, stdout
    ths = threads_of(m)
    run_wall = max(t.stats["wall_ns"] for _p, t in ths.values()) * 1e-9
    margin = 0.15 * run_wall + 0.01
    said = " ".join(stderr.split())
    assert "switched too often for a record" in said, said
    for tid, cpu_s in own.items():
        p, t = ths[tid]
        cpu = float(t.values[:, CPUTIME].sum()) * 1e-9
        off = float(t.values[:, OFFCPU].sum()) * 1e-9
        assert abs(cpu - cpu_s) <= margin, (tid, cpu, cpu_s)
        # wall = on CPU + off CPU: exact in the gap (its estimate is the rest of the gap);
        # before the cap, CPUTIME is short by the CPU samples the rings lost
        real = float(t.values[:, REALTIME].sum()) * 1e-9
        assert real == pytest.approx(cpu + off, abs=1e-6)
        assert abs(t.stats["wall_ns"] * 1e-9 - (cpu + off)) <= margin, (tid, cpu, off)
        assert 0 < t.stats["offcpu_estimated_ns"] <= t.stats["offcpu_ns"]
        # the summary's line for the thread says its time off CPU was estimated, from when
        line = next(x for x in stderr.split("\n") if f"(tid {tid}," in x)
        assert re.search(r"estimated off CPU [\d.]+ s \(\d+%: in [\d.]+ s of its life "
                         r"from [\d.]+ s on", " ".join(line.split())), line
        # the estimate sits where the thread left the CPU: in read() on its pipe, or in the
        # write() that woke the other thread (which took its CPU), not at the thread's root
        paths = node_paths(m, p, t)
        there = under(paths, t.values[:, OFFCPU].tolist(), r"main|pong",
                      r"(__libc_)?read|(__libc_|__)?write") * 1e-9
        top = sorted(zip(t.values[:, OFFCPU].tolist(), paths, strict=True))[-3:]
        assert off >= 0.2 * run_wall and there >= 0.8 * off, (tid, off, there, top,
                                                               dict(t.stats))


def test_mpi_recv_waits(perf_ok: None, bindir: Path, tmp_path: Path) -> None:  # noqa: F811
    cc = Path(sys.executable).parent / "mpicc"
    launcher = mpi_launch.mpirun()
    if not cc.exists() or launcher is None:
        pytest.skip("the mpi extra's mpicc is not installed (pip install 'callpath[mpi]')")
    exe = build(bindir, str(cc), "mpi_wait.c")
    m, stdout, _ = measure(tmp_path / "m", launcher, "-n", "2", str(exe))
    waited = float(re.search(r"rank 0 waited ([\d.]+) s", stdout)[1])  # type: ignore[index]
    rank0 = [p for p in m.processes if p.info.get("rank") == 0]
    assert len(rank0) == 1
    p = rank0[0]
    main = next(t for t in p.threads if int(t.info["index"]) == 0)
    paths = node_paths(m, p, main)
    got = under(paths, main.values[:, REALTIME].tolist(), r"wait_for_result(\.\w+)*",
                r"P?MPI_Recv") * 1e-9
    # MPICH polls with sched_yield (CPU time, and preempted at each yield on a busy
    # machine): either way the wall-clock time is there. It yields thousands of times a
    # second, above the every-switch limit, so a few unsampled switches' time can go to a
    # neighbouring sampled switch elsewhere (start-up, UCX's threads). On a quiet machine
    # that is a few percent (2.87 of 2.93 s); a CI run on a loaded one put 0.37 of 0.62 s
    # there, so the bound is loose: the call site holds a large part of the wait. The same
    # spill goes the other way (a CI run at load 6 put 0.703 s there for 0.681 s waited, of
    # 0.776 s): beyond the wait, a tenth of the thread's time at most.
    run_wall = main.stats["wall_ns"] * 1e-9
    assert waited >= 0.3
    assert 0.3 * waited - SLACK_S <= got <= waited + 0.1 * run_wall + SLACK_S, (got, waited)
    assert got <= run_wall + SLACK_S


def test_report_threads_and_prof(perf_ok: None, bindir: Path, tmp_path: Path  # noqa: F811
                                 ) -> None:
    """The database has REALTIME, CPUTIME and OFFCPU, a <blocked> context, and the Thread
    view shows the idle reader thread with its wall-clock time."""
    exe = build(bindir, "gcc", "waits.c", "-pthread")
    measure(tmp_path / "m", str(exe), "3")
    r = callpath("prof", str(tmp_path / "m"), "-o", str(tmp_path / "db"))
    assert r.returncode == 0, r.stderr
    lm = callpath("report", str(tmp_path / "db"), "--list-metrics")
    assert lm.returncode == 0, lm.stderr
    for name in ("REALTIME (sec)", "CPUTIME (sec)", "OFFCPU (sec)"):
        assert name in lm.stdout
    rep = callpath("report", str(tmp_path / "db"), "--threads", "THREAD 1", "-d", "40")
    assert rep.returncode == 0, rep.stderr
    assert "<blocked>" in rep.stdout and "wait_for_data" in rep.stdout
    share = callpath("report", str(tmp_path / "db"), "-d", "3", "--derived",
                     "waiting=$4/$0")
    assert share.returncode == 0, share.stderr


@pytest.mark.parametrize("events, expect", [
    (["REALTIME", "wall"], "given twice"),
    (["REALTIME", "cpu-clock"], "no other cpu-clock"),
    (["REALTIME@abc"], "expected REALTIME, REALTIME@PERIOD"),
])
def test_user_errors(events: list[str], expect: str, tmp_path: Path) -> None:
    args = [a for e in events for a in ("-e", e)]
    r = callpath("run", *args, "-o", str(tmp_path / "m"), "--", "true")
    assert r.returncode == 2 and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_new_processes_found_among_switch_records(perf_ok: None, bindir: Path,  # noqa: F811
                                                  tmp_path: Path) -> None:
    """The launcher finds the FORK and exec COMM records of new processes in its batches
    without walking them (``launch.new_processes``): on the raw data of a real run (a shell
    that forks and execs five processes, one of them passing a token 4,000 times, between
    switch records and stack samples of 8 KiB), the same (pid, time) pairs as a walk of every
    record, and what the launcher noted of those processes while they lived is among them (it
    notes none from its last drain, after the program's end). (A longer ping-pong on the loaded
    shared machine overflowed the rings: records lost, the processes' among them.) The unused
    tail of a stack sample holds stale ring bytes, earlier records among them: each pair once."""
    from callpath.measure import perf_events as events
    from callpath.measure import perf_launch as launch

    exe = build(bindir, "gcc", "pingpong.c", "-pthread")
    out = tmp_path / "m"
    script = f"{exe} 2000 0 > /dev/null; /bin/true; ls / > /dev/null; (sleep 0.01 &); wait"
    launch.run(["/bin/sh", "-c", script],
               launch.RunOptions([events.parse_event("cpu-clock")], out, realtime=True))
    data = (out / launch.RAW_FILE).read_bytes()
    walked, pos, kinds = [], 0, set()
    while pos + 8 <= len(data):
        typ, misc, size = struct.unpack_from("<IHH", data, pos)
        kinds.add(typ)
        if typ == launch.REC_FORK or (typ == launch.REC_COMM and misc & launch.MISC_COMM_EXEC):
            pid, ppid = struct.unpack_from("<II", data, pos + 8)
            if typ == launch.REC_COMM or pid != ppid:
                walked.append((pid, struct.unpack_from("<Q", data, pos + size - 24)[0]))
        pos += size
    assert pos == len(data)
    assert {9, 14} <= kinds  # samples and switch records were in the batches
    # the five processes' records, unless a ring overflowed (a LOST record: CI at load 6)
    assert len({p for p, _t in walked}) >= 3 or 2 in kinds, walked
    assert launch.new_processes(data) == walked
    noted = [json.loads(line) for line in (out / launch.PROCS_FILE).read_text().splitlines()]
    assert {(d["pid"], d["time"]) for d in noted} <= set(walked)
