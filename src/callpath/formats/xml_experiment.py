"""Reader for HPCToolkit's older database format: ``experiment.xml`` plus dense ``*.metric-db``.

Before the sparse v4 format (``meta.db``/``profile.db``), ``hpcprof`` wrote a database as one
XML document (format 2.x, see ``hpc-experiment.dtd``) holding the calling context tree and the
tables it refers to, and, when per-thread values were kept, one binary *metric-db* file per
execution context. A metric-db file is a dense matrix: a 24-byte ASCII magic
(``HPCPROF-metricdb__<version>``), big-endian ``u32`` node and metric counts, then big-endian
``f64`` values row-major by node, row ``k`` belonging to the scope whose XML id ``i`` is
``k + 1`` (id 1 being the implicit root, ``SecCallPathProfileData``).

The XML is parsed in one streaming pass with expat: the tree is accumulated as preorder columns
(document order *is* preorder) and no element tree is kept, so memory grows with the number of
scopes only, and every semantic error can still name the line and column it was found at.
Metric-db files are decoded with numpy in one vectorised step per file; only nonzero values are
kept, as the model's sparse :class:`~callpath.model.values.ProfileBlock`.

Mapping onto the model (see ``docs/formats-xml.md``): ``PF`` is a called function, ``Pr``/``A``
are inlined (alien) or nested static procedures, ``L`` a loop, ``S`` a statement line and ``C``
a call-site line. Every node keeps its XML ``i`` as ``ctx_id`` (the implicit root is ctx 0).
Each inclusive/exclusive ``MetricDB`` pair becomes one metric with ``execution`` and
``function`` scopes; per-node ``point`` values do not exist in this format and are not invented.
"""

from __future__ import annotations

import os
import re
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NoReturn
from xml.parsers import expat

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.model.cct import CCT, HAS_FUNCTION, HAS_SRCLOC, NodeKind, Relation
from callpath.model.contexts import ExecutionContext, Identifier, IdKind
from callpath.model.experiment import (
    Experiment,
    build_experiment,
    standard_metric,
    standard_scopes,
)
from callpath.model.metrics import Metric, PropagationScope
from callpath.model.tables import Function, LoadModule, SourceFile
from callpath.model.values import ProfileBlock

__all__ = ["METRICDB_MAGIC", "read_metric_db", "read_xml_experiment"]

EXPERIMENT_XML = "experiment.xml"
METRICDB_MAGIC = b"HPCPROF-metricdb"  # followed by "__<version>" up to the 24-byte header
METRICDB_HEADER_SIZE = 24  # the magic; the two u32 counts follow it
METRICDB_COUNTS_SIZE = 8
DEFAULT_GLOB = "*.metric-db"

# <prefix>-<rank>-<thread>-<host id>-<pid>-<generation>.metric-db, anchored at the end because
# the program name in front may itself contain dashes.
_METRICDB_NAME = re.compile(r"-(\d+)-(\d+)-([0-9a-fA-F]+)-(\d+)-(\d+)\.metric-db$")
_IE_SUFFIX = re.compile(r"\s*\((?:I|E)\)\s*$")
_DECIMAL = re.compile(r"[0-9]+")
_LINE = re.compile(r"^\s*(\d+)(?:\s*-\s*(\d+))?\s*$")

# Scope elements of the call path section, and the elements that may appear between them.
_SCOPES = frozenset({"PF", "Pr", "A", "L", "C", "S"})
_DATA_OTHER = frozenset({"M"})
_UNKNOWN_FILES = frozenset({"", "<unknown file>"})
_UNKNOWN_MODULES = frozenset({"", "<unknown load module>"})
_METRIC_KINDS = frozenset({"inclusive", "exclusive", "nil"})
_CHUNK = 1 << 20
_FUNCTION = int(NodeKind.FUNCTION)
_CALL = int(Relation.CALL)
_INLINED = int(Relation.INLINED_CALL)
_LEXICAL = int(Relation.LEXICAL)
_LEXICAL_KINDS = {
    "S": (int(NodeKind.LINE), _LEXICAL),  # a statement
    "C": (int(NodeKind.LINE), _LEXICAL),  # a call site: the line the callees hang under
    "L": (int(NodeKind.LOOP), _LEXICAL),
}
_U32_MAX = 0xFFFFFFFF  # ids and lines are 32-bit in the model (and in hpcprof)

_Adder = Callable[[str], int]  # adds a name to a table, returns its index (-1: unknown)


@dataclass(frozen=True)
class _MetricDB:
    """One ``MetricDB`` element: a column of every metric-db file."""

    xml_id: int
    name: str
    kind: str  # inclusive | exclusive | nil
    partner: int | None
    glob: str
    column: int
    n_columns: int | None
    header_size: int | None


def _column(root_value: int) -> array[int]:
    return array("q", [root_value])


def _np(col: array[int]) -> npt.NDArray[np.int64]:
    return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, np.int64)


@dataclass
class _Parsed:
    """Everything the XML pass collects, in the form the model wants."""

    version: str = ""
    title: str = ""
    # Tree columns in preorder, starting with the root. Typed arrays rather than lists: 8 bytes
    # a value instead of a pointer plus an int object, and numpy views them without copying.
    parent: array[int] = field(default_factory=lambda: _column(-1))
    kind: array[int] = field(default_factory=lambda: _column(int(NodeKind.ROOT)))
    relation: array[int] = field(default_factory=lambda: _column(int(Relation.NONE)))
    function: array[int] = field(default_factory=lambda: _column(-1))
    file: array[int] = field(default_factory=lambda: _column(-1))
    line: array[int] = field(default_factory=lambda: _column(0))
    module: array[int] = field(default_factory=lambda: _column(-1))
    ctx_id: array[int] = field(default_factory=lambda: _column(0))  # -1: scope without ``i``
    modules: list[LoadModule] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    metric_dbs: list[_MetricDB] = field(default_factory=list)
    saw_data: bool = False


class _XmlPass:
    """Streaming expat handlers that turn ``experiment.xml`` into :class:`_Parsed`.

    Tables come before the call path data in the document, so references (``lm``, ``f``,
    ``n``) are resolved as the scopes stream by and the tree is final at the end of the pass.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.out = _Parsed()
        self.parser = expat.ParserCreate()
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.tags: list[str] = []
        # enclosing scopes inside SecCallPathProfileData: (node, file, module); the file and
        # module are what statements, loops and call sites inside inherit
        self.scopes: list[tuple[int, int, int]] = []
        self.n_sections = 0
        # XML id -> table index (-1 for an entry that means "unknown")
        self.module_ids: dict[str, int] = {}
        self.file_ids: dict[str, int] = {}
        self.proc_names: dict[str, str] = {}
        # literal (non-id) names and deduplicated functions
        self.module_by_name: dict[str, int] = {}
        self.file_by_name: dict[str, int] = {}
        self.function_index: dict[tuple[str, int, int, int], int] = {}
        self.seen_ids: set[int] = set()
        self.metricdb_ids: set[int] = set()

    # ---- driving ---------------------------------------------------------------------------

    def run(self, stream: BinaryIO) -> _Parsed:
        try:
            # large reads: ParseFile's small default buffer costs more calls into expat
            while chunk := stream.read(_CHUNK):
                self.parser.Parse(chunk, False)
            self.parser.Parse(b"", True)
        except expat.ExpatError as exc:
            msg = expat.errors.messages.get(exc.code, str(exc))
            raise FormatError(self.path, f"malformed XML at line {exc.lineno}, column "
                              f"{exc.offset + 1}: {msg}") from None
        if not self.out.saw_data:
            self._fail_at_end("no SecCallPathProfile/SecCallPathProfileData section (expected a "
                              "call path profile; flat-only experiments are not supported)")
        return self.out

    def _where(self) -> str:
        return (f"line {self.parser.CurrentLineNumber}, "
                f"column {self.parser.CurrentColumnNumber + 1}")

    def _fail(self, message: str) -> NoReturn:
        raise FormatError(self.path, f"{self._where()}: {message}")

    def _fail_at_end(self, message: str) -> NoReturn:
        raise FormatError(self.path, message)

    # ---- attribute helpers -----------------------------------------------------------------

    def _req(self, tag: str, attrs: dict[str, str], name: str) -> str:
        value = attrs.get(name)
        if value is None:
            self._fail(f"<{tag}> lacks the required attribute {name!r}")
        return value

    def _int(self, tag: str, name: str, value: str) -> int:
        """A decimal attribute value in ``0..2**32-1``, the range of every such field here."""
        if _DECIMAL.fullmatch(value) is None:
            self._fail(f"<{tag} {name}={value!r}>: expected a decimal integer")
        out = int(value)
        if out > _U32_MAX:
            self._fail(f"<{tag} {name}={value!r}>: expected an integer from 0 to {_U32_MAX}")
        return out

    def _opt_int(self, tag: str, attrs: dict[str, str], name: str) -> int | None:
        value = attrs.get(name)
        return None if value is None else self._int(tag, name, value)

    def _line(self, tag: str, value: str | None) -> int:
        """The first line of an ``l`` attribute, which is ``N`` or an inclusive ``beg-end``."""
        if value is None:
            return 0
        if value.isascii() and value.isdigit() and len(value) < 10:  # the common case
            return int(value)
        m = _LINE.match(value)
        if m is None or int(m.group(1)) > _U32_MAX:
            self._fail(f"<{tag} l={value!r}>: expected a line number or a 'begin-end' range")
        return int(m.group(1))

    # ---- element dispatch ------------------------------------------------------------------

    def _start(self, tag: str, attrs: dict[str, str]) -> None:
        depth = len(self.tags)
        parent = self.tags[-1] if self.tags else ""
        self.tags.append(tag)
        if depth == 0:
            self._root(tag, attrs)
        elif tag == "Header" and parent == "HPCToolkitExperiment":
            self.out.title = attrs.get("n", "")
        elif tag == "SecCallPathProfile":
            self.n_sections += 1
            if self.n_sections > 1:
                self._fail("more than one SecCallPathProfile (expected exactly one)")
            if not self.out.title:
                self.out.title = attrs.get("n", "")
        elif tag == "SecCallPathProfileData":
            if parent != "SecCallPathProfile":
                self._fail("<SecCallPathProfileData> outside <SecCallPathProfile>")
            self.out.saw_data = True
            # the bulk of the document: switch to handlers that know only scopes
            self.parser.StartElementHandler = self._data_start
            self.parser.EndElementHandler = self._data_end
        elif tag == "MetricDB" and parent == "MetricDBTable":
            self._metric_db(attrs)
        elif tag == "LoadModule" and parent == "LoadModuleTable":
            self._table_entry(tag, attrs, self.module_ids, self._add_module)
        elif tag == "File" and parent == "FileTable":
            self._table_entry(tag, attrs, self.file_ids, self._add_file)
        elif tag == "Procedure" and parent == "ProcedureTable":
            ident = self._req(tag, attrs, "i")
            if ident in self.proc_names:
                self._fail(f"<Procedure i={ident!r}> is defined twice")
            self.proc_names[ident] = self._req(tag, attrs, "n")
        # Anything else in the headers (Info, NV, MetricTable, TraceDBTable, ...) carries
        # nothing the model holds; it is skipped so newer header additions stay readable.

    def _end(self, tag: str) -> None:
        self.tags.pop()

    def _data_start(self, tag: str, attrs: dict[str, str]) -> None:
        if tag in _SCOPES:
            self._scope(tag, attrs)
        elif tag not in _DATA_OTHER:
            self._fail(f"unknown element <{tag}> in the call path data (expected one of "
                       f"{', '.join(sorted(_SCOPES | _DATA_OTHER))})")

    def _data_end(self, tag: str) -> None:
        # expat has checked that tags match, and no SecCallPathProfileData nests in the data
        if tag in _SCOPES:
            self.scopes.pop()
        elif tag == "SecCallPathProfileData":
            self.tags.pop()
            self.parser.StartElementHandler = self._start
            self.parser.EndElementHandler = self._end

    def _root(self, tag: str, attrs: dict[str, str]) -> None:
        if tag != "HPCToolkitExperiment":
            self._fail(f"root element is <{tag}>, expected <HPCToolkitExperiment>")
        version = self._req(tag, attrs, "version")
        if version.split(".")[0] != "2":
            self._fail(f"unsupported experiment.xml version {version!r} (expected 2.x, the "
                       "format with dense metric-db files)")
        self.out.version = version

    # ---- tables ----------------------------------------------------------------------------

    def _table_entry(self, tag: str, attrs: dict[str, str], ids: dict[str, int],
                     add: _Adder) -> None:
        ident = self._req(tag, attrs, "i")
        if ident in ids:
            self._fail(f"<{tag} i={ident!r}> is defined twice")
        ids[ident] = add(self._req(tag, attrs, "n"))

    def _add_module(self, name: str) -> int:
        if name in _UNKNOWN_MODULES:
            return -1
        idx = self.module_by_name.get(name)
        if idx is None:
            idx = len(self.out.modules)
            self.out.modules.append(LoadModule(name))
            self.module_by_name[name] = idx
        return idx

    def _add_file(self, name: str) -> int:
        """A file index; files under the database's ``src/`` are copies kept with it."""
        if name in _UNKNOWN_FILES:
            return -1
        idx = self.file_by_name.get(name)
        if idx is None:
            path = name
            copied = False
            if not os.path.isabs(name):
                norm = os.path.normpath(name).replace(os.sep, "/")
                if norm.split("/", 1)[0] == "src":
                    path, copied = norm, True
            idx = len(self.out.files)
            self.out.files.append(SourceFile(path, copied=copied, flags=int(copied)))
            self.file_by_name[name] = idx
        return idx

    def _metric_db(self, attrs: dict[str, str]) -> None:
        tag = "MetricDB"
        xml_id = self._int(tag, "i", self._req(tag, attrs, "i"))
        if xml_id in self.metricdb_ids:
            self._fail(f"<MetricDB i=\"{xml_id}\"> is defined twice")
        self.metricdb_ids.add(xml_id)
        kind = attrs.get("t", "nil")
        if kind not in _METRIC_KINDS:
            self._fail(f"<MetricDB t={kind!r}>: expected inclusive, exclusive or nil")
        column = self._opt_int(tag, attrs, "db-id")
        if column is None:
            self._fail("<MetricDB> lacks 'db-id' (its column in the metric-db files)")
        self.out.metric_dbs.append(_MetricDB(
            xml_id=xml_id,
            name=self._req(tag, attrs, "n"),
            kind=kind,
            partner=self._opt_int(tag, attrs, "partner"),
            glob=attrs.get("db-glob", DEFAULT_GLOB),
            column=column,
            n_columns=self._opt_int(tag, attrs, "db-num-metrics"),
            header_size=self._opt_int(tag, attrs, "db-header-sz"),
        ))

    def _resolve(self, tag: str, attr: str, value: str, ids: dict[str, int],
                 add: _Adder, table: str) -> int:
        """``lm``/``f`` are "a string or an id" in the DTD: digits must name a table entry."""
        idx = ids.get(value)
        if idx is not None:
            return idx
        if value.isdigit():
            self._fail(f"<{tag} {attr}={value!r}> refers to no entry of the {table}")
        return add(value)

    def _proc_name(self, tag: str, attrs: dict[str, str], required: bool) -> str | None:
        value = attrs.get("n")
        if value is None:
            if required:
                self._fail(f"<{tag}> lacks the required attribute 'n'")
            return None
        if value.isdigit():
            name = self.proc_names.get(value)
            if name is None:
                self._fail(f"<{tag} n={value!r}> refers to no entry of the ProcedureTable")
            return name
        return value

    def _function(self, name: str | None, module: int, file: int, line: int) -> int:
        key = (name if name is not None else "\0", module, file, line)
        idx = self.function_index.get(key)
        if idx is None:
            idx = len(self.out.functions)
            self.out.functions.append(Function(name or "", module=module, file=file, line=line,
                                               has_name=name is not None))
            self.function_index[key] = idx
        return idx

    # ---- the calling context tree ----------------------------------------------------------

    def _scope(self, tag: str, attrs: dict[str, str]) -> None:
        """Append one node. Called once per scope of a possibly huge tree, so it is written
        for speed: plain dict lookups first, the careful checks only on unusual values."""
        out = self.out
        parent, in_file, in_module = self.scopes[-1] if self.scopes else (0, -1, -1)
        ident = attrs.get("i")
        if ident is None:
            ctx = -1  # no metric-db row; numbered after the last XML id
        else:
            simple = ident.isascii() and ident.isdigit() and len(ident) < 10
            ctx = int(ident) if simple else self._int(tag, "i", ident)
            if ctx < 2:
                self._fail(f"<{tag} i={ident!r}>: scope ids start at 2 (id 1 is the implicit "
                           "root, SecCallPathProfileData)")
            seen = self.seen_ids
            if ctx in seen:
                self._fail(f"<{tag} i={ident!r}>: scope id used twice")
            seen.add(ctx)
        line = self._line(tag, attrs.get("l"))
        function = -1
        f_attr = attrs.get("f")
        lm_attr = attrs.get("lm")
        if tag in _LEXICAL_KINDS:  # S, C, L: lines and loops of the enclosing code
            knd, rel = _LEXICAL_KINDS[tag]
        else:  # PF, Pr, A
            knd = _FUNCTION
            if tag == "PF":
                rel = _CALL
                in_file = in_module = -1  # a callee inherits nothing from its call site
            else:
                alien = attrs.get("a", "1" if tag == "A" else "0")
                if alien not in ("0", "1"):
                    self._fail(f"<{tag} a={alien!r}>: expected 0 or 1")
                if alien == "1":  # inlined code: same binary, but its own source file
                    rel, in_file = _INLINED, -1
                else:  # a static procedure scope nested in its frame
                    rel = _LEXICAL
        file = in_file if f_attr is None else self._resolve(
            tag, "f", f_attr, self.file_ids, self._add_file, "FileTable")
        module = in_module if lm_attr is None else self._resolve(
            tag, "lm", lm_attr, self.module_ids, self._add_module, "LoadModuleTable")
        if knd == _FUNCTION:
            name = self._proc_name(tag, attrs, required=tag != "A")
            function = self._function(name, module, file, line)
        out.parent.append(parent)
        out.kind.append(knd)
        out.relation.append(rel)
        out.function.append(function)
        out.file.append(file)
        out.line.append(line)
        out.module.append(module)
        out.ctx_id.append(ctx)
        # statements, loops and call sites inside this scope default to its file and module
        self.scopes.append((len(out.parent) - 1, file, module))


# ---- metrics --------------------------------------------------------------------------------


@dataclass
class _MetricPlan:
    """The model's metrics and where each propagated value comes from in the metric-db files."""

    metrics: list[Metric]
    columns: list[tuple[int, int]]  # (metric-db column, prop_metric_id)
    glob: str
    n_columns: int


def _plan_metrics(path: Path, dbs: list[_MetricDB],
                  scopes: list[PropagationScope]) -> _MetricPlan:
    """Pair inclusive/exclusive ``MetricDB`` columns into metrics and check the table agrees
    with itself, so that a metric-db file can then be checked against it."""
    if not dbs:
        raise FormatError(path, "no MetricDB entries in the MetricDBTable: this experiment has no "
                          "per-thread metric-db files to read (hpcprof writes them with "
                          "--metric-db yes)")
    globs = sorted({d.glob for d in dbs})
    if len(globs) != 1:
        raise FormatError(path, f"MetricDB entries use several db-glob patterns {globs}: "
                          "expected one set of metric-db files")
    glob = globs[0]
    if "/" in glob or "\\" in glob or ".." in glob or not glob:
        raise FormatError(path, f"db-glob {glob!r} must name files inside the database "
                          "directory")
    sizes = {d.header_size for d in dbs if d.header_size is not None}
    if sizes - {METRICDB_HEADER_SIZE}:
        raise FormatError(path, f"db-header-sz {sorted(sizes)}: expected "
                          f"{METRICDB_HEADER_SIZE} (the only metric-db layout known)")
    counts = {d.n_columns for d in dbs if d.n_columns is not None}
    if len(counts) > 1:
        raise FormatError(path, f"MetricDB entries disagree on db-num-metrics {sorted(counts)}")
    n_columns = counts.pop() if counts else max(d.column for d in dbs) + 1
    seen: dict[int, _MetricDB] = {}
    for d in dbs:
        if d.column >= n_columns:
            raise FormatError(path, f"MetricDB {d.name!r} has db-id {d.column}, expected "
                              f"0..{n_columns - 1} (db-num-metrics is {n_columns})")
        if d.column in seen:
            raise FormatError(path, f"MetricDB {d.name!r} and {seen[d.column].name!r} share "
                              f"db-id {d.column}")
        seen[d.column] = d

    by_id = {d.xml_id: d for d in dbs}
    done: set[int] = set()
    groups: list[tuple[str, _MetricDB | None, _MetricDB | None]] = []
    for d in dbs:
        if d.xml_id in done:
            continue
        done.add(d.xml_id)
        inc: _MetricDB | None = None
        exc: _MetricDB | None = None
        if d.partner is not None and d.kind != "nil":
            p = by_id.get(d.partner)
            if p is None:
                raise FormatError(path, f"MetricDB {d.name!r} (i={d.xml_id}) names partner "
                                  f"{d.partner}, which is not in the MetricDBTable")
            if p.partner != d.xml_id or {d.kind, p.kind} != {"inclusive", "exclusive"}:
                raise FormatError(path, f"MetricDB i={d.xml_id} ({d.kind}) and i={p.xml_id} "
                                  f"({p.kind}) are not an inclusive/exclusive partner pair")
            done.add(p.xml_id)
            inc, exc = (d, p) if d.kind == "inclusive" else (p, d)
        elif d.kind == "exclusive":
            exc = d
        else:  # inclusive, or nil: values are shown as they are, like inclusive ones
            inc = d
        named = inc if inc is not None else exc
        assert named is not None
        groups.append((_IE_SUFFIX.sub("", named.name), inc, exc))

    if 3 * len(groups) > 0xFFFF:
        raise FormatError(path, f"{len(groups)} metrics: more than the model's 16-bit metric ids "
                          "can number")
    metrics: list[Metric] = []
    columns: list[tuple[int, int]] = []
    for g, (name, inc, exc) in enumerate(groups):
        base = standard_metric(name, 3 * g, scopes)
        keep = set()
        for db, scope in ((inc, "execution"), (exc, "function")):
            if db is None:
                continue
            keep.add(scope)
            pid = base.prop_id(scopes, scope)
            assert pid is not None
            columns.append((db.column, pid))
        # The point scope is dropped: this format has no per-node point values.
        metrics.append(Metric(
            name,
            [s for s in base.scope_insts if scopes[s.scope].name in keep],
            [s for s in base.summaries if scopes[s.scope].name in keep],
            description=base.description, unit=base.unit, period=base.period,
        ))
    return _MetricPlan(metrics, columns, glob, n_columns)


# ---- metric-db files ------------------------------------------------------------------------

_PREAMBLE = METRICDB_HEADER_SIZE + METRICDB_COUNTS_SIZE


def read_metric_db(path: Path, *, n_nodes: int | None = None,
                   n_metrics: int | None = None) -> npt.NDArray[np.float64]:
    """The dense ``(nodes, metrics)`` matrix of one metric-db file, in native byte order.

    ``n_nodes``/``n_metrics``, when given, are what ``experiment.xml`` promises; a file that
    disagrees belongs to another database (or was cut short) and is refused with a
    :class:`FormatError` naming the file and the byte offset of the offending field.
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(_PREAMBLE)
            if len(head) < _PREAMBLE:
                raise FormatError(path, f"truncated: {len(head)} bytes, expected at least the "
                                  f"{_PREAMBLE}-byte header (magic, node and metric counts)",
                                  len(head))
            if not head.startswith(METRICDB_MAGIC):
                magic = head[:METRICDB_HEADER_SIZE].decode("latin-1")
                raise FormatError(path, f"bad magic {magic!r}: expected "
                                  "'HPCPROF-metricdb__<version>' (not a metric-db file)", 0)
            nodes, metrics = struct.unpack_from(">II", head, METRICDB_HEADER_SIZE)
            if n_nodes is not None and nodes != n_nodes:
                raise FormatError(path, f"holds {nodes} node rows but experiment.xml's largest "
                                  f"scope id is {n_nodes} (expected one row per id: is this "
                                  "file from another database?)", METRICDB_HEADER_SIZE)
            if n_metrics is not None and metrics != n_metrics:
                raise FormatError(path, f"holds {metrics} metrics per node but experiment.xml's "
                                  f"MetricDBTable has db-num-metrics {n_metrics}",
                                  METRICDB_HEADER_SIZE + 4)
            want = nodes * metrics * 8
            body = fh.read(want + 1)
    except OSError as exc:
        raise FormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(body) < want:
        raise FormatError(path, f"truncated: {_PREAMBLE + len(body)} bytes, expected "
                          f"{_PREAMBLE + want} for {nodes} nodes x {metrics} metrics",
                          _PREAMBLE + len(body))
    if len(body) > want:
        raise FormatError(path, f"trailing bytes after {nodes} nodes x {metrics} metrics "
                          f"(expected a file of {_PREAMBLE + want} bytes)", _PREAMBLE + want)
    values = np.frombuffer(body, dtype=">f8").astype(np.float64)
    return values.reshape(nodes, metrics)


def _metric_db_files(directory: Path, glob: str) -> list[tuple[int, int, Path]]:
    """``(rank, thread, path)`` of every metric-db file, sorted; the name is the only place
    this format records which execution context a file belongs to."""
    found: dict[tuple[int, int], Path] = {}
    for p in sorted(directory.glob(glob)):
        if not p.is_file():
            continue
        m = _METRICDB_NAME.search(p.name)
        if m is None:
            raise FormatError(p, "file name does not give a rank and thread: expected "
                              "'<program>-<rank>-<thread>-<host>-<pid>-<gen>.metric-db'")
        key = (int(m.group(1)), int(m.group(2)))
        if key in found:
            raise FormatError(p, f"rank {key[0]} thread {key[1]} also has {found[key].name}: "
                              "expected one metric-db file per execution context")
        found[key] = p
    if not found:
        raise FormatError(directory / glob, "no metric-db file matches (experiment.xml's "
                          "MetricDBTable expects one per rank and thread in the database "
                          "directory)")
    return [(r, t, found[(r, t)]) for r, t in sorted(found)]


# ---- the experiment -------------------------------------------------------------------------


def _row_contexts(ctx: npt.NDArray[np.int64], max_id: int
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The context of every metric-db row and whether the tree has it.

    Row k holds XML id k+1; id 1 (row 0) is the implicit root, our context 0. Rows of ids that
    name no scope carry nothing the tree could show and are dropped."""
    row_ctx = np.arange(1, max_id + 1, dtype=np.int64)
    row_ctx[0] = 0
    known = np.zeros(max_id + 1, dtype=bool)
    known[ctx[ctx <= max_id]] = True
    known[1] = True
    return row_ctx, known[1:]


def read_xml_experiment(directory: Path) -> Experiment:
    """Read an ``experiment.xml`` (format 2.x) database with its ``*.metric-db`` files.

    ``directory`` is the database directory (``experiment.xml`` itself is accepted too). Any
    problem with the files raises :class:`~callpath.errors.FormatError` naming the file and
    what was expected; the result is an :class:`Experiment` whose profile 0 is the sum over
    all ranks and threads, computed here, not taken from the XML's rounded ``<M>`` values.
    """
    directory = Path(directory)
    if directory.name == EXPERIMENT_XML and directory.is_file():
        directory = directory.parent
    xml_path = directory / EXPERIMENT_XML
    try:
        stream = xml_path.open("rb")
    except FileNotFoundError:
        raise FormatError(xml_path, "no such file (expected the experiment.xml of an "
                          "HPCToolkit database directory)") from None
    except OSError as exc:
        raise FormatError(xml_path, f"cannot read: {exc.strerror or exc}") from None
    with stream:
        parsed = _XmlPass(xml_path).run(stream)

    scopes = standard_scopes()
    plan = _plan_metrics(xml_path, parsed.metric_dbs, scopes)

    ctx = _np(parsed.ctx_id).copy()
    max_id = max(int(ctx.max()), 1)  # metric-db rows are ids 1..max_id
    unnamed = np.flatnonzero(ctx < 0)
    if max_id + len(unnamed) > _U32_MAX:
        raise FormatError(xml_path, f"scope ids up to {max_id} leave no room for the "
                          f"{len(unnamed)} scopes without an 'i' in 32-bit context ids")
    ctx[unnamed] = max_id + 1 + np.arange(len(unnamed), dtype=np.int64)

    contexts: list[ExecutionContext] = []
    blocks: list[ProfileBlock] = []
    rows: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None
    for rank, thread, path in _metric_db_files(directory, plan.glob):
        # the header is checked against max_id before any row-sized array is made
        dense = read_metric_db(path, n_nodes=max_id, n_metrics=plan.n_columns)
        if rows is None:
            rows = _row_contexts(ctx, max_id)
        row_ctx, keep_row = rows
        parts_c, parts_m, parts_v = [], [], []
        for column, prop_id in plan.columns:
            col = dense[:, column]
            sel = keep_row & (col != 0)
            parts_c.append(row_ctx[sel])
            parts_m.append(np.full(int(sel.sum()), prop_id, dtype=np.int64))
            parts_v.append(col[sel])
        blocks.append(ProfileBlock.from_triples(np.concatenate(parts_c),
                                                np.concatenate(parts_m),
                                                np.concatenate(parts_v)))
        ids = (Identifier(IdKind.RANK, rank), Identifier(IdKind.THREAD, thread))
        contexts.append(ExecutionContext(len(contexts) + 1, ids))

    function = _np(parsed.function)
    file = _np(parsed.file)
    # The format states functions and source locations but no instruction addresses, so the
    # "point" flag stays clear even though modules are known.
    flags = (function >= 0) * HAS_FUNCTION + (file >= 0) * HAS_SRCLOC
    cct = CCT.from_columns(
        _np(parsed.parent), _np(parsed.kind), ctx_id=ctx, relation=_np(parsed.relation),
        function=function, file=file, line=_np(parsed.line), module=_np(parsed.module),
        flags=flags,
    )
    return build_experiment(
        cct, plan.metrics, scopes, contexts, blocks,
        modules=parsed.modules, files=parsed.files, functions=parsed.functions,
        title=parsed.title, description=f"HPCToolkit experiment.xml version {parsed.version}",
        path=directory, format="experiment.xml",
    )
