"""A narrow, fast reader of ``.debug_info``: subprograms and their inlining trees.

pyelftools materialises every DIE as an object and caches them with list insertions (13.5 s and
950 MB on libpython3.11); structure recovery needs only a few tags and attributes. This reader
walks each unit linearly, skips uninteresting DIEs by a size precomputed per abbreviation (or by
``DW_AT_sibling``), and decodes attributes only for compile units, subprograms, inlined
subroutines and the lexical blocks they sit in. DWARF 2–5, 32- and 64-bit units, string and
address indexes, ``.debug_ranges``/``.debug_rnglists``, dwz's ``.gnu_debugaltlink``
supplementary file, and split DWARF (``-gsplit-dwarf``, DWARF 5 and GNU's DWARF 4 form: a
skeleton unit here, the DIEs in a ``.dwo`` file found by its name and ``DW_AT_comp_dir``,
addresses in this file's ``.debug_addr``) are handled.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from callpath.errors import FormatError

if TYPE_CHECKING:
    from callpath.structure.dwarf_units import UnitCache, UnitRecords

TAG_compile_unit = 0x11
TAG_partial_unit = 0x3C
TAG_subprogram = 0x2E
TAG_inlined_subroutine = 0x1D
TAG_lexical_block = 0x0B
TAG_namespace = 0x39
TAG_skeleton_unit = 0x4A
_WALK_TAGS = {TAG_compile_unit, TAG_partial_unit, TAG_skeleton_unit, TAG_subprogram,
              TAG_inlined_subroutine, TAG_lexical_block, TAG_namespace}

AT_sibling = 0x01
AT_name = 0x03
AT_stmt_list = 0x10
AT_low_pc = 0x11
AT_high_pc = 0x12
AT_comp_dir = 0x1B
AT_inline = 0x20
AT_abstract_origin = 0x31
AT_decl_file = 0x3A
AT_decl_line = 0x3B
AT_declaration = 0x3C
AT_specification = 0x47
AT_entry_pc = 0x52
AT_ranges = 0x55
AT_call_file = 0x58
AT_call_line = 0x59
AT_linkage_name = 0x6E
AT_str_offsets_base = 0x72
AT_addr_base = 0x73
AT_rnglists_base = 0x74
AT_dwo_name = 0x76
AT_noreturn = 0x87
AT_MIPS_linkage_name = 0x2007
AT_GNU_dwo_name = 0x2130
AT_GNU_ranges_base = 0x2132
AT_GNU_addr_base = 0x2133
_WANTED = {AT_sibling, AT_name, AT_stmt_list, AT_low_pc, AT_high_pc, AT_comp_dir,
           AT_abstract_origin, AT_decl_file, AT_decl_line, AT_declaration, AT_specification,
           AT_ranges, AT_call_file, AT_call_line, AT_linkage_name, AT_str_offsets_base,
           AT_addr_base, AT_rnglists_base, AT_noreturn, AT_MIPS_linkage_name, AT_dwo_name,
           AT_GNU_dwo_name, AT_GNU_ranges_base, AT_GNU_addr_base}

# Fixed sizes of forms; None = variable, -1 = address size, -2 = offset size.
_FIXED: dict[int, int | None] = {
    0x01: -1, 0x03: None, 0x04: None, 0x05: 2, 0x06: 4, 0x07: 8, 0x08: None, 0x09: None,
    0x0A: None, 0x0B: 1, 0x0C: 1, 0x0D: None, 0x0E: -2, 0x0F: None, 0x10: -2, 0x11: 1, 0x12: 2,
    0x13: 4, 0x14: 8, 0x15: None, 0x16: None, 0x17: -2, 0x18: None, 0x19: 0, 0x1A: None,
    0x1B: None, 0x1C: 4, 0x1D: -2, 0x1E: 16, 0x1F: -2, 0x20: 8, 0x21: 0, 0x22: None, 0x23: None,
    0x24: 8, 0x25: 1, 0x26: 2, 0x27: 3, 0x28: 4, 0x29: 1, 0x2A: 2, 0x2B: 3, 0x2C: 4,
    0x1F01: None, 0x1F02: None, 0x1F20: -2, 0x1F21: -2,
}
_REF_LOCAL = {0x11, 0x12, 0x13, 0x14, 0x15}
_FORM_addr = 0x01
_ADDRX = {0x1B, 0x29, 0x2A, 0x2B, 0x2C, 0x1F01}
_STRX = {0x1A, 0x25, 0x26, 0x27, 0x28, 0x1F02}


@dataclass
class Subprogram:
    """A concrete (code-carrying) subprogram DIE."""

    offset: int
    ranges: list[tuple[int, int]]
    name_ref: tuple[int, int]  # (alt?, offset) of the DIE whose name it carries
    decl_file: int  # global file id, -1 unknown
    decl_line: int
    noreturn: bool
    name: str = ""
    link_name: str = ""


@dataclass
class Inlined:
    """One ``DW_TAG_inlined_subroutine``: a call of ``name`` at ``call_file:call_line``."""

    sub: int  # index of the enclosing Subprogram
    parent: int  # index of the enclosing Inlined, -1 at the subprogram's top
    ranges: list[tuple[int, int]]
    origin: tuple[int, int]
    call_file: int
    call_line: int
    name: str = ""


@dataclass
class DebugInfo:
    units: list[tuple[int, str]] = field(default_factory=list)  # (stmt_list, comp_dir)
    subprograms: list[Subprogram] = field(default_factory=list)
    inlined: list[Inlined] = field(default_factory=list)
    #: Names of subprograms marked DW_AT_noreturn, in any unit read.
    noreturn_names: set[str] = field(default_factory=set)
    #: The same per unit (by the offset of its unit in the main file's ``.debug_info``): a
    #: call is taken as never returning where the caller's own unit says so.
    unit_noreturn: dict[int, set[str]] = field(default_factory=dict)


@dataclass
class _Recorder:
    """What a whole walk of a unit notes for :mod:`~callpath.structure.dwarf_units`: each
    subtree a limited walk may skip, ``(ranges, DIE offset, end offset)``, and the DIE
    offset of each inlined record."""

    skips: list[tuple[list[tuple[int, int]], int, int]] = field(default_factory=list)
    inl_offs: list[int] = field(default_factory=list)


@dataclass
class _Abbrev:
    tag: int
    children: bool
    attrs: list[tuple[int, int, int]]  # (name, form, implicit const)
    size: int | None  # fixed byte size of all attributes, None if variable


class _Sections:
    """The byte strings of one file's DWARF sections."""

    def __init__(self, path: str, get: Callable[[str], bytes | None]) -> None:
        self.path = path
        self.info = get(".debug_info") or b""
        self.abbrev = get(".debug_abbrev") or b""
        self.str = get(".debug_str")
        self.line_str = get(".debug_line_str")
        self.str_offsets = get(".debug_str_offsets")
        self.addr = get(".debug_addr")
        self.ranges = get(".debug_ranges")
        self.rnglists = get(".debug_rnglists")
        self.get = get
        self.abbrev_cache: dict[int, dict[int, _Abbrev]] = {}
        self.unit_starts: list[int] = []


class _Unit:
    __slots__ = ("abbrevs", "addr_base", "addr_size", "alt", "base", "die_start",
                 "dwo_name_seen", "end", "offset", "offsz", "ranges_base", "rnglists_base", "sec",
                 "str_offsets_base", "unit_type", "version")

    def __init__(self, sec: _Sections, offset: int) -> None:
        d = sec.info
        self.sec = sec
        self.offset = offset
        self.alt = 0  # which file: 0 main, 1 dwz supplement, 2+ a split .dwo
        self.dwo_name_seen = False  # a DWARF 4 (GNU) skeleton unit
        self.unit_type = 1
        if offset + 11 > len(d):
            raise FormatError(sec.path, "truncated unit header in .debug_info", offset)
        length = int.from_bytes(d[offset:offset + 4], "little")
        pos = offset + 4
        self.offsz = 4
        if length == 0xFFFFFFFF:
            length = int.from_bytes(d[pos:pos + 8], "little")
            pos += 8
            self.offsz = 8
        self.end = pos + length
        if self.end > len(d) or length < 7:
            raise FormatError(sec.path, "unit runs past the end of .debug_info", offset)
        self.version = int.from_bytes(d[pos:pos + 2], "little")
        pos += 2
        if not 2 <= self.version <= 5:
            raise FormatError(sec.path, f"unsupported DWARF version {self.version} "
                              "(expected 2..5)", offset)
        if self.version >= 5:
            unit_type = self.unit_type = d[pos]
            self.addr_size = d[pos + 1]
            abbrev_off = int.from_bytes(d[pos + 2:pos + 2 + self.offsz], "little")
            pos += 2 + self.offsz
            if unit_type in (4, 5):  # skeleton / split_compile: dwo id
                pos += 8
            elif unit_type in (2, 6):  # type / split_type: signature + type offset
                pos += 8 + self.offsz
        else:
            abbrev_off = int.from_bytes(d[pos:pos + self.offsz], "little")
            pos += self.offsz
            self.addr_size = d[pos]
            pos += 1
        if self.addr_size not in (4, 8):
            raise FormatError(sec.path, f"unsupported address size {self.addr_size}", offset)
        self.die_start = pos
        self.abbrevs = _abbrevs(sec, abbrev_off, self.addr_size, self.offsz)
        self.base = 0
        self.str_offsets_base = 8
        self.addr_base = 8
        self.rnglists_base = 0
        self.ranges_base = 0  # DWARF 4 split units: DW_AT_GNU_ranges_base of the skeleton


def uleb(d: bytes, pos: int) -> tuple[int, int]:
    """An unsigned LEB128 number at ``pos``: (value, position after it); IndexError when cut."""
    result = shift = 0
    while True:
        b = d[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, pos


def sleb(d: bytes, pos: int) -> tuple[int, int]:
    """A signed LEB128 number at ``pos``: (value, position after it); IndexError when cut."""
    result = shift = 0
    while True:
        b = d[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            if b & 0x40:
                result -= 1 << shift
            return result, pos


def _abbrevs(sec: _Sections, off: int, addr_size: int, offsz: int) -> dict[int, _Abbrev]:
    key = off * 64 + addr_size * 8 + offsz
    got = sec.abbrev_cache.get(key)
    if got is not None:
        return got
    d = sec.abbrev
    out: dict[int, _Abbrev] = {}
    pos = off
    try:
        while True:
            code, pos = uleb(d, pos)
            if code == 0:
                break
            tag, pos = uleb(d, pos)
            children = d[pos] != 0
            pos += 1
            attrs: list[tuple[int, int, int]] = []
            size: int | None = 0
            while True:
                name, pos = uleb(d, pos)
                form, pos = uleb(d, pos)
                if name == 0 and form == 0:
                    break
                const = 0
                if form == 0x21:
                    const, pos = sleb(d, pos)
                attrs.append((name, form, const))
                if form not in _FIXED:
                    raise FormatError(sec.path, f"unknown DWARF form {form:#x} in abbreviation "
                                      f"{code}", pos)
                fs = _FIXED[form]
                if fs is None or size is None:
                    size = None
                else:
                    size += addr_size if fs == -1 else offsz if fs == -2 else fs
            out[code] = _Abbrev(tag, children, attrs, size)
    except IndexError:
        raise FormatError(sec.path, "truncated .debug_abbrev", pos) from None
    sec.abbrev_cache[key] = out
    return out


def _read_attrs(u: _Unit, pos: int, ab: _Abbrev,
                want: set[int] | None) -> tuple[dict[int, tuple[int, object]], int]:
    """Decode (or skip) the attributes of one DIE; returns {name: (form, value)} and the end."""
    d = u.sec.info
    out: dict[int, tuple[int, object]] = {}
    addr_size, offsz = u.addr_size, u.offsz
    for name, form, const in ab.attrs:
        while form == 0x16:  # indirect
            form, pos = uleb(d, pos)
        fs = _FIXED.get(form)
        keep = want is None or name in want
        val: object = None
        if fs is not None:
            n = addr_size if fs == -1 else offsz if fs == -2 else fs
            if keep:
                val = int.from_bytes(d[pos:pos + n], "little") if n else (
                    const if form == 0x21 else 1)
            pos += n
        elif form == 0x08:  # string
            end = d.find(b"\0", pos)
            if end < 0:
                raise FormatError(u.sec.path, "unterminated string in .debug_info", pos)
            if keep:
                val = d[pos:end].decode("utf-8", "replace")
            pos = end + 1
        elif form in (0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02):
            val, pos = uleb(d, pos)
        elif form == 0x0D:
            val, pos = sleb(d, pos)
        elif form in (0x09, 0x18):
            n, pos = uleb(d, pos)
            pos += n
        elif form == 0x0A:
            pos += 1 + d[pos]
        elif form == 0x03:
            pos += 2 + int.from_bytes(d[pos:pos + 2], "little")
        elif form == 0x04:
            pos += 4 + int.from_bytes(d[pos:pos + 4], "little")
        else:
            raise FormatError(u.sec.path, f"unsupported DWARF form {form:#x}", pos)
        if keep:
            out[name] = (form, val)
    return out, pos


class DwarfReader:
    """Reads subprograms and inlining trees of one file (plus its dwz supplementary file)."""

    def __init__(self, path: str, get: Callable[[str], bytes | None],
                 alt_get: Callable[[str], bytes | None] | None = None,
                 open_dwo: Callable[[str, str], tuple[str, Callable[[str], bytes | None]] | None]
                 | None = None) -> None:
        self.main = _Sections(path, get)
        self.alt = _Sections(path + " (dwz supplementary file)", alt_get) if alt_get else None
        #: Split DWARF: (name, comp_dir) -> the .dwo file's section getter (None: not found).
        self.open_dwo = open_dwo
        self.dwo: list[_Sections] = []  # alt id 2 + k
        self._names: dict[tuple[int, int], tuple[str, str, tuple[int, int] | None]] = {}
        #: sorted disjoint ``(lo, hi)`` lists: walk only the subprograms with code there
        #: (:meth:`read`); None: all
        self.near: tuple[list[int], list[int]] | None = None
        self._unit_cache: dict[tuple[int, int], _Unit] = {}

    # -- strings and addresses -------------------------------------------------------------

    def _string(self, u: _Unit, form: int, val: object, alt: int) -> str:
        sec = u.sec
        if form == 0x08:
            return str(val)
        if form == 0x0E:
            return _cstr(sec.str, int(val), sec.path, ".debug_str")  # type: ignore[call-overload]
        if form == 0x1F:
            return _cstr(sec.line_str, int(val), sec.path,  # type: ignore[call-overload]
                         ".debug_line_str")
        if form in _STRX:
            so = sec.str_offsets
            i = u.str_offsets_base + int(val) * u.offsz  # type: ignore[call-overload]
            if so is None or i + u.offsz > len(so):
                raise FormatError(sec.path, f"string index {val} outside .debug_str_offsets")
            return _cstr(sec.str, int.from_bytes(so[i:i + u.offsz], "little"), sec.path,
                         ".debug_str")
        if form in (0x1F21, 0x1D):  # GNU_strp_alt / strp_sup: in the supplementary file
            if self.alt is None:
                return ""
            return _cstr(self.alt.str, int(val), self.alt.path,  # type: ignore[call-overload]
                         ".debug_str")
        return ""

    def _address(self, u: _Unit, form: int, val: object) -> int:
        if form in _ADDRX:
            a = u.sec.addr
            i = u.addr_base + int(val) * u.addr_size  # type: ignore[call-overload]
            if a is None or i + u.addr_size > len(a):
                raise FormatError(u.sec.path, f"address index {val} outside .debug_addr")
            return int.from_bytes(a[i:i + u.addr_size], "little")
        return int(val)  # type: ignore[call-overload, no-any-return]

    def _ranges(self, u: _Unit, attrs: dict[int, tuple[int, object]]) -> list[tuple[int, int]]:
        if AT_low_pc in attrs:
            f, v = attrs[AT_low_pc]
            lo = self._address(u, f, v)
            if AT_high_pc not in attrs:
                return [(lo, lo + 1)]
            hf, hv = attrs[AT_high_pc]
            hi = self._address(u, hf, hv) if hf == _FORM_addr or hf in _ADDRX else lo + int(hv)  # type: ignore[call-overload]
            return [(lo, hi)] if hi > lo else []
        if AT_ranges in attrs:
            f, v = attrs[AT_ranges]
            return self._range_list(u, f, int(v))  # type: ignore[call-overload]
        return []

    def _range_list(self, u: _Unit, form: int, v: int) -> list[tuple[int, int]]:
        sec = u.sec
        out: list[tuple[int, int]] = []
        asz = u.addr_size
        try:
            if u.version < 5:
                d = sec.ranges
                if d is None:
                    raise FormatError(sec.path, "DW_AT_ranges without a .debug_ranges section")
                base, pos, top = u.base, v + u.ranges_base, (1 << (8 * asz)) - 1
                while True:
                    a = int.from_bytes(d[pos:pos + asz], "little")
                    b = int.from_bytes(d[pos + asz:pos + 2 * asz], "little")
                    if pos + 2 * asz > len(d):
                        raise FormatError(sec.path, "truncated .debug_ranges", pos)
                    pos += 2 * asz
                    if a == 0 and b == 0:
                        break
                    if a == top:
                        base = b
                    elif b > a:
                        out.append((base + a, base + b))
                return out
            d = sec.rnglists
            if d is None:
                raise FormatError(sec.path, "DW_AT_ranges without a .debug_rnglists section")
            if form == 0x23:  # rnglistx
                i = u.rnglists_base + v * u.offsz
                pos = u.rnglists_base + int.from_bytes(d[i:i + u.offsz], "little")
            else:
                pos = v
            base = u.base
            while True:
                kind = d[pos]
                pos += 1
                if kind == 0:
                    break
                if kind == 1:
                    x, pos = uleb(d, pos)
                    base = self._address(u, 0x1B, x)
                elif kind in (2, 3):
                    x, pos = uleb(d, pos)
                    y, pos = uleb(d, pos)
                    lo = self._address(u, 0x1B, x)
                    hi = self._address(u, 0x1B, y) if kind == 2 else lo + y
                    out.append((lo, hi))
                elif kind == 4:
                    x, pos = uleb(d, pos)
                    y, pos = uleb(d, pos)
                    out.append((base + x, base + y))
                elif kind == 5:
                    base = int.from_bytes(d[pos:pos + asz], "little")
                    pos += asz
                elif kind == 6:
                    lo = int.from_bytes(d[pos:pos + asz], "little")
                    hi = int.from_bytes(d[pos + asz:pos + 2 * asz], "little")
                    pos += 2 * asz
                    out.append((lo, hi))
                elif kind == 7:
                    lo = int.from_bytes(d[pos:pos + asz], "little")
                    pos += asz
                    y, pos = uleb(d, pos)
                    out.append((lo, lo + y))
                else:
                    raise FormatError(sec.path, f"unknown range list entry kind {kind}", pos - 1)
        except IndexError:
            raise FormatError(sec.path, "truncated range list", v) from None
        return [(a, b) for a, b in out if b > a]

    # -- name resolution -------------------------------------------------------------------

    def _unit_at(self, alt: int, offset: int) -> _Unit:
        sec = self._sec(alt)
        if not sec.unit_starts:
            pos = 0
            while pos < len(sec.info):
                sec.unit_starts.append(pos)
                length = int.from_bytes(sec.info[pos:pos + 4], "little")
                pos += 4 + (int.from_bytes(sec.info[pos + 4:pos + 12], "little") + 8
                            if length == 0xFFFFFFFF else length)
        import bisect
        i = bisect.bisect_right(sec.unit_starts, offset) - 1
        if i < 0:
            raise FormatError(sec.path, f"DIE reference {offset:#x} outside .debug_info")
        key = (alt, sec.unit_starts[i])
        u = self._unit_cache.get(key)
        if u is None:
            u = self._unit_cache[key] = _Unit(sec, sec.unit_starts[i])
            u.alt = alt
            self._unit_base_attrs(u)
        return u

    def _sec(self, alt: int) -> _Sections:
        if alt >= 2:
            return self.dwo[alt - 2]
        return self.alt if alt and self.alt is not None else self.main

    def _unit_base_attrs(self, u: _Unit) -> dict[int, tuple[int, object]]:
        d = u.sec.info
        code, pos = uleb(d, u.die_start)
        ab = u.abbrevs.get(code)
        if ab is None:
            raise FormatError(u.sec.path, f"unknown abbreviation code {code}", u.die_start)
        attrs, _ = _read_attrs(u, pos, ab, _WANTED)
        for at, slot in ((AT_str_offsets_base, "str_offsets_base"), (AT_addr_base, "addr_base"),
                         (AT_rnglists_base, "rnglists_base"), (AT_GNU_addr_base, "addr_base"),
                         (AT_GNU_ranges_base, "ranges_base")):
            if at in attrs:
                setattr(u, slot, int(attrs[at][1]))  # type: ignore[call-overload]
        if AT_low_pc in attrs:
            f, v = attrs[AT_low_pc]
            u.base = self._address(u, f, v)
        u.dwo_name_seen = AT_GNU_dwo_name in attrs
        return attrs

    def _ref(self, u: _Unit, alt: int, form: int, val: object) -> tuple[int, int]:
        v = int(val)  # type: ignore[call-overload]
        if form in _REF_LOCAL:
            return (alt, u.offset + v)
        if form in (0x1F20, 0x1C, 0x24):  # GNU_ref_alt / ref_sup
            return (1, v)
        return (alt, v)  # ref_addr

    def name_of(self, ref: tuple[int, int], depth: int = 0) -> tuple[str, str]:
        """(name, linkage name) of the DIE at ``ref``, following origins and specifications."""
        got = self._names.get(ref)
        if got is None:
            alt, off = ref
            if alt == 1 and self.alt is None:
                return ("", "")
            u = self._unit_at(alt, off)
            d = u.sec.info
            try:
                code, pos = uleb(d, off)
                ab = u.abbrevs.get(code)
                if ab is None:
                    raise FormatError(u.sec.path, f"unknown abbreviation code {code}", off)
                attrs, _ = _read_attrs(u, pos, ab, _WANTED)
            except IndexError:
                raise FormatError(u.sec.path, "truncated DIE", off) from None
            got = self._name_entry(u, alt, attrs)
            self._names[ref] = got
        name, link, nxt = got
        if (not name or not link) and nxt is not None and depth < 8:
            n2, l2 = self.name_of(nxt, depth + 1)
            return (name or n2, link or l2)
        return (name, link)

    def _name_entry(self, u: _Unit, alt: int, attrs: dict[int, tuple[int, object]]
                    ) -> tuple[str, str, tuple[int, int] | None]:
        name = link = ""
        if AT_name in attrs:
            name = self._string(u, *attrs[AT_name], alt)
        for at in (AT_linkage_name, AT_MIPS_linkage_name):
            if at in attrs:
                link = self._string(u, *attrs[at], alt)
                break
        nxt = None
        for at in (AT_abstract_origin, AT_specification):
            if at in attrs:
                nxt = self._ref(u, alt, *attrs[at])
                break
        return (name, link, nxt)

    def unit_offsets(self) -> list[int]:
        """Offsets of every unit of the main file's ``.debug_info`` (from their lengths)."""
        sec = self.main
        if not sec.unit_starts:
            pos, d = 0, sec.info
            while pos + 4 <= len(d):
                sec.unit_starts.append(pos)
                length = int.from_bytes(d[pos:pos + 4], "little")
                pos += 4 + (int.from_bytes(d[pos + 4:pos + 12], "little") + 8
                            if length == 0xFFFFFFFF else length)
        return sec.unit_starts

    def units(self, only: set[int] | None = None, cache: UnitCache | None = None
              ) -> list[tuple[int, str]]:
        """``(DW_AT_stmt_list, DW_AT_comp_dir)`` of every unit (or of the units at the
        offsets ``only``), from the unit DIEs alone (or ``cache``'s records of them)."""
        out: list[tuple[int, str]] = []
        sec = self.main
        for pos in self.unit_offsets():
            if only is not None and pos not in only:
                continue
            kept = cache.get(pos) if cache is not None else None
            if kept is not None:
                if kept.stmt >= 0:
                    out.append((kept.stmt, kept.comp_dir))
                continue
            u = _Unit(sec, pos)
            try:
                top = self._unit_base_attrs(u)
            except IndexError:
                raise FormatError(sec.path, "truncated unit DIE", pos) from None
            if AT_stmt_list in top:
                cd = self._string(u, *top[AT_comp_dir], 0) if AT_comp_dir in top else ""
                out.append((int(top[AT_stmt_list][1]), cd))  # type: ignore[call-overload]
        return out

    def unit_ranges(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        """The code each unit covers: ``(units of unknown extent, [(lo, hi, unit)...])``.

        From ``.debug_aranges`` for the units it lists; for the others, from the unit DIE's
        ``DW_AT_low_pc``/``high_pc``/``ranges`` (read only for those: parsing every unit's
        abbreviations was 0.7 s of libc's 2063 units). A unit with neither may hold code
        anywhere. This is what lets :mod:`callpath.structure.binary` read only the units
        holding the procedures a measurement touched, and what decides, for both that and
        the whole binary, which units' ``DW_AT_noreturn`` a caller sees."""
        offsets = self.unit_offsets()
        spans: list[tuple[int, int, int]] = []
        listed: set[int] = set()
        ar = self.main.get(".debug_aranges")
        if ar:
            try:
                spans, listed = _aranges(ar)
            except (IndexError, ValueError):
                raise FormatError(self.main.path, "corrupt .debug_aranges") from None
        unknown: list[int] = []
        for off in offsets:
            if off in listed:
                continue
            u = _Unit(self.main, off)
            try:
                top = self._unit_base_attrs(u)
                rng = self._ranges(u, top)
            except IndexError:
                raise FormatError(self.main.path, "truncated unit DIE", off) from None
            if u.unit_type in (2, 6):  # type units hold no code
                continue
            if rng:
                spans.extend((a, b, off) for a, b in rng)
            else:
                unknown.append(off)
        known = set(offsets)
        return unknown, [x for x in spans if x[2] in known]

    # -- the walk --------------------------------------------------------------------------

    def read(self, file_of: Callable[[int, int], int], only: set[int] | None = None,
             cache: UnitCache | None = None) -> DebugInfo:
        """Walk every unit (or the units at the offsets ``only``). ``file_of(stmt_list,
        index)`` maps a unit's file number to a global file id (the line tables are decoded
        first, so their file tables are known). With ``cache``, a unit is walked whole the
        first time and its records kept there; what a walk limited to :attr:`near` would
        find is then taken from them (:mod:`callpath.structure.dwarf_units`)."""
        out = DebugInfo()
        sec = self.main
        walked_s: list[tuple[int, int]] = []  # spans of records whose names are to resolve
        walked_i: list[tuple[int, int]] = []
        for pos in self.unit_offsets():
            if only is not None and pos not in only:
                continue
            if cache is not None:
                kept = cache.get(pos)
                if kept is None:
                    kept = self._walk_whole(pos)
                    if kept is not None:
                        cache.put(pos, kept)
                if kept is not None:
                    self._add_kept(pos, kept, out, file_of)
                    continue
            s0, i0 = len(out.subprograms), len(out.inlined)
            u = _Unit(sec, pos)
            self._unit_cache[(0, pos)] = u
            try:
                self._walk_unit(u, out, file_of)
            except IndexError:
                raise FormatError(sec.path, "truncated or corrupt DIE in .debug_info",
                                  u.offset) from None
            if u.unit_type == 4 or (u.version < 5 and u.dwo_name_seen):
                self._walk_split(u, out, file_of)  # a skeleton: the DIEs are in a .dwo file
            walked_s.append((s0, len(out.subprograms)))
            walked_i.append((i0, len(out.inlined)))
        for a, b in walked_s:
            for s in out.subprograms[a:b]:
                s.name, s.link_name = self.name_of(s.name_ref)
        for a, b in walked_i:
            for i in out.inlined[a:b]:
                i.name = self.name_of(i.origin)[0]
        return out

    def _walk_whole(self, pos: int) -> UnitRecords | None:
        """The records of the unit at ``pos``, walked whole, for the cache (None for a
        skeleton unit, whose DIEs are in a ``.dwo`` file: not kept)."""
        from callpath.structure.dwarf_units import records_of

        u = _Unit(self.main, pos)
        self._unit_cache[(0, pos)] = u
        tmp = DebugInfo()
        rec = _Recorder()
        near, self.near = self.near, None
        try:
            self._walk_unit(u, tmp, lambda _stmt, index: index, rec=rec)
        except IndexError:
            raise FormatError(self.main.path, "truncated or corrupt DIE in .debug_info",
                              u.offset) from None
        finally:
            self.near = near
        if u.unit_type == 4 or (u.version < 5 and u.dwo_name_seen):
            return None
        stmt, comp_dir = tmp.units[0] if tmp.units else (-1, "")
        sub_offs = [s.offset for s in tmp.subprograms]
        subs = [(s.offset, s.ranges, *self.name_of(s.name_ref), s.decl_file, s.decl_line,
                 s.noreturn) for s in tmp.subprograms]
        inls = [(i.sub, i.parent, i.ranges, i.call_file, i.call_line,
                 self.name_of(i.origin)[0]) for i in tmp.inlined]
        skips = [(rng, bisect.bisect_left(sub_offs, d0), bisect.bisect_left(sub_offs, end),
                  bisect.bisect_left(rec.inl_offs, d0), bisect.bisect_left(rec.inl_offs, end))
                 for rng, d0, end in rec.skips]
        return records_of(stmt, comp_dir, sorted(tmp.unit_noreturn.get(pos, set())),
                          sorted(tmp.noreturn_names), subs, inls, skips)

    def _add_kept(self, pos: int, kept: UnitRecords, out: DebugInfo,
                  file_of: Callable[[int, int], int]) -> None:
        """Add to ``out`` what a walk of the unit at ``pos`` limited to :attr:`near` finds,
        from its records (file numbers mapped by ``file_of``)."""
        stmt = kept.stmt
        if stmt >= 0:
            out.units.append((stmt, kept.comp_dir))
        out.unit_noreturn.setdefault(pos, set()).update(kept.unit_noreturn)
        out.noreturn_names.update(kept.noreturn)
        ks, ki = kept.near(self.near)
        c, names = kept.cols, kept.names

        def file(f: int) -> int:  # -1 where the unit has no line table, as the walk gives
            return file_of(stmt, f) if f >= 0 else -1

        first = len(out.subprograms)
        sub_at = np.full(len(c["s_off"]), -1, dtype=np.int64)
        sub_at[ks] = np.arange(first, first + len(ks))
        for k, off, nm, ln, f, line, nr in zip(
                ks.tolist(), c["s_off"][ks].tolist(), c["s_name"][ks].tolist(),
                c["s_link"][ks].tolist(), c["s_file"][ks].tolist(), c["s_line"][ks].tolist(),
                c["s_noret"][ks].tolist(), strict=True):
            out.subprograms.append(Subprogram(off, kept.ranges("s", k), (0, off), file(f),
                                              line, bool(nr), names[nm], names[ln]))
        first = len(out.inlined)
        inl_at = np.full(len(c["i_sub"]), -1, dtype=np.int64)
        inl_at[ki] = np.arange(first, first + len(ki))
        for k, sub, par, f, line, nm in zip(
                ki.tolist(), sub_at[c["i_sub"][ki]].tolist(), c["i_parent"][ki].tolist(),
                c["i_file"][ki].tolist(), c["i_line"][ki].tolist(), c["i_name"][ki].tolist(),
                strict=True):
            out.inlined.append(Inlined(sub, int(inl_at[par]) if par >= 0 else -1,
                                       kept.ranges("i", k), (0, 0), file(f), line, names[nm]))

    def _walk_split(self, skel: _Unit, out: DebugInfo,
                    file_of: Callable[[int, int], int]) -> None:
        """Walk the split unit of the skeleton ``skel`` in its ``.dwo`` file, if found.

        Its addresses are indexes into this file's ``.debug_addr`` at the skeleton's
        ``DW_AT_addr_base``; its file numbers are the skeleton's line table's.
        """
        top = self._unit_base_attrs(skel)
        at = top.get(AT_dwo_name) or top.get(AT_GNU_dwo_name)
        if at is None or self.open_dwo is None:
            return
        name = self._string(skel, *at, 0)
        comp_dir = self._string(skel, *top[AT_comp_dir], 0) if AT_comp_dir in top else ""
        got = self.open_dwo(name, comp_dir)
        if got is None:
            return  # no .dwo: lines still come from the skeleton's line table
        path, get = got
        main = self.main

        def dwo_get(sec_name: str) -> bytes | None:
            if sec_name == ".debug_addr":
                return main.addr
            if sec_name == ".debug_ranges":  # DWARF 4 split: ranges stay in the binary
                return main.ranges
            return get(sec_name + ".dwo")

        dsec = _Sections(path, dwo_get)
        self.dwo.append(dsec)
        alt = 1 + len(self.dwo)
        stmt = int(top[AT_stmt_list][1]) if AT_stmt_list in top else -1  # type: ignore[call-overload]
        pos = 0
        while pos < len(dsec.info):
            u = _Unit(dsec, pos)
            dsec.unit_starts.append(pos)
            u.alt = alt
            self._unit_cache[(alt, pos)] = u
            if u.unit_type == 5 or u.version < 5:  # DW_UT_split_compile, or GNU's DWARF 4
                u.addr_base = skel.addr_base
                u.base = skel.base
                u.rnglists_base = 12 if u.offsz == 4 else 20  # past the list table's header
                u.ranges_base = skel.ranges_base
                if u.version < 5:
                    u.str_offsets_base = 0  # GNU's .debug_str_offsets.dwo has no header
                try:
                    self._walk_unit(u, out, file_of, stmt_of_skeleton=stmt,
                                    key=skel.offset)
                except IndexError:
                    raise FormatError(path, "truncated or corrupt DIE in .debug_info.dwo",
                                      u.offset) from None
            pos = u.end

    def _walk_unit(self, u: _Unit, out: DebugInfo,
                   file_of: Callable[[int, int], int],
                   stmt_of_skeleton: int | None = None, key: int | None = None,
                   rec: _Recorder | None = None) -> None:
        near = self.near
        d = u.sec.info
        unit_nr = out.unit_noreturn.setdefault(u.offset if key is None else key, set())
        top = self._unit_base_attrs(u)
        if stmt_of_skeleton is not None:  # a split unit: lines and files are the skeleton's
            stmt = stmt_of_skeleton
        else:
            stmt = int(top[AT_stmt_list][1]) if AT_stmt_list in top else -1  # type: ignore[call-overload]
            comp_dir = self._string(u, *top[AT_comp_dir], 0) if AT_comp_dir in top else ""
            if stmt >= 0:
                out.units.append((stmt, comp_dir))
        alt = u.alt
        abbrevs = u.abbrevs
        walk_tags = _WALK_TAGS
        # Stack of (subprogram index, inlined index, inside a subprogram) contexts for DIEs
        # with children.
        stack: list[tuple[int, int, bool]] = []
        ctx = (-1, -1, False)
        pos = u.die_start
        end = u.end
        subs, inls = out.subprograms, out.inlined
        while pos < end:
            die_off = pos
            code = d[pos]
            pos += 1
            if code >= 0x80:
                code, pos = uleb(d, pos - 1)
            if code == 0:
                if stack:
                    ctx = stack.pop()
                continue
            ab = abbrevs.get(code)
            if ab is None:
                raise FormatError(u.sec.path, f"unknown abbreviation code {code}", pos)
            if ab.tag not in walk_tags:
                if ab.children:
                    attrs, npos = _read_attrs(u, pos, ab, {AT_sibling})
                    sib = attrs.get(AT_sibling)
                    if sib is not None and sib[0] in _REF_LOCAL:
                        target = u.offset + int(sib[1])  # type: ignore[call-overload]
                        if npos <= target <= end:
                            pos = target
                            continue
                    pos = npos
                    stack.append(ctx)
                elif ab.size is not None:
                    pos += ab.size
                else:
                    _, pos = _read_attrs(u, pos, ab, set())
                continue
            attrs, pos = _read_attrs(u, pos, ab, _WANTED)
            new = ctx
            tag = ab.tag
            if tag == TAG_subprogram:
                if alt != 1:
                    self._names[(alt, die_off)] = self._name_entry(u, alt, attrs)
                if AT_noreturn in attrs and AT_name in attrs:
                    nm = self._string(u, *attrs[AT_name], alt)
                    out.noreturn_names.add(nm)
                    if not ctx[2]:  # declared at file scope (not inside a function)
                        unit_nr.add(nm)
                rng = self._ranges(u, attrs) if AT_declaration not in attrs else []
                skip_to = -1  # where its subtree ends, when it can be skipped
                if ab.children:
                    sib = attrs.get(AT_sibling)
                    if sib is not None and sib[0] in _REF_LOCAL:
                        target = u.offset + int(sib[1])  # type: ignore[call-overload]
                        if pos <= target <= end:
                            skip_to = target
                if skip_to >= 0:
                    if near is not None and not _meets(rng, *near):
                        # no code near the addresses asked for: its subtree is skipped whole
                        pos = skip_to
                        continue
                    if rec is not None:  # a subtree that such a walk may skip
                        rec.skips.append((rng, die_off, skip_to))
                if AT_declaration not in attrs:
                    if rng:
                        df = -1
                        if AT_decl_file in attrs and stmt >= 0:
                            df = file_of(stmt, int(attrs[AT_decl_file][1]))  # type: ignore[call-overload]
                        dl = int(attrs[AT_decl_line][1]) if AT_decl_line in attrs else 0  # type: ignore[call-overload]
                        subs.append(Subprogram(die_off, rng, (alt, die_off), df, dl,
                                               AT_noreturn in attrs))
                        new = (len(subs) - 1, -1, True)
                    else:
                        new = (-1, -1, True)
                else:
                    new = (ctx[0], ctx[1], True)
            elif tag == TAG_inlined_subroutine and ctx[0] >= 0:
                rng = self._ranges(u, attrs)
                if rng and AT_abstract_origin in attrs:
                    cf = -1
                    if AT_call_file in attrs and stmt >= 0:
                        cf = file_of(stmt, int(attrs[AT_call_file][1]))  # type: ignore[call-overload]
                    cl = int(attrs[AT_call_line][1]) if AT_call_line in attrs else 0  # type: ignore[call-overload]
                    origin = self._ref(u, alt, *attrs[AT_abstract_origin])
                    inls.append(Inlined(ctx[0], ctx[1], rng, origin, cf, cl))
                    if rec is not None:
                        rec.inl_offs.append(die_off)
                    new = (ctx[0], len(inls) - 1, ctx[2])
            if ab.children:
                stack.append(ctx)
                ctx = new


def _meets(rng: list[tuple[int, int]], lo: list[int], hi: list[int]) -> bool:
    """Whether one of the ranges ``rng`` meets one of the sorted disjoint ``[lo, hi)``."""
    for a, b in rng:
        j = bisect.bisect_left(lo, b) - 1
        if j >= 0 and hi[j] > a:
            return True
    return False


def _aranges(d: bytes) -> tuple[list[tuple[int, int, int]], set[int]]:
    """``[(lo, hi, unit offset)...]`` of ``.debug_aranges`` and the units it lists."""
    out: list[tuple[int, int, int]] = []
    listed: set[int] = set()
    pos = 0
    while pos + 4 <= len(d):
        start = pos
        length = int.from_bytes(d[pos:pos + 4], "little")
        pos += 4
        offsz = 4
        if length == 0xFFFFFFFF:
            length = int.from_bytes(d[pos:pos + 8], "little")
            pos += 8
            offsz = 8
        end = pos + length
        if length == 0 or end > len(d):
            raise ValueError("set runs past the section")
        pos += 2  # version
        cu = int.from_bytes(d[pos:pos + offsz], "little")
        pos += offsz
        asz, seg = d[pos], d[pos + 1]
        pos += 2
        if asz not in (4, 8) or seg:
            raise ValueError("unsupported address or segment size")
        pos = start + -(-(pos - start) // (2 * asz)) * (2 * asz)  # tuples are aligned
        listed.add(cu)
        while pos + 2 * asz <= end:
            a = int.from_bytes(d[pos:pos + asz], "little")
            n = int.from_bytes(d[pos + asz:pos + 2 * asz], "little")
            pos += 2 * asz
            if a == 0 and n == 0:
                break
            if n:
                out.append((a, a + n, cu))
        pos = end
    return out, listed


def _cstr(sec: bytes | None, off: int, path: str, name: str) -> str:
    if sec is None or off >= len(sec):
        raise FormatError(path, f"string offset {off:#x} outside {name}")
    end = sec.find(b"\0", off)
    return sec[off:end if end >= 0 else len(sec)].decode("utf-8", "replace")
