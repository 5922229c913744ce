"""HPCToolkit's structure XML (``hpc-structure.dtd``, version 4.9): writer and reader.

The writer emits what ``hpcstruct`` emits, so HPCToolkit's ``hpcprof`` can use our files: procedure
names carry the module in brackets (``n="f [libfoo.so]"``, ``ln`` the link name), procedures
without source live in a pseudo file ``[module]``, and an inlined scope is written as
HPCToolkit's pair of aliens — an outer ``A`` with the call site (``f``/``l``, empty ``n``) around
an inner ``A`` with the callee's name and its own file and line. The reader accepts files from
``hpcstruct`` and from us and folds those pairs back into one ALIEN scope of the model; an outer
alien named ``<inline>`` (hpcstruct's guess for lines outside the procedure) stays as is.

A statement or call site whose source file is not its scope's (code of a header or another
``.c`` file without inlining records: glibc's ``__brk`` at ``brk.c`` inside a procedure of
``brk_call.h``) cannot say so itself: ``S`` and ``C`` carry no file, and a reader gives them
the file of the procedure or inlined scope around them. The writer wraps each such scope in
HPCToolkit's guard alien (``<A n="<inline>" f=FILE>``, as ``hpcstruct`` writes it), and the
reader folds a guard that holds only statements and call sites, in a file other than the
scope around it, back into those scopes' own file: what is written reads back as it was.

Parsing a large file costs a Python step per scope (libc's 27,000 scopes: 0.7 s, serial work
before ``callpath prof`` can fork its workers), so the parsed arrays of files of at least
:data:`CACHE_MIN_BYTES` are kept in ``$XDG_CACHE_HOME/callpath/parsed`` (default
``~/.cache/callpath/parsed``), one ``.npz`` per distinct content: the entry is named by the
content's digest (the file is read and hashed on every use: a few milliseconds for
megabytes), so the structure files that every ``callpath profile`` run writes anew for the same
libraries share one entry. The directory is kept under :data:`CACHE_MAX_BYTES` by deleting
the entries used least recently. A cache entry that cannot be read, is truncated or corrupt
(the ``.npz`` members carry CRCs) or does not match is ignored and rewritten; a cache
directory that cannot be written is skipped. Either way the result is the parse's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import quoteattr

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError, FormatError
from callpath.model.structure import Kind, Structure, StructureBuilder

DTD_PATH_NOTE = "hpc-structure.dtd version 4.9"
_HEADER = """<?xml version="1.0"?>
<!DOCTYPE HPCToolkitStructure [
<!ELEMENT HPCToolkitStructure (LM)*>
<!ATTLIST HPCToolkitStructure
        version CDATA #REQUIRED
        i       CDATA #REQUIRED
        n       CDATA #IMPLIED>
  <!ELEMENT LM (F|P)*>
  <!ATTLIST LM
        i CDATA #REQUIRED
        n CDATA #REQUIRED
        has-calls CDATA #REQUIRED
        v CDATA #IMPLIED>
  <!ELEMENT F (P|L|S)*>
  <!ATTLIST F
        i CDATA #REQUIRED
        n CDATA #REQUIRED>
  <!ELEMENT P (P|A|L|S|C)*>
  <!ATTLIST P
        i  CDATA #REQUIRED
        n  CDATA #REQUIRED
        ln CDATA #IMPLIED
        l  CDATA #IMPLIED
        s  CDATA #IMPLIED
        v  CDATA #IMPLIED>
  <!ELEMENT A (A|L|S|C)*>
  <!ATTLIST A
        i CDATA #REQUIRED
        f CDATA #IMPLIED
        n CDATA #IMPLIED
        ln CDATA #IMPLIED
        l CDATA #IMPLIED
        v CDATA #IMPLIED>
  <!ELEMENT L (A|L|S|C)*>
  <!ATTLIST L
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        f CDATA #IMPLIED
        v CDATA #IMPLIED>
  <!ELEMENT S EMPTY>
  <!ATTLIST S
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        v CDATA #IMPLIED>
  <!ELEMENT C (C)*>
  <!ATTLIST C
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        v CDATA #IMPLIED
        t CDATA #IMPLIED
        d CDATA #IMPLIED>
]>
"""


def write_hpcstruct(structs: list[Structure], out: IO[str], comment: str | None = None, *,
                    jobs: int = 1) -> None:
    """Write one ``HPCToolkitStructure`` document holding every load module of ``structs``
    (``comment``, if given, goes in an XML comment after the DOCTYPE: the cache's version
    stamp). With ``jobs`` > 1 and ``out`` a file, a large module's second half is written by
    a forked process at the same time (:func:`_write_lm`); the text is the same."""
    out.write(_HEADER)
    if comment:
        out.write(f"<!-- {comment.replace('--', '- -')} -->\n")
    out.write('<HPCToolkitStructure i="0" version="4.9" n="">\n')
    ident = [2]
    for s in structs:
        _write_lm(s, out, ident, jobs)
    out.write("</HPCToolkitStructure>\n")


def write_hpcstruct_file(structs: list[Structure], path: str | os.PathLike[str],
                         comment: str | None = None, *, jobs: int = 1) -> None:
    """Write atomically (a temporary file renamed over ``path``): readers never see half."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            write_hpcstruct(structs, f, comment, jobs=jobs)
        os.replace(tmp, path)
    except OSError as e:
        # name the file the user asked for, not the temporary one beside it
        where = os.path.dirname(os.fspath(path)) or "."
        why = (f"the directory {where} does not exist" if not os.path.isdir(where)
               else e.strerror or str(e))
        raise CallpathError(f"{os.fspath(path)}: cannot write the structure file: {why}") \
            from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


#: Scopes whose columns the writer converts at a time.
_CHUNK = 1 << 18

#: Modules with at least this many scopes are written by two processes when allowed (below,
#: forking and copying the second half's text cost more than they save).
_SPLIT_MIN = 1 << 20

#: The name of HPCToolkit's guard aliens, as written (see the module docstring).
GUARD = "<inline>"
_GUARD_Q = quoteattr(GUARD)

_CLOSE = {int(Kind.FILE): "</F>\n", int(Kind.PROC): "</P>\n", int(Kind.ALIEN): "</A>\n</A>\n",
          int(Kind.LOOP): "</L>\n"}


def _write_lm(s: Structure, out: IO[str], ident: list[int], jobs: int = 1) -> None:
    """One ``LM`` element, in one pass over the preorder arrays with a stack of open scopes.

    With ``jobs`` > 1, a large module and ``out`` a file, the scopes from the middle on are
    written by a forked child into a temporary file while this process writes the first half,
    then copied after it: the child starts from the element number and the stack of open
    scopes that the first half ends with, both read off the arrays (libtorch_cpu.so: 5M
    scopes, ~14 s of formatting in one process).
    """
    w = out.write
    w(f'<LM i="{ident[0]}" n={quoteattr(s.path)} has-calls="{int(s.has_calls)}" v="{{}}">\n')
    n = ident[0] + 1
    total = len(s.kind)
    open_: list[tuple[int, str]] = []  # (scope, its closing tags), innermost last
    mid = (total // 2) if jobs > 1 and total >= _SPLIT_MIN and hasattr(os, "fork") else 0
    fileno = _fileno(out) if mid else None
    guarded = _guarded(s)
    if fileno is None:
        n = _write_scopes(s, guarded, w, 1, total, open_, n)
    else:
        n = _write_split(s, guarded, out, mid, open_, n)
    while open_:
        w(open_.pop()[1])
    ident[0] = n
    w("</LM>\n")


def _fileno(out: IO[str]) -> int | None:
    try:
        return out.fileno()
    except (OSError, AttributeError, ValueError):
        return None


def _elements(kind: npt.NDArray[np.uint8], guarded: npt.NDArray[np.bool_]) -> int:
    """How many XML elements (and so ``i`` numbers) scopes of these kinds write, ``guarded``
    marking those written inside a guard alien of their own."""
    k = kind.astype(np.int64)
    return int(np.isin(k, (Kind.FILE, Kind.PROC, Kind.LOOP, Kind.STMT, Kind.CALL)).sum()
               + 2 * (k == Kind.ALIEN).sum() + guarded.sum())


def _guarded(s: Structure) -> npt.NDArray[np.bool_]:
    """Per scope: a statement or call site whose file is not the one a reader gives it (the
    file of the nearest ``F`` or alien around it, none for a pseudo file ``[module]``), and
    so written inside a guard alien (see the module docstring). Linear numpy passes: the
    nearest such ancestor by pointer jumping over the parent column."""
    n = len(s.kind)
    out = np.zeros(n, np.bool_)
    if n < 2:
        return out
    kind = s.kind.astype(np.int64)
    leaf = (kind == Kind.STMT) | (kind == Kind.CALL)
    if not leaf.any():
        return out
    # the file each scope gives the scopes inside it, for the scopes that set it
    canon = _canonical_ids(s.strings)
    setter = (kind == Kind.FILE) | (kind == Kind.ALIEN)
    setter[0] = True
    given = np.full(n, -1, np.int64)
    fid = s.file.astype(np.int64)
    alien = kind == Kind.ALIEN
    given[alien] = np.where(fid[alien] >= 0, canon[np.maximum(fid[alien], 0)], -1)
    files = np.flatnonzero(kind == Kind.FILE)
    for j in files.tolist():  # one per source file: few
        nm = int(s.name[j])
        if nm >= 0 and not s.strings[nm].startswith("["):
            given[j] = canon[nm]
    up = np.where(setter, np.arange(n), np.maximum(s.parent.astype(np.int64), 0))
    while True:
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    idx = np.flatnonzero(leaf)
    ctx = given[up[np.maximum(s.parent[idx].astype(np.int64), 0)]]
    own = np.where(fid[idx] >= 0, canon[np.maximum(fid[idx], 0)], -1)
    out[idx] = own != ctx
    return out


def _canonical_ids(strings: list[str]) -> npt.NDArray[np.int64]:
    """Each string id mapped to the first id of the same text (a structure's table may hold
    a text twice)."""
    first: dict[str, int] = {}
    canon = np.fromiter((first.setdefault(x, i) for i, x in enumerate(strings)), np.int64,
                        len(strings))
    return canon if len(canon) else np.zeros(1, np.int64)


def _open_after(s: Structure, j: int) -> list[tuple[int, str]]:
    """The stack of open scopes once scope ``j`` is written: its container ancestors (and
    itself if it is one), outermost first."""
    x = j if int(s.kind[j]) in _CLOSE else int(s.parent[j])
    chain = []
    while x > 0:
        chain.append((x, _CLOSE[int(s.kind[x])]))
        x = int(s.parent[x])
    return chain[::-1]


def _write_split(s: Structure, guarded: npt.NDArray[np.bool_], out: IO[str], mid: int,
                 open_: list[tuple[int, str]], n: int) -> int:
    """Scopes ``[1, mid)`` here and ``[mid, end)`` in a forked child (see :func:`_write_lm`);
    the element number after all of them. Where the fork or the child fails, this process
    writes the second half too."""
    total = len(s.kind)
    n_mid = n + _elements(s.kind[1:mid], guarded[1:mid])
    stack = _open_after(s, mid - 1)
    out.flush()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as tmp:
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:  # child: never returns into the caller's code
            status = 1
            try:
                own = list(stack)
                _write_scopes(s, guarded, tmp.write, mid, total, own, n_mid)
                while own:
                    tmp.write(own.pop()[1])
                tmp.flush()
                status = 0
            finally:
                os._exit(status)
        got = _write_scopes(s, guarded, out.write, 1, mid, open_, n)
        if got != n_mid or open_ != stack:
            raise AssertionError("structure writer: the halves do not meet")
        ok = False
        if pid > 0:
            _, status = os.waitpid(pid, 0)
            ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if not ok:
            return _write_scopes(s, guarded, out.write, mid, total, open_, n_mid)
        tmp.seek(0)
        shutil.copyfileobj(tmp, out, 1 << 20)
    open_.clear()
    return n_mid + _elements(s.kind[mid:], guarded[mid:])


def _write_scopes(s: Structure, guarded: npt.NDArray[np.bool_], w: Callable[[str], object],
                  start: int, stop: int, open_: list[tuple[int, str]], n: int) -> int:
    """Scopes ``[start, stop)`` with ``open_`` the stack of scopes open before them (left
    with those open after them) and ``n`` the next element number; the next element number.
    A scope marked in ``guarded`` goes inside a guard alien naming its file.

    Columns are read as ``array.array`` (8 bytes per entry) rather than lists: enum
    comparisons and numpy scalar access per scope cost more than the formatting itself, and
    lists of Python ints would double the peak memory of a large module.
    """
    base = os.path.basename(s.path)
    suffix = f" [{base}]"
    unknown_file = f"[{base}]"
    q = quoteattr
    strings = s.strings

    def col(x: npt.NDArray[Any], code: str = "q") -> array[int]:
        a: array[int] = array(code)
        a.frombytes(np.ascontiguousarray(x, dtype=np.uint64 if code == "Q" else np.int64)
                    .tobytes())
        return a

    quoted: dict[int, str] = {}

    def qs(sid: int, default: str = "") -> str:
        got = quoted.get(sid)
        if got is None:
            got = quoted[sid] = q(strings[sid] if sid >= 0 else default)
        return got

    FILE, PROC, ALIEN, LOOP, STMT, CALL = (int(Kind.FILE), int(Kind.PROC), int(Kind.ALIEN),
                                           int(Kind.LOOP), int(Kind.STMT), int(Kind.CALL))
    # Columns are converted a chunk of scopes at a time: whole, they doubled the memory of
    # libtorch_cpu.so's ~6M scopes while writing.
    for c0 in range(start, stop, _CHUNK):
        c1 = min(stop, c0 + _CHUNK)
        kind, parent = col(s.kind[c0:c1]), col(s.parent[c0:c1])
        name, link = col(s.name[c0:c1]), col(s.link_name[c0:c1])
        file, line = col(s.file[c0:c1]), col(s.line[c0:c1])
        cfile, cline = col(s.call_file[c0:c1]), col(s.call_line[c0:c1])
        target = col(s.target[c0:c1], "Q")
        guard = col(guarded[c0:c1])
        rptr = col(s.range_ptr[c0:c1 + 1])
        r0 = rptr[0]
        rlo, rhi = col(s.range_lo[r0:rptr[-1]], "Q"), col(s.range_hi[r0:rptr[-1]], "Q")

        def vset(j: int, rptr: array[int] = rptr, r0: int = r0, rlo: array[int] = rlo,
                 rhi: array[int] = rhi) -> str:
            a, b = rptr[j] - r0, rptr[j + 1] - r0
            return "{" + " ".join(f"[{rlo[x]:#x}-{rhi[x]:#x})" for x in range(a, b)) + "}"

        for j in range(c1 - c0):
            p = parent[j]
            while open_ and open_[-1][0] != p:
                w(open_.pop()[1])
            k = kind[j]
            if guard[j]:
                w(f'<A i="{n}" l="{line[j]}" f={qs(file[j], "<unknown>")} n={_GUARD_Q} '
                  'v="{}">\n')
                n += 1
            if k == STMT:
                w(f'<S i="{n}" l="{line[j]}" v="{vset(j)}"/>\n')
                n += 1
                if guard[j]:
                    w("</A>\n")
                continue
            if k == CALL:
                t = target[j]
                ts = f' t="{t:#x}"' if t else ""
                w(f'<C i="{n}" l="{line[j]}" v="{vset(j)}"{ts}/>\n')
                n += 1
                if guard[j]:
                    w("</A>\n")
                continue
            if k == FILE:
                w(f'<F i="{n}" n={qs(name[j])}>\n')
                n += 1
                close = "</F>\n"
            elif k == PROC:
                nm = strings[name[j]] if name[j] >= 0 else ""
                ln = qs(link[j]) if link[j] >= 0 else qs(name[j])
                w(f'<P i="{n}" n={q(nm + suffix)} ln={ln} l="{line[j]}" v="{vset(j)}">\n')
                n += 1
                close = "</P>\n"
            elif k == ALIEN:
                w(f'<A i="{n}" l="{cline[j]}" f={qs(cfile[j], "<unknown>")} n="" v="{{}}">\n'
                  f'<A i="{n + 1}" l="{line[j]}" f={qs(file[j], "<unknown>")} '
                  f'n={qs(name[j])} v="{vset(j)}">\n')
                n += 2
                close = "</A>\n</A>\n"
            elif k == LOOP:
                w(f'<L i="{n}" l="{line[j]}" f={qs(file[j], unknown_file)} v="{vset(j)}">\n')
                n += 1
                close = "</L>\n"
            else:
                continue
            open_.append((c0 + j, close))
    return n


# -- reader ------------------------------------------------------------------------------------

_RANGE = re.compile(r"\[\s*(0x[0-9a-fA-F]+|\d+)\s*-\s*(0x[0-9a-fA-F]+|\d+)\s*\)")


def _parse_vset(text: str | None, path: str) -> list[tuple[int, int]]:
    if not text:
        return []
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise FormatError(path, f"bad address range set {text!r} (expected {{[lo-hi) ...}})")
    out = []
    for m in _RANGE.finditer(t):
        a, b = int(m.group(1), 0), int(m.group(2), 0)
        if b >= 2**64:
            raise FormatError(path, f"address range [{a:#x}-{b:#x}) beyond 64 bits")
        if b < a:
            raise FormatError(path, f"bad address range [{a:#x}-{b:#x}) in {text!r}")
        out.append((a, b))
    if not out and t[1:-1].strip():
        raise FormatError(path, f"bad address range set {text!r}")
    return out


def _int_attr(e: ET.Element, name: str, path: str, default: int = 0) -> int:
    v = e.get(name)
    if v is None:
        return default
    try:
        x = int(v, 0)
    except ValueError:
        raise FormatError(path, f"<{e.tag}> attribute {name}={v!r} is not an integer") from None
    lo, hi = (0, 2**64 - 1) if name == "t" else (-(2**31), 2**31 - 1)  # the model's dtypes
    if not lo <= x <= hi:
        raise FormatError(path, f"<{e.tag}> attribute {name}={v!r} is out of range "
                          f"({'an address' if name == 't' else 'a 32-bit line number'})")
    return x


def read_hpcstruct(path: str | os.PathLike[str], *, cache: bool = True) -> list[Structure]:
    """Load modules of a structure file (by ``hpcstruct`` or by us) as :class:`Structure`s
    (from the parse cache when ``cache`` and the file is large: see the module docstring)."""
    p = str(path)
    data: bytes | None = None
    ident: dict[str, Any] | None = None
    if cache:
        data, ident = _cache_ident(p)
        if ident is not None:
            got = _cache_load(ident)
            if got is not None:
                return got
    try:
        root = (ET.fromstring(data) if data is not None else ET.parse(p).getroot())
    except OSError as e:
        raise FormatError(p, f"cannot open: {e.strerror or e}") from None
    except ET.ParseError as e:
        raise FormatError(p, f"malformed XML: {e}") from None
    if root.tag != "HPCToolkitStructure":
        raise FormatError(p, f"root element is <{root.tag}>, expected <HPCToolkitStructure>")
    out = []
    for lm in root:
        if lm.tag != "LM":
            raise FormatError(p, f"<{lm.tag}> inside <HPCToolkitStructure>, expected <LM>")
        out.append(_read_lm(lm, p))
    if ident is not None:
        _cache_store(ident, out)
    return out


# -- the parse cache ---------------------------------------------------------------------------

CACHE_MIN_BYTES = 1 << 18  # smaller files parse in well under 10 ms: not worth an entry
CACHE_MAX_BYTES = 1 << 28  # the directory's bound (libc's entry: 12 MB)
_CACHE_VERSION = 3  # bumped whenever the reader's result changes
_ARRAYS = ("kind", "parent", "name", "link_name", "file", "line", "call_file", "call_line",
           "target", "range_ptr", "range_lo", "range_hi", "map_lo", "map_hi", "map_scope")


def parse_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "callpath" / "parsed"


def _cache_ident(path: str) -> tuple[bytes | None, dict[str, Any] | None]:
    """The file's content and its cache identity (None when it is too small to cache or
    cannot be read here; the parse then reports the error)."""
    try:
        st = os.stat(path)
        if st.st_size < CACHE_MIN_BYTES:
            return None, None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    digest = hashlib.blake2b(data, digest_size=20).hexdigest()
    return data, {"version": _CACHE_VERSION, "size": len(data), "digest": digest,
                  "entry": digest[:32] + ".npz"}


def _cache_load(ident: dict[str, Any]) -> list[Structure] | None:
    """The cached parse, or None if there is none that matches and reads back whole."""
    entry = parse_cache_dir() / ident["entry"]
    try:
        with np.load(entry, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            if not isinstance(meta, dict) or {k: meta.get(k) for k in ident} != ident:
                return None
            out = []
            for i, m in enumerate(meta["modules"]):
                cols = {k: z[f"{i}.{k}"] for k in _ARRAYS}
                text = bytes(z[f"{i}.strings"]).decode("utf-8", "surrogatepass")
                strings = text.split("\0") if m["n_strings"] else []
                n = len(cols["kind"])
                if (len(strings) != m["n_strings"] or len(cols["range_ptr"]) != n + 1
                        or any(len(cols[k]) != n for k in _ARRAYS[:9])
                        or not len(cols["range_lo"]) == len(cols["range_hi"])
                        == int(cols["range_ptr"][-1])
                        or not len(cols["map_lo"]) == len(cols["map_hi"])
                        == len(cols["map_scope"])):
                    return None
                out.append(Structure(path=m["path"], build_id=m["build_id"], strings=strings,
                                     has_calls=bool(m["has_calls"]),
                                     proc_suffix=bool(m["proc_suffix"]), **cols))
    except Exception:  # any entry that does not read back whole means: parse instead
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # used now: the last to be pruned
    return out


def _cache_store(ident: dict[str, Any], structs: list[Structure]) -> None:
    """Write the entry (atomically: a temporary file renamed into place); skipped silently
    where the cache directory cannot be written."""
    d = parse_cache_dir()
    arrays: dict[str, npt.NDArray[Any]] = {}
    mods = []
    for i, st in enumerate(structs):
        for k in _ARRAYS:
            arrays[f"{i}.{k}"] = getattr(st, k)
        arrays[f"{i}.strings"] = np.frombuffer(
            "\0".join(st.strings).encode("utf-8", "surrogatepass"), dtype=np.uint8)
        mods.append({"path": st.path, "build_id": st.build_id, "has_calls": st.has_calls,
                     "proc_suffix": st.proc_suffix, "n_strings": len(st.strings)})
    meta = dict(ident, modules=mods)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    tmp = d / f".{ident['entry']}.{os.getpid()}.tmp"
    try:
        d.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, d / ident["entry"])
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return
    _cache_prune(d, CACHE_MAX_BYTES, ident["entry"])


def _cache_prune(d: Path, limit: int, keep: str) -> None:
    """Delete the entries used least recently, except ``keep`` (the one just written), until
    the directory holds at most ``limit`` bytes (entries vanishing meanwhile, e.g. pruned by
    another process, are fine)."""
    entries = []
    with contextlib.suppress(OSError):
        for e in os.scandir(d):
            with contextlib.suppress(OSError):
                if e.name.endswith(".npz") and e.name != keep:
                    st = e.stat()
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    with contextlib.suppress(OSError):
        total += os.stat(d / keep).st_size
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
        total -= size


_ALLOWED = {"LM": {"F", "P"}, "F": {"P", "L", "S"}, "P": {"P", "A", "L", "S", "C"},
            "A": {"A", "L", "S", "C"}, "L": {"A", "L", "S", "C"}, "S": set(), "C": {"C"}}


def _read_lm(lm: ET.Element, path: str) -> Structure:
    name = lm.get("n")
    if name is None:
        raise FormatError(path, "<LM> without the required n= attribute")
    base = os.path.basename(name)
    suffix = f" [{base}]"
    b = StructureBuilder(name, None)
    b.has_calls = lm.get("has-calls", "0") not in ("0", "")
    suffixed = [False]

    def need_l(e: ET.Element) -> int:
        if e.get("l") is None:
            raise FormatError(path, f"<{e.tag} i={e.get('i')!r}> without the required l= "
                              "attribute")
        return _int_attr(e, "l", path)

    def walk(e: ET.Element, parent: int, file: str | None) -> None:
        for c in e:
            tag = c.tag
            if tag not in _ALLOWED.get(e.tag, set()):
                raise FormatError(path, f"<{tag}> inside <{e.tag}> is not allowed by "
                                  "hpc-structure.dtd")
            rs = _parse_vset(c.get("v"), path)
            if tag == "F":
                fn = c.get("n", "")
                sc = b.add(Kind.FILE, parent, name=fn)
                walk(c, sc, None if fn.startswith("[") else fn)
            elif tag == "P":
                n = c.get("n", "")
                if n.endswith(suffix):
                    n = n[: -len(suffix)]
                    suffixed[0] = True
                sc = b.add(Kind.PROC, parent, name=n, link=c.get("ln") or n, file=file,
                           line=_int_attr(c, "l", path), ranges=rs)
                walk(c, sc, file)
            elif tag == "A":
                kids = list(c)
                inner = kids[0] if len(kids) == 1 and kids[0].tag == "A" else None
                f = c.get("f")
                f = None if f == "<unknown>" else f
                if (c.get("n") == GUARD and f != file and kids
                        and all(k.tag in ("S", "C") for k in kids)):
                    # a guard alien naming its statements' own file: fold it back into them
                    walk(c, parent, f)
                elif not c.get("n") and inner is not None:
                    # hpcstruct's pair: call site outside, callee inside.
                    cf = c.get("f")
                    f = inner.get("f")
                    sc = b.add(Kind.ALIEN, parent, name=inner.get("n", ""),
                               file=None if f in (None, "<unknown>") else f,
                               line=_int_attr(inner, "l", path),
                               call_file=None if cf in (None, "<unknown>") else cf,
                               call_line=_int_attr(c, "l", path),
                               ranges=_parse_vset(inner.get("v"), path))
                    walk(inner, sc, None if f in (None, "<unknown>") else f)
                else:
                    sc = b.add(Kind.ALIEN, parent, name=c.get("n", ""), file=f,
                               line=_int_attr(c, "l", path), call_file=file,
                               call_line=_int_attr(c, "l", path), ranges=rs)
                    walk(c, sc, f)
            elif tag == "L":
                f = c.get("f")
                sc = b.add(Kind.LOOP, parent, file=None if f is None or f.startswith("[")
                           else f, line=need_l(c), ranges=rs)
                walk(c, sc, file)
            elif tag == "S":
                sc = b.add(Kind.STMT, parent, file=file, line=need_l(c), ranges=rs)
                for a, z in rs:
                    b.map_range(a, z, sc)
            elif tag == "C":
                sc = b.add(Kind.CALL, parent, file=file, line=need_l(c),
                           target=_int_attr(c, "t", path), ranges=rs)
                for a, z in rs:
                    b.map_range(a, z, sc)
                walk(c, sc, file)

    if any(c.tag not in ("F", "P") for c in lm):
        bad = next(c.tag for c in lm if c.tag not in ("F", "P"))
        raise FormatError(path, f"<{bad}> inside <LM> is not allowed by hpc-structure.dtd")
    walk(lm, 0, None)
    s = b.build()
    s.proc_suffix = suffixed[0]
    # Overlapping statement ranges (C inside S) resolve to the later (deeper) scope.
    if len(s.map_lo) > 1:
        order = np.lexsort((np.arange(len(s.map_lo)), s.map_lo))
        s.map_lo, s.map_hi, s.map_scope = s.map_lo[order], s.map_hi[order], s.map_scope[order]
    return s
