"""Structure of a Python source file from the bytecode the interpreter cached for it.

``import torch`` runs the module code of ~900 files, so a ``--native`` profile of a PyTorch
program has that many sources in its samples. Parsing them with :mod:`ast` took 12 s of a
2-core machine (30 MB of source); their ``__pycache__/*.pyc`` files, written when the program
imported them, unmarshal in 0.13 s and hold what the structure needs:

- one code object per function, with its qualified name (``co_qualname``) and the source
  span (``co_positions``) of every instruction: the procedures and their lines;
- a code object per comprehension and generator expression up to 3.11 (3.12 inlines list,
  set and dict comprehensions, whose ``BUILD_*`` instruction spans the expression): their loops;
- the spans of expressions, which join the lines of a multi-line statement (a sample reports
  the line of the instruction, any line of the statement).

Two things come from the source text beside the bytecode: ``for``/``while`` loops are the
statements that begin with those keywords (every version compiles them differently, their
text is the same), and a loop ends where the next statement at its indentation or less
begins. Spans that begin with a compound statement's keyword (``with``, ``try``, ``for``...)
cover the statement's whole body and are not joined.

The result is the model :func:`~callpath.structure.python_ast.structure_of_python` builds,
through the same :func:`~callpath.structure.python_ast.build_python_structure`; it is used
only where the ``.pyc`` is this interpreter's (magic number) and matches the source (its
recorded size and modification time, or its hash). ``lines``, where given, keeps only the
statements holding those lines: ``prof --no-cache``, which keeps nothing for later runs,
needs no others.
"""

from __future__ import annotations

import dis
import importlib.util
import marshal
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType

import numpy as np
import numpy.typing as npt

from callpath.model.structure import Kind, Structure
from callpath.structure.python_ast import PyScope, build_python_structure

_CO_NEWLOCALS = 0x2
_LOOP_CODES = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}
#: a span that starts with one of these is a compound statement's (header and whole body)
_COMPOUND = re.compile(rb"(?:if|elif|else|for|while|with|try|except|finally|def|class|async"
                       rb"|match|case)\b|@")
_COMPOUND_STARTS = np.array([(w[0] << 8) | w[1] for w in (
    b"if", b"el", b"fo", b"wh", b"wi", b"tr", b"ex", b"fi", b"de", b"cl", b"as", b"ma", b"ca")])
#: a line that begins a compound statement's header and does not end with its colon
_HEADER_LINE = re.compile(rb"[ \t]*(?:if|elif|while|for|with|async|except|def|class)\b"
                          rb"(?![^\n]*:[ \t\r]*$)")
_OPENERS = (b"(", b"[", b"{", b"\\", b",", b"=")
_OPENER_BYTES = np.frombuffer(b"([{\\,=", dtype=np.uint8)
_STRING = re.compile(rb"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_LOOP_LINE = re.compile(rb"[ \t]*(?:async[ \t]+)?(?:for|while)\b")
_LOOP_STARTS = np.array([(w[0] << 8) | w[1] for w in (b"fo", b"wh", b"as")])
_DEF = re.compile(rb"[ \t]*(?:async[ \t]+)?def\b")
_CLASS = re.compile(rb"[ \t]*class\b")
_FOR_ITER = dis.opmap["FOR_ITER"]
_SWAP = dis.opmap.get("SWAP", -1)
_BUILD_OPS = [dis.opmap[n] for n in ("BUILD_LIST", "BUILD_SET", "BUILD_MAP")]
#: 3.12+ inlines list/set/dict comprehensions into the enclosing code
_INLINED_COMPS = sys.version_info >= (3, 12)


def cached_code(path: str, source: bytes, st: os.stat_result) -> CodeType | None:
    """The module code object of ``path`` from its ``.pyc``, when that file was written by
    this interpreter for exactly this source; else None."""
    try:
        pyc = importlib.util.cache_from_source(path)
        with open(pyc, "rb") as f:
            data = f.read()
    except (OSError, ValueError, NotImplementedError):
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags & 1:  # hash-based (PEP 552)
        if data[8:16] != importlib.util.source_hash(source):
            return None
    elif (int.from_bytes(data[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
          or int.from_bytes(data[12:16], "little") != st.st_size & 0xFFFFFFFF):
        return None
    try:
        code = marshal.loads(memoryview(data)[16:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def structure_from_bytecode(path: str | os.PathLike[str],
                            lines: npt.ArrayLike | None = None) -> Structure | None:
    """Functions, loops and statements of the Python file at ``path`` from its cached
    bytecode; None where there is no usable ``.pyc`` (the caller parses the source then)."""
    p = str(path)
    try:
        with open(p, "rb") as f:
            source = f.read()
        st = os.stat(p)
    except OSError:
        return None
    code = cached_code(p, source, st)
    if code is None:
        return None
    try:
        return _build(p, source, code, lines)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None  # bytecode of a shape not foreseen: the caller parses the source


def _kind(code: CodeType, top: bool) -> str:
    """"module", "proc", "class" (a class body), "loop" (a comprehension), "open" (lambda)."""
    if top:
        return "module"
    name = code.co_name
    if name in _LOOP_CODES:
        return "loop"
    if not code.co_flags & _CO_NEWLOCALS:
        return "class"
    if name.startswith("<"):
        return "open"  # a lambda, 3.12's type-parameter scopes
    return "proc"


def _build(p: str, source: bytes, top: CodeType, keep: npt.ArrayLike | None) -> Structure:
    """Everything in a few passes over flat arrays of the file's lines and of all its code
    objects' instructions: some 50 numpy calls a file; Python loops only over procedures,
    loops and the few lines that continue a statement."""
    nlines = source.count(b"\n") + 2
    text = source.split(b"\n")

    def line_text(ln: int) -> bytes:
        return text[ln - 1] if 0 < ln <= len(text) else b""

    # Lines: the last non-blank byte, the indentation, whether a comment may be on it.
    arr = np.frombuffer(source + b"\n", dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    lstart = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)  # line ln: lstart[ln - 1]
    lend = nl.astype(np.int64)
    blank = (arr == 32) | (arr == 9) | (arr == 13) | (arr == 10)
    nbp = np.concatenate([[-1], np.flatnonzero(~blank), [len(arr)]])  # non-blank bytes
    last_nb = nbp[np.searchsorted(nbp, lend) - 1]
    last_char = np.where(last_nb >= lstart, arr[np.maximum(last_nb, 0)], 0)
    first_nb = nbp[np.searchsorted(nbp, lstart)]
    indent = np.where(first_nb < lend, first_nb - lstart, 1 << 30)
    # the last non-blank byte before a line's first "#" (a "#" in a string may mislead it)
    hash_at = np.concatenate([np.flatnonzero(arr == 35), [len(arr)]])
    first_hash = hash_at[np.searchsorted(hash_at, lstart)]
    has_hash = first_hash < lend
    bh = nbp[np.searchsorted(nbp, first_hash) - 1]
    before_hash = np.where(has_hash & (bh >= lstart), arr[np.maximum(bh, 0)], 0)

    # each line's first two non-blank bytes, to find the lines that begin with a keyword
    fpc = np.minimum(first_nb, len(arr) - 2)
    two = (arr[fpc].astype(np.int64) << 8) | arr[fpc + 1]

    def lines_of(pattern: re.Pattern[bytes], starts: npt.NDArray[np.int64]
                 ) -> npt.NDArray[np.int64]:
        """The lines whose first two bytes are among ``starts`` and that match ``pattern``."""
        cand = np.flatnonzero(np.isin(two, starts) & (first_nb < lend)) + 1
        return np.array([ln for ln in cand.tolist() if pattern.match(text[ln - 1])],
                        dtype=np.int64)

    # Code objects, depth first; the locations of their instructions in flat arrays.
    codes: list[CodeType] = []
    parent: list[int] = []
    kinds: list[str] = []
    stack: list[tuple[CodeType, int]] = [(top, -1)]
    while stack:
        c, par = stack.pop()
        k = len(codes)
        codes.append(c)
        parent.append(par)
        kinds.append(_kind(c, par < 0))
        stack.extend((x, k) for x in reversed(c.co_consts) if isinstance(x, CodeType))
    loc = locations(codes)
    line0, line1, col = loc.line, loc.end_line, loc.col
    real = line0 > 0
    firsts = np.array([c.co_firstlineno for c in codes], dtype=np.int64)
    lo_c: list[int] = firsts.tolist()
    hi_c: list[int] = firsts.tolist()
    if len(line0):
        seg = np.searchsorted(loc.code, np.arange(len(codes)), side="left")
        has = seg < np.searchsorted(loc.code, np.arange(len(codes)), side="right")
        segc = np.minimum(seg, len(line0) - 1)
        lo_a = np.minimum.reduceat(np.where(real, line0, 1 << 40), segc)
        hi_a = np.maximum.reduceat(np.where(real, np.maximum(line0, line1), 0), segc)
        lo_c = np.where(has & (lo_a != 1 << 40), lo_a, firsts).tolist()
        hi_c = np.maximum(np.where(has, hi_a, 0), firsts).tolist()
    for k in range(len(codes) - 1, 0, -1):  # a code's extent covers its nested ones
        hi_c[parent[k]] = max(hi_c[parent[k]], hi_c[k])

    # Statements: every instruction's first line, joined with the other lines of its span
    # unless the span is a compound statement's; a ``def`` or ``class`` statement is its
    # decorators and its header, to the colon.
    heads: list[tuple[int, int]] = []
    head_of: dict[int, int] = {}
    for k, c in enumerate(codes):
        if kinds[k] in ("proc", "class"):
            first = c.co_firstlineno
            start = _header(first, hi_c[k], line_text, _DEF if kinds[k] == "proc" else _CLASS)
            simple = 0 < start <= len(text) and last_char[start - 1] == 58 \
                and not has_hash[start - 1]  # "def f():" on one line
            heads.append((first, start if simple else _header_end(start, line_text)))
            head_of[k] = start
    first_l, last_l, col_r = line0[real], line1[real], col[real]
    multi = np.flatnonzero(last_l > first_l)
    spans = np.zeros((0, 2), dtype=np.int64)
    if len(multi):
        key = np.unique((first_l[multi] << 40) | (last_l[multi] << 16)
                        | np.clip(col_r[multi] + 1, 0, 0xFFFF))
        pairs = np.stack([key >> 40, (key >> 16) & 0xFFFFFF, (key & 0xFFFF) - 1], axis=1)
        where = lstart[np.clip(pairs[:, 0] - 1, 0, len(lstart) - 1)] + np.maximum(pairs[:, 2], 0)
        pair2 = (arr[np.minimum(where, len(arr) - 1)].astype(np.int64) << 8) \
            | arr[np.minimum(where + 1, len(arr) - 1)]
        maybe = np.flatnonzero(np.isin(pair2, _COMPOUND_STARTS) | ((pair2 >> 8) == 64))
        ok = np.ones(len(pairs), dtype=bool)
        for i in maybe.tolist():
            a, _b, c = pairs[i].tolist()
            ok[i] = c < 0 or not _COMPOUND.match(line_text(a), c)
        spans = pairs[ok][:, :2]
    mark = np.zeros(len(text) + 2, dtype=bool)
    mark[np.clip(first_l, 0, len(text) + 1)] = True
    mark[0] = mark[-1] = False
    single = np.flatnonzero(mark).astype(np.int64)
    if heads:
        spans = np.concatenate([spans, np.array(heads, dtype=np.int64)])
    g_lo, g_hi = _merge(np.concatenate([spans[:, 0], single]),
                        np.concatenate([spans[:, 1], single]), nlines)
    # A statement continued on the next lines where no expression's span joins them: an
    # assignment whose value begins on the next line (its group's last line ends with an
    # opening bracket, a comma, "=" or a backslash); a header such as ``if (a ==`` whose
    # lines hold separate operands (a group of a line that begins with a keyword and does
    # not end with the colon), or hold no instruction at all (``if (``).
    more: list[tuple[int, int]] = []
    ends = g_hi[g_hi <= len(text)]
    cont = ends[np.isin(last_char[ends - 1], _OPENER_BYTES)
                | (has_hash[ends - 1] & np.isin(before_hash[ends - 1], _OPENER_BYTES))]
    for ln in cont.tolist():
        if _code_of(line_text(ln)).endswith(_OPENERS):
            end = _header_end(ln, line_text)
            if end > ln:
                more.append((ln, end))
    hl = lines_of(_HEADER_LINE, _COMPOUND_STARTS)
    if len(hl) and len(g_lo):
        gi = np.maximum(np.searchsorted(g_lo, hl, side="right") - 1, 0)
        inside = (g_lo[gi] <= hl) & (hl <= g_hi[gi])
        last = np.where(inside, g_hi[gi], hl)
        hl = hl[np.where(inside, (last_char[np.minimum(last, len(text)) - 1] != 58)
                         | has_hash[np.minimum(last, len(text)) - 1],
                         np.isin(last_char[hl - 1], _OPENER_BYTES))]
    for ln in hl.tolist():
        end = _header_end(ln, line_text)
        if end > ln and _code_of(line_text(end)).endswith(b":"):
            more.append((ln, end))
    if more:
        extra = np.array(more, dtype=np.int64)
        g_lo, g_hi = _merge(np.concatenate([g_lo, extra[:, 0]]),
                            np.concatenate([g_hi, extra[:, 1]]), nlines)
    stmt_of = np.zeros(nlines + 1, dtype=np.int32)
    n_l = g_hi - g_lo + 1
    offs = np.arange(int(n_l.sum())) - np.repeat(np.cumsum(n_l) - n_l, n_l)
    stmt_of[np.repeat(g_lo, n_l) + offs] = np.repeat(g_lo, n_l).astype(np.int32)

    # Procedures: from the ``def`` line (after decorators) to the end of the code.
    module = PyScope(Kind.PROC, "<module>", 1, nlines)
    scopes: list[PyScope] = []
    owner: list[PyScope] = []  # per code object: the procedure its lines belong to
    for k, c in enumerate(codes):
        if kinds[k] == "module":
            sc = module
        elif kinds[k] == "proc":
            start = head_of[k]
            sc = PyScope(Kind.PROC, c.co_qualname, start, max(start, hi_c[k]))
            scopes.append(sc)
        else:
            sc = owner[parent[k]]
        owner.append(sc)
    procs = [module, *sorted(scopes, key=lambda s: s.line)]
    proc_of = np.zeros(nlines + 1, dtype=np.int32)  # the innermost procedure of each line
    for i, pr in enumerate(procs[1:], 1):
        proc_of[pr.line:pr.end + 1] = i

    # Loops: ``for``/``while`` statements to the next statement indented no deeper;
    # comprehensions (code objects up to 3.11; from 3.12 a BUILD_* then FOR_ITER inline).
    loops: list[tuple[int, int, PyScope]] = []
    heads_l = lines_of(_LOOP_LINE, _LOOP_STARTS)
    if len(g_lo) and len(heads_l):
        gi = np.minimum(np.searchsorted(g_lo, heads_l), len(g_lo) - 1)
        ok_h = g_lo[gi] == heads_l
        g_ind = indent[g_lo - 1]
        for i, ln in zip(gi[ok_h].tolist(), heads_l[ok_h].tolist(), strict=True):
            later = np.flatnonzero(g_ind[i + 1:] <= g_ind[i])
            j = i + 1 + int(later[0]) if len(later) else len(g_lo)
            loops.append((ln, int(g_hi[i:j].max()), procs[int(proc_of[ln])]))
    for k in range(len(codes)):
        if kinds[k] == "loop":
            loops.append((lo_c[k], hi_c[k], owner[parent[k]]))
    if _INLINED_COMPS and len(line0):
        raw = np.frombuffer(b"".join(c.co_code for c in codes), dtype=np.uint8)
        ops, args = raw[0::2], raw[1::2]
        b = np.flatnonzero(np.isin(ops[:-2], _BUILD_OPS)) if len(ops) > 2 else ops[:0]
        b = b[args[b] == 0]
        nxt = np.where(ops[b + 1] == _SWAP, b + 2, b + 1)
        b = b[ops[nxt] == _FOR_ITER]
        e = np.searchsorted(loc.unit, b, side="right") - 1
        for i in e[(e >= 0) & (line0[np.maximum(e, 0)] > 0)].tolist():
            loops.append((int(line0[i]), int(max(line0[i], line1[i])), owner[int(loc.code[i])]))

    # Nest loops in their procedure by lines; paint the innermost scope of every line.
    all_scopes: list[PyScope] = [module]
    module.ident = 0
    for pr in procs[1:]:
        pr.ident = len(all_scopes)
        all_scopes.append(pr)
    by_proc: dict[int, list[PyScope]] = {}
    for a, b_end, pr in sorted(loops, key=lambda x: (x[0], -x[1])):
        sc = PyScope(Kind.LOOP, "", a, b_end)
        sc.ident = len(all_scopes)
        all_scopes.append(sc)
        open_ = by_proc.setdefault(pr.ident, [])
        while open_ and not (open_[-1].line <= a and b_end <= open_[-1].end):
            open_.pop()
        (open_[-1] if open_ else pr).children.append(sc)
        open_.append(sc)
    scope_of = np.zeros(nlines + 1, dtype=np.int32)
    for sc in sorted(all_scopes[1:], key=lambda s: (s.line, -s.end, s.kind != Kind.PROC)):
        scope_of[sc.line:sc.end + 1] = sc.ident
    keep_lines = None if keep is None else np.asarray(keep, dtype=np.int64)
    return build_python_structure(p, nlines, procs, scope_of, stmt_of, keep_lines)


@dataclass
class Locations:
    """The location table of code objects, one row per entry (a run of code units): its code
    object, first code unit (counted over all the code objects, in order), line, end line and
    column (0 and -1 where the entry has no location)."""

    code: npt.NDArray[np.int64]
    unit: npt.NDArray[np.int64]
    line: npt.NDArray[np.int64]
    end_line: npt.NDArray[np.int64]
    col: npt.NDArray[np.int64]


def locations(codes: list[CodeType]) -> Locations:
    """Decode the ``co_linetable`` of every code object at once (the format of CPython 3.11
    to 3.13, ``InternalDocs/code_objects.md``): entries start at the bytes with the high bit
    set, whose bits 3-6 give the entry's form and bits 0-2 its code units less one; a line
    changes by a signed varint (long and no-column forms) or by the form (one-line forms);
    only the long form has an end line of its own. ``co_positions`` gives the same per code
    unit, as one Python tuple each: 9 of the 12 s of 900 torch files."""
    tables = [c.co_linetable for c in codes]
    buf = np.frombuffer(b"".join(tables) + b"\x80\x80", dtype=np.uint8).astype(np.int64)
    tend = np.cumsum([len(t) for t in tables]).astype(np.int64)
    at = np.flatnonzero(buf[:-2] & 0x80)
    at = at[at < (tend[-1] if len(tend) else 0)]
    head = buf[at]
    form = (head >> 3) & 15
    units = (head & 7) + 1
    code = np.searchsorted(tend, at, side="right").astype(np.int64)
    delta = np.zeros(len(at), dtype=np.int64)
    end = np.zeros(len(at), dtype=np.int64)
    col = np.full(len(at), -1, dtype=np.int64)
    long_, nocol = form == 14, form == 13
    vq = np.flatnonzero(long_ | nocol)
    sv, q = _varints(buf, at[vq] + 1)
    delta[vq] = np.where(sv & 1, -(sv >> 1), sv >> 1)
    lq = np.flatnonzero(long_[vq])
    ev, q2 = _varints(buf, q[lq])
    cv, _ = _varints(buf, q2)
    end[vq[lq]] = ev
    col[vq[lq]] = cv - 1
    one = (form >= 10) & (form <= 12)
    delta[one] = form[one] - 10
    col[one] = buf[at[one] + 1]
    short = form < 10
    col[short] = form[short] * 8 + ((buf[at[short] + 1] >> 4) & 7)
    # line = the code's first line + its entries' deltas so far
    csum = np.cumsum(delta)
    first_entry = np.searchsorted(code, np.arange(len(codes)), side="left")
    before = np.concatenate([[0], csum])[np.minimum(first_entry, len(csum))]
    firsts = np.array([c.co_firstlineno for c in codes], dtype=np.int64)
    line = firsts[code] + csum - before[code] if len(code) else csum
    none = form == 15
    end_line = np.where(long_, line + end, line)
    line = np.where(none, 0, line)
    end_line = np.where(none, 0, end_line)
    unit = np.cumsum(units) - units
    return Locations(code, unit, line, end_line, col)


def _merge(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], nlines: int
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Line intervals joined where they share a line: the statements' (first, last) lines."""
    if len(lo) == 0:
        return lo, hi
    order = np.lexsort((-hi, lo))
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    new = np.ones(len(lo), dtype=bool)
    new[1:] = lo[1:] > reach[:-1]
    g_lo = np.clip(lo[new], 1, nlines)
    return g_lo, np.clip(np.maximum.reduceat(hi, np.flatnonzero(new)), g_lo, nlines)


def _varints(buf: npt.NDArray[np.int64], q: npt.NDArray[np.int64]
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The unsigned varints (6 bits a byte, 0x40: more follow) at positions ``q``, and the
    positions after them."""
    b = buf[q]
    v = b & 63
    more = (b & 64) != 0
    shift = 6
    q = q + 1
    while more.any():
        b = buf[np.where(more, q, 0)]
        v = np.where(more, v | ((b & 63) << shift), v)
        q = np.where(more, q + 1, q)
        more = more & ((b & 64) != 0)
        shift += 6
    return v, q


def _header(first: int, last: int, line_text: Callable[[int], bytes],
            keyword: re.Pattern[bytes]) -> int:
    """The ``def``/``class`` line of a code object whose first line may be a decorator's."""
    for ln in range(first, min(last, first + 64) + 1):
        if keyword.match(line_text(ln)):
            return ln
    return first


def _code_of(t: bytes) -> bytes:
    """A line without its strings and comment, right-stripped (strings that span lines are
    not seen: a header is looked at over 32 lines at most)."""
    if b"'" in t or b'"' in t:
        t = _STRING.sub(b"''", t)
    if b"#" in t:
        t = t.split(b"#", 1)[0]
    return t.rstrip()


def _header_end(line: int, line_text: Callable[[int], bytes]) -> int:
    """The last line of a statement that begins at ``line``: where its brackets close and no
    backslash continues it (at most 32 lines)."""
    depth = 0
    for ln in range(line, line + 32):
        t = _code_of(line_text(ln))
        depth += t.count(b"(") + t.count(b"[") + t.count(b"{")
        depth -= t.count(b")") + t.count(b"]") + t.count(b"}")
        if depth <= 0 and not t.endswith(b"\\"):
            return ln
    return line
