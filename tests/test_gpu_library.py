"""callpath's CUPTI library (``cupti_inject.c``): it builds against the CUPTI headers found here
and reads the launching thread's Python frames without the GIL. Needs CUPTI's headers and
library (NVIDIA's nvidia-cuda-cupti package or a CUDA toolkit), not a GPU; skips without."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.formats import measdir as md
from callpath.formats import measdir_gpu as mdg
from callpath.measure.gpu import convert as cv
from callpath.measure.gpu import library
from callpath.measure.gpu import session as gpu_session
from callpath.model.contexts import IdKind
from conftest import SHARED, run_cli


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cupti = library.find_cupti()
    if cupti is None:
        pytest.skip("no CUPTI headers and library here (nvidia-cuda-cupti or a CUDA toolkit)")
    if library.python_include() is None:
        pytest.skip("this interpreter has no internal headers to read its frame records")
    path = library.build(cupti, tmp_path_factory.mktemp("cupti-cache"))
    return ctypes.CDLL(str(path))


def _frames(lib: ctypes.CDLL, raw: Path) -> tuple[list[tuple[str, str, int]], list[int]]:
    buf = (ctypes.c_uint64 * 512)()
    n = lib.callpath_cupti_selftest(str(raw).encode(), buf)  # ctypes releases the GIL
    assert n > 0
    codes = cv.read_raw(raw).codes
    keys = [int(buf[2 * i]) for i in range(n)]
    names = [KNOWN.setdefault(k, codes.get(k, ("?", "?", 0)))[:2] for k in keys]
    return [(*nm, int(buf[2 * i + 1])) for i, nm in enumerate(names)], keys


KNOWN: dict[int, tuple[str, str, int]] = {}


def _launch_here(lib: ctypes.CDLL, raw: Path) -> tuple[list[tuple[str, str, int]], list[int]]:
    return _frames(lib, raw)


class Model:
    def forward(self, lib: ctypes.CDLL, raw: Path) -> tuple[list[tuple[str, str, int]],
                                                            list[int]]:
        return _launch_here(lib, raw)


def test_python_frames_without_the_gil(lib: ctypes.CDLL, tmp_path: Path) -> None:
    """The frames a launch records from a thread that released the GIL: innermost first,
    with the line executing in each, named by file and qualified name as the sampler names
    them; a code object is described once (later records reuse its key)."""
    frames, keys = Model().forward(lib, tmp_path / "gpu-1.raw")
    here = Path(__file__).resolve()
    lines = {name: code.co_firstlineno for name, code in (
        ("_frames", _frames.__code__), ("_launch_here", _launch_here.__code__),
        ("Model.forward", Model.forward.__code__))}
    got = [(Path(f).resolve() == here, name, ln - lines[name]) for f, name, ln in frames[:3]]
    assert got == [(True, "_frames", 2), (True, "_launch_here", 1), (True, "Model.forward", 2)]
    assert any(name == "test_python_frames_without_the_gil" for _, name, _ in frames)
    _, again = _frames(lib, tmp_path / "gpu-2.raw")
    described = cv.read_raw(tmp_path / "gpu-2.raw").codes
    assert again[0] == keys[0] and again[0] not in described


def test_launch_callbacks_are_chosen_by_name(lib: ctypes.CDLL) -> None:
    """The library calls back only for the calls that launch GPU work, chosen by the names
    this CUPTI gives its callback ids: every launch, copy, memset and synchronization the
    recorded PyTorch run joined to GPU work is among them; queries are not."""
    cupti = library.find_cupti()
    assert cupti is not None
    so = ctypes.CDLL(str(cupti.lib / library._libname(cupti.lib)))
    chosen: set[str] = set()
    for domain, runtime in ((1, 0), (2, 1)):
        for cbid in range(1, 4096):
            name = ctypes.c_char_p()
            if so.cuptiGetCallbackName(domain, cbid, ctypes.byref(name)) != 0 or not name.value:
                continue
            if lib.callpath_cupti_wanted(name.value, runtime):
                chosen.add(name.value.decode())
    if not chosen:
        pytest.skip("this CUPTI gives no callback names without a driver")
    # the API calls that launched GPU work in ../shared/data/gpu's PyTorch recording
    for api in ("cudaLaunchKernel_v7000", "cudaLaunchKernelExC_v11060", "cuLaunchKernel",
                "cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020", "cudaStreamSynchronize_v3020",
                "cudaDeviceSynchronize_v3020"):
        assert api in chosen
    # allocations and frees too (GMEM), timed by their own calls
    for api in ("cudaMalloc_v3020", "cudaFree_v3020", "cudaMallocHost_v3020",
                "cudaMallocAsync_v11020", "cuMemAlloc_v2", "cuMemFree_v2"):
        assert api in chosen
    assert lib.callpath_cupti_wanted(b"cudaMalloc_v3020", 1) == 2
    assert lib.callpath_cupti_wanted(b"cudaFree_v3020", 1) == 3
    assert not chosen & {"cudaGetDevice_v3020", "cudaStreamGetCaptureInfo_v2_v11030",
                         "cuCtxGetCurrent", "cudaMemGetInfo_v3020", "cuMemGetInfo_v2"}
    assert len(chosen) < 300


def _launch_from_python(lib: ctypes.CDLL, raw: Path) -> int:
    line = sys._getframe().f_lineno + 1
    assert lib.callpath_cupti_fake_launch(str(raw).encode()) == 0  # no GIL, as in PyTorch
    return line


def test_launch_to_database_without_a_gpu(lib: ctypes.CDLL, tmp_path: Path) -> None:
    """The library's path from a launch to the database, CUPTI's side made up (see
    callpath_cupti_fake_launch): the runtime launch's Python frames and the kernel joined by
    its correlation id, the driver call inside it not recorded, the clock readings and load
    map written; prof puts the kernel under <gpu kernel> under the calling line here."""


    meas = tmp_path / "m"
    md.write_header(meas, [], command=["pytest"], status="complete")
    raw = meas / "gpu-4242.raw"
    line = _launch_from_python(lib, raw)
    got = cv.read_raw(raw)
    assert [a[0] for a in got.apis] == [5]  # the runtime call only
    assert any(n.startswith("clock ") for n in got.notes) is False  # written at exit only
    assert got.maps
    (comp,) = cv.convert_all(meas, trace=True)
    g = mdg.read(comp)
    (ops,) = g.ops.values()
    assert ops["correlation"].tolist() == [5] and ops["grid"].tolist() == [8]
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    names = [(f, ln) for f, ln, _ in _kernel_path(db)]
    assert names[0][0] == "axpy(float*, float const*, float, int)"
    assert names[1][0] == "<gpu kernel>"
    # the statement that launched it, in its function, called from this test
    assert names[2:4] == [("", line), ("_launch_from_python", 0)]
    assert names[5][0] == "test_launch_to_database_without_a_gpu"


def _kernel_path(db: Path) -> list[tuple[str, int, str]]:
    """(function, line, module's file name) from the kernel's node up to the root."""
    exp = callpath.open(db)
    cct = exp.cct
    # the innermost node with GKER of its own (a kernel's procedure counts its lines' cost
    # as its own, as hpcviewer shows)
    held = np.flatnonzero(exp.exclusive(exp.metric("GKER (sec)")))
    (leaf,) = np.setdiff1d(held, cct.parent[held])
    out = []
    n = int(leaf)
    while n > 0:
        f = int(cct.function[n])
        fn = exp.functions[f] if f >= 0 else None
        mod = exp.modules[fn.module].path if fn is not None and fn.module >= 0 else ""
        out.append((fn.name if fn else "", int(cct.line[n]), Path(mod).name))
        n = int(cct.parent[n])
    return out


class Layer:
    def forward(self, lib: ctypes.CDLL, raw: Path) -> int:
        return _launch_from_python(lib, raw)


def test_native_launch_paths_merge_python_and_native(lib: ctypes.CDLL, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With --native (CALLPATH_GPU_NATIVE=1) a launch from Python records its native frames
    too, and the conversion merges them as run --native merges a sample: the Python frames
    in place of the evaluation loop's activations, the native code between (here ctypes and
    libffi, as PyTorch's dispatcher in a training loop) below the Python line that called
    it, and no interpreter frames at the root or between Python frames."""
    paths = {}
    for native in ("0", "1"):
        monkeypatch.setenv("CALLPATH_GPU_NATIVE", native)
        meas = tmp_path / f"m{native}"
        md.write_header(meas, [], command=["pytest"], status="complete")
        line = Layer().forward(lib, meas / "gpu-4242.raw")
        (pcs,) = [a[4] for a in cv.read_raw(meas / "gpu-4242.raw").apis]
        assert bool(pcs) == (native == "1")
        cv.convert_all(meas, trace=False)
        run_cli("prof", str(meas), "-o", str(tmp_path / f"db{native}"), check=True)
        paths[native] = _kernel_path(tmp_path / f"db{native}")
    python_only, merged = paths["0"], paths["1"]
    assert python_only[:2] == merged[:2] and merged[1][0] == "<gpu kernel>"
    assert python_only[2][1] == line  # the Python-only path: the launching line, then Python
    at = merged.index(python_only[2])
    # from the launching line to the root, the merged path is the Python one: no interpreter
    # frames between Python frames, none at the root (the interpreter's entry left out)
    assert merged[at:] == python_only[2:]
    # between <gpu kernel> and that line, the native code it called: ctypes, then libffi
    native = [(f, m) for f, _, m in merged[2:at] if f]
    assert native and all(m.startswith(("libffi", "_ctypes")) for _, m in native)
    assert native[0][1].startswith("libffi") and native[-1][1].startswith("_ctypes")
    assert "_ctypes_callproc" in [f for f, _ in native]


def _alloc_from_python(lib: ctypes.CDLL, raw: Path) -> int:
    line = sys._getframe().f_lineno + 1
    assert lib.callpath_cupti_fake_alloc(str(raw).encode()) == 0
    return line


def test_allocations_and_frees_give_gmem(lib: ctypes.CDLL, tmp_path: Path) -> None:
    """cudaMalloc and cudaFree (CUPTI's side made up: callpath_cupti_fake_alloc) become
    <gpu alloc> and <gpu delete> under the calling line, with HPCToolkit's GMEM metrics:
    the API call's time, a count, and the memory record's bytes by kind (device here); the
    driver calls inside them are not counted again, and they are not GPU stream work."""
    meas = tmp_path / "m"
    md.write_header(meas, [], command=["pytest"], status="complete")
    raw = meas / "gpu-4243.raw"
    line = _alloc_from_python(lib, raw)
    got = cv.read_raw(raw)
    assert [a[0] for a in got.apis] == [8, 9]
    assert [(c, w) for c, _, w in got.call_ends] == [(8, 2), (9, 3)]
    assert [m[0] for m in got.memory] == [8, 109]  # the free's names the driver's call
    assert got.driver_corr == {108: 8, 109: 9}
    (comp,) = cv.convert_all(meas, trace=True)
    (ops,) = mdg.read(comp).ops.values()
    assert ops["kind"].tolist() == [5, 6] and ops["bytes"].tolist() == [1 << 20] * 2
    assert ops["sub"].tolist() == [3, 3]  # CUPTI's device memory
    secs = (ops["end"].astype(np.int64) - ops["start"].astype(np.int64)) * 1e-9
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    cct = exp.cct
    for placeholder, sec in (("<gpu alloc>", secs[0]), ("<gpu delete>", secs[1])):
        (node,) = [n for n in range(len(cct.parent)) if cct.function[n] >= 0
                   and exp.functions[int(cct.function[n])].name == placeholder]
        parent = int(cct.parent[node])
        assert int(cct.line[parent]) == line  # the statement that allocated or freed
        for metric, want in (("GMEM:DEV (B)", 1 << 20), ("GMEM:COUNT", 1),
                             ("GMEM (sec)", sec), ("GPUOP (sec)", sec)):
            assert exp.inclusive(exp.metric(metric))[node] == pytest.approx(want, abs=1e-12)
        assert exp.inclusive(exp.metric("GKER (sec)"))[node] == 0
    # host-side calls: no GPU stream context (one per stream with kernels, copies, memsets)
    assert exp.contexts and not any(IdKind.GPUSTREAM in [i.kind for i in c.ids]
                                    for c in exp.contexts)


LOOPS = SHARED / "data" / "hpctoolkit" / "meas"
LOOPS_CUBIN = (LOOPS / "loops-cuda-nvidia-t.m" / "gpubins"
               / "1165a3eeddeea5ea3616d1cdbc6faa59.gpubin")


def _load_and_launch(lib: ctypes.CDLL, raw: Path, cubin: bytes) -> int:
    line, kernel = sys._getframe().f_lineno + 1, b"_Z8kernmainv"
    assert lib.callpath_cupti_fake_module(str(raw).encode(), cubin, len(cubin), kernel) == 0
    return line


def test_module_loads_save_gpu_binaries_and_name_their_kernels(
        lib: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a module load (CUPTI's side made up: callpath_cupti_fake_module, with the cubin
    hpcrun saved of HPCToolkit's loops.cu) the library saves the cubin in gpubins/, once per
    content however many processes load it; the kernel launched from it gets that binary as
    its load module, and prof names it from callpath's own structure of the binary, with its
    source line. run's closing lines count the operation and the library's own time."""
    if not LOOPS_CUBIN.exists():
        pytest.skip(f"{LOOPS_CUBIN} is not here (../shared/data)")
    cubin = LOOPS_CUBIN.read_bytes()
    meas = tmp_path / "m"
    md.write_header(meas, [], command=["pytest"], status="complete")
    monkeypatch.setenv("CALLPATH_GPU_DIR", str(meas))
    for pid in (4244, 4245):  # two processes load the same module
        line = _load_and_launch(lib, meas / f"gpu-{pid}.raw", cubin)
    (saved,) = (meas / "gpubins").iterdir()
    assert saved.read_bytes() == cubin and saved.suffix == ".gpubin"
    assert [c[1:] for c in cv.read_raw(meas / "gpu-4244.raw").cubins] == \
        [(int(saved.stem, 16), len(cubin))]
    said = gpu_session.finish(meas, trace=False)
    held = json.loads((meas / md.HEADER_FILE).read_text())["gpu"]["summary"]
    assert held["operations"] == {"kernels": {"count": 2, "seconds": 6e-06, "bytes": 0}}
    assert held["streams"] == 2 and held["processes"] == 2  # stream 7 of each process
    cost = held["cost"]
    # per process: the runtime launch's ENTER and EXIT and the driver call's inside it, one
    # launch recorded, one kernel record, one binary loaded; saved by the first process only
    assert {k: cost[k] for k in ("calls", "launches", "records", "bins", "bins_bytes",
                                 "bins_saved")} == {
        "calls": 8, "launches": 2, "records": 2, "bins": 2, "bins_bytes": 2 * len(cubin),
        "bins_saved": 1}
    assert cost["calls_ns"] > 0 and cost["bins_ns"] > 0
    assert said[0] == "GPU: 2 kernels 0.0000 s on 2 streams of 2 processes"
    assert said[1].startswith("GPU measurement's own time: 2 launching calls recorded, ")
    assert f"2 GPU binaries loaded ({2 * len(cubin) / 1024:.1f} KiB, 1 saved)" in said[1]
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    path = _kernel_path(db)
    # the kernel's procedure in the saved binary, the line of its first instruction below it
    assert [p[0] for p in path[:3]] == ["", "kernmain()", "<gpu kernel>"]
    assert path[1][2] == saved.name
    # hpcstruct's structure of the same binary: kernmain's first statement, at its entry
    hs = (LOOPS_CUBIN.parent.parent / "structs"
          / f"{LOOPS_CUBIN.name}-gpucfg-yes.hpcstruct").read_text()
    first = re.search(r'<P [^>]*ln="_Z8kernmainv"[^>]*>\s*<S [^>]*l="(\d+)"', hs)
    assert first is not None and path[0][1] == int(first.group(1))
    assert path[3][1] == line  # launched from that line of _load_and_launch


ENGINE = Path(__file__).parent / "gpu_programs" / "engine_thread.c"


def _engine(tmp_path: Path) -> ctypes.CDLL:
    """engine_thread.c, its frames kept with rbp as frame pointer (the walk's other rule)"""
    so = tmp_path / "libengine.so"
    subprocess.run(["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o",
                    str(so), str(ENGINE), "-lpthread"], check=True)
    return ctypes.CDLL(str(so))


def test_launches_from_a_thread_without_python_get_native_paths(lib: ctypes.CDLL,
                                                                  tmp_path: Path) -> None:
    """A thread that runs no Python (PyTorch's autograd engine launches the backward pass's
    kernels from one) records its native return addresses: the conversion gives that thread
    a tree of its own, and prof puts its kernels under the program's C functions that
    launched them, every level of them, the library's own frames cut (CUPTI's side made up:
    callpath_cupti_fake_launches, called from engine_thread.c's thread)."""
    engine = _engine(tmp_path)
    meas = tmp_path / "m"
    md.write_header(meas, [], command=["pytest"], status="complete")
    raw = meas / "gpu-4246.raw"
    assert engine.launch_from_engine_thread(lib.callpath_cupti_fake_launches,
                                            str(raw).encode(), 3, 6) == 0
    got = cv.read_raw(raw)
    assert len(got.apis) == 3 and len({a[1] for a in got.apis}) == 1
    assert all(a[4] and not a[5] for a in got.apis)  # native frames, no Python frames
    assert got.apis[0][1] != threading.get_native_id()
    gpu_session.finish(meas, trace=False)
    cost = json.loads((meas / md.HEADER_FILE).read_text())["gpu"]["summary"]["cost"]
    assert cost["launches"] == 3 and cost["unwind_fallbacks"] == 0  # the library's own walk
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    assert exp.inclusive(exp.metric("GKER:COUNT"))[0] == 3
    # _kernel_path takes the one innermost node with GKER: all three kernels sit there
    path = [f for f, _, _ in _kernel_path(db)]
    at = path.index("<gpu kernel>")
    callers = [f for f in path[at + 1:] if f]
    # the library's frames cut; then the engine's call into it, its seven levels and its
    # thread's start
    assert callers[:9] == ["launch"] + ["backward_op"] * 7 + ["engine_thread_main"]
    assert "callpath_cupti_fake_launches" not in callers


def _unwind_check(lib: ctypes.CDLL, found: list[tuple[str, int, int, bool]], tag: str,
                  engine: ctypes.CDLL | None = None) -> int:
    """callpath_cupti_unwind_check here (or, with ``engine``, from engine_thread.c's thread
    150 C frames deep): (tag, the walk's count, backtrace()'s, whether they agree from the
    caller on) into ``found``."""
    fast, slow = (ctypes.c_void_p * 512)(), (ctypes.c_void_p * 512)()
    counts = (ctypes.c_int * 3)()
    if engine is None:
        assert lib.callpath_cupti_unwind_check(fast, slow, 512, counts) == 1
    else:
        assert engine.check_from_engine_thread(lib.callpath_cupti_unwind_check, fast, slow, 512,
                                               counts, 150) == 1
    nf, ns = counts[0], counts[1]
    # the walk's own result (not backtrace()'s, which it hands over to where it cannot go on)
    found.append((tag, nf, ns, counts[2] == 0 and list(fast[1:nf]) == list(slow[1:ns])))
    return 0


def test_launch_unwind_gives_backtraces_return_addresses(lib: ctypes.CDLL, tmp_path: Path
                                                         ) -> None:
    """The library's own walk of a launch's native frames (launch_unwind.c: each return
    address's rule computed once from libgcc's FDE) gives exactly the return addresses of
    glibc's backtrace(), here and where C calls back into Python: sorted's key, map, a
    ctypes callback from libc's qsort, numpy's vectorize, a thread of its own, a deep C
    recursion (engine_thread.c), and the same again once the rules are cached."""
    import numpy as np_

    found: list[tuple[str, int, int, bool]] = []
    for _ in range(2):  # computed, then from the table
        _unwind_check(lib, found, "here")
        sorted([3, 1, 2], key=lambda v: _unwind_check(lib, found, "sorted key") or v)
        list(map(lambda v: _unwind_check(lib, found, "map"), [1]))
        cmp = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
            lambda a, b: _unwind_check(lib, found, "qsort callback"))
        arr = (ctypes.c_int * 3)(3, 1, 2)
        ctypes.CDLL(None).qsort(arr, 3, 4, cmp)
        np_.vectorize(lambda v: _unwind_check(lib, found, "numpy vectorize"))(np_.arange(2))
        t = threading.Thread(target=lambda: _unwind_check(lib, found, "thread"))
        t.start()
        t.join()
    _unwind_check(lib, found, "engine thread", _engine(tmp_path))
    assert {t for t, *_ in found} >= {"here", "sorted key", "map", "qsort callback",
                                      "numpy vectorize", "thread", "engine thread"}
    assert all(same and nf == ns for _, nf, ns, same in found), found
    assert next(nf for t, nf, *_ in found if t == "engine thread") > 150


def _expected_rule(fde: Any, link: int) -> int:
    """The library's encoding of the row that callpath's own CFI interpreter
    (measure/eh_frame.py) gives at ``link``, or the hand-over value where the row is not one
    the walk expresses."""
    from callpath.measure import eh_frame as ef

    if fde.signal:
        return 0xFFFFFFFF
    row = [r for r in fde.lines() if r.pc <= link][-1]
    ra = row.rules.get(16)
    if ra is not None and ra[0] == ef.UNDEFINED:
        return 0xFFFFFFFE
    if row.cfa_expr is not None or row.cfa_reg not in (6, 7) or row.cfa_off < 8 \
            or row.cfa_off % 8 or ra != (ef.OFFSET, -8):
        return 0xFFFFFFFF
    bp = row.rules.get(6)
    if bp is None or bp[0] in (ef.SAME_VALUE, ef.UNDEFINED):
        slot = 0
    elif bp[0] == ef.OFFSET and bp[1] < 0 and bp[1] % 8 == 0 and -bp[1] // 8 < 32:
        slot = -bp[1] // 8
    else:
        return 0xFFFFFFFF
    return (1 if row.cfa_reg == 6 else 0) | (row.cfa_off // 8) << 1 | slot << 22


def test_launch_unwind_rules_are_the_post_mortem_unwinders(lib: ctypes.CDLL) -> None:
    """The rule the library's walk computes for a return address (callpath_cupti_rule_of) is
    the row that callpath's post-mortem unwinder's CFI interpreter, one of its own, gives
    from the same FDE (measure/eh_frame.py): the CFA's register and offset, the return
    address at CFA-8, rbp kept or saved, or the outermost frame; where the row is one the
    walk does not express, it hands over. Checked at addresses spread over libc, libpython
    (where the interpreter has one), libstdc++, libffi and numpy's core."""
    import numpy as np_

    from callpath.measure.elfinfo import ElfInfo

    lib.callpath_cupti_rule_of.restype = ctypes.c_uint32
    lib.callpath_cupti_rule_of.argtypes = [ctypes.c_uint64]
    assert np_.__version__
    wanted = ("libc.so", "libpython3", "libstdc++", "libffi", "_multiarray_umath")
    checked: dict[str, int] = {}
    covered = handed = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5]
        name = Path(path).name
        if not name.startswith(wanted) or name in checked:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        info = ElfInfo.get(path)
        base = info.link_address(int(parts[2], 16), executable=True) if info.ok else None
        if base is None:
            continue
        n = 0
        for addr in range(start + 5, end, max(64, (end - start) // 1500) | 1):
            link = addr - start + base
            fde = info.fde_for(link)
            if fde is None:
                continue
            want = _expected_rule(fde, link)
            got = lib.callpath_cupti_rule_of(addr + 1)  # a return address: its pc - 1
            # the same rule, or a hand-over where the walk stops short of the interpreter
            assert got in (want, 0xFFFFFFFF), (path, hex(link), hex(got), hex(want))
            n += 1
            covered += got < 0xFFFFFFFE
            handed += got == 0xFFFFFFFF and want < 0xFFFFFFFE
        checked[name] = n
    total = sum(checked.values())
    assert len(checked) >= 3 and all(n > 50 for n in checked.values()), checked
    assert covered > 0.9 * total and handed < 0.03 * total, (covered, handed, total)


def _records(data: bytes) -> list[tuple[int, bytes]]:
    table, _end = cv._walk_records(data)
    return [(tag, data[at:at + n]) for tag, at, n in table.tolist()]


def _whole(records: list[tuple[int, bytes]], start: int) -> bytes:
    """The records, those from ``start`` on written as a library with a full table writes
    them: each launch with its frames (R_API), each kernel with its name (R_KERNEL)."""
    stacks: dict[int, bytes] = {}
    names: dict[int, bytes] = {}
    out = []
    for i, (tag, body) in enumerate(records):
        if tag == cv.R_STACK:
            stacks[int.from_bytes(body[:8], "little")] = body[8:]
        elif tag == cv.R_NAME:
            names[int.from_bytes(body[:8], "little")] = body[8:]
        if i >= start and tag == cv.R_LAUNCH:
            tag, body = cv.R_API, body[:24] + stacks[int.from_bytes(body[24:], "little")]
        elif i >= start and tag == cv.R_KERNEL_N:
            tag, body = cv.R_KERNEL, body[:80] + names[int.from_bytes(body[80:], "little")]
        out.append(cv._HEAD.pack(tag, len(body)) + body)
    return b"".join(out)


@pytest.mark.parametrize(("native", "native_depth", "in_thread"),
                         [("0", 0, 0), ("1", 40, 0), ("0", 40, 1)])
def test_each_context_and_kernel_name_is_written_once(lib: ctypes.CDLL, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      native: str, native_depth: int,
                                                      in_thread: int) -> None:
    """A launch from a context seen before is a 40-byte record naming it, a kernel record
    names its kernel by number (a training loop launches from the same few hundred places):
    500 launches from one place hold their frames and the kernel's name once. The file
    converts to the same companion, byte for byte, as the same launches written whole (each
    with its frames and its kernel's name, as a library with a full table writes them), and
    as a file written whole from half-way on."""
    monkeypatch.setenv("CALLPATH_GPU_NATIVE", native)
    raw = tmp_path / "gpu-4250.raw"
    assert lib.callpath_cupti_fake_launches(str(raw).encode(), 500, native_depth,
                                            in_thread) == 0
    records = _records(raw.read_bytes())
    tags = [t for t, _ in records]
    assert tags.count(cv.R_LAUNCH) == 500 and tags.count(cv.R_KERNEL_N) == 500
    assert tags.count(cv.R_STACK) == 1 and tags.count(cv.R_NAME) == 1
    assert cv.R_API not in tags and cv.R_KERNEL not in tags
    (stack,) = [b for t, b in records if t == cv.R_STACK]
    python_frames = 0 if in_thread else 10  # pytest's, at least
    native_frames = native_depth if native == "1" or in_thread else 0
    assert len(stack) >= 16 + 16 * python_frames + 8 * native_frames
    assert all(len(b) == 32 for t, b in records if t == cv.R_LAUNCH)
    companions = []
    for i, start in enumerate((len(records), 0, len(records) // 2)):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / raw.name).write_bytes(_whole(records, start))
        got = cv.read_raw(d / raw.name)
        assert len(got.api_corr) == 500 and len(got.stacks) == 1 and got.names == \
            ["_Z4axpyPfPKffi"]
        companions.append(cv.convert(d / raw.name, d, trace=True, generation=0))
    whole = companions[1].read_bytes()
    assert all(c.read_bytes() == whole for c in companions)
    assert raw.stat().st_size * 2 < (companions[1].parent / raw.name).stat().st_size
    ops = next(iter(mdg.read(companions[0]).ops.values()))
    assert ops["correlation"].tolist() == list(range(5, 1005, 2))


def test_records_are_found_in_c_as_in_python(lib: ctypes.CDLL, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The C scan of a raw file's records (``_callpath_records``) finds what the Python walk
    finds, whole files and files cut inside a record (a killed process), each cut ending
    before the cut record; the conversion reads a cut file as far as it goes."""
    pytest.importorskip("callpath.measure.gpu._callpath_records",
                        reason="the C extension is not built for this interpreter")
    from callpath.measure.gpu import _callpath_records

    monkeypatch.setenv("CALLPATH_GPU_NATIVE", "1")
    raw = tmp_path / "gpu-4251.raw"
    assert lib.callpath_cupti_fake_launches(str(raw).encode(), 50, 20, 0) == 0
    data = raw.read_bytes()
    whole, end = cv._walk_records(data)
    assert end == len(data) and len(whole) > 100
    for cut in (len(data), len(data) - 1, len(data) // 2, 5, 0):
        table, pos = _callpath_records.scan(data[:cut])
        got = np.frombuffer(table, dtype=np.int64).reshape(-1, 3)
        py, py_end = cv._walk_records(data[:cut])
        assert np.array_equal(got, py) and pos == py_end <= cut
        assert np.array_equal(got, whole[:len(got)])
        assert len(got) == len(whole) or pos + 8 + whole[len(got), 2] > cut
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / raw.name).write_bytes(data[:len(data) - 1])
    got_raw = cv.read_raw(tmp_path / "cut" / raw.name)
    assert got_raw.truncated and len(got_raw.api_corr) == 50
