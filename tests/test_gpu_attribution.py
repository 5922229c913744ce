"""GPU operations in ``callpath prof``: placeholders, HPCToolkit's metrics, stream contexts and
traces, on CUPTI activity recorded on an H200 (``../shared/data/gpu``; see gpu_fixture.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.formats import measdir as md
from callpath.formats import measdir_gpu as mdg
from callpath.formats.hpcstruct import read_hpcstruct
from callpath.measure.gpu import convert as cv
from callpath.model.contexts import IdKind
from callpath.structure.demangle import demangle
from conftest import run_cli, shared_path
from gpu_fixture import load, write_raw


@pytest.fixture(scope="module")
def recorded() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return load(shared_path("gpu", "cupti-torch-h200.jsonl.gz"))


@pytest.fixture(scope="module")
def database(recorded: tuple[dict[str, Any], list[dict[str, Any]]],
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    meta, records = recorded
    meas = tmp_path_factory.mktemp("gpu") / "m"
    md.write_header(meas, [], command=["python3", "record_cupti.py"], status="complete")
    write_raw(meta, records, meas)
    made = cv.convert_all(meas, trace=True)
    assert [p.name for p in made] == ["gpu-504-0.cpm"]
    db = meas.parent / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    return db


def _kernels(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] in (3, 10)]


def _dur(rs: list[dict[str, Any]]) -> float:
    return sum(r["end"] - r["start"] for r in rs) * 1e-9


def _root(exp: Any, name: str) -> float:
    return float(exp.inclusive(exp.metric(name))[0])


def test_totals_equal_the_recorded_durations_and_bytes(database: Path, recorded: Any) -> None:
    _, records = recorded
    exp = callpath.open(database)
    kernels = _kernels(records)
    copies = [r for r in records if r["kind"] == 1]
    sets = [r for r in records if r["kind"] == 2]
    syncs = [r for r in records if r["kind"] == 38]
    assert len(kernels) == 380
    assert _root(exp, "GKER (sec)") == pytest.approx(_dur(kernels), rel=1e-9)
    assert _root(exp, "GKER:COUNT") == len(kernels)
    assert _root(exp, "GXCOPY (sec)") == pytest.approx(_dur(copies), rel=1e-9)
    assert _root(exp, "GXCOPY:COUNT") == len(copies)
    for kind, name in ((1, "H2D"), (2, "D2H")):
        assert _root(exp, f"GXCOPY:{name} (B)") == sum(r["bytes"] for r in copies
                                                      if r["copy_kind"] == kind)
    assert _root(exp, "GMSET (sec)") == pytest.approx(_dur(sets), rel=1e-9)
    assert _root(exp, "GMSET:DEV (B)") == sum(r["bytes"] for r in sets if r["memory_kind"] == 3)
    assert _root(exp, "GSYNC (sec)") == pytest.approx(_dur(syncs), rel=1e-9)
    assert _root(exp, "GSYNC:STR (sec)") == pytest.approx(
        _dur([r for r in syncs if r["type"] == 3]), rel=1e-9)
    assert _root(exp, "GPUOP (sec)") == pytest.approx(
        _dur(kernels) + _dur(copies) + _dur(sets) + _dur(syncs), rel=1e-9)
    assert _root(exp, "GKER:THR_REG_ACUMU") == sum(r["registers_per_thread"] for r in kernels)
    assert _root(exp, "GKER:BLKS_ACUMU") == sum(r["grid_x"] * r["grid_y"] * r["grid_z"]
                                                for r in kernels)


def _name(exp: Any, n: int) -> str:
    f = int(exp.cct.function[n])
    return exp.functions[f].name if f >= 0 else ""


def test_kernels_sit_under_gpu_kernel_under_the_launching_call(database: Path,
                                                               recorded: Any) -> None:
    meta, records = recorded
    exp = callpath.open(database)
    cct = exp.cct
    rt = {v: k for k, v in meta["enums"]["runtime_api_trace_cbid"].items()}
    dr = {v: k for k, v in meta["enums"]["driver_api_trace_cbid"].items()}
    api = {r["correlation_id"]: (rt if r["kind"] == 5 else dr)[r["cbid"]]
           for r in records if r["kind"] in (4, 5)}
    # per (launching API, kernel name): launches and GPU time, as recorded
    want: dict[tuple[str, str], float] = {}
    for r in _kernels(records):
        key = (api[r["correlation_id"]], demangle(r["name"]))
        want[key] = want.get(key, 0.0) + (r["end"] - r["start"]) * 1e-9
    got: dict[tuple[str, str], float] = {}
    gker = exp.exclusive(exp.metric("GKER (sec)"))
    for n in np.flatnonzero(gker):
        ph = int(cct.parent[n])
        assert _name(exp, ph) == "<gpu kernel>"
        # the placeholder is called from the API frame's line: line -> API function
        up = int(cct.parent[ph])
        while up > 0 and _name(exp, up) == "":
            up = int(cct.parent[up])
        key = (_name(exp, up), _name(exp, int(n)))
        got[key] = got.get(key, 0.0) + float(gker[n])
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9), k
    assert any("(" in k for _, k in want) and not any(k.startswith("_Z") for _, k in got)


def test_copies_memsets_and_syncs_have_their_placeholders(database: Path) -> None:
    exp = callpath.open(database)
    by_placeholder: dict[str, set[str]] = {}
    for name in ("GXCOPY:H2D (B)", "GXCOPY:D2H (B)", "GMSET (sec)", "GSYNC (sec)"):
        ex = exp.exclusive(exp.metric(name))
        by_placeholder[name] = {_name(exp, int(n)) for n in np.flatnonzero(ex)}
    assert by_placeholder == {"GXCOPY:H2D (B)": {"<gpu copyin>"},
                              "GXCOPY:D2H (B)": {"<gpu copyout>"},
                              "GMSET (sec)": {"<gpu memset>"}, "GSYNC (sec)": {"<gpu sync>"}}


def test_streams_are_execution_contexts_with_interval_traces(database: Path,
                                                             recorded: Any) -> None:
    _, records = recorded
    exp = callpath.open(database)
    work = [r for r in records if r["kind"] in (1, 2, 3, 10)]
    want: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in work:
        want.setdefault((r["context_id"], r["stream_id"]), []).append(r)
    streams = {}
    for c in exp.contexts:
        kinds = [i.kind for i in c.ids]
        if IdKind.GPUSTREAM in kinds:
            assert kinds == [IdKind.NODE, IdKind.GPUCONTEXT, IdKind.GPUSTREAM]
            streams[(c.ids[1].logical_id, c.ids[2].logical_id)] = c.index
    assert set(streams) == set(want)
    assert exp.traces is not None
    lines = {t.prof_index: t for t in exp.traces.lines}
    node_of = {int(c): i for i, c in enumerate(exp.cct.ctx_id)}
    for key, prof in streams.items():
        line = lines[prof]
        ops = sorted(want[key], key=lambda r: r["start"])
        assert len(line.timestamps) == 2 * len(ops)
        assert np.all(np.diff(line.timestamps.astype(np.int64)) >= 0)
        starts = line.timestamps[0::2].astype(np.int64)
        assert starts.tolist() == [r["start"] for r in ops]
        names = [_name(exp, node_of[int(c)]) for c in line.ctx_ids[0::2]]
        assert names == [demangle(r["name"]) if r["kind"] in (3, 10) else
                         {1: "<gpu copyin>", 2: "<gpu copyout>"}.get(r.get("copy_kind", 0),
                                                                     "<gpu copy>")
                         if r["kind"] == 1 else "<gpu memset>" for r in ops]
        assert set(line.ctx_ids[1::2].tolist()) == {int(exp.cct.ctx_id[0])}
    # the GPU values belong to the launching thread, as hpcprof has them
    gker = exp.metric("GKER (sec)")
    for prof in streams.values():
        assert float(exp.values_in(prof, gker, "execution").sum()) == 0.0


def test_companion_file_round_trip(tmp_path: Path, recorded: Any) -> None:
    meta, records = recorded
    write_raw(meta, records, tmp_path)
    path = cv.convert(tmp_path / "gpu-504.raw", tmp_path, trace=False)
    assert path is not None
    g = mdg.read(path)
    ops = np.concatenate(list(g.ops.values()))
    assert len(ops) == sum(1 for r in records if r["kind"] in (1, 2, 3, 10, 38))
    assert sorted(set(g.names)) == sorted({r["name"] for r in _kernels(records)})
    # a cut-off companion is refused with the file named, not a traceback
    data = path.read_bytes()
    bad = tmp_path / "gpu-9-0.cpm"
    bad.write_bytes(data.replace(b"CPMEAS", b"XXMEAS", 1))
    with pytest.raises(callpath.CallpathError, match=r"gpu-9-0\.cpm"):
        mdg.read(bad)


def test_native_launch_context_is_mapped_through_the_load_map(tmp_path: Path) -> None:
    """A launch's native return addresses (here this very process's, from glibc's
    backtrace() as the library takes them) become NATIVE frames at link-time addresses and
    prof names them from the modules' symbols: ctypes' ffi_call is on the path, under it
    the placeholder and the kernel."""
    import ctypes
    import struct

    buf = (ctypes.c_void_p * 128)()
    n = ctypes.CDLL(None).backtrace(buf, 128)
    pcs = [int(buf[i] or 0) for i in range(n)]
    maps = Path("/proc/self/maps").read_text()

    def rec(tag: int, payload: bytes) -> bytes:
        return struct.pack("<II", tag, len(payload)) + payload

    pid = 4242
    raw = rec(cv.R_API, struct.pack("<4Q", 7, pid | (2 << 32), 1, len(pcs))
              + struct.pack(f"<{len(pcs)}Q", *pcs))
    raw += rec(cv.R_KERNEL, struct.pack("<10Q", 7, 10**9 + 1000, 10**9 + 3000, 1 << 32, 7, 4,
                                        128, 32, 0, 0)
               + b"_Z4axpyPfPKffi")
    raw += rec(cv.R_MAPS, maps.encode())
    # the library's clock readings: CUPTI's clock is 10**9 ns ahead of CLOCK_MONOTONIC
    raw += rec(cv.R_INFO, b"clock start cupti=1000000500 mono=500")
    raw += rec(cv.R_INFO, b"clock end cupti=1000009000 mono=9000")
    meas = tmp_path / "m"
    md.write_header(meas, [], command=["app"], status="complete")
    (meas / f"gpu-{pid}.raw").write_bytes(raw)
    (comp,) = cv.convert_all(meas, trace=False)
    g = mdg.read(comp)
    assert g.process.info["gpu_clock"] == "monotonic"
    (ops,) = g.ops.values()
    assert (int(ops["start"][0]), int(ops["end"][0])) == (1000, 3000)  # on CLOCK_MONOTONIC
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    gker = exp.exclusive(exp.metric("GKER (sec)"))
    (leaf,) = np.flatnonzero(gker)
    assert gker[leaf] == pytest.approx(2e-6)
    assert _name(exp, int(leaf)) == "axpy(float*, float const*, float, int)"
    path = []
    node = int(exp.cct.parent[leaf])
    while node > 0:
        path.append(_name(exp, node))
        node = int(exp.cct.parent[node])
    assert path[0] == "<gpu kernel>"
    assert any(p.startswith("ffi_call") for p in path), path


def _measurement_with_cubin(tmp_path: Path, data: bytes, kernel: str) -> tuple[Path, int]:
    """A measurement directory whose process loaded the GPU binary ``data`` (saved by the
    library as gpubins/HASH.gpubin) and ran ``kernel`` once; returns it and the hash."""
    import struct

    meas = tmp_path / "m"
    md.write_header(meas, [], command=["app"], status="complete")
    h = 1469598103934665603
    for b in data:  # the library's FNV-1a 64 of the binary's bytes
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    (meas / "gpubins").mkdir()
    (meas / "gpubins" / f"{h:016x}.gpubin").write_bytes(data)

    def rec(tag: int, payload: bytes) -> bytes:
        return struct.pack("<II", tag, len(payload)) + payload

    raw = rec(cv.R_CUBIN, struct.pack("<3Q", 1, h, len(data)))
    raw += rec(cv.R_KERNEL, struct.pack("<10Q", 7, 1000, 3000, 1 << 32, 7, 4, 128, 32, 0, 0)
               + kernel.encode())
    (meas / "gpu-77.raw").write_bytes(raw)
    cv.convert_all(meas, trace=False)
    return meas, h


def test_kernels_named_by_their_gpu_binary(tmp_path: Path) -> None:
    """A GPU binary the process loaded (saved as gpubins/HASH.gpubin; here the cubin hpcrun
    saved of HPCToolkit's loops.cu) that defines the kernel becomes the kernel's load module
    at the kernel's offset in the file, as hpcprof attributes kernels to gpubins/; with its
    structure (prof recovers it on demand) the kernel is its procedure with the source file
    and line, and the line of its first instruction below it, as in hpcprof's database of
    the same binary."""
    cubin = shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m", "gpubins",
                        "1165a3eeddeea5ea3616d1cdbc6faa59.gpubin")
    ref = callpath.open(shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d"))
    (want,) = [f for f in ref.functions if f.name == "kernmain()"]
    meas, h = _measurement_with_cubin(tmp_path, cubin.read_bytes(), "_Z8kernmainv")
    gpubin = meas / "gpubins" / f"{h:016x}.gpubin"
    # without structure: the kernel's name, module and address
    db0 = tmp_path / "db0"
    run_cli("prof", str(meas), "-o", str(db0), "--ignore-structs", check=True)
    exp = callpath.open(db0)
    (leaf,) = np.flatnonzero(exp.exclusive(exp.metric("GKER (sec)")))
    fn = exp.functions[int(exp.cct.function[leaf])]
    assert fn.name == "kernmain()"
    assert exp.modules[fn.module].path == str(gpubin)
    assert fn.offset == want.offset == 0x2E00  # hpcprof's address of the kernel
    # with the structure prof recovers: the procedure at its source line, its first line
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    hot = np.flatnonzero(exp.exclusive(exp.metric("GKER (sec)")))
    leaf = int(hot[np.argmax(exp.cct.depth[hot])])  # (a procedure's exclusive has its lines)
    assert exp.cct.kind[leaf] == 2  # a line
    line_file = exp.files[int(exp.cct.file[leaf])].path
    assert (line_file.rsplit("/", 1)[-1], int(exp.cct.line[leaf])) == ("loops.cu", 19)
    kern = int(exp.cct.parent[leaf])
    fn = exp.functions[int(exp.cct.function[kern])]
    assert _name(exp, int(exp.cct.parent[kern])) == "<gpu kernel>"
    assert fn.name == "kernmain()" and fn.offset == 0x2E00
    assert exp.modules[fn.module].path == str(gpubin)
    # the file and the kernel's line as hpcprof has them (from hpcstruct's structure of the
    # same binary): the smallest line of its code, 16, a device function inlined into it;
    # below it the line of its first instruction, 19
    assert (exp.files[fn.file].path, fn.line) == (ref.files[want.file].path, want.line) \
        == ("/builds/hpctoolkit/hpctoolkit/tests/data/meas/loops.cu", 16)
    (ref_line,) = [int(ref.cct.line[i]) for i in range(len(ref.cct.parent))
                   if ref.cct.kind[i] == 2 and ref.cct.function[ref.cct.parent[i]] >= 0
                   and ref.functions[int(ref.cct.function[ref.cct.parent[i]])].name
                   == "kernmain()"][:1]
    assert ref_line == 19


def test_struct_of_a_measurements_gpu_binaries(tmp_path: Path) -> None:
    """``callpath struct MEASDIR`` analyses the GPU binaries the run saved (gpubins/) beside
    its host modules, into MEASDIR/structs/ where prof reads them, and says in one line that
    loops need nvdisasm when it is not there; prof then maps the kernel through it."""
    cubin = shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m", "gpubins",
                        "1165a3eeddeea5ea3616d1cdbc6faa59.gpubin")
    meas, h = _measurement_with_cubin(tmp_path, cubin.read_bytes(), "_Z8kernmainv")
    gpubin = meas / "gpubins" / f"{h:016x}.gpubin"
    run = run_cli("struct", str(meas), "--no-cache", check=True,
                  env={"CALLPATH_NVDISASM": ""})
    notes = [ln for ln in run.stderr.splitlines() if "nvdisasm" in ln]
    assert notes == [f"callpath struct: {gpubin}: no loops: nvdisasm not found (a CUDA "
                     "toolkit, or 'pip install nvidia-cuda-nvdisasm'; CALLPATH_NVDISASM "
                     "names one)"]
    index = json.loads((meas / "structs" / "index.json").read_text())["modules"]
    (s,) = read_hpcstruct(meas / "structs" / index[str(gpubin)])
    assert [s.text(int(s.name[i])) for i in range(len(s)) if s.kind[i] == 2] == ["kernmain()"]
    # the directory moved: the structure is still found (by the binary's content hash)
    moved = tmp_path / "moved"
    meas.rename(moved)
    db = tmp_path / "db"
    run_cli("prof", str(moved), "-o", str(db), check=True)
    exp = callpath.open(db)
    hot = np.flatnonzero(exp.exclusive(exp.metric("GKER (sec)")))
    leaf = int(hot[np.argmax(exp.cct.depth[hot])])
    assert (int(exp.cct.kind[leaf]), int(exp.cct.line[leaf])) == (2, 19)
