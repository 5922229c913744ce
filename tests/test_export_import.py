"""``callpath export`` and ``callpath import`` against their real consumers and producers.

- folded stacks: totals equal the database's sample totals (a callpath-profiled program, with
  its ``(samples)`` metric) and its time totals within the rounding of each line;
- pprof: read by pprof itself (``go tool pprof -raw`` and ``-traces``; Debian's golang-go,
  skipped without ``go``): each sample type's total equals the database's, its stacks equal
  the folded export's;
- Chrome trace: the trace-event format (complete events that nest per track, metadata), one
  ``samples`` entry per running trace sample, each naming the stack at that sample;
- import of each format then export round-trips; ``perf script`` output of a real
  ``perf record`` imports with every sample;
- bad input anywhere is one line and exit 2, and every reader survives fuzzing (hypothesis).
Real databases: ../shared/data (small.d, loops-cputime-t.d) and a C program profiled here.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import callpath
from callpath.errors import CallpathError
from callpath.formats import stacks
from conftest import ROOT, perf_reason, run_cli, shared_path

SPIN = ROOT / "tests" / "export_programs" / "spin.c"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of a real run of spin.c by ``callpath profile -t`` (samples and traces)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("export")
    exe = d / "spin"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(SPIN)], check=True)
    db = d / "spin.d"
    run_cli("profile", "-t", "-m", str(d / "spin.m"), "-o", str(db), "--", str(exe),
            check=True)
    return db


def _dbs(profiled: Path) -> list[Path]:
    return [shared_path("hpctoolkit", "dbase", "small.d"),
            shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"), profiled]


def folded(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        out[stack] = out.get(stack, 0) + int(count)
    return out


def cli(*args: str) -> tuple[int, str, str]:
    """The ``callpath`` command run in this process (the same ``main`` as the installed
    script; a subprocess per call would cost the suite ~0.5 s of CPU each): (status, stdout,
    stderr). The real subprocess is exercised by the bad-input test."""
    import contextlib
    import io
    import os

    import conftest
    from callpath.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = conftest._CONFIG_HOME  # no saved filters of the user's
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:
                rc = int(e.code or 0)
    finally:
        if saved is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = saved
    return rc, out.getvalue(), err.getvalue()


def cli_ok(*args: str) -> str:
    rc, out, err = cli(*args)
    assert rc == 0, f"callpath {' '.join(args)}: {err}"
    return out


def export(db: Path, fmt: str, out: Path, *extra: str) -> Path:
    cli_ok("export", str(db), "--to", fmt, "-o", str(out), *extra)
    return out


# ---- folded --------------------------------------------------------------------------------


def test_folded_totals_equal_sample_totals(profiled: Path, tmp_path: Path) -> None:
    exp = callpath.open(profiled)
    m = stacks.default_metric(exp)
    assert m.name.endswith("(samples)")
    lines = folded(export(profiled, "folded", tmp_path / "f.txt"))
    assert sum(lines.values()) == round(float(exp.inclusive(m)[0])) > 50
    assert any(s.endswith("leaf") for s in lines), lines
    # a time metric: nanoseconds, each line rounded once
    t = next(x for x in exp.metrics if x.name.endswith("(sec)"))
    lines = folded(export(profiled, "folded", tmp_path / "t.txt", "--metric", t.name))
    assert abs(sum(lines.values()) - exp.inclusive(t)[0] * 1e9) <= len(lines)


def test_folded_of_hpctoolkit_database(tmp_path: Path) -> None:
    db = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    exp = callpath.open(db)
    lines = folded(export(db, "folded", tmp_path / "f.txt"))
    assert abs(sum(lines.values()) - exp.inclusive(0)[0] * 1e9) <= len(lines)
    # one thread only: the sum over that context
    one = folded(export(db, "folded", tmp_path / "one.txt", "--contexts", "THREAD 0"))
    p = [c.index for c in exp.contexts if c.label(exp.id_names).endswith("THREAD 0")]
    assert abs(sum(one.values()) - exp.values_in(p[0], 0, "execution")[0] * 1e9) <= len(one)


# ---- pprof ---------------------------------------------------------------------------------


def go_pprof(*args: str) -> str:
    """``go tool pprof -symbolize=none ARGS`` (pprof itself, as Debian's golang-go ships
    it): its stdout. ``-symbolize=none``: function names as written. By default pprof
    "demangles" a name equal to its system name by C++ heuristics, dropping anything in
    ``<...>`` or ``(...)``, so ``<unknown procedure> 0x880 [vdso]`` would read `` 0x880
    [vdso]``. Go versions that build the tool on first use cache it under .cache/go-build,
    not in the per-run cache directory, so only the first run ever pays for the build."""
    import os

    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (Debian's golang-go ships 'go tool pprof')")
    env = dict(os.environ)
    env.setdefault("GOCACHE", str(ROOT / ".cache" / "go-build"))
    r = subprocess.run([go, "tool", "pprof", "-symbolize=none", *args], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, f"go tool pprof {' '.join(args)}: {r.stderr.strip()[-500:]}"
    return r.stdout


class Pprof:
    """What pprof reads in a profile: the sample types (``type``, ``unit``) and, per sample
    with a stack, its values and its frames (leaf first, inlined ones with ``inline``). The
    types and exact values come from ``-raw`` (the profile as pprof parsed it), the stacks
    from ``-traces`` (one block per sample, in the same order, samples without locations
    left out)."""

    def __init__(self, path: Path) -> None:
        import re

        raw = go_pprof("-raw", str(path))
        _, _, rest = raw.partition("\nSamples:\n")
        samples_text, _, _ = rest.partition("\nLocations\n")
        header, *lines = samples_text.splitlines()
        self.types = [(t, u) for t, u in
                      re.findall(r"(.+?)/(\w+)(?:\[dflt\])?(?: |$)", header)]
        self.values: list[list[int]] = []
        for line in lines:
            m = re.fullmatch(r"\s*(-?\d+(?:\s+-?\d+)*):\s*((?:\d+\s*)*)", line)
            if m and m.group(2).strip():  # a sample with locations (pprof lists their ids)
                self.values.append([int(v) for v in m.group(1).split()])
        self.stacks: list[list[tuple[str, bool]]] = []
        blocks = go_pprof("-traces", str(path)).split("-" * 11 + "+" + "-" * 55 + "\n")[1:]
        for block in blocks:
            frames = []
            for line in block.splitlines():
                if not frames and re.match(r" *[^ :]+:  ", line):
                    continue  # a label of the sample (context)
                name = line[13:]
                frames.append((name.removesuffix(" (inline)"), name.endswith(" (inline)")))
            if frames:
                self.stacks.append(frames)
        assert len(self.stacks) == len(self.values) > 0, (len(self.stacks), len(self.values))

    def total(self, k: int) -> int:
        return sum(v[k] for v in self.values)

    def folded(self, k: int) -> dict[str, int]:
        """Sample type k's stacks as folded lines (root first, ';' in names as ':')."""
        out: dict[str, int] = {}
        for frames, v in zip(self.stacks, self.values, strict=True):
            key = ";".join(n.replace(";", ":") for n, _ in reversed(frames))
            out[key] = out.get(key, 0) + v[k]
        return {k_: v for k_, v in out.items() if v}


def test_pprof_reads_the_export(profiled: Path, tmp_path: Path) -> None:
    """pprof itself (``go tool pprof``) reads each export: parsing alone checks the string
    table, and that every location and function a sample or line names exists. One sample
    type per metric, each type's total the database's, inlined code as lines of its caller's
    location, and the stacks of the folded export."""
    for db in _dbs(profiled):
        exp = callpath.open(db)
        prof = Pprof(export(db, "pprof", tmp_path / f"{db.name}.pb.gz"))
        assert len(prof.types) == len(exp.metrics)
        assert "main" in {n for frames in prof.stacks for n, _ in frames}
        for k, m in enumerate(exp.metrics):
            unit = prof.types[k][1]
            total = prof.total(k)
            factor = 1e9 if unit == "nanoseconds" else 1.0
            assert abs(total - exp.inclusive(m)[0] * factor) <= len(prof.values), m.name
            if m.name.endswith("(samples)"):
                assert unit == "count" and total == round(float(exp.inclusive(m)[0]))
        # inlined code is part of its caller's location (loops-cputime-t.d has some): pprof
        # marks those frames '(inline)', each above the frame the database inlined it into
        # (a routine may be inlined into one of the same name: glibc's _IO_doallocbuf is)
        ft = stacks.frame_tree(exp)
        sub = np.flatnonzero(ft.inlined & (ft.parent >= 0))
        if len(sub):
            name = [ft.names[f] for f in ft.frame]
            pairs = {(name[k], name[ft.parent[k]]) for k in sub}
            inl = {(f[i][0], f[i + 1][0]) for f in prof.stacks for i in range(len(f) - 1)
                   if f[i][1]}
            assert inl and inl <= pairs, sorted(inl - pairs)[:5]
        # the same stacks as the folded export of the first metric
        want = folded(export(db, "folded", tmp_path / f"{db.name}.folded", "--metric", "0"))
        got = prof.folded(0)
        assert got.keys() == want.keys()
        assert all(abs(got[k] - want[k]) <= 8 for k in got)


# ---- Chrome trace --------------------------------------------------------------------------


def test_chrome_trace_event_format(profiled: Path, tmp_path: Path) -> None:
    for db in (shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"), profiled):
        exp = callpath.open(db)
        doc = json.loads(export(db, "chrome", tmp_path / f"{db.name}.json").read_text())
        events = doc["traceEvents"]
        assert {e["ph"] for e in events} == {"X", "M"}
        # what Perfetto's JSON reader needs: traceEvents first, no arrays inside an event
        assert next(iter(doc)) == "traceEvents"
        assert not any(isinstance(v, list) for e in events for v in e.values())
        running = sum(int((ln.ctx_ids > 0).sum()) for ln in exp.traces.lines)
        assert len(doc["samples"]) == running > 0
        tracks = {e["tid"] for e in events if e["ph"] == "X"}
        assert tracks <= {ln.prof_index for ln in exp.traces.lines} and tracks
        named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert named == {ln.prof_index for ln in exp.traces.lines}
        for tid in tracks:  # complete events nest perfectly on each track
            xs = sorted((e for e in events if e["ph"] == "X" and e["tid"] == tid),
                        key=lambda e: (e["ts"], -e["dur"]))
            open_ends: list[float] = []
            for e in xs:
                assert e["dur"] >= 0 and isinstance(e["name"], str)
                while open_ends and open_ends[-1] <= e["ts"] + 1e-6:
                    open_ends.pop()
                if open_ends:
                    assert e["ts"] + e["dur"] <= open_ends[-1] + 1e-3
                open_ends.append(e["ts"] + e["dur"])
        # each sample's stack frames: the stack of the slices covering it, innermost last
        frames = doc["stackFrames"]
        by_tid: dict[int, list[dict[str, Any]]] = {}
        for e in events:
            if e["ph"] == "X":
                by_tid.setdefault(e["tid"], []).append(e)
        for s in doc["samples"][:200]:
            chain = []
            k = s["sf"]
            while k is not None:
                chain.append(frames[k]["name"])
                k = frames[k].get("parent")
            covering = sorted((e for e in by_tid[s["tid"]]
                               if e["ts"] <= s["ts"] < e["ts"] + e["dur"]),
                              key=lambda e: -e["dur"])
            assert [e["name"] for e in covering][-len(chain):] == chain[::-1]


def test_chrome_needs_traces(tmp_path: Path) -> None:
    src = tmp_path / "a.folded"
    src.write_text("main;f 3\n")
    cli_ok("import", str(src), "-o", str(tmp_path / "a.d"))
    rc, _, err = cli("export", str(tmp_path / "a.d"), "--to", "chrome", "-o", str(tmp_path / "x"))
    assert rc == 2 and "no traces" in err and len(err.splitlines()) == 1


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["folded", "speedscope", "pprof"])
def test_import_then_export_round_trips(profiled: Path, tmp_path: Path, fmt: str) -> None:
    for db in _dbs(profiled):
        want = folded(export(db, "folded", tmp_path / "want.txt"))
        ext = {"folded": "txt", "speedscope": "json", "pprof": "pb.gz"}[fmt]
        f = export(db, fmt, tmp_path / f"{db.name}.{ext}")
        back = tmp_path / f"{db.name}.{fmt}.d"
        cli_ok("import", str(f), "-o", str(back))
        got = folded(export(back, "folded", tmp_path / "got.txt"))
        assert got.keys() == want.keys(), (fmt, db)
        assert all(abs(got[k] - want[k]) <= 2 for k in got), (fmt, db)
        # and the imported database is an ordinary one: the report reads it
        assert "main" in cli_ok("report", str(back), "-d", "3")
    # a callpath speedscope file keeps its execution contexts
    if fmt == "speedscope":
        db = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
        back = tmp_path / "ctx.d"
        cli_ok("import", str(export(db, "speedscope", tmp_path / "c.json")), "-o", str(back))
        assert len(callpath.open(back).contexts) == len(callpath.open(db).contexts)


def test_perf_script_import(tmp_path: Path) -> None:
    """Real 'perf record' + 'perf script' output of spin.c; every sample is imported."""
    perf = shutil.which("perf")
    if perf is None or shutil.which("gcc") is None:
        pytest.skip("Debian's linux-perf (perf) or gcc is not installed")
    exe = tmp_path / "spin"
    subprocess.run(["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", str(exe), str(SPIN)],
                   check=True)
    data = tmp_path / "perf.data"
    rec = subprocess.run([perf, "record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-o",
                          str(data), str(exe)], capture_output=True, text=True, timeout=120)
    if rec.returncode != 0 or not data.exists():
        pytest.skip(f"perf record cannot sample here: {rec.stderr.strip()[:200]}")
    text = subprocess.run([perf, "script", "-i", str(data)], capture_output=True, text=True,
                          timeout=120, check=True).stdout
    (tmp_path / "out.perf").write_text(text)
    n = sum(1 for ln in text.splitlines() if ln and not ln[0].isspace())
    assert n > 50
    db = tmp_path / "perf.d"
    cli_ok("import", str(tmp_path / "out.perf"), "-o", str(db))
    exp = callpath.open(db)
    assert [m.name for m in exp.metrics] == ["cpu-clock (samples)"]
    assert exp.inclusive(0)[0] == n
    lines = folded(export(db, "folded", tmp_path / "p.txt"))
    assert sum(lines.values()) == n
    leaf = sum(c for s, c in lines.items() if ";main;" in f";{s};" and "leaf" in s)
    assert leaf > 0.5 * n  # the program spends nearly all its time in leaf()
    # perf's sample times became a trace: the Chrome export holds every sample
    doc = json.loads(export(db, "chrome", tmp_path / "p.trace.json").read_text())
    assert len(doc["samples"]) == n
    # pprof and speedscope of the import
    export(db, "pprof", tmp_path / "p.pb.gz")
    export(db, "speedscope", tmp_path / "p.json")


BUSY = ROOT / "tests" / "export_programs" / "busy.py"


def _py_spy() -> str:
    """py-spy (a real producer of speedscope and folded files): on PATH, in the bench's
    environment, or installed by this test into .cache/py-spy (pip, the wheel bundles it)."""
    for cand in (shutil.which("py-spy"), ROOT / "bench" / ".env-pyprof" / "bin" / "py-spy",
                 ROOT / ".cache" / "py-spy" / "bin" / "py-spy"):
        if cand and Path(cand).exists():
            return str(cand)
    target = ROOT / ".cache" / "py-spy"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                        str(target), "py-spy"], capture_output=True, text=True, timeout=300)
    exe = target / "bin" / "py-spy"
    if r.returncode != 0 or not exe.exists():
        pytest.skip(f"py-spy cannot be installed here: {r.stderr.strip()[-200:]}")
    return str(exe)


def test_py_spy_files_import(tmp_path: Path) -> None:
    """py-spy's speedscope (sampled profile) and raw (folded) output of a real run import
    with every sample. busy.py spends nearly all its time in leaf(): with ~200 samples and
    p(leaf) > 0.9, fewer than half in leaf has probability below 1e-20."""
    exe = _py_spy()
    out = {}
    for fmt, name in (("speedscope", "busy.json"), ("raw", "busy.folded")):
        r = subprocess.run([exe, "record", "-r", "200", "-f", fmt, "-o", str(tmp_path / name),
                            "--", sys.executable, str(BUSY)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0 or not (tmp_path / name).exists():
            pytest.skip(f"py-spy cannot sample here: {r.stderr.strip()[-200:]}")
        db = tmp_path / f"{name}.d"
        cli_ok("import", str(tmp_path / name), "-o", str(db))
        out[fmt] = (tmp_path / name, db)
    # speedscope: total weight (seconds) and the frames
    doc = json.loads(out["speedscope"][0].read_text())
    weight = sum(sum(p["weights"]) for p in doc["profiles"])
    exp = callpath.open(out["speedscope"][1])
    assert [m.name for m in exp.metrics] == ["time (sec)"]
    assert abs(exp.inclusive(0)[0] - weight) < 1e-9 * max(1.0, weight)
    lines = folded(export(out["speedscope"][1], "folded", tmp_path / "s.txt"))
    leaf = sum(c for k, c in lines.items() if k.endswith("main;middle;leaf"))
    assert leaf > 0.5 * sum(lines.values())
    # raw: folded lines, some with an empty stack; the count total is kept
    text = out["raw"][0].read_text()
    total = sum(int(ln.rsplit(None, 1)[-1]) for ln in text.splitlines() if ln.strip())
    lines = folded(export(out["raw"][1], "folded", tmp_path / "r.txt"))
    assert sum(lines.values()) == total > 50
    leaf = sum(c for k, c in lines.items() if "middle (busy.py" in k and "leaf (busy.py" in k)
    assert leaf > 0.5 * total


# ---- bad input -------------------------------------------------------------------------------


def _one_line_error(args: list[str], name: str, *, subprocess_: bool = False) -> None:
    if subprocess_:
        r = run_cli(*args)
        rc, err = r.returncode, r.stderr
    else:
        rc, _, err = cli(*args)
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert name in err


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    db = shared_path("hpctoolkit", "dbase", "small.d")
    good = export(db, "pprof", tmp_path / "g.pb.gz").read_bytes()
    ss = export(db, "speedscope", tmp_path / "g.json").read_text()
    cases = {
        "empty.txt": b"",
        "trunc.pb.gz": good[: len(good) // 2],
        "trunc.pb": gzip.decompress(good)[:40],
        "random.bin": bytes(range(256)) * 4,
        "other.json": b'{"traceEvents": []}',
        "trunc.json": ss[: len(ss) // 2].encode(),
        "bad.folded": b"main;f 3\nthis line has no count\n",
        "perf.txt": b"prog 12/12 1.000001: 1 cpu-clock:\n\tzz not a frame\n",
    }
    for k, (name, data) in enumerate(cases.items()):
        p = tmp_path / name
        p.write_bytes(data)
        _one_line_error(["import", str(p), "-o", str(tmp_path / "o.d")], name,
                        subprocess_=k < 2)
    _one_line_error(["import", str(tmp_path / "missing"), "-o", str(tmp_path / "o.d")],
                    "missing")
    _one_line_error(["export", str(tmp_path / "nodb"), "--to", "folded", "-o", "-"], "nodb")
    _one_line_error(["export", str(db), "--to", "folded", "-m", "NOPE", "-o", "-"], "NOPE")
    _one_line_error(["export", str(db), "--to", "pprof", "--contexts", "RANK 99", "-o",
                     str(tmp_path / "x")], "RANK 99", subprocess_=True)


def _samples() -> dict[str, bytes]:
    db = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    exp = callpath.open(db)
    ft = stacks.frame_tree(exp)
    m = exp.metrics[0]
    import io

    from callpath.formats.export_folded import write_folded
    from callpath.formats.export_pprof import PprofSource, pprof_bytes
    from callpath.formats.export_speedscope import write_speedscope

    f = io.StringIO()
    write_folded(ft, stacks.point_values(exp, m), m, f)
    f.write(" 4\n")  # a sample without frames, as py-spy writes them
    s = io.StringIO()
    write_speedscope(ft, m, [("t", stacks.point_values(exp, m, 1))], s, "x")
    pb = pprof_bytes(ft, [m], [PprofSource(None, [stacks.point_values(exp, m)])])
    perf = (b"spin 1/1 1.000001: 1001 cpu-clock:\n\t 1152 leaf+0x19 (/tmp/spin)\n"
            b"\t 11ae main+0x18 (/tmp/spin)\n\nspin 1/2 1.002: 1001 cpu-clock:\n"
            b"\t 1152 leaf+0x19 (/tmp/spin)\n\n")
    return {"folded": f.getvalue().encode(), "speedscope": s.getvalue().encode(),
            "pprof": pb, "pprof-raw": gzip.decompress(pb), "perf": perf}


SAMPLES: dict[str, bytes] = {}


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["folded", "speedscope", "pprof", "pprof-raw", "perf"]),
       cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)),
                                          max_size=4))
def test_readers_survive_fuzzing(tmp_path: Path, which: str, cut: float,
                                 flips: list[tuple[float, int]]) -> None:
    from callpath.formats.import_build import build
    from callpath.formats.import_detect import read_profile

    if not SAMPLES:
        SAMPLES.update(_samples())
    data = bytearray(SAMPLES[which])
    data = data[: max(1, int(len(data) * cut))] if cut < 1 else data
    for where, byte in flips:
        data[min(len(data) - 1, int(where * len(data)))] = byte
    p = tmp_path / "fuzz"
    p.write_bytes(bytes(data))
    try:
        _, ss = read_profile(p)
        build(ss)
    except CallpathError as e:
        assert "\n" not in str(e)



@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=50))
def test_varints_round_trip(values: list[int]) -> None:
    """The vectorised varint writer against the decoder and against the protobuf rules: a
    value takes one byte per started 7 bits (negative int64 values ten)."""
    import numpy as np

    from callpath.formats import protowire as pw

    enc = pw.varints(np.asarray(values, dtype=np.int64))
    back = pw.unpack_varints(enc.tobytes(), "x").astype(np.int64).tolist()
    assert back == values
    want = [10 if v < 0 else max(1, -(-v.bit_length() // 7)) for v in values]
    assert enc.lengths().tolist() == want


def test_samples_without_frames(tmp_path: Path) -> None:
    """A folded line with an empty stack (py-spy writes them) keeps its cost, at the
    thread's entry point, also when no line has frames."""
    for text, want in (("7\n", {"main thread": 7}),
                       ("a;b 3\n 2\n", {"a;b": 3, "main thread": 2})):
        src = tmp_path / "e.folded"
        src.write_text(text)
        db = tmp_path / f"e{len(want)}.d"
        cli_ok("import", str(src), "-o", str(db))
        assert folded(export(db, "folded", tmp_path / "e.txt")) == want


def test_export_of_a_comparison(tmp_path: Path) -> None:
    """A 'callpath diff' database exports its [base] and [new] columns (times in
    nanoseconds, the tags kept), and its pprof re-imports with the same metric names."""
    db = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    diff = tmp_path / "self.d"
    cli_ok("diff", str(db), str(db), "-o", str(diff))
    exp = callpath.open(diff)
    names = [m.name for m in exp.metrics]
    assert names == ["CPUTIME (sec) [base]", "CPUTIME (sec) [new]"]
    prof = Pprof(export(diff, "pprof", tmp_path / "d.pb.gz"))
    assert prof.types == [("CPUTIME [base]", "nanoseconds"), ("CPUTIME [new]", "nanoseconds")]
    assert prof.total(0) == prof.total(1) > 0
    back = tmp_path / "back.d"
    cli_ok("import", str(tmp_path / "d.pb.gz"), "-o", str(back))
    assert [m.name for m in callpath.open(back).metrics] == names
    a = folded(export(diff, "folded", tmp_path / "a.txt", "-m", names[0]))
    assert a == folded(export(db, "folded", tmp_path / "b.txt"))
