"""CodeAnalyst view configurations: read, validate, match to a data set, expand into columns.

A view configuration (``seeds/002``) is an XML file that says which events a view needs
(``<data>``) and which columns it shows (``<output>``: an event's value, or the sum, difference,
product or ratio of two). This module reads such files strictly -- every rule of the format is
checked and a broken one is reported in one line naming the file, the line and the rule -- and
turns a view into column specifications for the views of :mod:`callpath.analysis`.

Rules enforced (docs/view-configs.md has the full list): one non-empty ``<view_configuration>``
root holding one or more ``<view>`` elements; ``<view>`` with a non-empty ``name`` and the
optional booleans ``separate_cpus``, ``separate_processes``, ``separate_threads`` and
``default_view`` (exactly ``"T"`` or ``"F"``, default ``"F"``); exactly one each of ``<data>``,
``<output>``, ``<tool_tip>`` and ``<description>``, with ``<data>`` before ``<output>``;
``<event>`` with a unique ``id`` and hexadecimal ``select`` and ``mask``; ``<column>`` with a
``title``, a ``sort`` of ``none``/``ascending``/``descending`` and an optional boolean
``visible`` (default ``"T"``), holding exactly one empty ``<value id>``, ``<sum>``,
``<difference>``, ``<product>`` or ``<ratio>`` (``left`` and ``right``) naming defined events;
at most one sorted column; a ``<value>`` of an event before any combination using that event,
and none after one; tool tip and description non-empty, trimmed, runs of spaces and new lines
folded into one space. Unknown elements and attributes are errors.

Extension: an ``<event>`` may name a measured metric directly with ``metric="NAME"`` (then
``select`` and ``mask`` may be left out); the name is matched like the event table's aliases
(:mod:`callpath.analysis.event_codes`), so ``metric="cycles"`` also finds ``PAPI_TOT_CYC``.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.analysis.event_codes import FAMILIES, family_of, find_metric, lookup_code
from callpath.errors import CallpathError
from callpath.model.contexts import DEFAULT_ID_NAMES, ExecutionContext, IdKind

F64 = npt.NDArray[np.float64]

OPS = ("value", "sum", "difference", "product", "ratio")
SORTS = ("none", "ascending", "descending")
_HEX = re.compile(r"^(0[xX])?[0-9a-fA-F]+$")


class ViewConfigError(CallpathError):
    """A view configuration file that breaks a rule of the format."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = source if line is None else f"{source}, line {line}"
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


@dataclass(frozen=True)
class Event:
    id: str
    select: int | None
    mask: int | None
    metric: str | None = None  # extension: a measured metric named directly
    line: int = 0

    def describe(self) -> str:
        if self.metric is not None:
            return f"metric {self.metric!r}"
        code = lookup_code(self.select or 0, self.mask)
        what = f" ({code.description})" if code else ""
        return f"select 0x{self.select or 0:02x} mask 0x{self.mask or 0:02x}{what}"

    def wanted(self) -> tuple[str, ...]:
        """Metric names that satisfy this event, best first."""
        if self.metric is not None:
            fam = family_of(self.metric)
            extra = tuple(n for n in fam.names() if n != self.metric) if fam else ()
            return (self.metric, *extra)
        if self.select is None:
            return ()
        code = lookup_code(self.select, self.mask)
        return FAMILIES[code.family].names() if code else ()


@dataclass(frozen=True)
class Column:
    title: str
    sort: str  # none | ascending | descending
    visible: bool
    op: str  # value | sum | difference | product | ratio
    operands: tuple[str, ...]  # event ids: (id,) for value, (left, right) otherwise
    line: int = 0


@dataclass(frozen=True)
class View:
    name: str
    events: tuple[Event, ...]
    columns: tuple[Column, ...]
    tool_tip: str
    description: str
    separate_cpus: bool = False
    separate_processes: bool = False
    separate_threads: bool = False
    default_view: bool = False
    source: str = ""
    line: int = 0

    def event(self, event_id: str) -> Event:
        for e in self.events:
            if e.id == event_id:
                return e
        raise KeyError(event_id)


# ---- XML to a small tree with line numbers -----------------------------------------------


@dataclass
class _El:
    tag: str
    attrs: dict[str, str]
    line: int
    children: list[_El] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def alltext(self) -> str:
        return "".join(self.text)


def _parse_xml(data: bytes, source: str) -> _El:
    parser = xml.parsers.expat.ParserCreate()
    stack: list[_El] = []
    roots: list[_El] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = _El(tag, attrs, parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(el)
        stack.append(el)

    def end(tag: str) -> None:
        stack.pop()

    def chars(text: str) -> None:
        if stack:
            stack[-1].text.append(text)

    def doctype(*args: object) -> None:
        raise ViewConfigError(source, parser.CurrentLineNumber, "a DOCTYPE is not allowed in "
                                                                "a view configuration")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = doctype
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as e:
        msg = xml.parsers.expat.ErrorString(e.code)
        raise ViewConfigError(source, e.lineno, f"not well-formed XML at column "
                                                f"{e.offset + 1}: {msg}") from None
    return roots[0]


# ---- validation --------------------------------------------------------------------------


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def err(self, el: _El | None, msg: str) -> ViewConfigError:
        return ViewConfigError(self.source, el.line if el else None, msg)

    def attrs(self, el: _El, required: Sequence[str], optional: Sequence[str] = ()) -> None:
        allowed = (*required, *optional)
        for a in el.attrs:
            if a not in allowed:
                exp = ", ".join(allowed) if allowed else "no attributes"
                raise self.err(el, f"<{el.tag}> has an unknown attribute {a!r} (expected "
                                   f"{exp})")
        for a in required:
            if a not in el.attrs:
                raise self.err(el, f"<{el.tag}> lacks the required attribute {a!r}")

    def no_text(self, el: _El) -> None:
        text = el.alltext().strip()
        if text:
            short = text if len(text) <= 30 else text[:27] + "..."
            raise self.err(el, f"<{el.tag}> must not contain text (found {short!r})")

    def empty(self, el: _El) -> None:
        if el.children:
            raise self.err(el.children[0], f"<{el.tag}> must be an empty element (found "
                                           f"<{el.children[0].tag}> inside it)")
        self.no_text(el)

    def boolean(self, el: _El, name: str, default: bool) -> bool:
        v = el.attrs.get(name)
        if v is None:
            return default
        if v not in ("T", "F"):
            raise self.err(el, f"<{el.tag}> attribute {name}={v!r}: booleans must be \"T\" or "
                               "\"F\"")
        return v == "T"

    def nonempty(self, el: _El, name: str) -> str:
        v = el.attrs[name]
        if not v.strip():
            raise self.err(el, f"<{el.tag}> attribute {name!r} must not be empty")
        return v

    def hexnum(self, el: _El, name: str, limit: int) -> int | None:
        v = el.attrs.get(name)
        if v is None:
            return None
        if not _HEX.match(v.strip()):
            raise self.err(el, f"<{el.tag}> attribute {name}={v!r}: expected a hexadecimal "
                               "integer such as \"c0\"")
        n = int(v.strip(), 16)
        if n > limit:
            raise self.err(el, f"<{el.tag}> attribute {name}={v!r}: must be at most "
                               f"0x{limit:x}")
        return n

    def text_element(self, el: _El) -> str:
        if el.children:
            raise self.err(el.children[0], f"<{el.tag}> must hold text only (found "
                                           f"<{el.children[0].tag}>)")
        self.attrs(el, ())
        text = " ".join(el.alltext().split())
        if not text:
            raise self.err(el, f"<{el.tag}> must not be empty")
        return text

    # -- the document --

    def document(self, root: _El) -> list[View]:
        if root.tag != "view_configuration":
            raise self.err(root, f"the root element is <{root.tag}>: expected "
                                 "<view_configuration>")
        self.attrs(root, ())
        self.no_text(root)
        if not root.children:
            raise self.err(root, "<view_configuration> is empty: expected at least one <view>")
        views: list[View] = []
        for el in root.children:
            if el.tag != "view":
                raise self.err(el, f"<view_configuration> may contain only <view> elements "
                                   f"(found <{el.tag}>)")
            v = self.view(el)
            if any(o.name == v.name for o in views):
                raise self.err(el, f"a second view named {v.name!r} in the same file")
            views.append(v)
        return views

    def view(self, el: _El) -> View:
        self.attrs(el, ("name",), ("separate_cpus", "separate_processes", "separate_threads",
                                   "default_view"))
        name = self.nonempty(el, "name")
        flags = {k: self.boolean(el, k, False) for k in
                 ("separate_cpus", "separate_processes", "separate_threads", "default_view")}
        self.no_text(el)
        parts: dict[str, _El] = {}
        for child in el.children:
            if child.tag not in ("data", "output", "tool_tip", "description"):
                raise self.err(child, f"<view> may contain only <data>, <output>, <tool_tip> "
                                      f"and <description> (found <{child.tag}>)")
            if child.tag in parts:
                raise self.err(child, f"<view> {name!r} has a second <{child.tag}> (the first "
                                      f"is at line {parts[child.tag].line})")
            parts[child.tag] = child
        for tag in ("data", "output", "tool_tip", "description"):
            if tag not in parts:
                raise self.err(el, f"<view> {name!r} lacks its <{tag}> element")
        if el.children.index(parts["output"]) < el.children.index(parts["data"]):
            raise self.err(parts["output"], "<output> comes before <data>: <data> must appear "
                                            "first, since <output> uses the event ids it "
                                            "defines")
        events = self.data(parts["data"])
        columns = self.output(parts["output"], {e.id: e for e in events})
        return View(name, tuple(events), tuple(columns), self.text_element(parts["tool_tip"]),
                    self.text_element(parts["description"]), source=self.source, line=el.line,
                    **flags)

    def data(self, el: _El) -> list[Event]:
        self.attrs(el, ())
        self.no_text(el)
        if not el.children:
            raise self.err(el, "<data> is empty: expected one or more <event> elements")
        events: list[Event] = []
        for ev in el.children:
            if ev.tag != "event":
                raise self.err(ev, f"<data> may contain only <event> elements (found "
                                   f"<{ev.tag}>)")
            if "metric" in ev.attrs:
                self.attrs(ev, ("id", "metric"), ("select", "mask"))
                metric: str | None = self.nonempty(ev, "metric")
            else:
                self.attrs(ev, ("id", "select", "mask"))
                metric = None
            self.empty(ev)
            eid = self.nonempty(ev, "id")
            if any(e.id == eid for e in events):
                raise self.err(ev, f"event id {eid!r} is defined twice")
            events.append(Event(eid, self.hexnum(ev, "select", 0xFFFF),
                                self.hexnum(ev, "mask", 0xFF), metric, ev.line))
        return events

    def output(self, el: _El, events: dict[str, Event]) -> list[Column]:
        self.attrs(el, ())
        self.no_text(el)
        if not el.children:
            raise self.err(el, "<output> is empty: expected one or more <column> elements")
        columns: list[Column] = []
        sorted_at: int | None = None
        first_combo: dict[str, int] = {}  # event id -> line of the first combination using it
        valued: set[str] = set()
        for col in el.children:
            if col.tag != "column":
                raise self.err(col, f"<output> may contain only <column> elements (found "
                                    f"<{col.tag}>)")
            self.attrs(col, ("title", "sort"), ("visible",))
            title = col.attrs["title"]
            sort = col.attrs["sort"]
            if sort not in SORTS:
                raise self.err(col, f"<column> {title!r}: sort={sort!r}, expected \"none\", "
                                    "\"ascending\" or \"descending\"")
            if sort != "none":
                if sorted_at is not None:
                    raise self.err(col, f"<column> {title!r} is sorted {sort} but the column "
                                        f"at line {sorted_at} is sorted already: at most one "
                                        "column may be sorted")
                sorted_at = col.line
            visible = self.boolean(col, "visible", True)
            self.no_text(col)
            if len(col.children) != 1:
                raise self.err(col, f"<column> {title!r} holds {len(col.children)} elements: "
                                    "expected exactly one of <value>, <sum>, <difference>, "
                                    "<product>, <ratio>")
            op_el = col.children[0]
            if op_el.tag not in OPS:
                raise self.err(op_el, f"<column> {title!r} holds <{op_el.tag}>: expected one "
                                      "of <value>, <sum>, <difference>, <product>, <ratio>")
            names = ("id",) if op_el.tag == "value" else ("left", "right")
            self.attrs(op_el, names)
            self.empty(op_el)
            operands = tuple(op_el.attrs[a] for a in names)
            for a, ref in zip(names, operands, strict=True):
                if ref not in events:
                    defined = ", ".join(repr(k) for k in events)
                    raise self.err(op_el, f"<{op_el.tag}> {a}={ref!r} names no event of "
                                          f"<data> (defined: {defined})")
            if op_el.tag == "value":
                ref = operands[0]
                if ref in first_combo:
                    raise self.err(op_el, f"<value id={ref!r}> comes after a combination "
                                          f"using {ref!r} (line {first_combo[ref]}): simple "
                                          "values must appear before any combination of the "
                                          "same event")
                valued.add(ref)
            else:
                for ref in operands:
                    if ref not in valued:
                        raise self.err(op_el, f"<{op_el.tag}> uses event {ref!r} before any "
                                              f"<value id={ref!r}> column: a simple value of "
                                              "an event must come before combinations using it")
                    first_combo.setdefault(ref, op_el.line)
            columns.append(Column(title, sort, visible, op_el.tag, operands, col.line))
        return columns


def parse_view_configs(data: bytes | str, source: str = "<string>") -> list[View]:
    """Every view of one configuration document; raises :class:`ViewConfigError`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _Checker(source).document(_parse_xml(raw, source))


def load_view_configs(path: str | Path) -> list[View]:
    """Every view of a configuration file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ViewConfigError(str(p), None, f"cannot read the view configuration: "
                                            f"{e.strerror}") from e
    return parse_view_configs(data, str(p))


def load_predefined() -> list[View]:
    """The view configurations shipped with callpath (``analysis/viewconfigs/*.xml``)."""
    folder = resources.files("callpath.analysis") / "viewconfigs"
    views: list[View] = []
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        if item.name.endswith(".xml"):
            views.extend(parse_view_configs(item.read_bytes(), f"viewconfigs/{item.name}"))
    return views


# ---- matching a data set -----------------------------------------------------------------


def resolve_events(view: View, metric_names: Sequence[str]) -> dict[str, str | None]:
    """Event id -> the data set's metric for it (None when the data set lacks it)."""
    out: dict[str, str | None] = {}
    for e in view.events:
        found = None
        for want in e.wanted():
            found = find_metric(want, metric_names)
            if found is not None:
                break
        out[e.id] = found
    return out


def offered(view: View, metric_names: Sequence[str]) -> tuple[bool, str]:
    """Whether the data set has every event the view needs, and if not, why."""
    resolved = resolve_events(view, metric_names)
    for e in view.events:
        if resolved[e.id] is not None:
            continue
        have = ", ".join(repr(n) for n in metric_names) or "no metrics"
        wanted = e.wanted()
        if not wanted:
            return False, (f"view {view.name!r} needs event {e.id!r} ({e.describe()}), a code "
                           "that callpath's event table does not know; name the metric with "
                           f"metric=\"...\" instead (this data set has {have})")
        alts = ", ".join(wanted[:6]) + (", ..." if len(wanted) > 6 else "")
        return False, (f"view {view.name!r} needs event {e.id!r} ({e.describe()}: one of "
                       f"{alts}), which this data set lacks (it has {have})")
    return True, ""


# ---- columns -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ColumnSpec:
    """One column of a view configuration, for one group of execution contexts."""

    title: str
    tooltip: str
    op: str
    operands: tuple[str, ...]  # metric names
    contexts: npt.NDArray[np.int64] | None  # indices into the contexts list; None = all
    sort: str | None  # None, "ascending" or "descending"
    visible: bool
    group: str = ""  # label of the context group ("" = aggregate)


_SEPARATION = {  # flag -> (the kind that separates, kinds that qualify it)
    "separate_cpus": (IdKind.CORE, (IdKind.NODE,)),
    "separate_processes": (IdKind.RANK, (IdKind.NODE,)),
    "separate_threads": (IdKind.THREAD, (IdKind.NODE, IdKind.RANK, IdKind.GPUDEVICE,
                                         IdKind.GPUCONTEXT, IdKind.GPUSTREAM)),
}

_OP_WORDS = {"value": "{0}", "sum": "{0} + {1}", "difference": "{0} - {1}",
             "product": "{0} × {1}", "ratio": "{0} / {1}"}


def context_groups(view: View, contexts: Sequence[ExecutionContext],
                   id_names: Sequence[str] = DEFAULT_ID_NAMES,
                   ) -> list[tuple[str, npt.NDArray[np.int64] | None]]:
    """The column groups a view asks for: ``[(label, context indices)]``.

    One aggregate group (``("", None)``) unless a ``separate_*`` flag is set and the contexts
    carry the identifier kind it separates by (CORE for CPUs, RANK for processes, THREAD for
    threads). A process is told apart by NODE and RANK, a thread by everything but CORE (so
    thread 0 of rank 1 is not thread 0 of rank 0). Contexts lacking the separating kind form
    a group of their own ("no THREAD")."""
    kinds: set[int] = set()
    primaries: set[int] = set()
    for flag, (primary, qualifiers) in _SEPARATION.items():
        if not getattr(view, flag):
            continue
        if not any(i.kind == primary for c in contexts for i in c.ids):
            continue  # nothing to separate by: aggregate over this dimension
        primaries.add(primary)
        kinds.add(primary)
        kinds.update(qualifiers)
    if not kinds:
        return [("", None)]
    order = sorted(kinds)
    keys: list[tuple[int | None, ...]] = []
    for c in contexts:
        ids = {i.kind: i.logical_id for i in c.ids}
        keys.append(tuple(ids.get(k) for k in order))
    distinct = sorted(set(keys), key=lambda k: tuple((v is None, v or 0) for v in k))
    varying = [j for j in range(len(order)) if len({k[j] for k in distinct}) > 1]
    shown = varying or [j for j in range(len(order)) if order[j] in primaries]
    groups: list[tuple[str, npt.NDArray[np.int64] | None]] = []
    for key in distinct:
        idx = np.array([i for i, k in enumerate(keys) if k == key], dtype=np.int64)
        parts = []
        for j in shown:
            name = id_names[order[j]] if order[j] < len(id_names) else f"KIND{order[j]}"
            parts.append(f"{name} {key[j]}" if key[j] is not None else f"no {name}")
        groups.append((" ".join(parts), idx))
    return groups


def expand_columns(view: View, contexts: Sequence[ExecutionContext],
                   metric_names: Sequence[str] | None = None,
                   id_names: Sequence[str] = DEFAULT_ID_NAMES) -> list[ColumnSpec]:
    """The view's columns, one set per context group (see :func:`context_groups`).

    With ``metric_names`` the operands are the data set's metric names (a view that is not
    offered raises :class:`CallpathError` with the reason); without, the canonical event
    names (``cycles``, ``instructions``, or the ``metric=`` given). Only the first group keeps
    the sorted column's sort, so at most one column is sorted in the result too."""
    if metric_names is not None:
        ok, why = offered(view, metric_names)
        if not ok:
            raise CallpathError(why)
        resolved = resolve_events(view, metric_names)
        metric_of = {k: v for k, v in resolved.items() if v is not None}
    else:
        metric_of = {}
        for e in view.events:
            wanted = e.wanted()
            metric_of[e.id] = wanted[0] if wanted else e.id
    specs: list[ColumnSpec] = []
    for gi, (label, idx) in enumerate(context_groups(view, contexts, id_names)):
        for col in view.columns:
            metrics = tuple(metric_of[o] for o in col.operands)
            expr = _OP_WORDS[col.op].format(*(f"{o} ({metric_of[o]})" for o in col.operands))
            tooltip = f"{col.title}: {expr}" + (f", {label}" if label else "")
            title = f"{col.title} [{label}]" if label else col.title
            sort = col.sort if col.sort != "none" and gi == 0 else None
            specs.append(ColumnSpec(title, tooltip, col.op, metrics, idx, sort, col.visible,
                                    label))
    return specs


def evaluate_column(spec: ColumnSpec,
                    values: Callable[[str, npt.NDArray[np.int64] | None], npt.ArrayLike]) -> F64:
    """Per-node values of one column; ``values(metric, contexts)`` gives an operand's values.

    A ratio whose denominator is 0 is NaN (an empty cell), never infinity or a warning."""
    operands = [np.asarray(values(m, spec.contexts), dtype=np.float64) for m in spec.operands]
    with np.errstate(all="ignore"):
        if spec.op == "value":
            return operands[0].astype(np.float64, copy=True)
        a, b = operands
        if spec.op == "sum":
            return a + b
        if spec.op == "difference":
            return a - b
        if spec.op == "product":
            return a * b
        if spec.op == "ratio":
            return np.where(b == 0.0, np.nan, a / b)
    raise CallpathError(f"unknown column operation {spec.op!r}")
