"""In-process half of ``callpath run --native``: start the signal-time capture, note what the
post-mortem merge needs to read it.

Runs inside the measured program, loaded by path by ``sampler.py`` (standard library only, no
import of the ``callpath`` package), like the sampler itself. The capture is the C extension
``_callpath_native`` (see its header): a real SIGPROF handler that records, for every sample of
every thread, the registers, a slice of the native stack and the Python frame records of that
instant, and a writer thread that appends them to ``native-PID-GEN.samples``. The Python
sampler keeps running as without ``--native``: it interns every code object it walks (keeping
it alive, so its address stays unique), which is what lets the merge name the code objects
that the C handler saw only by address. This module adds to ``native-PID-GEN.json`` (one JSON
object a line) what the samples refer to and cannot carry: the code objects' addresses and line
tables (``codes``), the executable mappings of the address space as they change (``maps``), and
the capture's own facts (``start``, ``end``).
"""

from __future__ import annotations

import contextlib
import json
import opcode
import os
import sys
import time
from typing import Any

ENV_NATIVE = "CALLPATH_PY_NATIVE"  # bytes of native stack copied per sample (e.g. 60000)
# at most this much is copied, and only as much as the stack holds from sp to the outermost
# evaluation frame: a deeper copy costs only the samples that need it (import torch's nested
# imports: 6.3% of the paths partial with 32 KiB, 0.0% with 60000 bytes)
DEFAULT_STACK = 60000
SLOTS = 256  # ring slots of ~60 KiB (15 MiB): the writer drains at 64 (or every 20 ms)


def _load_extension() -> tuple[Any, str | None]:
    """The C extension built beside this file, or None and why not."""
    try:
        import importlib.machinery
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(here, "_callpath_native" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location("_callpath_native", path)
                if spec is None or spec.loader is None:
                    break
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                reason = mod.supported()
                return (None, str(reason)) if reason is not None else (mod, None)
    except (ImportError, OSError, AttributeError) as e:
        return None, f"the native capture extension does not load ({e})"
    return None, (f"no native capture extension built for this interpreter "
                  f"({sys.implementation.name} {sys.version.split()[0]})")


def _exec_maps() -> list[list[Any]]:
    """Executable file mappings and the vdso: [start, end, file offset, path]."""
    out: list[list[Any]] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or "x" not in parts[1]:
                    continue
                path = parts[5].strip()
                if not (path.startswith("/") or path == "[vdso]"):
                    continue
                lo, hi = parts[0].split("-")
                out.append([int(lo, 16), int(hi, 16), int(parts[2], 16), path])
    except OSError:
        pass
    return out


class NativeCapture:
    """One per process image: files named like the sampler's process file."""

    def __init__(self, sampler: Any, stack_bytes: int) -> None:
        self.sampler = sampler
        self.stack_bytes = stack_bytes
        self.ext, self.reason = _load_extension()
        self.fd = self.jfd = -1
        self.codes_noted = 0
        self.last_maps: list[list[Any]] = []
        self.comms: dict[int, str] = {}
        self.active = False

    def start(self) -> str:
        """Open the files and install the handler (after the sampler's signal.signal and its
        process file); returns what the process metadata should say."""
        if self.ext is None:
            return f"python only: {self.reason}"
        s = self.sampler
        base = os.path.splitext(s.path)[0].replace("process-", "native-", 1)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(base + ".samples", flags, 0o644)
            self.jfd = os.open(base + ".json", flags, 0o644)
        except OSError as e:
            return f"python only: cannot create the native sample file ({e.strerror})"
        head, frame, max_py, code_off = self.ext.layout()
        self._note({"start": {"pid": os.getpid(), "period_ns": s.period_ns,
                              "stack_bytes": self.stack_bytes, "head": head, "frame": frame,
                              "max_py": max_py, "code_offset": code_off,
                              "python": sys.version.split()[0],
                              "main_tid": _native_tid()}})
        self._save_vdso()
        self.ext.install(self.fd, s.period_ns, self.stack_bytes, SLOTS)
        self.active = True
        self.flush()
        return "merged (CPython frame records + CFI unwinding)"

    def _note(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        while data:
            n = os.write(self.jfd, data)
            data = data[n:]

    def _save_vdso(self) -> None:
        """The kernel's vdso has no file: save its image once per directory for unwinding."""
        path = os.path.join(self.sampler.out_dir, "vdso.so")
        if os.path.exists(path):
            return
        for lo, hi, _off, name in _exec_maps():
            if name == "[vdso]":
                try:
                    import ctypes
                    data = ctypes.string_at(lo, hi - lo)
                    tmp = f"{path}.{os.getpid()}"
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, path)
                except (OSError, ValueError, ImportError):
                    pass
                return

    def flush(self) -> None:
        """Called from the sampler's flush (with the GIL, outside the handler): note the code
        objects interned since the last call and the mappings if they changed."""
        if not self.active:
            return
        s = self.sampler
        codes = s.codes
        if self.codes_noted < len(codes):
            rows = []
            for ci in range(self.codes_noted, len(codes)):
                starts, lines = s.line_table_of(ci)
                rows.append([ci, id(codes[ci]), starts, lines, first_resume(codes[ci])])
            self.codes_noted = len(codes)
            self._note({"codes": rows, "t": time.monotonic_ns()})
        maps = _exec_maps()
        if maps != self.last_maps:
            self.last_maps = maps
            self._note({"maps": maps})
        comms = _thread_names()
        new = {t: n for t, n in comms.items() if self.comms.get(t) != n}
        if new:  # threads that native libraries start have no Python name: the kernel's
            self.comms.update(new)
            self._note({"comm": {str(t): n for t, n in new.items()}})

    def stop(self) -> None:
        """Timers off, last records written, files closed (the sampler flushes after this)."""
        if not self.active:
            return
        records, lost, nbytes, handler_ns, handled, writer_ns = self.ext.stop()
        self.flush()
        self.active = False
        self._note({"end": {"records": records, "lost": lost, "bytes": nbytes,
                            "handler_ns": handler_ns, "handled": handled,
                            "writer_ns": writer_ns}})
        self._close()

    def _close(self) -> None:
        for fd in (self.fd, self.jfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.jfd = -1

    def after_fork(self) -> str:
        """In a forked child: the parent's writer thread and timers are gone; start anew
        with this process's files (the sampler has already opened its own)."""
        if self.ext is None:
            return f"python only: {self.reason}"
        self.ext.forget()
        self._close()
        self.codes_noted = 0
        self.last_maps = []
        self.comms = {}
        self.active = False
        return self.start()


def first_resume(code: Any) -> int:
    """Byte offset of the code object's first ``RESUME`` instruction (what CPython keeps as
    ``_co_firsttraceable``, in code units): a frame of its own (not a generator's) whose offset
    is before it has not started yet, and the merge leaves it out as the interpreter's
    ``_PyFrame_IsIncomplete`` would. Computed here, outside the signal handler, because the
    handler must not read code objects (a stale frame's may be freed memory)."""
    raw = getattr(code, "co_code", b"")
    for i in range(0, len(raw) - 1, 2):
        if raw[i] == _RESUME:
            return i
    return 0


_RESUME = opcode.opmap.get("RESUME", -1)


def _thread_names() -> dict[int, str]:
    """Each thread's kernel name (``comm``: what pthread_setname_np set, else inherited from
    its creator), by thread id; a thread that ends while it is read is left out."""
    out: dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out[int(t)] = f.read().rstrip("\n")
        except (OSError, ValueError):
            continue
    return out


def _native_tid() -> int:
    import _thread
    return int(_thread.get_native_id())


def from_environment(sampler: Any) -> NativeCapture | None:
    """A capture when the launcher asked for ``--native`` (``CALLPATH_PY_NATIVE``)."""
    value = os.environ.get(ENV_NATIVE, "")
    if not value:
        return None
    try:
        stack = int(value)
    except ValueError:
        stack = DEFAULT_STACK
    if not 0 <= stack <= 61440:
        stack = DEFAULT_STACK
    return NativeCapture(sampler, stack)
