"""Read the Python call stacks of another process from its memory (CPython 3.11-3.13).

Why from outside: a process that is already running has no sampler inside it. As py-spy does,
callpath reads the interpreter's structures with ``process_vm_readv`` (the ptrace access check,
no ptrace stop: the program never pauses): ``_PyRuntime`` (found through the ELF symbol of the
python binary or libpython) → interpreters → thread states → each thread's chain of
``_PyInterpreterFrame`` → code object (file, qualified name, first line, location table) and
the instruction pointer, from which the line comes.

The offsets are those of each version's structures on x86-64, printed by
``scripts/python_offsets.c`` compiled against that version's internal headers (3.11.7, 3.12.1,
3.13.0; the fields read did not move within these minor versions). Reading a running program
without stopping it can catch a stack mid-change: every read is checked (a frame's code must
be a code object, chains are bounded), and a stack that cannot be read is reported as such,
never invented.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
from dataclasses import dataclass

from callpath.errors import CallpathError

#: scripts/python_offsets.c, x86-64
OFFSETS: dict[tuple[int, int], dict[str, int]] = {
    (3, 11): {"runtime_interpreters_head": 40, "interp_next": 0, "interp_threads_head": 16,
              "tstate_next": 8, "tstate_thread_id": 152, "tstate_native_thread_id": 160,
              "tstate_cframe": 56, "cframe_current_frame": 8, "frame_code": 32,
              "frame_instr": 56, "frame_previous": 48, "frame_is_entry": 68, "frame_owner": 69,
              "code_filename": 112,
              "code_qualname": 128, "code_firstlineno": 72, "code_linetable": 136,
              "code_adaptive": 184, "unicode_length": 16, "unicode_state": 32,
              "unicode_ascii_size": 48, "unicode_compact_size": 72, "bytes_size": 16,
              "bytes_data": 32, "object_type": 8},
    (3, 12): {"runtime_interpreters_head": 40, "interp_next": 0, "interp_threads_head": 72,
              "tstate_next": 8, "tstate_thread_id": 136, "tstate_native_thread_id": 144,
              "tstate_cframe": 56, "cframe_current_frame": 0, "frame_code": 0,
              "frame_instr": 56, "frame_previous": 8, "frame_owner": 70, "code_filename": 112,
              "code_qualname": 128, "code_firstlineno": 68, "code_linetable": 136,
              "code_adaptive": 192, "unicode_length": 16, "unicode_state": 32,
              "unicode_ascii_size": 40, "unicode_compact_size": 56, "bytes_size": 16,
              "bytes_data": 32, "object_type": 8},
    (3, 13): {"runtime_interpreters_head": 632, "interp_next": 7264,
              "interp_threads_head": 7344, "tstate_next": 8, "tstate_thread_id": 152,
              "tstate_native_thread_id": 160, "tstate_current_frame": 72, "frame_code": 0,
              "frame_instr": 56, "frame_previous": 8, "frame_owner": 70, "code_filename": 112,
              "code_qualname": 128, "code_firstlineno": 68, "code_linetable": 136,
              "code_adaptive": 200, "unicode_length": 16, "unicode_state": 32,
              "unicode_ascii_size": 40, "unicode_compact_size": 56, "bytes_size": 16,
              "bytes_data": 32, "object_type": 8},
}
OWNED_BY_CSTACK = 3  # 3.12+: the shim frame an evaluation activation pushes
MAX_FRAMES = 1024
MAX_THREADS = 4096


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


class ReadError(Exception):
    """Memory of the process could not be read at an address (it moved, or exited)."""


@dataclass(frozen=True)
class Code:
    file: str
    name: str
    first_line: int
    linetable: bytes


@dataclass(frozen=True)
class Frame:
    code: Code
    line: int  # 0 where unknown
    #: the first frame of its evaluation activation (3.11: ``is_entry``; 3.12+: the frame
    #: just above a shim owned by the C stack): where ``--native`` cuts the Python frames
    #: into the groups that replace the native stack's ``_PyEval_EvalFrameDefault`` frames
    entry: bool = False
    #: the frame's instruction pointer (an address in its code object's bytecode): the
    #: evaluation loop keeps it in a register or on the C stack while it calls into C, so a
    #: native sample's stack that holds it was taken at this instruction (``remote_native``)
    instr: int = 0


@dataclass
class PyThread:
    native_id: int  # the kernel's tid
    thread_id: int  # threading.get_ident()
    frames: list[Frame]  # innermost first
    error: str = ""  # why the stack could not be read (frames then empty)


def line_at(table: bytes, first_line: int, unit: int) -> int:
    """The line of code unit ``unit`` from a 3.11+ location table (``co_linetable``, the format
    of CPython's Objects/locations.md); 0 where the instruction has no line."""
    if unit < 0:
        return first_line
    line, addr, i, n = first_line, 0, 0, len(table)

    def varint(i: int) -> tuple[int, int]:
        b = table[i]
        val, shift, i = b & 63, 6, i + 1
        while b & 64 and i < n:
            b = table[i]
            val |= (b & 63) << shift
            shift, i = shift + 6, i + 1
        return val, i

    while i < n:
        b = table[i]
        i += 1
        code, length = (b >> 3) & 15, (b & 7) + 1
        delta: int | None
        if code == 15:
            delta = None
        elif code in (13, 14):
            u, i = varint(i)
            delta = -(u >> 1) if u & 1 else u >> 1
            if code == 14:
                for _ in range(3):
                    _, i = varint(i)
        elif code >= 10:
            delta, i = code - 10, i + 2
        else:
            delta, i = 0, i + 1
        if delta is not None:
            line += delta
        if addr <= unit < addr + length:
            return line if delta is not None else 0
        addr += length
    return 0


_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym


def _symbols(path: str, names: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """Link-time addresses of ``names`` (dynamic, then static symbol table), and the first
    loadable segment's page-aligned address.

    Read with ``struct`` from a memory map of the file, looking up only the names wanted
    (their offsets in the string table, then the symbols that point there): pyelftools took
    a tenth of a second of start-up, to import and to index libpython's ten thousand
    symbols, at every ``run --pid`` and ``dump``."""
    import mmap

    found: dict[str, int] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        phoff, shoff = struct.unpack_from("<QQ", m, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", m, 0x36)
        loads = [struct.unpack_from("<Q", m, phoff + i * phentsize + 16)[0]
                 for i in range(phnum)
                 if struct.unpack_from("<I", m, phoff + i * phentsize)[0] == 1]  # PT_LOAD
        first = min(loads) & ~0xFFF if loads else 0
        sections = [struct.unpack_from("<IIQQQQII", m, shoff + i * shentsize)
                    for i in range(shnum)]
        for want_type in (11, 2):  # SHT_DYNSYM, SHT_SYMTAB
            for _n, typ, _fl, _addr, off, size, link, _info in sections:
                if typ != want_type or link >= len(sections):
                    continue
                str_off, str_size = sections[link][4], sections[link][5]
                table = m[str_off:str_off + str_size]
                wanted: dict[int, str] = {}
                for name in names:
                    if name in found:
                        continue
                    key = name.encode() + b"\0"
                    i = table.find(key)
                    while i >= 0:
                        wanted[i] = name  # a string ending with the name (tails are shared)
                        i = table.find(key, i + 1)
                if not wanted:
                    continue
                for j in range(size // _SYM.size):
                    name_off, _i, _o, _shndx, value, _size = _SYM.unpack_from(
                        m, off + j * _SYM.size)
                    hit = wanted.get(name_off)
                    if hit is not None and value and hit not in found:
                        found[hit] = value
    return found, first


class RemotePython:
    """The CPython interpreter of process ``pid``; raises CallpathError when there is none
    (or not a version whose layout is known)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._buf = ctypes.create_string_buffer(4096)
        self._local = _IoVec(ctypes.cast(self._buf, ctypes.c_void_p), 0)
        self._remote = _IoVec(None, 0)
        self._local_p = ctypes.pointer(self._local)
        self._remote_p = ctypes.pointer(self._remote)
        candidates: dict[str, int] = {}  # file -> start of its mapping at file offset 0
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 6:
                        continue
                    path = parts[5].strip()
                    base = os.path.basename(path)
                    if (base.startswith("libpython3") or base.startswith("python3")
                            or path == os.readlink(f"/proc/{pid}/exe")) \
                            and int(parts[2], 16) == 0 and path not in candidates:
                        candidates[path] = int(parts[0].split("-")[0], 16)
        except OSError as e:
            raise CallpathError(f"--pid {pid}: cannot read its memory map "
                                f"({e.strerror})") from None
        want = ("_PyRuntime", "PyCode_Type", "Py_Version")
        for path, start in sorted(candidates.items(), key=lambda kv: "libpython" not in kv[0]):
            try:
                syms, first = _symbols(path, want)
            except (OSError, ValueError, struct.error):
                continue
            if "_PyRuntime" in syms and "PyCode_Type" in syms:
                bias = start - first
                self.runtime = bias + syms["_PyRuntime"]
                self.code_type = bias + syms["PyCode_Type"]
                if "Py_Version" in syms:
                    hexv = self._u64(bias + syms["Py_Version"]) & 0xFFFFFFFF
                    self.version = (hexv >> 24, (hexv >> 16) & 0xFF)
                else:
                    self.version = (3, 10)
                    for part in os.path.basename(path).replace("libpython", "python").split("."):
                        if part.isdigit() and self.version[0] == 3:
                            self.version = (3, int(part))
                            break
                self.binary = path
                break
        else:
            raise CallpathError(f"--pid {pid}: not a CPython process (no _PyRuntime symbol in "
                                "its python binary or libpython)")
        if self.version not in OFFSETS:
            raise CallpathError(f"--pid {pid}: Python {self.version[0]}.{self.version[1]}; "
                                "expected CPython 3.11, 3.12 or 3.13 to read its frames")
        self.o = OFFSETS[self.version]
        self._codes: dict[int, Code] = {}
        self._strings: dict[int, str] = {}
        self._lines: dict[tuple[int, int], int] = {}
        self._ts_size = max(v for k, v in self.o.items() if k.startswith("tstate_")) + 8

    # ---- memory
    def read(self, addr: int, size: int) -> bytes:
        if size > len(self._buf):
            self._buf = ctypes.create_string_buffer(max(size, 2 * len(self._buf)))
            self._local.iov_base = ctypes.cast(self._buf, ctypes.c_void_p)
        self._local.iov_len = size
        self._remote.iov_base = addr
        self._remote.iov_len = size
        n = _libc.process_vm_readv(self.pid, self._local_p, 1, self._remote_p, 1, 0)
        if n != size:
            err = ctypes.get_errno()
            if n < 0 and err in (1, 13):  # EPERM, EACCES
                raise PermissionError(err, os.strerror(err))
            if n < 0 and err == 3:  # ESRCH
                raise ProcessLookupError(err, os.strerror(err))
            raise ReadError(f"cannot read {size} bytes at {addr:#x}")
        return self._buf.raw[:size]

    def _u64(self, addr: int) -> int:
        return int(struct.unpack("<Q", self.read(addr, 8))[0])

    def _string(self, addr: int) -> str:
        s = self._strings.get(addr)
        if s is not None:
            return s
        o = self.o
        head = self.read(addr, o["unicode_compact_size"])
        length = struct.unpack_from("<q", head, o["unicode_length"])[0]
        state = struct.unpack_from("<I", head, o["unicode_state"])[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length < 1 << 16:
            raise ReadError(f"not a compact str at {addr:#x}")
        data = addr + (o["unicode_ascii_size"] if ascii_ else o["unicode_compact_size"])
        raw = self.read(data, length * kind) if length else b""
        s = raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")
        self._strings[addr] = s
        return s

    def _code(self, addr: int) -> Code | None:
        c = self._codes.get(addr)
        if c is not None:
            return c
        o = self.o
        head = self.read(addr, o["code_adaptive"])
        if struct.unpack_from("<Q", head, o["object_type"])[0] != self.code_type:
            return None  # not a code object (3.13's None of a shim, a torn read)
        file_p, name_p, table_p = (struct.unpack_from("<Q", head, o[k])[0] for k in
                                   ("code_filename", "code_qualname", "code_linetable"))
        first = struct.unpack_from("<i", head, o["code_firstlineno"])[0]
        tsize = self._u64(table_p + o["bytes_size"])
        if not 0 <= tsize < 1 << 20:
            raise ReadError(f"bad location table at {table_p:#x}")
        table = self.read(table_p + o["bytes_data"], tsize) if tsize else b""
        c = Code(self._string(file_p), self._string(name_p), first, table)
        self._codes[addr] = c
        return c

    # ---- walking
    def thread_states(self) -> list[int]:
        o = self.o
        out: list[int] = []
        interp = self._u64(self.runtime + o["runtime_interpreters_head"])
        seen: set[int] = set()
        while interp and interp not in seen and len(out) < MAX_THREADS:
            seen.add(interp)
            ts = self._u64(interp + o["interp_threads_head"])
            while ts and ts not in seen and len(out) < MAX_THREADS:
                seen.add(ts)
                out.append(ts)
                ts = self._u64(ts + o["tstate_next"])
            interp = self._u64(interp + o["interp_next"])
        return out

    def stack(self, ts: int) -> PyThread:
        o = self.o
        head = self.read(ts, self._ts_size)  # the fields read, in one system call
        tid = struct.unpack_from("<Q", head, o["tstate_native_thread_id"])[0]
        ident = struct.unpack_from("<Q", head, o["tstate_thread_id"])[0]
        frames: list[Frame] = []
        try:
            if "tstate_current_frame" in o:
                f = struct.unpack_from("<Q", head, o["tstate_current_frame"])[0]
            else:
                cf = struct.unpack_from("<Q", head, o["tstate_cframe"])[0]
                f = self._u64(cf + o["cframe_current_frame"]) if cf else 0
            seen: set[int] = set()
            size = o["frame_owner"] + 1
            while f and len(seen) < MAX_FRAMES:
                if f in seen:
                    raise ReadError("a cycle in the frame chain (read while it changed)")
                seen.add(f)
                raw = self.read(f, size)
                prev = struct.unpack_from("<Q", raw, o["frame_previous"])[0]
                owner = raw[o["frame_owner"]]
                if self.version >= (3, 12) and owner == OWNED_BY_CSTACK:
                    if frames and not frames[-1].entry:
                        frames[-1] = dataclasses.replace(frames[-1], entry=True)
                    f = prev
                    continue
                code_p = struct.unpack_from("<Q", raw, o["frame_code"])[0]
                code = self._code(code_p) if code_p else None
                if code is not None:
                    instr = struct.unpack_from("<Q", raw, o["frame_instr"])[0]
                    unit = (instr - (code_p + o["code_adaptive"])) // 2
                    line = self._lines.get((code_p, unit))
                    if line is None:
                        line = line_at(code.linetable, code.first_line, unit)
                        self._lines[(code_p, unit)] = line
                    entry = "frame_is_entry" in o and raw[o["frame_is_entry"]] != 0
                    frames.append(Frame(code, line, entry, instr))
                f = prev
        except ReadError as e:
            return PyThread(tid, ident, [], str(e))
        return PyThread(tid, ident, frames)

    def threads(self) -> list[PyThread]:
        """Every Python thread's stack, innermost frame first (a running program: each
        stack is read as it is at that moment)."""
        return [self.stack(ts) for ts in self.thread_states()]
