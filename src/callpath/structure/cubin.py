"""Structure of NVIDIA GPU binaries: cubins (ELF files for ``EM_CUDA``) and fatbins.

What a cubin gives without any NVIDIA tool: its functions (the ELF symbol table; kernels and
the device functions the compiler kept) and, where it was built with ``-lineinfo`` or ``-G``,
its source lines (a DWARF 2 ``.debug_line`` whose ``DW_LNE_set_address`` operands are
relocations against each function's symbol) with the code inlined into each function
(NVIDIA's extended opcode ``DW_LNE_NVIDIA_inlined_call``: from a row on, code inlined at the
call site that an earlier row describes, in a function named in ``.debug_str``). Loops need the
control flow of the machine code, which only NVIDIA's disassembler decodes: with ``nvdisasm``
installed (a CUDA toolkit, or PyPI's ``nvidia-cuda-nvdisasm``) each function's branches give
its control-flow graph and Havlak's analysis its loops; without it there are no loops, and
:func:`analyze_gpu_binary` says so in its notes.

Addresses are those hpcrun and hpcstruct give a cubin (``gpubins/*.gpubin``): a cubin's
sections all sit at address 0, so each instruction is named by its *file offset* (section
offset + offset in the section), which keeps the functions of one cubin apart. A fatbin (or a
host object's ``.nv_fatbin``) holds several cubins: each instruction is named by its offset in
the whole file, so the cubins of every architecture share one structure without overlapping.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import subprocess
import tempfile
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from callpath.errors import CallpathError, FormatError
from callpath.structure.demangle import demangle
from callpath.structure.dwarf_lines import _decode_one
from callpath.structure.havlak import find_loops
from callpath.structure.model import Kind, Structure, StructureBuilder

EM_CUDA = 190
FATBIN_MAGIC = 0xBA55ED50
_FATBIN_ELF = 2  # fatbin entry kind: 1 PTX, 2 ELF (cubin)
_FATBIN_COMPRESSED = 0x2000  # entry flag: payload compressed (LZ4 or zstd)
_R_CUDA_64 = 2  # the 64-bit absolute relocation of cubin debug sections


@dataclass
class Cubin:
    """One cubin of a GPU binary: its bytes and where they start in the file."""

    offset: int
    data: bytes
    arch: int  # SM version (90 for sm_90), 0 unknown


@dataclass
class GpuFunction:
    name: str  # link (mangled) name
    address: int  # file offset of its first instruction
    size: int
    section: str


@dataclass
class _Rows:
    """A cubin's line rows in program order (before sorting), with NVIDIA's inline records."""

    address: list[int] = field(default_factory=list)
    file: list[int] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    inline: list[tuple[int, int, int]] = field(default_factory=list)
    strings: bytes = b""
    #: derived by :meth:`index`: the addresses that start a row, sorted, and the row that
    #: describes each (the last of several rows at one address); each row's inline state
    starts: list[int] = field(default_factory=list)
    row_at: list[int] = field(default_factory=list)
    ctx: list[tuple[int, int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # sorted addresses of sequence ends

    def index(self) -> None:
        last: dict[int, int] = {}
        ends = set()
        for r, a in enumerate(self.address):
            if self.line[r] > 0:
                last[a] = r
            else:  # an end of sequence: no row of its own
                last.pop(a, None)
                ends.add(a)
        self.starts = sorted(last)
        self.row_at = [last[a] for a in self.starts]
        self.ends = sorted(ends)
        n = len(self.address)
        self.ctx = [(-1, 0)] * n
        ch = sorted(self.inline)
        for k, (start, c, name) in enumerate(ch):
            end = ch[k + 1][0] if k + 1 < len(ch) else n
            for r in range(start, min(end, n)):
                self.ctx[r] = (c if 0 <= c < r else -1, name)

    def outermost(self, r: int) -> int:
        """The row of the outermost call site of row r's inlined code (r if not inlined)."""
        while self.ctx[r][0] >= 0:
            r = self.ctx[r][0]
        return r

    def function_rows(self, lo: int, hi: int) -> dict[int, int]:
        """Row start address -> row, for the rows inside ``[lo, hi)``; a row that starts
        before ``lo`` and whose sequence goes on past it covers ``lo`` too (as in hpcstruct:
        a function the line program gives no row of its own, a math library routine the
        compiler appended, takes the line before it)."""
        i, j = bisect_left(self.starts, lo), bisect_left(self.starts, hi)
        out = dict(zip(self.starts[i:j], self.row_at[i:j], strict=True))
        if lo not in out and i > 0:
            prev = self.starts[i - 1]
            k = bisect_right(self.ends, prev)
            if k >= len(self.ends) or self.ends[k] > lo:
                out[lo] = self.row_at[i - 1]
        return out


def gpu_binary_kind(path: str | os.PathLike[str]) -> str | None:
    """``"cubin"``, ``"fatbin"`` or None (not a GPU binary), from the first bytes only."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if len(head) >= 20 and head[:4] == b"\x7fELF" and \
            struct.unpack_from("<H", head, 18)[0] == EM_CUDA:
        return "cubin"
    if len(head) >= 16 and struct.unpack_from("<I", head, 0)[0] == FATBIN_MAGIC:
        return "fatbin"
    return None


def cubins_of(data: bytes, *, path: str = "") -> tuple[list[Cubin], list[str]]:
    """The cubins of a GPU binary's bytes (a cubin, or fatbins one after the other) and one
    note per entry that could not be read (compressed)."""
    if data[:4] == b"\x7fELF":
        if len(data) < 52 or struct.unpack_from("<H", data, 18)[0] != EM_CUDA:
            raise FormatError(path, "an ELF file for another machine than NVIDIA CUDA")
        return [Cubin(0, data, _elf_arch(data))], []
    out: list[Cubin] = []
    notes: list[str] = []
    pos = 0
    while pos + 16 <= len(data):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            if not out and not notes:
                raise FormatError(path, "not a cubin or fatbin (expected the ELF magic or "
                                  f"the fatbin magic {FATBIN_MAGIC:#x})")
            break
        p, end = pos + hsize, min(pos + hsize + fsize, len(data))
        while p + 16 <= end:
            kind, _v, ehs, padded = struct.unpack_from("<HHII", data, p)
            if ehs < 16 or p + ehs > end:
                break
            arch = struct.unpack_from("<I", data, p + 28)[0] if ehs >= 32 else 0
            flags = struct.unpack_from("<Q", data, p + 40)[0] if ehs >= 48 else 0
            body = p + ehs
            if kind == _FATBIN_ELF:
                if flags & _FATBIN_COMPRESSED:
                    notes.append(f"sm_{arch} cubin at offset {body:#x} is compressed: skipped "
                                 "(the CUDA driver hands measurements the decompressed one)")
                elif data[body:body + 4] == b"\x7fELF":
                    out.append(Cubin(body, data[body:body + padded], arch))
            p = body + padded
        pos = (end + 7) & ~7
    return out, notes


def _elf_arch(data: bytes) -> int:
    """The SM version in a cubin's ``e_flags`` (its low bits in the pre-CUDA-12.8 layout,
    bits 8-15 in the newer one), 0 when it cannot be told."""
    flags = int(struct.unpack_from("<I", data, 48)[0])
    for v in ((flags >> 8) & 0xFF, flags & 0xFF):
        if 20 <= v <= 200:
            return v
    return 0


_SYM64 = [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
          ("value", "<u8"), ("size", "<u8")]
_SHT_SYMTAB = 2
_STT_FUNC = 2
_SHN_LORESERVE = 0xFF00


def functions_of(cubin: Cubin, path: str = "cubin") -> list[GpuFunction]:
    """The function symbols of a cubin at their file offsets (hpcrun's relocation).

    A 64-bit little-endian cubin (every cubin of CUDA's supported architectures) is read
    directly: its section headers, then its symbol table as one array, the names of the
    function symbols only. PyTorch's and cuBLAS's modules hold thousands of functions, and
    ``callpath run -e gpu=nvidia`` reads every module the program loaded after the run:
    pyelftools's symbol by symbol took about 50 ms per MB, this about 1. Anything else goes
    through pyelftools."""
    import numpy as np

    data = cubin.data
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return _functions_of_elftools(cubin, path)
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        if shentsize != 64 or shoff + 64 * shnum > len(data):
            raise ValueError("section headers outside the file")
        heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
        strings = data[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]] \
            if shstrndx < shnum else b""

        out: list[GpuFunction] = []
        for h in heads:
            if h[1] != _SHT_SYMTAB:
                continue
            off, size, link, entsize = h[4], h[5], h[6], h[9]
            if entsize != 24 or off + size > len(data) or link >= shnum:
                raise ValueError("a symbol table outside the file")
            syms = np.frombuffer(data, dtype=np.dtype(_SYM64), count=size // 24, offset=off)
            shn = syms["shndx"].astype(np.int64)
            keep = np.flatnonzero(((syms["info"] & 0xF) == _STT_FUNC) & (syms["name"] != 0)
                                  & (shn > 0) & (shn < min(shnum, _SHN_LORESERVE)))
            if not len(keep):
                continue
            names = data[heads[link][4]:heads[link][4] + heads[link][5]]
            secname = {i: _cstr(strings, heads[i][0]) for i in np.unique(shn[keep]).tolist()}
            for name_at, sec, value, fsize in zip(syms["name"][keep].tolist(),
                                                  shn[keep].tolist(),
                                                  syms["value"][keep].tolist(),
                                                  syms["size"][keep].tolist(), strict=True):
                name = _cstr(names, name_at)
                if name:
                    out.append(GpuFunction(name, cubin.offset + heads[sec][4] + value, fsize,
                                           secname[sec]))
    except (ValueError, struct.error, IndexError) as e:
        raise FormatError(path, f"corrupt cubin at offset {cubin.offset:#x}: {e}") from None
    return _sized(out)


def _functions_of_elftools(cubin: Cubin, path: str) -> list[GpuFunction]:
    """:func:`functions_of` through pyelftools (32-bit or big-endian ELF files)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(io.BytesIO(cubin.data))
        secs = list(elf.iter_sections())
        out: list[GpuFunction] = []
        for sec in secs:
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                shn = sym["st_shndx"]
                if sym["st_info"]["type"] != "STT_FUNC" or not sym.name or \
                        not isinstance(shn, int) or not 0 < shn < len(secs):
                    continue
                host = secs[shn]
                out.append(GpuFunction(sym.name, cubin.offset + int(host["sh_offset"])
                                       + int(sym["st_value"]), int(sym["st_size"]), host.name))
    except (ELFError, ValueError, struct.error, KeyError, IndexError) as e:
        raise FormatError(path, f"corrupt cubin at offset {cubin.offset:#x}: {e}") from None
    return _sized(out)


def _sized(out: list[GpuFunction]) -> list[GpuFunction]:
    """Functions by address, each ending where the next one of its section starts: a
    non-inlined device function of a whole-program build sits inside its caller's section,
    after the caller's code, and the caller's symbol size covers it."""
    out.sort(key=lambda f: f.address)
    for a, b in pairwise(out):
        if a.section == b.section and a.address < b.address < a.address + a.size:
            a.size = b.address - a.address
    return out


def display_name(link: str) -> str:
    """A function's name as shown: demangled, except a device function that the compiler
    placed in its caller's section, ``$caller$callee``, named so as hpcstruct names it (no
    demangler takes it; hpcprof's databases show it so)."""
    if link.startswith("$"):
        return link
    return demangle(link)


def _line_rows(cubin: Cubin, path: str) -> _Rows:
    """The ``.debug_line`` rows of a cubin with its relocations applied (empty without
    line information)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    rows = _Rows()
    try:
        elf = ELFFile(io.BytesIO(cubin.data))
        secs = list(elf.iter_sections())
        idx = next((i for i, s in enumerate(secs) if s.name == ".debug_line"), -1)
        if idx < 0:
            return rows
        data = bytearray(secs[idx].data())
        symtab = next((s for s in secs if isinstance(s, SymbolTableSection)), None)
        for rs in secs:
            if not isinstance(rs, RelocationSection) or rs["sh_info"] != idx or symtab is None:
                continue
            for r in rs.iter_relocations():
                if r["r_info_type"] != _R_CUDA_64 or r["r_offset"] + 8 > len(data):
                    continue
                sym = symtab.get_symbol(r["r_info_sym"])
                shn = sym["st_shndx"]
                base = int(secs[shn]["sh_offset"]) if isinstance(shn, int) and \
                    0 < shn < len(secs) else 0
                off = int(r["r_offset"])
                addend = int(r.entry["r_addend"]) if rs.is_RELA() else \
                    int.from_bytes(data[off:off + 8], "little")
                value = cubin.offset + base + int(sym["st_value"]) + addend
                data[off:off + 8] = (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
        strs = next((s for s in secs if s.name == ".debug_str"), None)
        rows.strings = strs.data() if strs is not None else b""
    except (ELFError, ValueError, struct.error, KeyError, IndexError) as e:
        raise FormatError(path, f"corrupt cubin at offset {cubin.offset:#x}: {e}") from None
    buf = bytes(data)
    file_ids: dict[str, int] = {}
    pos = 0
    while pos + 4 <= len(buf):  # one line program per compilation unit
        unit = int.from_bytes(buf[pos:pos + 4], "little")
        if unit == 0 or unit == 0xFFFFFFFF:  # padding; 64-bit DWARF is not used in cubins
            break
        _decode_one(buf, pos, "", path, rows.strings, None, 8, rows.files, file_ids,
                    rows.address, rows.file, rows.line, rows.inline)
        pos += 4 + unit
    # nvcc names files relative to the build directory ("builddir/../tests/x.cu"): the
    # normalised path is the file's name, as hpcstruct writes it
    rows.files = [os.path.normpath(f) if f else f for f in rows.files]
    rows.index()
    return rows


def _cstr(blob: bytes, off: int) -> str:
    end = blob.find(b"\0", off)
    return blob[off:end if end >= 0 else len(blob)].decode("utf-8", "replace") \
        if 0 <= off < len(blob) else ""


# ------------------------------------------------------------------------ nvdisasm (loops)

def find_nvdisasm() -> str | None:
    """``nvdisasm`` from PATH, ``$CUDA_HOME``/``$CUDA_PATH``, /usr/local/cuda*, or PyPI's
    ``nvidia-cuda-nvdisasm`` (``nvidia/cu*/bin``); ``CALLPATH_NVDISASM`` names it (empty:
    none)."""
    named = os.environ.get("CALLPATH_NVDISASM")
    if named is not None:
        return named if named and os.access(named, os.X_OK) else None
    got = shutil.which("nvdisasm")
    if got:
        return got
    cands = [Path(os.environ[v]) / "bin" / "nvdisasm" for v in ("CUDA_HOME", "CUDA_PATH")
             if os.environ.get(v)]
    cands += sorted(Path("/usr/local").glob("cuda*/bin/nvdisasm"), reverse=True)
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            cands += sorted(Path(loc).glob("*/bin/nvdisasm"), reverse=True)
    except (ImportError, ValueError):
        pass
    return next((str(c) for c in cands if os.access(c, os.X_OK)), None)


_INS = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)$")
_SEC = re.compile(r"^\s*\.section\s+(\.text\.[^,\s]+)")
_LABEL = re.compile(r"^(\.L_\w+|[A-Za-z_$][\w.$]*):\s*$")
_TARGET = re.compile(r"`\(([^)]+)\)")


@dataclass
class _Insn:
    addr: int  # offset in its section
    op: str
    predicated: bool
    label: str | None  # target label of a direct branch or call
    dest: int = -1  # its section offset (-1: indirect, or a label of another section)


def disassemble(nvdisasm: str, cubin: Cubin) -> dict[str, list[_Insn]]:
    """Each code section's instructions (``nvdisasm -c``), by section name; raises
    :class:`CallpathError` with nvdisasm's message when it fails."""
    with tempfile.TemporaryDirectory(prefix="callpath-cubin-") as tmp:
        f = Path(tmp) / "code.cubin"
        f.write_bytes(cubin.data)
        try:
            run = subprocess.run([nvdisasm, "-c", str(f)], capture_output=True, text=True,
                                 timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CallpathError(f"{nvdisasm}: {e}") from None
    if run.returncode != 0:
        msg = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["failed"]
        raise CallpathError(f"{nvdisasm}: {msg[0]}")
    out: dict[str, list[_Insn]] = {}
    labels: dict[str, dict[str, int]] = defaultdict(dict)
    cur: list[_Insn] | None = None
    sec = ""
    pending: list[str] = []
    for ln in run.stdout.splitlines():
        m = _SEC.match(ln)
        if m:
            sec = m.group(1)
            cur = out.setdefault(sec, [])
            continue
        if cur is None:
            continue
        m = _LABEL.match(ln.strip()) if ln.strip().endswith(":") else None
        if m:
            pending.append(m.group(1))
            continue
        m = _INS.match(ln)
        if m:
            a = int(m.group(1), 16)
            for lab in pending:
                labels[sec][lab] = a
            pending.clear()
            t = _TARGET.search(m.group(4))
            pred = m.group(2) is not None and m.group(2).strip() not in ("@PT", "@UPT")
            cur.append(_Insn(a, m.group(3).split(".")[0], pred, t.group(1) if t else None))
    for s, ins in out.items():  # labels -> section offsets
        for i in ins:
            if i.label is not None:
                i.dest = labels[s].get(i.label, -1)
    return out


_BRANCH = {"BRA", "JMP"}
_INDIRECT = {"BRX", "JMX"}
_STOP = {"EXIT", "RET", "KILL"}


def loops_of(ins: list[_Insn], lo: int, hi: int) -> tuple[list[tuple[int, int, int]],
                                                           list[tuple[int, int, int]]]:
    """Loops of one function's instructions in ``[lo, hi)`` (section offsets): returns the
    loops as ``(header address, latch branch address, parent loop)`` and the blocks as
    ``(start, end, innermost loop)``."""
    code = [i for i in ins if lo <= i.addr < hi]
    if not code:
        return [], []
    starts = {code[0].addr}
    for k, i in enumerate(code):
        if i.op in _BRANCH or i.op in _INDIRECT or i.op in _STOP:
            if k + 1 < len(code):
                starts.add(code[k + 1].addr)
            if i.op in _BRANCH and lo <= i.dest < hi:
                starts.add(i.dest)
    order = sorted(starts)
    block_of = {a: n for n, a in enumerate(order)}
    bounds = [*order, code[-1].addr + 16]
    succ: list[list[int]] = [[] for _ in order]
    last: list[int] = [0] * len(order)
    b = 0
    for k, i in enumerate(code):
        if i.addr in block_of:
            b = block_of[i.addr]
        nxt = code[k + 1].addr if k + 1 < len(code) else None
        if nxt is not None and nxt not in block_of:
            continue
        last[b] = i.addr
        falls = nxt is not None and (i.predicated or not (
            i.op in _BRANCH or i.op in _INDIRECT or i.op in _STOP))
        if falls:
            succ[b].append(block_of[nxt])  # type: ignore[index]
        if i.op in _BRANCH and i.dest in block_of:
            succ[b].append(block_of[i.dest])
    loops, innermost = find_loops(succ)
    out = []
    for lp in loops:
        srcs = list(lp.back_sources) or [lp.header]
        latch = max(srcs, key=lambda x: order[x])
        out.append((order[lp.header], last[latch], lp.parent))
    blocks = [(order[n], bounds[n + 1], innermost[n] if n < len(innermost) else -1)
              for n in range(len(order))]
    return out, blocks


# ------------------------------------------------------------------------------- analysis

@dataclass
class GpuStructure:
    structure: Structure
    notes: list[str]


def analyze_gpu_binary(path: str | os.PathLike[str], *, name: str | None = None,
                       nvdisasm: str | bool | None = True) -> GpuStructure:
    """Structure of a cubin or fatbin: functions, source lines with inlined code, loops
    (with ``nvdisasm``; ``nvdisasm=True`` looks for it, a path uses that one, None/False
    none). ``notes`` say what could not be recovered, one line each."""
    p = str(path)
    try:
        data = Path(p).read_bytes()
    except OSError as e:
        raise FormatError(p, f"cannot read: {e.strerror or e}") from None
    cubins, notes = cubins_of(data, path=p)
    tool = find_nvdisasm() if nvdisasm is True else (nvdisasm or None)
    b = StructureBuilder(name or p, None)
    files: dict[str, int] = {}
    no_lines = 0
    nfun = 0
    todo: list[tuple[Cubin, GpuFunction, _Rows, list[_Insn] | None, int]] = []
    for cb in cubins:
        funcs = functions_of(cb, p)
        rows = _line_rows(cb, p)
        code: dict[str, list[_Insn]] = {}
        if tool and funcs:
            try:
                code = disassemble(tool, cb)
            except CallpathError as e:
                notes.append(f"loops of sm_{cb.arch} cubin: {e}")
        sec_off = _section_offsets(cb, p)
        todo.extend((cb, fn, rows, code.get(fn.section), sec_off.get(fn.section, 0))
                    for fn in funcs)
    # scopes go in preorder: the functions of one source file together
    todo.sort(key=lambda t: (_function_file(t[2], t[1]) or "", t[1].address))
    for _cb, fn, rows, code_, base in todo:
        nfun += 1
        no_lines += 0 if _build_function(b, files, fn, rows, code_, base) else 1
    if not cubins:
        notes.append("no cubin found")
    elif nfun and no_lines == nfun:
        notes.append("no line information (built without -lineinfo or -G): function names "
                     "only")
    if nfun and tool is None and nvdisasm is True:
        notes.append("no loops: nvdisasm not found (a CUDA toolkit, or 'pip install "
                     "nvidia-cuda-nvdisasm'; CALLPATH_NVDISASM names one)")
    # as hpcstruct's --gpucfg yes: with the control flow decoded, the call sites are all there
    # (has-calls="1" tells hpcprof it may rebuild calling contexts inside kernels from them)
    b.has_calls = b.has_calls or bool(tool and cubins)
    return GpuStructure(b.build(), notes)


def _function_file(rows: _Rows, fn: GpuFunction) -> str | None:
    """The source file of a function: that of its first line row (one carried in from before
    it included), or of that row's outermost call site where it is inlined code."""
    got = rows.function_rows(fn.address, fn.address + max(fn.size, 1))
    if not got:
        return None
    return _row_file(rows, rows.outermost(got[min(got)]))


def _section_offsets(cb: Cubin, path: str) -> dict[str, int]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        elf = ELFFile(io.BytesIO(cb.data))
        return {s.name: cb.offset + int(s["sh_offset"]) for s in elf.iter_sections()}
    except (ELFError, ValueError, struct.error) as e:
        raise FormatError(path, f"corrupt cubin at offset {cb.offset:#x}: {e}") from None


def _build_function(b: StructureBuilder, files: dict[str, int], fn: GpuFunction, rows: _Rows,
                    code: list[_Insn] | None, sec_base: int) -> bool:
    """Append one function's FILE (shared by the functions of one source file), PROC, LOOP,
    ALIEN and STMT scopes; False when no line row falls inside it."""
    lo, hi = fn.address, fn.address + max(fn.size, 1)
    seq = rows.function_rows(lo, hi)  # segment start -> its row
    addrs = sorted(seq)
    link = fn.name
    display = display_name(link)
    if not addrs:
        fscope = _file_scope(b, files, f"[{os.path.basename(b.path)}]")
        ps = b.add(Kind.PROC, fscope, name=display, link=link, line=0, ranges=[(lo, lo + 1)])
        b.map_range(lo, hi, ps)
        return False
    if addrs[0] > lo:  # code before the first row: the first row's line
        seq[lo] = seq[addrs[0]]
        addrs.insert(0, lo)
    entry = seq[addrs[0]]
    # the entry row may itself be inlined code: the function's own file is then its outermost
    # call site's; its line is the smallest of its code's (hpcstruct's: the opening line
    # where the compiler gave the entry a row of its own, else the line of the first
    # statement, or of an inlined function defined above it)
    top = rows.outermost(entry)
    fname = _row_file(rows, top)
    fscope = _file_scope(b, files, fname)
    pscope = b.add(Kind.PROC, fscope, name=display, link=link, file=fname,
                   line=min(rows.line[r] for r in seq.values()), ranges=[(lo, lo + 1)])
    loops: list[tuple[int, int, int]] = []
    seg_loop = [-1] * len(addrs)
    # call instructions (nvdisasm's CALL): scopes of their own, as hpcstruct's C, with the
    # callee's address where it is in this cubin's section (0 otherwise)
    calls = {i.addr + sec_base: (i.dest + sec_base if i.dest >= 0 else 0)
             for i in code or () if i.op == "CALL" and lo <= i.addr + sec_base < hi}
    if code:
        lps, blocks = loops_of(code, lo - sec_base, hi - sec_base)
        loops = [(h + sec_base, lt + sec_base, par) for h, lt, par in lps]
        bl = [(x + sec_base, e + sec_base, lp) for x, e, lp in blocks]
        # split segments at block starts so that each segment lies in one block, and around
        # each call instruction
        cut = sorted(set(addrs) | {x for x, _, _ in bl if lo <= x < hi}
                     | {y for c in calls for y in (c, c + 16) if y < hi})
        seq = {x: seq[addrs[bisect_right(addrs, x) - 1]] for x in cut}
        addrs = cut
        bstart = [x for x, _, _ in bl]
        seg_loop = []
        for x in addrs:
            k = bisect_right(bstart, x) - 1
            seg_loop.append(bl[k][2] if k >= 0 and x < bl[k][1] else -1)
    seg_hi = [*addrs[1:], hi]

    def loop_chain(n: int) -> list[int]:
        out: list[int] = []
        while n >= 0:
            out.append(n)
            n = loops[n][2]
        return out[::-1]

    def inline_chain(r: int) -> list[tuple[int, int]]:
        """(call-site row, name offset) of each inlined frame around row r, outermost first."""
        out: list[tuple[int, int]] = []
        while rows.ctx[r][0] >= 0:
            out.append(rows.ctx[r])
            r = rows.ctx[r][0]
        return out[::-1]

    scopes: dict[tuple[tuple[int, int], ...], int] = {(): pscope}
    Path_ = tuple[tuple[int, int], ...]
    stmts: dict[Path_, dict[tuple[int, int], list[tuple[int, int]]]] = defaultdict(
        lambda: defaultdict(list))
    call_scopes: dict[Path_, list[tuple[int, int, int, int]]] = defaultdict(list)

    def scope_of(path: Path_, at: int) -> int:
        got = scopes.get(path)
        if got is not None:
            return got
        parent = scope_of(path[:-1], at)
        kind, ref = path[-1]
        if kind == 0:  # loop
            h, latch, _ = loops[ref]
            lf, ll = _line_at(rows, seq, addrs, latch)
            sc = b.add(Kind.LOOP, parent, file=lf, line=ll, ranges=[(h, h + 1)])
        else:  # inlined frame: ref = index into the flat list of (call row, name)
            call_row, name_off = frames[ref]
            nm = _cstr(rows.strings, name_off)
            first = seq[at]
            sc = b.add(Kind.ALIEN, parent, name=demangle(nm) if nm else "",
                       file=_row_file(rows, first), line=rows.line[first],
                       call_file=_row_file(rows, call_row), call_line=rows.line[call_row])
        scopes[path] = sc
        return sc

    frames: list[tuple[int, int]] = []
    frame_ix: dict[tuple[int, int], int] = {}
    seg_paths = []
    for n, x in enumerate(addrs):
        r = seq[x]
        path: list[tuple[int, int]] = [(0, lp) for lp in loop_chain(seg_loop[n])]
        for fr in inline_chain(r):
            k = frame_ix.setdefault(fr, len(frames))
            if k == len(frames):
                frames.append(fr)
            path.append((1, k))
        seg_paths.append(tuple(path))
    # scopes are appended in preorder: a parent's statements before its children, children
    # in address order. Collect first, emit after.
    tree: dict[Path_, list[Path_]] = defaultdict(list)
    seen: dict[Path_, int] = {(): 0}
    for n, pth in enumerate(seg_paths):
        for d in range(1, len(pth) + 1):
            pre = pth[:d]
            if pre not in seen:
                seen[pre] = n
                tree[pth[:d - 1]].append(pre)
        r = seq[addrs[n]]
        f = rows.file[r]
        if addrs[n] in calls and seg_hi[n] == addrs[n] + 16:
            call_scopes[pth].append((addrs[n], f, rows.line[r], calls[addrs[n]]))
            continue
        stmts[pth][(f, rows.line[r])].append((addrs[n], seg_hi[n]))

    def emit(pth: Path_) -> None:
        sc = scope_of(pth, addrs[seen[pth]])
        # statements and call sites in line order, as hpcstruct writes them (hpcprof's
        # reconstruction of calling contexts visits callers in the file's order)
        for (f, ln), rs in sorted(stmts[pth].items(), key=lambda kv: (kv[0][1], kv[1][0][0])):
            merged: list[tuple[int, int]] = []
            for x, y in rs:
                if merged and merged[-1][1] == x:
                    merged[-1] = (merged[-1][0], y)
                else:
                    merged.append((x, y))
            st = b.add(Kind.STMT, sc, file=rows.files[f] if 0 <= f < len(rows.files) else None,
                       line=ln, ranges=merged)
            for x, y in merged:
                b.map_range(x, y, st)
        for a, f, ln, t in sorted(call_scopes[pth], key=lambda c: (c[2], c[0])):
            cs = b.add(Kind.CALL, sc, file=rows.files[f] if 0 <= f < len(rows.files) else None,
                       line=ln, target=t, ranges=[(a, a + 16)])
            b.map_range(a, a + 16, cs)
            b.has_calls = True
        for ch in tree[pth]:
            emit(ch)

    emit(())
    return True


def _row_file(rows: _Rows, r: int) -> str | None:
    f = rows.file[r]
    return rows.files[f] if 0 <= f < len(rows.files) else None


def _line_at(rows: _Rows, seq: dict[int, int], addrs: list[int], at: int
             ) -> tuple[str | None, int]:
    k = bisect_right(addrs, at) - 1
    if k < 0:
        return None, 0
    r = seq[addrs[k]]
    return _row_file(rows, r), rows.line[r]


def _file_scope(b: StructureBuilder, files: dict[str, int], fname: str | None) -> int:
    key = fname or ""
    got = files.get(key)
    if got is None:
        got = files[key] = b.add(Kind.FILE, 0, name=fname or f"[{os.path.basename(b.path)}]")
    return got
