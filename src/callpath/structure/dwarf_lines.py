"""A purpose-written decoder of DWARF 2–5 line programs (``.debug_line``).

pyelftools builds one Python object per row and per opcode; on a large library that is ~8x
slower than this loop, which keeps the state machine in local variables and appends only the
three numbers a row needs (address, file, line) to flat lists. The result is a
:class:`LineTable`: numpy arrays sorted by address, where row ``i`` covers
``[address[i], address[i+1])`` unless it ends a sequence (``line == -1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError

# Forms that may appear in DWARF 5 directory/file entry formats.
_DW_FORM_block = 0x09
_DW_FORM_block1 = 0x0A
_DW_FORM_data1 = 0x0B
_DW_FORM_data2 = 0x05
_DW_FORM_data4 = 0x06
_DW_FORM_data8 = 0x07
_DW_FORM_data16 = 0x1E
_DW_FORM_string = 0x08
_DW_FORM_strp = 0x0E
_DW_FORM_line_strp = 0x1F
_DW_FORM_udata = 0x0F
_DW_FORM_strx = 0x1A
_DW_FORM_strx1 = 0x25
_DW_FORM_strx2 = 0x26
_DW_FORM_strx3 = 0x27
_DW_FORM_strx4 = 0x28
_DW_LNCT_path = 1
_DW_LNCT_directory_index = 2


@dataclass
class LineTable:
    """All rows of all line programs of a module, sorted by address.

    ``files`` holds the path of every global file index; ``line == -1`` marks the end of a
    sequence (the address past its last instruction).
    """

    address: npt.NDArray[np.uint64]
    file: npt.NDArray[np.int32]
    line: npt.NDArray[np.int32]
    files: list[str]
    #: ``DW_AT_stmt_list`` offset -> global file id of each file number of that program.
    unit_files: dict[int, list[int]]

    def file_of(self, stmt_list: int, index: int) -> int:
        ids = self.unit_files.get(stmt_list)
        return ids[index] if ids is not None and 0 <= index < len(ids) else -1

    def lookup(self, addrs: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.int32],
                                                            npt.NDArray[np.int32]]:
        """(file, line) of each address; (-1, 0) where no row covers it."""
        i = np.searchsorted(self.address, addrs, side="right").astype(np.int64) - 1
        ok = i >= 0
        ic = np.where(ok, i, 0)
        line = np.where(ok, self.line[ic], -1) if len(self.line) else np.full(len(addrs), -1)
        ok &= line >= 0
        f = np.where(ok, self.file[ic] if len(self.file) else -1, -1).astype(np.int32)
        return f, np.where(ok, line, 0).astype(np.int32)


class _Reader:
    __slots__ = ("data", "path", "pos")

    def __init__(self, data: bytes, pos: int, path: str) -> None:
        self.data = data
        self.pos = pos
        self.path = path

    def need(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise FormatError(self.path, "truncated .debug_line", self.pos)

    def u(self, n: int) -> int:
        self.need(n)
        v = int.from_bytes(self.data[self.pos:self.pos + n], "little")
        self.pos += n
        return v

    def uleb(self) -> int:
        data, pos, result, shift = self.data, self.pos, 0, 0
        while True:
            if pos >= len(data):
                raise FormatError(self.path, "truncated LEB128 in .debug_line", pos)
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                self.pos = pos
                return result

    def cstr(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise FormatError(self.path, "unterminated string in .debug_line", self.pos)
        s = self.data[self.pos:end].decode("utf-8", "replace")
        self.pos = end + 1
        return s


def _strp(sec: bytes | None, off: int, path: str, name: str) -> str:
    if sec is None or off >= len(sec):
        raise FormatError(path, f"string offset {off:#x} outside {name}")
    end = sec.find(b"\0", off)
    return sec[off:end if end >= 0 else len(sec)].decode("utf-8", "replace")


def _join(d: str, f: str) -> str:
    if not d or f.startswith("/"):
        return f
    return d.rstrip("/") + "/" + f


#: one unit's decoded rows: addresses, file numbers (-1: none), lines, its file table's names
UnitRows = tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32], npt.NDArray[np.int32],
                 list[str]]


@dataclass
class LineCache:
    """The decoded line programs of one module, per unit (``DW_AT_stmt_list`` offset), kept
    on disk between runs (``path``; ``None``: in memory only).

    On-demand structure reads only the units around the sampled procedures, and every run of
    a program samples procedures no earlier run did: their units' line programs were decoded
    again each time (libpython: 85 units, 0.5 s of a warm ``profile --native`` of a PyTorch
    loop). A unit's rows depend only on the file's bytes, so they are kept by the structure
    cache's module key. Rows keep their unit's file numbers; the caller maps them to its own
    file ids."""

    path: os.PathLike[str] | None
    _units: dict[int, UnitRows] | None = None
    _new: dict[int, UnitRows] = field(default_factory=dict)

    FORMAT = "callpath line programs"
    VERSION = 1

    def _expect(self) -> dict[str, object]:
        return {"format": self.FORMAT, "version": self.VERSION}

    def _read(self) -> dict[int, UnitRows]:
        from callpath.structure import store
        out: dict[int, UnitRows] = {}
        got = store.load_arrays(self.path, self._expect()) if self.path is not None else None
        if got is None:
            return out
        meta, a = got
        try:
            offs, rp, npt_ = a["off"].tolist(), a["rptr"].tolist(), a["nptr"].tolist()
            names = store.array_to_strings(a["names"], int(meta["n_names"]))
            if len(rp) != len(offs) + 1 or len(npt_) != len(offs) + 1 \
                    or rp[-1] != len(a["a"]) or npt_[-1] != len(names):
                return {}
            for k, off in enumerate(offs):
                out[off] = (a["a"][rp[k]:rp[k + 1]], a["f"][rp[k]:rp[k + 1]],
                            a["l"][rp[k]:rp[k + 1]], names[npt_[k]:npt_[k + 1]])
        except (KeyError, ValueError, TypeError, UnicodeDecodeError):
            return {}
        return out

    def get(self, off: int) -> UnitRows | None:
        if self._units is None:
            self._units = self._read()
        return self._units.get(off)

    def put(self, off: int, rows: UnitRows) -> None:
        if self._units is None:
            self._units = self._read()
        self._units[off] = self._new[off] = rows

    def save(self) -> None:
        """Write the units this run decoded, with what the file holds now (another process
        may have added to it since it was read); a file that cannot be written only costs
        the decoding next time."""
        if not self._new or self.path is None:
            return
        from callpath.structure import store
        units = self._read()
        units.update(self._new)
        offs = sorted(units)
        rows = [units[o] for o in offs]
        names = [n for r in rows for n in r[3]]
        store.save_arrays(self.path, {**self._expect(), "n_names": len(names)}, {
            "off": np.array(offs, dtype=np.int64),
            "rptr": np.cumsum([0] + [len(r[0]) for r in rows]).astype(np.int64),
            "nptr": np.cumsum([0] + [len(r[3]) for r in rows]).astype(np.int64),
            "a": np.concatenate([r[0] for r in rows]).astype(np.uint64),
            "f": np.concatenate([r[1] for r in rows]).astype(np.int32),
            "l": np.concatenate([r[2] for r in rows]).astype(np.int32),
            "names": store.strings_to_array(names)})
        self._new = {}


def decode_line_tables(debug_line: bytes, offsets: list[tuple[int, str]], *, path: str,
                       debug_str: bytes | None = None, debug_line_str: bytes | None = None,
                       address_size: int = 8, cache: LineCache | None = None) -> LineTable:
    """Decode the line programs at ``offsets`` (``(DW_AT_stmt_list, comp_dir)`` of each CU);
    with ``cache``, a unit decoded by an earlier run is taken from it, and the units decoded
    here are added to it (the caller saves it)."""
    files: list[str] = []
    file_ids: dict[str, int] = {}
    chunks: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32], npt.NDArray[np.int32]]]
    chunks = []
    unit_files: dict[int, list[int]] = {}
    for off, comp_dir in offsets:
        if off in unit_files:
            continue
        if not 0 <= off < len(debug_line):
            raise FormatError(path, f"DW_AT_stmt_list {off:#x} outside .debug_line")
        got = cache.get(off) if cache is not None else None
        if got is not None:
            ua, uf, ul, names = got
            gids = []
            for name in names:  # as _decode_one numbers them: in file-table order
                g = file_ids.get(name)
                if g is None:
                    g = file_ids[name] = len(files)
                    files.append(name)
                gids.append(g)
            gmap = np.array([*gids, -1], dtype=np.int32)  # file number -1: the last
            chunks.append((ua, gmap[uf], ul))
            unit_files[off] = gids
            continue
        out_a: list[int] = []
        out_f: list[int] = []
        out_l: list[int] = []
        gids = _decode_one(debug_line, off, comp_dir, path, debug_str, debug_line_str,
                           address_size, files, file_ids, out_a, out_f, out_l)
        unit_files[off] = gids
        a = np.array(out_a, dtype=np.uint64)
        f = np.array(out_f, dtype=np.int32)
        ln = np.array(out_l, dtype=np.int32)
        chunks.append((a, f, ln))
        if cache is not None:
            number = {g: k for k, g in reversed(list(enumerate(gids)))}
            local = np.array([number.get(g, -1) for g in f.tolist()], dtype=np.int32) \
                if len(f) else f
            cache.put(off, (a, local, ln, [files[g] for g in gids]))
    a = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros(0, dtype=np.uint64)
    f = np.concatenate([c[1] for c in chunks]) if chunks else np.zeros(0, dtype=np.int32)
    ln = np.concatenate([c[2] for c in chunks]) if chunks else np.zeros(0, dtype=np.int32)
    # Sort by address; a stable sort keeps the order of rows at the same address, so the last
    # row at an address is the one that describes its instructions.
    order = np.argsort(a, kind="stable")
    a, f, ln = a[order], f[order], ln[order]
    if len(a):
        # Rows at the same address: keep the last (earlier ones cover no bytes). An end of
        # sequence sharing its address with the start of another sequence loses to it.
        last = np.ones(len(a), dtype=bool)
        last[:-1] = a[1:] != a[:-1]
        a, f, ln = a[last], f[last], ln[last]
    return LineTable(a, f, ln, files, unit_files)


def _decode_one(data: bytes, off: int, comp_dir: str, path: str, debug_str: bytes | None,
                debug_line_str: bytes | None, address_size: int, files: list[str],
                file_ids: dict[str, int], out_a: list[int], out_f: list[int],
                out_l: list[int], nv: list[tuple[int, int, int]] | None = None) -> list[int]:
    """Append the rows of the line program at ``off`` to ``out_a/out_f/out_l``; return the
    global file id of each of its file numbers. ``nv``, when given, receives NVIDIA's inline
    records (cubins built with ``-lineinfo``/``-G``) as ``(row, context, name)``: from row
    ``row`` (an index into the output lists) on, rows are code inlined at the call site that
    row ``context`` describes (0: not inlined; else a 1-based row of this sequence; here
    made an index into the output lists), in the
    function whose name is at ``name`` in ``.debug_str``. The state machine keeps them until
    the next record, so only the changes are recorded (nothing per row)."""
    r = _Reader(data, off, path)
    first_row = len(out_a)
    unit_length = r.u(4)
    offsz = 4
    if unit_length == 0xFFFFFFFF:
        unit_length = r.u(8)
        offsz = 8
    end = r.pos + unit_length
    if end > len(data):
        raise FormatError(path, f"line program at {off:#x} runs past the end of .debug_line", off)
    version = r.u(2)
    if not 2 <= version <= 5:
        raise FormatError(path, f"unsupported .debug_line version {version} (expected 2..5)", off)
    if version >= 5:
        r.u(1)  # address size (set_address carries its own length)
        r.u(1)  # segment selector size
    header_length = r.u(offsz)
    prog_start = r.pos + header_length
    min_inst = r.u(1)
    if version >= 4:
        r.u(1)  # maximum operations per instruction (1 on x86)
    r.u(1)  # default_is_stmt: every row counts, statement or not
    line_base = r.u(1)
    if line_base >= 128:
        line_base -= 256
    line_range = r.u(1)
    opcode_base = r.u(1)
    if line_range == 0:
        raise FormatError(path, f"line program at {off:#x} has line_range 0", off)
    std_lengths = [0] + [r.u(1) for _ in range(max(opcode_base - 1, 0))]
    local_files: list[str] = []
    if version >= 5:
        dirs = _v5_entries(r, path, debug_str, debug_line_str, offsz)
        dir_names: list[str] = [str(d.get(_DW_LNCT_path, "")) for d in dirs]
        for fe in _v5_entries(r, path, debug_str, debug_line_str, offsz):
            di = fe.get(_DW_LNCT_directory_index, 0)
            dn = dir_names[di] if isinstance(di, int) and di < len(dir_names) else ""
            dn = _join(comp_dir, dn)
            local_files.append(_join(dn, str(fe.get(_DW_LNCT_path, ""))))
    else:
        dir_names = [comp_dir]
        while True:
            s = r.cstr()
            if not s:
                break
            dir_names.append(_join(comp_dir, s))
        local_files.append("")  # DWARF < 5: file numbers start at 1
        while True:
            s = r.cstr()
            if not s:
                break
            di = r.uleb()
            r.uleb()
            r.uleb()
            local_files.append(_join(dir_names[di] if di < len(dir_names) else "", s))
    gids: list[int] = []
    for name in local_files:
        g = file_ids.get(name)
        if g is None:
            g = file_ids[name] = len(files)
            files.append(name)
        gids.append(g)
    ngids = len(gids)
    default_file = 1  # the state machine starts at file 1 in every version

    # Special-opcode tables, computed once per program.
    addr_adv = [0] * 256
    line_adv = [0] * 256
    for op in range(opcode_base, 256):
        adj = op - opcode_base
        addr_adv[op] = (adj // line_range) * min_inst
        line_adv[op] = line_base + adj % line_range
    const_add = ((255 - opcode_base) // line_range) * min_inst

    pos = prog_start
    addr = 0
    file = default_file
    line = 1
    ap, fp, lp = out_a.append, out_f.append, out_l.append
    d = data
    try:
        while pos < end:
            op = d[pos]
            pos += 1
            if op >= opcode_base:
                addr += addr_adv[op]
                line += line_adv[op]
                ap(addr)
                fp(gids[file] if file < ngids else -1)
                lp(line)
            elif op == 0:  # extended opcode
                ln = 0
                shift = 0
                while True:
                    b = d[pos]
                    pos += 1
                    ln |= (b & 0x7F) << shift
                    shift += 7
                    if b < 0x80:
                        break
                if ln == 0:
                    continue
                sub = d[pos]
                nxt = pos + ln
                if sub == 1:  # end_sequence
                    ap(addr)
                    fp(-1)
                    lp(-1)
                    addr = 0
                    file = default_file
                    line = 1
                    first_row = len(out_a)
                elif sub == 2:  # set_address
                    addr = int.from_bytes(d[pos + 1:nxt], "little")
                elif sub == 0x90 and nv is not None:  # DW_LNE_NVIDIA_inlined_call
                    q = _Reader(d, pos + 1, path)
                    ctx = q.uleb()
                    fname = q.uleb()
                    nv.append((len(out_a), first_row + ctx - 1 if ctx else -1, fname))
                pos = nxt
            elif op == 1:  # copy
                ap(addr)
                fp(gids[file] if file < ngids else -1)
                lp(line)
            elif op == 2:  # advance_pc
                v = shift = 0
                while True:
                    b = d[pos]
                    pos += 1
                    v |= (b & 0x7F) << shift
                    shift += 7
                    if b < 0x80:
                        break
                addr += v * min_inst
            elif op == 3:  # advance_line (signed)
                v = shift = 0
                while True:
                    b = d[pos]
                    pos += 1
                    v |= (b & 0x7F) << shift
                    shift += 7
                    if b < 0x80:
                        break
                if b & 0x40:
                    v -= 1 << shift
                line += v
            elif op == 4:  # set_file
                v = shift = 0
                while True:
                    b = d[pos]
                    pos += 1
                    v |= (b & 0x7F) << shift
                    shift += 7
                    if b < 0x80:
                        break
                file = v
            elif op == 8:  # const_add_pc
                addr += const_add
            elif op == 9:  # fixed_advance_pc
                addr += d[pos] | (d[pos + 1] << 8)
                pos += 2
            elif op in (6, 7, 10, 11):
                pass
            else:  # set_column (5), set_isa (12) and unknown standard opcodes: skip operands
                for _ in range(std_lengths[op] if op < len(std_lengths) else 0):
                    while d[pos] & 0x80:
                        pos += 1
                    pos += 1
    except IndexError:
        raise FormatError(path, f"line program at {off:#x} runs past its end", pos) from None
    if pos > end:
        raise FormatError(path, f"line program at {off:#x} runs past its end", pos)
    return gids


def _v5_entries(r: _Reader, path: str, debug_str: bytes | None, debug_line_str: bytes | None,
                offsz: int) -> list[dict[int, object]]:
    nfmt = r.u(1)
    fmts = [(r.uleb(), r.uleb()) for _ in range(nfmt)]
    count = r.uleb()
    out: list[dict[int, object]] = []
    for _ in range(count):
        ent: dict[int, object] = {}
        for content, form in fmts:
            val: object
            if form == _DW_FORM_string:
                val = r.cstr()
            elif form == _DW_FORM_line_strp:
                val = _strp(debug_line_str, r.u(offsz), path, ".debug_line_str")
            elif form == _DW_FORM_strp:
                val = _strp(debug_str, r.u(offsz), path, ".debug_str")
            elif form in (_DW_FORM_udata,):
                val = r.uleb()
            elif form == _DW_FORM_data1:
                val = r.u(1)
            elif form == _DW_FORM_data2:
                val = r.u(2)
            elif form == _DW_FORM_data4:
                val = r.u(4)
            elif form == _DW_FORM_data8:
                val = r.u(8)
            elif form == _DW_FORM_data16:
                r.need(16)
                r.pos += 16
                val = None
            elif form == _DW_FORM_block:
                n = r.uleb()
                r.need(n)
                r.pos += n
                val = None
            elif form == _DW_FORM_block1:
                n = r.u(1)
                r.need(n)
                r.pos += n
                val = None
            elif form == _DW_FORM_strx1:
                r.u(1)
                val = ""
            elif form == _DW_FORM_strx2:
                r.u(2)
                val = ""
            elif form == _DW_FORM_strx3:
                r.u(3)
                val = ""
            elif form in (_DW_FORM_strx4,):
                r.u(4)
                val = ""
            elif form == _DW_FORM_strx:
                r.uleb()
                val = ""
            else:
                raise FormatError(path, f"unsupported form {form:#x} in a DWARF 5 line header",
                                  r.pos)
            ent[content] = val
        out.append(ent)
    return out

