"""Writer of HPCToolkit's sparse database format v4 (``../specs/hpctoolkit-FORMATS.md``).

``write_v4(exp, directory)`` writes ``meta.db``, ``profile.db``, ``cct.db``, ``trace.db`` (when the
experiment has traces), ``metrics/default.yaml`` and a ``src/`` folder of copied source files.

Design: every big array is laid out with numpy and written with one buffer write; there is no
Python loop over values, and none over contexts either:

- ``meta.db``: the context tree is laid out as sibling groups (the children of one parent are one
  contiguous array, in preorder), ordered by the parent's preorder index. Record sizes follow from
  the flags (flex words), so every record's position, every ``pChildren``/``szChildren`` and the
  flex sub-fields are computed for all nodes at once and stored into one array of u64 words.
- ``profile.db`` and ``cct.db`` are streamed (:mod:`callpath.formats.v4.stream`, whose phases
  are :mod:`~callpath.formats.v4.spool` and :mod:`~callpath.formats.v4.transpose`): each
  profile's block is written as soon as it is produced, straight into ``profile.db`` behind
  its fixed-size head for the first chunk of profiles, to a spool file for the others;
  their values are then read back by context range, put in ``cct.db``'s order one range at
  a time and written in place (offsets follow from counts taken while spooling), and the
  spooled bytes are written into ``profile.db`` on the way. The summary block comes last
  (it may depend on the transpose). Memory stays bounded by a block and a range, and an
  experiment that computes its blocks on demand (``callpath prof``) has them computed,
  written and transposed in parallel workers.

Files are written under temporary names in the target directory and renamed into place only
once all of them are complete, so a failure never leaves a half-written database behind the
real names. Layout choices where the specification leaves freedom follow the files hpcprof
writes (section order, 8-byte aligned sections and footers) and are listed in
``docs/formats-v4.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4 import entry, spool, stream, transpose
from callpath.formats.v4.blocks import align_up, pad_to, sorted_block, write_profile_block
from callpath.model.cct import HAS_FUNCTION, HAS_POINT, HAS_SRCLOC, EntryPoint, NodeKind
from callpath.model.experiment import Experiment
from callpath.model.metrics import Combine, Metric, PropagationScope
from callpath.model.tables import SourceFile
from callpath.model.values import ProfileBlock, Traces

__all__ = ["write_v4"]

MAGIC = b"HPCTOOLKIT"
MAJOR, MINOR = 4, 0
FOOTERS = {b"meta": b"_meta.db", b"prof": b"_prof.db", b"ctxt": b"__ctx.db", b"trce": b"trace.db"}

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def _struct(fields: list[tuple[str, str, int]], size: int) -> np.dtype[Any]:
    """A numpy dtype for a C-like structure with explicit field offsets; padding stays zero
    in arrays made with ``np.zeros``."""
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
                     "offsets": [f[2] for f in fields], "itemsize": size})


# Packed (unaligned) value structures: exactly the on-disk byte layout.
TRACE_ELEM = np.dtype([("timestamp", "<u8"), ("ctxId", "<u4")])  # 12 bytes

MODULE_SPEC = _struct([("flags", "<u4", 0), ("pPath", "<u8", 8)], 0x10)
FILE_SPEC = _struct([("flags", "<u4", 0), ("pPath", "<u8", 8)], 0x10)
FUNCTION_SPEC = _struct([("pName", "<u8", 0), ("pModule", "<u8", 8), ("offset", "<u8", 0x10),
                         ("pFile", "<u8", 0x18), ("line", "<u4", 0x20), ("flags", "<u4", 0x24)],
                        0x28)
ENTRY_SPEC = _struct([("szChildren", "<u8", 0), ("pChildren", "<u8", 8), ("ctxId", "<u4", 0x10),
                      ("entryPoint", "<u2", 0x14), ("pPrettyName", "<u8", 0x18)], 0x20)
SCOPE_SPEC = _struct([("pScopeName", "<u8", 0), ("type", "u1", 8),
                      ("propagationIndex", "u1", 9)], 0x10)
METRIC_SPEC = _struct([("pName", "<u8", 0), ("pScopeInsts", "<u8", 8), ("pSummaries", "<u8", 0x10),
                       ("nScopeInsts", "<u2", 0x18), ("nSummaries", "<u2", 0x1A)], 0x20)
SCOPE_INST_SPEC = _struct([("pScope", "<u8", 0), ("propMetricId", "<u2", 8)], 0x10)
SUMMARY_SPEC = _struct([("pScope", "<u8", 0), ("pFormula", "<u8", 8), ("combine", "u1", 0x10),
                        ("statMetricId", "<u2", 0x12)], 0x18)
PROFILE_INFO = _struct([("nValues", "<u8", 0), ("pValues", "<u8", 8), ("nCtxs", "<u4", 0x10),
                        ("pCtxIndices", "<u8", 0x18), ("pIdTuple", "<u8", 0x20),
                        ("flags", "<u4", 0x28)], 0x30)
IDENTIFIER = _struct([("kind", "u1", 0), ("flags", "<u2", 2), ("logicalId", "<u4", 4),
                      ("physicalId", "<u8", 8)], 0x10)
CONTEXT_INFO = _struct([("nValues", "<u8", 0), ("pValues", "<u8", 8), ("nMetrics", "<u2", 0x10),
                        ("pMetricIndices", "<u8", 0x18)], 0x20)
TRACE_HEADER = _struct([("profIndex", "<u4", 0), ("pStart", "<u8", 8), ("pEnd", "<u8", 0x10)],
                       0x18)

CTX_HEADER_WORDS = 4  # a {Ctx} record is 32 bytes plus its flex words
ENTRY_NAMES = {EntryPoint.UNKNOWN: "unknown entry", EntryPoint.MAIN_THREAD: "main thread",
               EntryPoint.APPLICATION_THREAD: "application thread"}


def _encode(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CallpathError(f"{what} {s!r} cannot be written as UTF-8: {e.reason}") from None
    if b"\0" in b:
        raise CallpathError(f"{what} {s!r} contains a NUL character, which v4 strings cannot hold")
    return b


def _file_header(fmt: bytes, sections: list[tuple[int, int]]) -> bytes:
    """The common header: magic, format, version, then (size, pointer) of every section."""
    out = bytearray(MAGIC + fmt + bytes([MAJOR, MINOR]))
    for size, ptr in sections:
        out += size.to_bytes(8, "little") + ptr.to_bytes(8, "little")
    return bytes(out)


def _footer(fmt: bytes, pos: int) -> bytes:
    """Padding to an 8-byte boundary, then the footer (as hpcprof places it)."""
    return bytes(align_up(pos) - pos) + FOOTERS[fmt]


class _Section:
    """A section being assembled in memory at a known absolute file offset."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.buf = bytearray()

    @property
    def pos(self) -> int:
        return self.base + len(self.buf)

    def align(self, a: int = 8) -> int:
        self.buf += bytes(align_up(len(self.buf), a) - len(self.buf))
        return self.pos

    def put(self, data: bytes | bytearray | memoryview | npt.NDArray[Any]) -> int:
        at = self.pos
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).tobytes()
        self.buf += data
        return at

    def reserve(self, n: int) -> int:
        at = self.pos
        self.buf += bytes(n)
        return at

    def patch(self, at: int, data: bytes | npt.NDArray[Any]) -> None:
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).tobytes()
        rel = at - self.base
        self.buf[rel:rel + len(data)] = data

    def strings(self, items: Iterable[str], what: str) -> dict[str, int]:
        """Place each distinct string once (NUL-terminated); return string -> pointer."""
        table: dict[str, int] = {}
        for s in items:
            if s not in table:
                table[s] = self.put(_encode(s, what) + b"\0")
        return table

    @property
    def size(self) -> int:
        return len(self.buf)


def _write(f: BinaryIO, arr: npt.NDArray[Any]) -> None:
    """Write an array's bytes without an intermediate copy when it is contiguous."""
    a = np.ascontiguousarray(arr)
    if a.size:
        f.write(a.view(np.uint8).reshape(-1).data)


# ==== the public entry point ============================================================


def write_v4(exp: Experiment, directory: str | os.PathLike[str], *,
             copy_sources: bool = True) -> Path:
    """Write ``exp`` as an HPCToolkit v4 database into ``directory`` (created if needed).

    Existing database files in the directory are replaced; a ``trace.db`` left from an earlier
    database is removed when ``exp`` has no traces. With ``copy_sources``, source files that
    exist on this machine are copied under ``src/`` and marked ``copied``. Returns the directory.
    Raises :class:`CallpathError` when the experiment cannot be represented (e.g. profile 0 is
    not a summary profile) or the directory cannot be written.
    """
    out = Path(directory)
    _check_experiment(exp)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CallpathError(f"{out}: cannot create the database directory: "
                            f"{e.strerror or e}") from None
    if not out.is_dir():
        raise CallpathError(f"{out}: not a directory")
    if not os.access(out, os.W_OK | os.X_OK):
        raise CallpathError(f"{out}: the database directory is not writable")

    temps: dict[str, Path] = {}

    def temp(name: str) -> Path:
        p = out / f".{name.replace('/', '_')}.{os.getpid()}.tmp"
        temps[name] = p
        return p

    spool_dir = out / f".spool.{os.getpid()}.tmp"
    try:
        files = _prepare_sources(exp, out, copy_sources)
        source = stream.value_source(exp)
        transposed = np.array([not p.is_summary for p in exp.profiles], dtype=bool)
        summary = (None if source.summary is not None
                   else sorted_block(source.block(0), 0))
        n0 = max(exp.n_ctx_slots, int(exp.cct.ctx_id.max()) + 1)
        if summary is not None and len(summary.ctx_ids):
            n0 = max(n0, int(summary.ctx_ids[-1]) + 1)
        synthetic = -1
        if entry.needs_synthetic_entry(exp):
            synthetic, n0 = n0, n0 + 1
            source = entry.with_entry_values(exp, source, synthetic)
            if summary is not None:
                summary = sorted_block(source.block(0), 0)
        n_ids = len({i.prop_metric_id for m in exp.metrics for i in m.scope_insts})
        bounds = transpose.bucket_bounds(n0, int(transposed.sum()), n_ids)
        head = _ProfileHead.of(exp)
        spool_dir.mkdir(exist_ok=True)
        with open(temp("profile.db"), "wb"):
            pass  # the first chunk of profiles is written into it behind the head
        spools = spool.spool_profiles(source, spool_dir, transposed, bounds, n0,
                                      (temps["profile.db"], head.data_base))
        blocks_end = spool.place_spools(spools, head.data_base, temps["profile.db"],
                                        spool_dir)
        _fill_infos(head, spools)
        n_slots = max([n0, *(sp.top_ctx for sp in spools)])
        if n_slots > 0xFFFFFFFF:
            raise CallpathError(f"{n_slots} contexts; v4 allows at most 2^32-1")
        tree = _TreeLayout.build(exp, n_slots, synthetic)
        with open(temp("meta.db"), "wb") as f:
            f.write(_meta_db(exp, files, tree))
        layout = transpose.ContextLayout.of(spools, tree.n_slots)
        with open(temp("cct.db"), "wb") as f:
            data_base = _write_cct_db(f, layout)
        groups = transpose.transpose_buckets(source, spools, bounds, layout, temps["cct.db"],
                                             data_base, temps["profile.db"])
        spool.copy_uncopied(temps["profile.db"], spools)
        spool.remove_spools(spool_dir)
        if summary is None:
            assert source.summary is not None
            summary = sorted_block(source.summary(groups), 0)
            if len(summary.ctx_ids) and int(summary.ctx_ids[-1]) >= n_slots:
                raise CallpathError(f"the summary profile has a value at context "
                                    f"{int(summary.ctx_ids[-1])}, beyond the {n_slots} "
                                    "contexts of the database")
        with open(temps["profile.db"], "r+b") as pf:
            _write_profile_db(pf, head, summary, blocks_end)
        if exp.traces is not None:
            with open(temp("trace.db"), "wb") as f:
                _write_trace_db(f, exp.traces, len(exp.profiles))
        (out / "metrics").mkdir(exist_ok=True)
        yaml_text = exp.metrics_yaml if exp.metrics_yaml is not None else default_metrics_yaml(exp)
        temp("metrics/default.yaml").write_text(yaml_text, encoding="utf-8")
        _copy_sources(exp, out, files)
        for name, p in temps.items():
            os.replace(p, out / name)
        temps.clear()
        if exp.traces is None and (out / "trace.db").exists():
            (out / "trace.db").unlink()
    except OSError as e:
        what = e.filename or out
        raise CallpathError(f"{what}: cannot write the database: {e.strerror or e}") from None
    finally:
        for p in temps.values():
            with contextlib.suppress(OSError):
                p.unlink()
        spool.remove_spools(spool_dir)
    return out


# ==== consistency checks ================================================================


def _check_experiment(exp: Experiment) -> None:
    if not exp.profiles or not exp.profiles[0].is_summary:
        raise CallpathError("cannot write a v4 database: profile 0 must be the summary profile "
                            "(build experiments with callpath.model.build_experiment)")
    for i, p in enumerate(exp.profiles):
        if p.index != i:
            raise CallpathError(f"profile at position {i} has index {p.index}: profiles must be "
                                "listed in index order")
    if len(exp.values) != len(exp.profiles):
        raise CallpathError(f"{len(exp.values)} value blocks for {len(exp.profiles)} profiles")
    if len(exp.id_names) > 255:
        raise CallpathError(f"{len(exp.id_names)} identifier kinds; v4 allows at most 255")
    if len(exp.scopes) > 0xFFFF:
        raise CallpathError(f"{len(exp.scopes)} propagation scopes; v4 allows at most 65535")
    cct = exp.cct
    if cct.ctx_id[0] != 0 or cct.kind[0] != NodeKind.ROOT:
        raise CallpathError("the tree's first node must be the global context (ctx 0, ROOT)")
    if len(cct) > 1:
        if np.any(cct.ctx_id[1:] == 0):
            raise CallpathError("context identifier 0 is reserved for the global context")
        ids = cct.ctx_id
        top = int(ids.max())
        counts = (np.bincount(ids, minlength=top + 1) if top < 8 * len(ids)
                  else np.unique(ids, return_counts=True)[1])
        if int(counts.max()) > 1:
            raise CallpathError("context identifiers in the tree are not unique")
        kind = cct.kind[1:]
        par = cct.parent[1:]
        if np.any((kind == NodeKind.ENTRY) & (par != 0)):
            raise CallpathError("an entry point is not a child of the global context")
        if np.any(kind == NodeKind.ROOT):
            raise CallpathError("the global context (ROOT) appears below the top of the tree")
        if np.any(kind > NodeKind.ROOT):
            raise CallpathError(f"unknown node kind {int(kind.max())}")


# ==== metrics/default.yaml ==============================================================


def default_metrics_yaml(exp: Experiment) -> str:
    """A METRICS.yaml taxonomy with one root per metric: inclusive = sum over the
    ``execution`` scope, exclusive = sum over the ``function`` scope (those that exist)."""
    inputs: list[str] = []
    roots: list[str] = []
    for k, m in enumerate(exp.metrics):
        refs: dict[str, str] = {}
        for scope in ("execution", "function"):
            if m.stat_id(exp.scopes, scope, Combine.SUM) is None:
                continue
            anchor = f"metric{k}-sum-{scope}"
            refs[scope] = anchor
            inputs += [f"  - &{anchor}", f"    metric: {json.dumps(m.name)}",
                       f"    scope: {json.dumps(scope)}", "    formula: $$",
                       "    combine: sum"]
        if not refs:
            continue
        render = "[number, percent]" if "execution" in refs else "number"
        roots += [f"  - name: {json.dumps(m.name)}",
                  f"    description: {json.dumps(m.description or m.name)}",
                  "    variants:", "      Sum:", f"        render: {render}",
                  "        formula:"]
        if "execution" in refs:
            roots += ["          inclusive:", f"            standard: *{refs['execution']}"]
        if "function" in refs:
            roots += ["          exclusive:", f"            standard: *{refs['function']}"]
    lines = ["version: 0"]
    lines += ["inputs:", *inputs] if inputs else ["inputs: []"]
    lines += ["roots:", *roots] if roots else ["roots: []"]
    return "\n".join(lines) + "\n"


# ==== source files ======================================================================


def _inside(out: Path, rel: str) -> Path:
    dest = (out / rel).resolve()
    root = out.resolve()
    if dest != root and root not in dest.parents:
        raise CallpathError(f"source file path {rel!r} leads outside the database directory")
    return dest


def _copied_name(path: Path) -> str:
    """``src/`` + the absolute path without its leading slash (hpcprof's convention)."""
    parts = PurePosixPath(os.path.abspath(path)).parts[1:]
    return str(PurePosixPath("src", *parts))


def _prepare_sources(exp: Experiment, out: Path, copy_sources: bool) -> list[SourceFile]:
    """The source file table as written: copied files stay copied when their copy can be
    found (in the source database or already in ``out``); with ``copy_sources``, files that
    exist on this machine become copied ones. Nothing is copied yet."""
    result: list[SourceFile] = []
    for sf in exp.files:
        if sf.copied:
            have = exp.path is not None and (exp.path / sf.path).is_file()
            if have or _inside(out, sf.path).is_file():
                result.append(sf)
                continue
            # The copy is lost: fall back to the original location, as a plain reference.
            rel = PurePosixPath(sf.path)
            orig = ("/" + str(PurePosixPath(*rel.parts[1:]))
                    if rel.parts[:1] == ("src",) and len(rel.parts) > 1 else sf.path)
            result.append(SourceFile(orig, False, sf.flags & ~1))
            continue
        if copy_sources and sf.path:
            p = Path(sf.path)
            cand = p if p.is_absolute() else (exp.path / p if exp.path is not None else None)
            if cand is not None and cand.is_file():
                result.append(SourceFile(_copied_name(cand), True, sf.flags | 1))
                continue
        result.append(sf)
    return result


def _copy_sources(exp: Experiment, out: Path, files: list[SourceFile]) -> None:
    for orig, sf in zip(exp.files, files, strict=True):
        if not sf.copied:
            continue
        dest = _inside(out, sf.path)
        if orig.copied:
            src = exp.path / orig.path if exp.path is not None else dest
        else:
            p = Path(orig.path)
            src = p if p.is_absolute() or exp.path is None else exp.path / p
        if not src.is_file() or (dest.exists() and os.path.samefile(src, dest)):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


# ==== meta.db ===========================================================================


@dataclass
class _TreeLayout:
    """The context tree as v4 records: entry points and {Ctx} records with their sizes."""

    entries: I64  # node indices of the entry points, in order (-1: a synthetic entry)
    synthetic_ctx: int  # ctx id of the synthetic entry wrapping root's non-entry children
    body: I64  # node indices of {Ctx} records in file order (sibling groups by parent)
    words: I64  # size of each body record in u64 words
    n_slots: int  # cct.db context count

    @classmethod
    def build(cls, exp: Experiment, n_slots: int, synthetic: int) -> _TreeLayout:
        """``synthetic``: the context id of the "unknown entry" v4 needs above contexts that
        hang directly below the global context (e.g. from experiment.xml), -1 for none;
        :mod:`callpath.formats.v4.entry` chose it and gave it its values."""
        cct = exp.cct
        kind = cct.kind
        is_ctx = kind <= NodeKind.INSTRUCTION
        entries = np.flatnonzero(kind == NodeKind.ENTRY).astype(np.int64)
        if synthetic >= 0:
            entries = np.append(entries, -1)
        body = np.flatnonzero(is_ctx).astype(np.int64)
        body = body[np.argsort(cct.parent[body], kind="stable")]
        fl = cct.flags[body].astype(np.int64)
        nflex = (fl & HAS_FUNCTION) + 2 * ((fl >> 1) & 1) + 2 * ((fl >> 2) & 1)
        return cls(entries, synthetic, body, CTX_HEADER_WORDS + nflex, n_slots)


def _meta_db(exp: Experiment, files: list[SourceFile], tree: _TreeLayout) -> bytes:
    n_sections = 8
    header_size = 0x10 + 16 * n_sections
    sections: list[tuple[int, int]] = []
    chunks: list[bytes] = []
    pos = header_size

    def add(sec: _Section) -> None:
        nonlocal pos
        sections.append((sec.size, sec.base))
        chunks.append(bytes(sec.base - pos) + bytes(sec.buf))
        pos = sec.base + sec.size

    # General Properties
    gen = _Section(align_up(pos))
    hdr = gen.reserve(0x10)
    p_title = gen.put(_encode(exp.title, "title") + b"\0")
    p_desc = gen.put(_encode(exp.description, "description") + b"\0")
    gen.patch(hdr, np.array([p_title, p_desc], dtype="<u8"))
    add(gen)

    # Identifier Names
    idn = _Section(align_up(pos))
    hdr = idn.reserve(9)
    names = idn.strings(exp.id_names, "identifier name")
    idn.align()
    pp = idn.put(np.array([names[s] for s in exp.id_names], dtype="<u8"))
    idn.patch(hdr, np.array([pp if exp.id_names else 0], dtype="<u8").tobytes()
              + bytes([len(exp.id_names)]))
    add(idn)

    # Performance Metrics
    add(_metrics_section(align_up(pos), exp.metrics, exp.scopes))

    # Common String Table
    strs = _Section(align_up(pos))
    entry_names = [_entry_name(exp, int(e)) for e in tree.entries]
    table = strs.strings(entry_names, "entry point name")
    table.update(strs.strings([m.path for m in exp.modules], "load module path"))
    table.update(strs.strings([f.path for f in files], "source file path"))
    table.update(strs.strings([fn.name for fn in exp.functions if fn.has_name], "function name"))
    add(strs)

    # Load Modules
    mods = _Section(align_up(pos))
    hdr = mods.reserve(0x0E)
    rec = np.zeros(len(exp.modules), MODULE_SPEC)
    rec["flags"] = [m.flags for m in exp.modules]
    rec["pPath"] = [table[m.path] for m in exp.modules]
    p_mods = mods.align()
    mods.put(rec)
    mods.patch(hdr, _table_header(p_mods, len(exp.modules), MODULE_SPEC.itemsize))
    add(mods)

    # Source Files
    fsec = _Section(align_up(pos))
    hdr = fsec.reserve(0x0E)
    rec = np.zeros(len(files), FILE_SPEC)
    rec["flags"] = [(f.flags & ~1) | int(f.copied) for f in files]
    rec["pPath"] = [table[f.path] for f in files]
    p_files = fsec.align()
    fsec.put(rec)
    fsec.patch(hdr, _table_header(p_files, len(files), FILE_SPEC.itemsize))
    add(fsec)

    # Functions
    fns = _Section(align_up(pos))
    hdr = fns.reserve(0x0E)
    p_fns = fns.align()
    fns.put(_function_records(exp, table, p_mods, p_files))
    fns.patch(hdr, _table_header(p_fns, len(exp.functions), FUNCTION_SPEC.itemsize))
    add(fns)

    # Context Tree
    add(_context_section(align_up(pos), exp, tree, table, entry_names, p_fns, p_files, p_mods))

    # Header order: General, IdNames, Metrics, Context, Strings, Modules, Files, Functions
    order = [0, 1, 2, 7, 3, 4, 5, 6]
    head = _file_header(b"meta", [sections[i] for i in order])
    body = b"".join(chunks)
    return head + body + _footer(b"meta", pos)


def _table_header(ptr: int, count: int, size: int) -> bytes:
    if count > 0xFFFFFFFF:
        raise CallpathError(f"{count} table entries; v4 allows at most 2^32-1")
    return (ptr if count else 0).to_bytes(8, "little") + count.to_bytes(4, "little") \
        + size.to_bytes(2, "little")


def _entry_name(exp: Experiment, node: int) -> str:
    if node < 0:
        return ENTRY_NAMES[EntryPoint.UNKNOWN]
    name = exp.cct.entry_names.get(node)
    if name is not None:
        return name
    ep = int(exp.cct.entry_point[node])
    return ENTRY_NAMES.get(EntryPoint(ep), f"entry point {ep}") if ep <= 2 \
        else f"entry point {ep}"


def _metrics_section(base: int, metrics: list[Metric], scopes: list[PropagationScope]
                     ) -> _Section:
    sec = _Section(base)
    hdr = sec.reserve(0x1B)
    names = sec.strings([s.name for s in scopes], "propagation scope name")
    names.update(sec.strings([s.formula for m in metrics for s in m.summaries], "formula"))
    names.update(sec.strings([m.name for m in metrics], "metric name"))

    p_scopes = sec.align()
    sc = np.zeros(len(scopes), SCOPE_SPEC)
    sc["pScopeName"] = [names[s.name] for s in scopes]
    sc["type"] = [int(s.type) for s in scopes]
    sc["propagationIndex"] = [s.propagation_index for s in scopes]
    sec.put(sc)

    def scope_ptr(i: int, what: str) -> int:
        if not 0 <= i < len(scopes):
            raise CallpathError(f"{what} refers to propagation scope {i}, but there are "
                                f"{len(scopes)}")
        return p_scopes + i * SCOPE_SPEC.itemsize

    p_metrics = sec.reserve(len(metrics) * METRIC_SPEC.itemsize)
    md = np.zeros(len(metrics), METRIC_SPEC)
    for k, m in enumerate(metrics):
        if len(m.scope_insts) > 0xFFFF or len(m.summaries) > 0xFFFF:
            raise CallpathError(f"metric {m.name!r} has too many sub-metrics for v4")
        md[k]["pName"] = names[m.name]
        md[k]["nScopeInsts"] = len(m.scope_insts)
        md[k]["nSummaries"] = len(m.summaries)
        if m.scope_insts:
            psi = np.zeros(len(m.scope_insts), SCOPE_INST_SPEC)
            psi["pScope"] = [scope_ptr(i.scope, f"metric {m.name!r}") for i in m.scope_insts]
            psi["propMetricId"] = [_metric_id(i.prop_metric_id, m) for i in m.scope_insts]
            md[k]["pScopeInsts"] = sec.put(psi)
        if m.summaries:
            ss = np.zeros(len(m.summaries), SUMMARY_SPEC)
            ss["pScope"] = [scope_ptr(s.scope, f"metric {m.name!r}") for s in m.summaries]
            ss["pFormula"] = [names[s.formula] for s in m.summaries]
            ss["combine"] = [int(s.combine) for s in m.summaries]
            ss["statMetricId"] = [_metric_id(s.stat_metric_id, m) for s in m.summaries]
            md[k]["pSummaries"] = sec.put(ss)
    sec.patch(p_metrics, md)
    head = np.zeros(1, _struct([("pMetrics", "<u8", 0), ("nMetrics", "<u4", 8),
                                ("szMetric", "u1", 0xC), ("szScopeInst", "u1", 0xD),
                                ("szSummary", "u1", 0xE), ("pScopes", "<u8", 0x10),
                                ("nScopes", "<u2", 0x18), ("szScope", "u1", 0x1A)], 0x1B))
    head["pMetrics"] = p_metrics if metrics else 0
    head["nMetrics"] = len(metrics)
    head["szMetric"] = METRIC_SPEC.itemsize
    head["szScopeInst"] = SCOPE_INST_SPEC.itemsize
    head["szSummary"] = SUMMARY_SPEC.itemsize
    head["pScopes"] = p_scopes if scopes else 0
    head["nScopes"] = len(scopes)
    head["szScope"] = SCOPE_SPEC.itemsize
    sec.patch(hdr, head)
    return sec


def _metric_id(i: int, m: Metric) -> int:
    if not 0 <= i <= 0xFFFF:
        raise CallpathError(f"metric {m.name!r}: metric identifier {i} does not fit in 16 bits")
    return i


def _function_records(exp: Experiment, table: dict[str, int], p_mods: int, p_files: int
                      ) -> npt.NDArray[Any]:
    fns = exp.functions
    rec = np.zeros(len(fns), FUNCTION_SPEC)
    if not fns:
        return rec
    mod = np.array([f.module for f in fns], dtype=np.int64)
    fil = np.array([f.file for f in fns], dtype=np.int64)
    if np.any(mod >= len(exp.modules)) or np.any(fil >= len(exp.files)):
        raise CallpathError("a function refers to a load module or source file that does not "
                            "exist")
    rec["pName"] = [table[f.name] if f.has_name else 0 for f in fns]
    rec["pModule"] = np.where(mod >= 0, p_mods + 16 * mod, 0)
    rec["offset"] = [f.offset for f in fns]
    rec["pFile"] = np.where(fil >= 0, p_files + 16 * fil, 0)
    rec["line"] = [f.line for f in fns]
    rec["flags"] = [f.flags for f in fns]
    return rec


def _context_section(base: int, exp: Experiment, tree: _TreeLayout, table: dict[str, int],
                     entry_names: list[str], p_fns: int, p_files: int, p_mods: int) -> _Section:
    """The context tree: header, the entry point array, then every {Ctx} record, grouped into
    children arrays. All positions and fields are computed for all nodes at once."""
    cct = exp.cct
    n = len(cct)
    sec = _Section(base)
    hdr = sec.reserve(0x0B)
    n_entries = len(tree.entries)
    if n_entries > 0xFFFF:
        raise CallpathError(f"{n_entries} entry points; v4 allows at most 65535")
    p_entries = sec.align()
    sec.reserve(n_entries * ENTRY_SPEC.itemsize)
    p_body = sec.align()

    body, words = tree.body, tree.words
    word_pos = np.zeros(len(body), dtype=np.int64)
    if len(body):
        np.cumsum(words[:-1], out=word_pos[1:])
    rec_ptr = p_body + 8 * word_pos
    # children arrays: one contiguous group per parent
    sz_children = np.zeros(n, dtype=np.uint64)
    p_children = np.zeros(n, dtype=np.uint64)
    if len(body):
        par = cct.parent[body]
        first = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
        gpar = par[first]
        sz_children[gpar] = 8 * np.add.reduceat(words, first)
        p_children[gpar] = rec_ptr[first]

    # entry points
    ent = np.zeros(n_entries, ENTRY_SPEC)
    e_nodes = tree.entries
    real = e_nodes >= 0
    ent["szChildren"] = np.where(real, sz_children[np.maximum(e_nodes, 0)], sz_children[0])
    ent["pChildren"] = np.where(real, p_children[np.maximum(e_nodes, 0)], p_children[0])
    ent["ctxId"] = np.where(real, cct.ctx_id[np.maximum(e_nodes, 0)], tree.synthetic_ctx)
    ent["entryPoint"] = np.where(real, cct.entry_point[np.maximum(e_nodes, 0)],
                                 EntryPoint.UNKNOWN)
    ent["pPrettyName"] = [table[s] for s in entry_names]
    sec.patch(p_entries, ent)

    # {Ctx} records as u64 words
    total_words = int(words.sum())
    w = np.zeros(total_words, dtype=np.uint64)
    if len(body):
        fl = (cct.flags[body] & (HAS_FUNCTION | HAS_SRCLOC | HAS_POINT)).astype(np.uint64)
        hf = (fl & HAS_FUNCTION).astype(np.int64)
        hs = ((fl >> np.uint64(1)) & np.uint64(1)).astype(np.int64)
        hp = ((fl >> np.uint64(2)) & np.uint64(1)).astype(np.int64)
        nflex = (words - CTX_HEADER_WORDS).astype(np.uint64)
        w[word_pos] = sz_children[body]
        w[word_pos + 1] = p_children[body]
        w[word_pos + 2] = (cct.ctx_id[body].astype(np.uint64)
                           | fl << np.uint64(32)
                           | cct.relation[body].astype(np.uint64) << np.uint64(40)
                           | cct.kind[body].astype(np.uint64) << np.uint64(48)
                           | nflex << np.uint64(56))
        w[word_pos + 3] = cct.propagation[body].astype(np.uint64)
        flex = word_pos + CTX_HEADER_WORDS

        def pointers(index: I64, present: npt.NDArray[np.bool_], base_ptr: int, stride: int,
                     count: int, what: str) -> U64:
            idx = index[present]
            if np.any((idx < 0) | (idx >= count)):
                raise CallpathError(f"a context's flags say it has a {what}, but its {what} "
                                    f"index is not one of the {count} in the table")
            return (base_ptr + stride * idx).astype(np.uint64)

        m = hf == 1
        w[flex[m]] = pointers(cct.function[body], m, p_fns, FUNCTION_SPEC.itemsize,
                              len(exp.functions), "function")
        m = hs == 1
        at = flex + hf
        w[at[m]] = pointers(cct.file[body], m, p_files, FILE_SPEC.itemsize, len(exp.files),
                            "source file")
        w[at[m] + 1] = cct.line[body][m].astype(np.uint64)
        m = hp == 1
        at = flex + hf + 2 * hs
        w[at[m]] = pointers(cct.module[body], m, p_mods, MODULE_SPEC.itemsize,
                            len(exp.modules), "load module")
        w[at[m] + 1] = cct.offset[body][m].astype(np.uint64)
    sec.put(w)
    sec.patch(hdr, (p_entries if n_entries else 0).to_bytes(8, "little")
              + n_entries.to_bytes(2, "little") + bytes([ENTRY_SPEC.itemsize]))
    return sec


# ==== profile.db ========================================================================


@dataclass
class _ProfileHead:
    """``profile.db``'s fixed-size part, known before any block: the header, the profile
    info array and the identifier tuples; the blocks start at ``data_base``."""

    p_infos: int
    p_array: int
    infos_size: int
    info: npt.NDArray[Any]
    tuples: _Section

    @property
    def data_base(self) -> int:
        return align_up(self.tuples.pos)

    @classmethod
    def of(cls, exp: Experiment) -> _ProfileHead:
        profiles = exp.profiles
        n = len(profiles)
        header_size = 0x10 + 16 * 2
        p_infos = align_up(header_size)
        p_array = align_up(p_infos + 0x0D)
        infos_size = p_array + n * PROFILE_INFO.itemsize - p_infos
        # identifier tuples: every profile but the canonical summary one, in profile order
        tuples = _Section(align_up(p_infos + infos_size))
        info = np.zeros(n, PROFILE_INFO)
        for i, p in enumerate(profiles):
            info[i]["flags"] = (p.flags & ~1) | int(p.is_summary)
            if i == 0:
                continue
            tuples.align()
            if len(p.ids) > 0xFFFF:
                raise CallpathError(f"profile {i}: identifier tuple too long")
            info[i]["pIdTuple"] = tuples.put(len(p.ids).to_bytes(2, "little") + bytes(6))
            ids = np.zeros(len(p.ids), IDENTIFIER)
            for k, ident in enumerate(p.ids):
                if not (0 <= ident.kind <= 0xFF and 0 <= ident.logical_id <= 0xFFFFFFFF
                        and 0 <= ident.physical_id < 1 << 64 and 0 <= ident.flags <= 0xFFFF):
                    raise CallpathError(f"profile {i}: identifier {ident} out of v4 range")
                ids[k] = (ident.kind, ident.flags, ident.logical_id, ident.physical_id)
            tuples.put(ids)
        return cls(p_infos, p_array, infos_size, info, tuples)


def _fill_infos(head: _ProfileHead, spools: list[spool.Spool]) -> None:
    """The info of the profiles in the spools, which have their places
    (:func:`spool.place_spools`)."""
    info = head.info
    for sp in spools:
        at = sp.profiles
        info["nValues"][at] = sp.n_values
        info["pValues"][at] = sp.p_values + sp.dest
        info["nCtxs"][at] = sp.n_ctxs
        info["pCtxIndices"][at] = sp.p_ctxs + sp.dest


def _write_profile_db(f: BinaryIO, head: _ProfileHead, summary: ProfileBlock, pos: int
                      ) -> None:
    """Finish ``profile.db`` (the other profiles' blocks are in place up to ``pos``): the
    summary block behind them, the footer, the headers."""
    if len(summary.ctx_ids) > 0xFFFFFFFF:
        raise CallpathError("profile 0: too many contexts for v4")
    f.seek(pos)
    p_values, p_ctx, pos = write_profile_block(f, pos, summary)
    info = head.info
    info[0]["nValues"], info[0]["pValues"] = len(summary.values), p_values
    info[0]["nCtxs"], info[0]["pCtxIndices"] = len(summary.ctx_ids), p_ctx
    f.write(_footer(b"prof", pos))
    f.seek(0)
    tuples = head.tuples
    f.write(_file_header(b"prof", [(head.infos_size, head.p_infos),
                                   (tuples.size, tuples.base)]))
    f.seek(head.p_infos)
    f.write(head.p_array.to_bytes(8, "little") + len(info).to_bytes(4, "little")
            + bytes([PROFILE_INFO.itemsize]))
    f.seek(head.p_array)
    f.write(info.tobytes())
    f.seek(tuples.base)
    f.write(bytes(tuples.buf))


# ==== cct.db ============================================================================


def _write_cct_db(f: BinaryIO, layout: transpose.ContextLayout) -> int:
    """The header, the context index and the footer, the file sized for the blocks, which
    the transposing workers write in place (:func:`transpose.transpose_buckets`). Returns the
    offset of the first block."""
    n_slots = len(layout.n_values)
    header_size = 0x10 + 16
    p_section = align_up(header_size)
    p_array = align_up(p_section + 0x0D)
    section_size = p_array + n_slots * CONTEXT_INFO.itemsize - p_section
    data_base = align_up(p_section + section_size)
    info = np.zeros(n_slots, CONTEXT_INFO)
    info["nValues"] = layout.n_values
    info["pValues"] = layout.start[:-1] + data_base
    info["nMetrics"] = layout.n_metrics
    info["pMetricIndices"] = layout.start[:-1] + data_base + 12 * layout.n_values
    end = data_base + int(layout.start[-1])
    f.seek(end)
    f.write(_footer(b"ctxt", end))
    f.seek(0)
    f.write(_file_header(b"ctxt", [(section_size, p_section)]))
    f.seek(p_section)
    f.write(p_array.to_bytes(8, "little") + n_slots.to_bytes(4, "little")
            + bytes([CONTEXT_INFO.itemsize]))
    f.seek(p_array)
    _write(f, info)
    return data_base


# ==== trace.db ==========================================================================


def _write_trace_db(f: BinaryIO, traces: Traces, n_profiles: int) -> None:
    header_size = 0x10 + 16
    p_section = align_up(header_size)
    p_array = p_section + 0x20
    n = len(traces.lines)
    section_size = p_array + n * TRACE_HEADER.itemsize - p_section
    heads = np.zeros(n, TRACE_HEADER)
    pos = align_up(p_section + section_size)
    f.seek(pos)
    for k, line in enumerate(traces.lines):
        ts = np.asarray(line.timestamps, dtype=np.uint64)
        cs = np.asarray(line.ctx_ids, dtype=np.uint32)
        if len(ts) != len(cs):
            raise CallpathError(f"trace {k}: {len(ts)} timestamps but {len(cs)} contexts")
        if len(ts) > 1 and np.any(ts[1:] < ts[:-1]):
            raise CallpathError(f"trace {k}: timestamps are not in increasing order")
        if not 0 <= line.prof_index < n_profiles:
            raise CallpathError(f"trace {k}: profile index {line.prof_index} does not exist")
        pos = pad_to(f, pos)
        el = np.empty(len(ts), TRACE_ELEM)
        el["timestamp"] = ts
        el["ctxId"] = cs
        heads[k] = (line.prof_index, pos, pos + el.nbytes)
        _write(f, el)
        pos += el.nbytes
    f.write(_footer(b"trce", pos))
    f.seek(0)
    f.write(_file_header(b"trce", [(section_size, p_section)]))
    f.seek(p_section)
    if n > 0xFFFFFFFF:
        raise CallpathError("too many traces for v4")
    head = np.zeros(1, _struct([("pTraces", "<u8", 0), ("nTraces", "<u4", 8),
                                ("szTrace", "u1", 0xC), ("minTimestamp", "<u8", 0x10),
                                ("maxTimestamp", "<u8", 0x18)], 0x20))
    head["pTraces"] = p_array if n else 0
    head["nTraces"] = n
    head["szTrace"] = TRACE_HEADER.itemsize
    head["minTimestamp"] = traces.min_timestamp
    head["maxTimestamp"] = traces.max_timestamp
    f.write(head.tobytes())
    f.write(heads.tobytes())

