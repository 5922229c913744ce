"""HPCToolkit measurements whose metrics have a sampling period (perf events, PAPI) or are in
perf's frequency mode: ``callpath prof`` gives the values hpcprof gives.

hpcprof's rule (docs/prof.md, "HPCToolkit measurements: metric periods"): every stored value,
an integer or a double as the descriptor's value format says, times the descriptor's period;
the frequency flag and the multiplexing statistics never change a value.

Two kinds of evidence:

* HPCToolkit's own perf-event measurement (``hpcrun -e perf::cpu-clock@f80 -e
  perf::task-clock@100000000``, its tests/data ``meas/loops-perf.m``) and the two databases its
  hpcprof wrote from it (``dbase/loops-perf.d``, ``loops-perf.nostruct.d``): same tree, same
  values, every metric. Looked for in ``../shared/data/hpctoolkit/{meas,dbase}`` and in
  ``$CALLPATH_HPCTOOLKIT_TESTDATA/{meas,dbase}`` (a checkout's tests/data); skipped if in
  neither.
* Always: the real CPUTIME measurements in ``../shared/data/hpctoolkit/meas`` with their
  metric descriptors rewritten byte-exactly (period, value format, frequency flag, flag
  convention), compared with hpcprof's database of the unmodified measurement times the
  factor the rule gives: every case hpcprof's reading distinguishes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.attribute.elfsyms import DirectSymbols, demangle
from callpath.attribute.kernelsyms import KernelSymbols, is_kernel_symbols
from callpath.formats.hpcrun import read_hpcrun
from callpath.model import Experiment, Metric, NodeKind
from conftest import run_cli, shared_path
from hpcrun_patch import new_flags, old_flags, patch
from prof_compare import hpctk_data, matched_nodes, profile_by_ids


def _point_total(exp: Experiment, profile: int, metric: Metric) -> float:
    """The sum of a metric's point values in one profile, hidden contexts included."""
    pid = metric.prop_id(exp.scopes, "point")
    vals = exp.values[profile]
    return float(np.asarray(vals.values)[np.asarray(vals.metric_ids) == pid].sum())


def assert_same(ours: Experiment, ref: Experiment, factor: float = 1.0) -> None:
    """Same tree (contexts named by their paths; function contexts also by module and entry),
    same execution contexts, and for every metric (matched by name: hpcprof's order comes from
    a hash set) ``ours == factor * ref`` in every scope of every profile and the summary."""
    ia, ib = matched_nodes(ours, ref)
    for i, j in zip(ia.tolist(), ib.tolist(), strict=True):
        if int(ours.cct.kind[i]) == int(NodeKind.FUNCTION):
            fo = ours.functions[int(ours.cct.function[i])]
            fr = ref.functions[int(ref.cct.function[j])]
            assert (ours.modules[fo.module].path, fo.offset) == \
                (ref.modules[fr.module].path, fr.offset), fo.name
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    assert set(pa) == set(pb)
    assert sorted(m.name for m in ours.metrics) == sorted(m.name for m in ref.metrics)
    for mr in ref.metrics:
        mo, = [m for m in ours.metrics if m.name == mr.name]
        assert mo.description == mr.description
        for key in pa:
            for scope in ("function", "lex_aware", "execution"):
                if pa[key] == 0:
                    va = ours.summary(mo.stat_id(ours.scopes, scope))[
                        ours.cct.ctx_id.astype(np.int64)][ia]
                    vb = ref.summary(mr.stat_id(ref.scopes, scope))[
                        ref.cct.ctx_id.astype(np.int64)][ib]
                else:
                    va = ours.values_in(pa[key], mo, scope)[ia]
                    vb = ref.values_in(pb[key], mr, scope)[ib]
                np.testing.assert_allclose(va, factor * vb, rtol=1e-9, atol=0,
                                           err_msg=f"{mr.name} profile {key} scope {scope}")
            if pa[key] != 0:  # point values: hpcprof's sit on hidden instruction contexts
                assert _point_total(ours, pa[key], mo) == pytest.approx(
                    factor * _point_total(ref, pb[key], mr), rel=1e-12)


# --- HPCToolkit's own perf-event measurement and its hpcprof databases ---------------------

PERF_CASES = [("loops-perf.d", []), ("loops-perf.nostruct.d", ["--ignore-structs"]),
              ("loops-perf.d", ["-j", "2"])]  # workers read the symbol files on their own


@pytest.mark.parametrize(("db", "opts"), PERF_CASES)
def test_perf_events_equal_hpcprof(tmp_path: Path, db: str, opts: list[str]) -> None:
    meas = hpctk_data("meas", "loops-perf.m")
    ref = callpath.open(hpctk_data("dbase", db))
    out = tmp_path / db
    run_cli("prof", str(meas), "-o", str(out), *opts, check=True)
    ours = callpath.open(out)
    assert_same(ours, ref)
    # the period is what is at stake: task-clock's stored values are sample counts
    task, = [m for m in ours.metrics if m.name == "perf::task-clock"]
    total = ours.summary(task.stat_id(ours.scopes, "execution"))[0]
    assert total == 36 * 100_000_000  # 4 threads x 9 samples of 0.1 s, in ns


def test_perf_descriptors_as_hpcrun_wrote_them() -> None:
    """Period mode stores the period and counts; frequency mode stores period 1, the kernel's
    period per sample as the value, and the frequency flag."""
    meas = hpctk_data("meas", "loops-perf.m")
    for f in sorted(meas.glob("*.hpcrun")):
        prof = read_hpcrun(f)
        cpu, task = prof.metrics
        assert (cpu.name, cpu.period, cpu.is_frequency) == ("perf::cpu-clock", 1, True)
        assert cpu.threshold_mean == 1e9 / 80  # @f80: the mean kernel period, 12.5 ms in ns
        assert (task.name, task.period, task.is_frequency) == ("perf::task-clock",
                                                                100_000_000, False)
        counts = prof.value[prof.value_mid == 1]
        assert np.all(counts == np.round(counts)) and counts.sum() == 9
        assert not cpu.is_int and not task.is_int


def test_kernel_frames_are_named_from_kernel_symbols() -> None:
    """The measurement's kernel call chains name kernel_symbols/vmlinux.<host>; every kernel
    frame lies in one of its text symbols."""
    meas = hpctk_data("meas", "loops-perf.m")
    prof = read_hpcrun(next(meas.glob("*-003-*.hpcrun")))
    (lm, path), = [(k, v) for k, v in prof.modules.items() if is_kernel_symbols(v)]
    ks = KernelSymbols.of_file(meas / path)
    assert ks is not None and len(ks.addrs) > 1000
    ips = prof.node_ip[prof.node_lm == lm]
    assert len(ips)
    names = {ks.find(int(ip)) for ip in ips.tolist()}
    assert None not in names
    assert all(n.endswith(" [vmlinux]") for _, n in names if n)


# --- every case of the rule, on real measurements with rewritten descriptors ----------------

REAL = 2
INT = 1


def _patched(tmp_path: Path, meas: str, **fields: object) -> Path:
    src = shared_path("hpctoolkit", "meas", meas)
    dst = tmp_path / meas
    shutil.copytree(src, dst)
    for f in sorted(dst.glob("*.hpcrun")):
        patch(f, **fields)  # type: ignore[arg-type]
    return dst


def _prof(meas: Path, out: Path) -> Experiment:
    run_cli("prof", str(meas), "-o", str(out), check=True)
    return callpath.open(out)


#: (measurement, hpcprof database, descriptor fields, factor on hpcprof's values)
CASES = [
    # period mode (perf -e EVENT@PERIOD, PAPI): stored counts times the period
    ("loops-cputime-t.m", "loops-cputime-t.d", {"period": 100_000_000}, 1e8),
    ("small.m", "small.d", {"period": 4999}, 4999.0),
    # perf frequency mode as hpcrun writes it: period 1, the flag set, values already counts
    ("loops-cputime-t.m", "loops-cputime-t.d",
     {"frequency": 1, "multiplexed": 1, "threshold_mean": 12_500_000.0, "num_samples": 7},
     1.0),
    # the frequency flag does not cancel a period either
    ("small.m", "small.d", {"frequency": 1, "period": 3}, 3.0),
    # integer values (PAPI, itimer before 2020: microseconds), with and without a period
    ("loops-cputime-t.m", "loops-cputime-t.d",
     {"flags": new_flags(INT), "values_to_int_scale": 1e6}, 1e6),
    ("small.m", "small.d", {"flags": new_flags(INT), "values_to_int_scale": 1e6,
                            "period": 3}, 3e6),
    # the older flag convention hpcprof still reads, real and integer
    ("small.m", "small.d", {"flags": old_flags(REAL)}, 1.0),
    ("loops-cputime-t.m", "loops-cputime-t.d",
     {"flags": old_flags(INT), "values_to_int_scale": 1e6, "period": 7}, 7e6),
]


@pytest.mark.parametrize(("meas", "db", "fields", "factor"), CASES,
                         ids=[f"{c[0]}-{'-'.join(c[2])}" for c in CASES])
def test_descriptor_cases_scale_as_hpcprof(tmp_path: Path, meas: str, db: str,
                                           fields: dict[str, object], factor: float) -> None:
    patched = _patched(tmp_path, meas, **fields)
    ours = _prof(patched, tmp_path / "out.d")
    assert_same(ours, callpath.open(shared_path("hpctoolkit", "dbase", db)), factor)


def test_the_rewrite_reads_back(tmp_path: Path) -> None:
    """The rewritten fields are what the reader sees (so the cases above test what they say)."""
    m = _patched(tmp_path, "small.m", flags=old_flags(INT), values_to_int_scale=1e6,
                 period=7, frequency=1, multiplexed=1, threshold_mean=2.5, num_samples=9)
    orig = read_hpcrun(next(shared_path("hpctoolkit", "meas", "small.m").glob("*.hpcrun")))
    prof = read_hpcrun(next(m.glob("*.hpcrun")))
    d, = prof.metrics
    assert (d.is_int, d.value_format, d.period, d.is_frequency, d.is_multiplexed,
            d.threshold_mean, d.num_samples) == (True, INT, 7, True, True, 2.5, 9)
    np.testing.assert_array_equal(prof.value, np.rint(orig.value * 1e6))


@pytest.mark.parametrize("valfmt", [0, 3])
def test_unknown_value_format_is_one_line_error(tmp_path: Path, valfmt: int) -> None:
    """hpcprof refuses a file whose metric has a value format other than integer or real."""
    m = _patched(tmp_path, "small.m", flags=new_flags(valfmt))
    r = run_cli("prof", str(m), "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert ".hpcrun" in r.stderr and "CPUTIME (sec)" in r.stderr and "value format" in r.stderr


# --- the symbol tables hpcprof falls back on ------------------------------------------------

def test_kernel_symbol_listing_rules() -> None:
    """Text symbols only; the first of equal addresses; an optional module name; no end."""
    ks = KernelSymbols.parse("\n".join([
        "ffffffff81000000 T _stext", "ffffffff81000000 T startup_64",
        "ffffffff81000100 D some_data", "ffffffff81000200 t local_fn [ext4]",
        "garbage line", "ffffffff81000300 T last"]))
    assert ks.find(0xFFFFFFFF80FFFFFF) is None
    assert ks.find(0xFFFFFFFF81000150) == (0xFFFFFFFF81000000, "_stext [vmlinux]")
    assert ks.find(0xFFFFFFFF81000200)[1] == "local_fn [ext4] [vmlinux]"  # type: ignore[index]
    assert ks.find(0xFFFFFFFFFFFFFFF0)[1] == "last [vmlinux]"  # type: ignore[index]


def _cc() -> str:
    for cc in ("g++", "c++", "clang++"):
        if shutil.which(cc):
            return cc
    pytest.skip("no C++ compiler to build a shared library")


def test_elf_symbols_as_hpcprof_reads_them(tmp_path: Path) -> None:
    """A real shared library without DWARF: the symbol containing an address, the last byte
    excluded, C++ names demangled; with DWARF hpcprof reads that instead, so none here."""
    src = tmp_path / "lib.cc"
    src.write_text("namespace ns { int twice(int x) { return 2 * x + 1; } }\n"
                   "extern \"C\" int plain(int x) { return x * x - 3; }\n")
    so = tmp_path / "lib.so"
    subprocess.run([_cc(), "-O1", "-g0", "-shared", "-fPIC", "-o", str(so), str(src)],
                   check=True)
    syms = DirectSymbols.of_file(so)
    assert syms is not None
    names = {syms._name(i): (int(lo), int(hi)) for i, (lo, hi) in
             enumerate(zip(syms.lo.tolist(), syms.hi.tolist(), strict=True))}
    lo, hi = names["ns::twice(int)"]
    assert syms.find(lo) == (lo, "ns::twice(int)")
    assert syms.find(hi - 1) == (lo, "ns::twice(int)")
    assert syms.find(hi) != (lo, "ns::twice(int)")  # hpcprof's interval stops before it
    assert "plain" in names
    dbg = tmp_path / "dbg.so"
    subprocess.run([_cc(), "-O1", "-g", "-shared", "-fPIC", "-o", str(dbg), str(src)],
                   check=True)
    assert DirectSymbols.of_file(dbg) is None
    assert demangle("_ZN2ns5twiceEi") == "ns::twice(int)" and demangle("main") == "main"


def test_unreadable_symbol_files_leave_instructions(tmp_path: Path) -> None:
    """A truncated vdso copy and a kernel listing that is not xz: hpcprof names no function
    from them and goes on; so does callpath (instruction contexts, no error)."""
    meas = tmp_path / "m"
    shutil.copytree(hpctk_data("meas", "loops-perf.m"), meas)
    vdso, = meas.glob("vdso/*.vdso")
    vdso.write_bytes(vdso.read_bytes()[:700])
    ksyms, = [p for p in meas.glob("kernel_symbols/vmlinux.*") if p.suffix != ".license"]
    ksyms.write_bytes(b"ffffffff81000000 T not_compressed\n")
    run_cli("prof", str(meas), "--ignore-structs", "-o", str(tmp_path / "db"), check=True)
    exp = callpath.open(tmp_path / "db")
    names = [f.name for f in exp.functions]
    assert not any("[vmlinux]" in n or "vdso" in n for n in names), names
    kernel = [i for i, m in enumerate(exp.modules) if m.path.startswith("kernel_symbols/")]
    assert kernel and np.isin(exp.cct.module, kernel).any()
