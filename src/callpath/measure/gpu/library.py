"""Finding CUPTI and building callpath's CUPTI library (``cupti_inject.c``) for this machine.

The library is compiled on first use, against the CUPTI headers that ship with the libcupti
it will load (NVIDIA's ``nvidia-cuda-cupti`` package, which PyTorch installs, or a CUDA
toolkit's ``extras/CUPTI``), and cached by the hash of its source and the headers' path: the
activity record layouts change between CUPTI versions, so building against the headers of
the library actually loaded is what keeps the records readable. Compiling needs gcc, which
callpath's own C extensions need anyway.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from callpath.errors import CallpathError

SOURCE = Path(__file__).with_name("cupti_inject.c")


@dataclass(frozen=True)
class Cupti:
    """Where CUPTI is: the directory of ``cupti.h``, the one of ``cuda.h`` and the directory
    of ``libcupti.so*``."""

    include: Path
    cuda_include: Path
    lib: Path


def _candidates() -> list[Path]:
    """Roots that may hold ``include/cupti.h`` and ``lib/libcupti.so*``, best first."""
    roots: list[Path] = []
    env = os.environ.get("CALLPATH_CUPTI_HOME")
    if env:
        roots.append(Path(env))
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cuda_cupti", "cu12"):
            roots.append(Path(loc) / sub)
    for cuda in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cuda:
            roots += [Path(cuda) / "extras" / "CUPTI", Path(cuda)]
    return roots


def find_cupti() -> Cupti | None:
    """CUPTI's headers and library, or None when this machine has none."""
    roots = _candidates()
    # cuda.h needs its companions (crt/host_defines.h): the runtime wheel's include folder
    # has cuda.h without them, a toolkit's has all
    cuda_h = [d for d in [*(r / "include" for r in roots), Path("/usr/local/cuda/include")]
              if (d / "cuda.h").is_file() and (d / "crt" / "host_defines.h").is_file()]
    for r in roots:
        inc = r / "include"
        if not (inc / "cupti.h").is_file():
            continue
        for libdir in (r / "lib", r / "lib64"):
            if any(libdir.glob("libcupti.so*")) and cuda_h:
                return Cupti(inc, cuda_h[0], libdir)
    return None


def driver_problem() -> str | None:
    """Why no NVIDIA driver can be used here (None if ``libcuda.so.1`` loads)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    return None


def unavailable() -> str | None:
    """Why ``-e gpu=nvidia`` cannot measure on this machine, in one phrase; None if it can."""
    problem = driver_problem()
    if problem:
        return problem
    if find_cupti() is None:
        roots = _candidates()
        if any((r / "include" / "cupti.h").is_file() for r in roots):
            return ("no complete cuda.h for CUPTI's headers (install a CUDA toolkit, or "
                    "pip install 'callpath[gpu]')")
        return ("no CUPTI (install NVIDIA's nvidia-cuda-cupti package, e.g. "
                "pip install 'callpath[gpu]', or set CALLPATH_CUPTI_HOME)")
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        return "no C compiler (gcc) to build callpath's CUPTI library"
    return None


def _latest(header: Path, struct: str, default: str) -> str:
    """The newest version of a CUPTI activity record type declared in ``header``'s folder
    (``CUpti_ActivityKernel13``): the layout this CUPTI fills in."""
    best, name = -1, default
    for h in ("cupti_activity.h", "cupti_activity_deprecated.h"):
        try:
            text = (header / h).read_text(errors="replace")
        except OSError:
            continue
        for m in re.finditer(rf"\}}\s*{struct}(\d*)\s*;", text):
            v = int(m.group(1) or 1)
            if v > best:
                best, name = v, f"{struct}{m.group(1)}"
    return name


def build(cupti: Cupti, cache: Path | None = None) -> Path:
    """The compiled library for ``cupti`` (built once, then cached)."""
    src = SOURCE.read_bytes() + (SOURCE.parent / "launch_unwind.c").read_bytes()
    defs = {"CP_KERNEL_T": _latest(cupti.include, "CUpti_ActivityKernel", "CUpti_ActivityKernel9"),
            "CP_MEMCPY_T": _latest(cupti.include, "CUpti_ActivityMemcpy", "CUpti_ActivityMemcpy5"),
            "CP_MEMSET_T": _latest(cupti.include, "CUpti_ActivityMemset", "CUpti_ActivityMemset4"),
            "CP_SYNC_T": _latest(cupti.include, "CUpti_ActivitySynchronization",
                                 "CUpti_ActivitySynchronization"),
            "CP_MEMORY_T": _latest(cupti.include, "CUpti_ActivityMemory", "CUpti_ActivityMemory4")}
    pyinc = python_include()
    key = hashlib.sha256(src + repr((cupti, sorted(defs.items()), pyinc)).encode()
                         ).hexdigest()[:16]
    base = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "callpath"
    out = base / f"libcallpath_cupti-{key}.so"
    if out.is_file():
        return out
    base.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    # CUPTI's own headers only, from the CUPTI that will be loaded: a toolkit's include
    # folder (searched after it, for cuda.h) holds other CUPTI headers of its own version,
    # and the runtime wheel's folder (often CUPTI's too) holds an incomplete cuda.h
    only = base / f"cupti-include-{key}"
    only.mkdir(exist_ok=True)
    for h in cupti.include.iterdir():
        if h.name.startswith(("cupti", "generated_", "nvperf", "cuda_stdint", "Open")) \
                and not (only / h.name).exists():
            (only / h.name).symlink_to(h)
    cmd = [os.environ.get("CC", "gcc"), "-O2", "-fno-omit-frame-pointer", "-shared", "-fPIC",
           "-Wall", "-o", str(tmp),
           str(SOURCE), f"-I{only}", f"-I{cupti.cuda_include}",
           *[f"-D{k}={v}" for k, v in defs.items()],
           *(["-DCP_PYTHON", f"-I{pyinc}"] if pyinc else []),
           f"-L{cupti.lib}", f"-Wl,-rpath,{cupti.lib}", "-l:" + _libname(cupti.lib),
           "-ldl", "-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = res.stderr.strip().splitlines() or ["(no message)"]
        first = next((x for x in lines if "error" in x), lines[0])
        raise CallpathError(f"cannot build callpath's CUPTI library with {cmd[0]}: {first}")
    os.replace(tmp, out)
    return out


def python_include() -> str | None:
    """The headers of this interpreter when the library can read its frame records (CPython
    3.11 to 3.13 with internal headers, not free-threaded: the --native sampler's layouts);
    None otherwise, and launches from Python then get native paths only."""
    import sys
    import sysconfig

    if not (3, 11) <= sys.version_info[:2] <= (3, 13) or sysconfig.get_config_var(
            "Py_GIL_DISABLED"):
        return None
    inc = sysconfig.get_paths().get("include")
    if inc and (Path(inc) / "internal" / "pycore_frame.h").is_file():
        return inc
    return None


def _libname(libdir: Path) -> str:
    names = sorted(p.name for p in libdir.glob("libcupti.so*"))
    return "libcupti.so" if "libcupti.so" in names else names[0]
