"""CodeAnalyst view configurations (seeds/002): the seed's IPC file, one broken variant per rule,
the event table, offering views on real databases and expanding their columns."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import callpath
from callpath.analysis.event_codes import CODES, FAMILIES, find_metric, lookup_code, normalize
from callpath.analysis.viewconfig import (
    ColumnSpec,
    View,
    ViewConfigError,
    context_groups,
    evaluate_column,
    expand_columns,
    load_predefined,
    load_view_configs,
    offered,
    parse_view_configs,
)
from callpath.errors import CallpathError
from callpath.model.contexts import ExecutionContext, Identifier, IdKind
from conftest import SHARED, shared_path


def seed_ipc_text() -> str:
    """The example view configuration file, cut out of the seed document itself."""
    seeds = sorted((SHARED / "seeds").glob("002_*"))
    if not seeds:
        pytest.skip(f"{SHARED / 'seeds'} has no 002_* seed: the shared folder must sit beside "
                    "the repository")
    text = seeds[0].read_text()
    start = text.index("<!--\nShow instructions per cycle")
    end = text.index("</view_configuration>", start) + len("</view_configuration>")
    return text[start:end] + "\n"


def line_of(text: str, marker: str) -> int:
    assert marker in text, marker
    return text[:text.index(marker)].count("\n") + 1


# ---- the seed's file -----------------------------------------------------------------------

def test_the_seed_ipc_view_loads(tmp_path: Path) -> None:
    path = tmp_path / "ipc.xml"
    path.write_text(seed_ipc_text())
    [view] = load_view_configs(path)
    assert view.name == "IPC"
    assert (view.separate_cpus, view.separate_processes, view.separate_threads) == (False,) * 3
    assert view.default_view is False  # optional, default false
    assert [(e.id, e.select, e.mask) for e in view.events] == [
        ("CPU_clocks", 0x76, 0x00), ("Ret_instructions", 0xC0, 0x00)]
    assert [(c.title, c.sort, c.visible, c.op, c.operands) for c in view.columns] == [
        ("Instructions", "none", True, "value", ("Ret_instructions",)),
        ("Cycles", "none", True, "value", ("CPU_clocks",)),
        ("IPC", "descending", True, "ratio", ("Ret_instructions", "CPU_clocks")),
        ("CPI", "none", True, "ratio", ("CPU_clocks", "Ret_instructions")),
    ]
    assert view.tool_tip == "Show instructions per cycle"
    assert view.description == ("Use this view to find hot-spots with low instruction level "
                                "paralellism.")
    assert view.source == str(path)
    assert view.line == line_of(seed_ipc_text(), '<view name="IPC"')


def test_the_predefined_ipc_view_is_the_seed_one() -> None:
    [seed] = parse_view_configs(seed_ipc_text())
    [ipc] = [v for v in load_predefined() if v.name == "IPC"]
    assert ipc.events == seed.events or [(e.id, e.select, e.mask) for e in ipc.events] == [
        (e.id, e.select, e.mask) for e in seed.events]
    assert [(c.title, c.sort, c.op, c.operands) for c in ipc.columns] == [
        (c.title, c.sort, c.op, c.operands) for c in seed.columns]


def test_predefined_views() -> None:
    views = load_predefined()
    names = {v.name for v in views}
    assert {"IPC", "CPU time", "Cache misses per instruction", "Branch mispredictions"} <= names
    assert len(names) == len(views)
    for v in views:
        assert v.tool_tip and v.description and v.columns
        assert sum(c.sort != "none" for c in v.columns) <= 1


# ---- one broken variant per rule -----------------------------------------------------------

# (rule, text to replace in the seed file, its replacement, marker of the expected line in the
#  broken file or None when no line applies, fragment of the message)
RULES: list[tuple[str, str, str, str | None, str]] = [
    ("well-formed XML", "</data>", "</dta>", "</dta>", "not well-formed XML"),
    ("root element", None, None, "<views>",
     "the root element is <views>: expected <view_configuration>"),
    ("root has no attributes", "<view_configuration>\n", '<view_configuration version="2">\n',
     "<view_configuration", "<view_configuration> has an unknown attribute 'version'"),
    ("root not empty", None, None, "<view_configuration>",
     "<view_configuration> is empty: expected at least one <view>"),
    ("root holds only views", "<view_configuration>\n", "<view_configuration>\n<data/>\n",
     "<data/>", "<view_configuration> may contain only <view> elements (found <data>)"),
    ("view name required", '<view name="IPC"\n', "<view\n", "<view\n",
     "<view> lacks the required attribute 'name'"),
    ("view name not empty", '<view name="IPC"', '<view name="  "', '<view name',
     "<view> attribute 'name' must not be empty"),
    ("view attributes known", 'separate_threads="F"\n', 'separate_threads="F"\nvendor="AMD"\n',
     '<view name', "<view> has an unknown attribute 'vendor'"),
    ("booleans are T or F", 'separate_cpus="F"', 'separate_cpus="false"', '<view name',
     "separate_cpus='false': booleans must be \"T\" or \"F\""),
    ("default_view boolean", 'separate_threads="F"\n', 'separate_threads="F" default_view="1"\n',
     '<view name', "default_view='1': booleans must be"),
    ("view needs data", "<data>\n<event id=\"CPU_clocks\" select=\"76\" mask=\"00\" />\n"
     "<event id=\"Ret_instructions\" select=\"c0\" mask=\"00\" />\n</data>\n", "",
     '<view name', "<view> 'IPC' lacks its <data> element"),
    ("view needs output", None, None, '<view name', "<view> 'IPC' lacks its <output> element"),
    ("view needs tool_tip", "<tool_tip>\nShow instructions per cycle\n</tool_tip>\n", "",
     '<view name', "<view> 'IPC' lacks its <tool_tip> element"),
    ("view needs description", None, None, '<view name',
     "<view> 'IPC' lacks its <description> element"),
    ("one data only", "</data>\n", "</data>\n<data><event id=\"x\" select=\"1\" mask=\"0\"/>"
     "</data>\n", "<data><event", "<view> 'IPC' has a second <data>"),
    ("one tool_tip only", "</tool_tip>\n", "</tool_tip>\n<tool_tip>again</tool_tip>\n",
     "<tool_tip>again", "has a second <tool_tip>"),
    ("data before output", None, None, "<output>", "<output> comes before <data>"),
    ("view children known", "<tool_tip>", "<icon/>\n<tool_tip>", "<icon/>",
     "<view> may contain only <data>, <output>, <tool_tip> and <description> (found <icon>)"),
    ("data not empty", None, None, "<data>", "<data> is empty: expected one or more <event>"),
    ("data holds events", '<event id="CPU_clocks"', '<counter id="CPU_clocks"', "<counter",
     "<data> may contain only <event> elements (found <counter>)"),
    ("no text in data", "<data>\n", "<data>\ncycles please\n", "<data>",
     "<data> must not contain text (found 'cycles please')"),
    ("event id required", '<event id="CPU_clocks" select', '<event select', '<event select',
     "<event> lacks the required attribute 'id'"),
    ("event select required", 'id="CPU_clocks" select="76" ', 'id="CPU_clocks" ',
     'id="CPU_clocks"', "<event> lacks the required attribute 'select'"),
    ("event mask required", 'select="c0" mask="00" ', 'select="c0" ', 'select="c0"',
     "<event> lacks the required attribute 'mask'"),
    ("select is hexadecimal", 'select="c0"', 'select="c0h"', 'select="c0h"',
     "attribute select='c0h': expected a hexadecimal integer"),
    ("mask is hexadecimal", 'select="76" mask="00"', 'select="76" mask="zz"', 'mask="zz"',
     "attribute mask='zz': expected a hexadecimal integer"),
    ("mask range", 'select="76" mask="00"', 'select="76" mask="100"', 'mask="100"',
     "attribute mask='100': must be at most 0xff"),
    ("event ids unique", 'id="Ret_instructions" select', 'id="CPU_clocks" select',
     '<event id="CPU_clocks" select="c0"', "event id 'CPU_clocks' is defined twice"),
    ("event is empty", '<event id="CPU_clocks" select="76" mask="00" />',
     '<event id="CPU_clocks" select="76" mask="00">cycles</event>', '<event id="CPU_clocks"',
     "<event> must not contain text"),
    ("event attributes known", 'select="76" mask="00"', 'select="76" mask="00" unit="x"',
     'unit="x"', "<event> has an unknown attribute 'unit'"),
    ("output not empty", None, None, "<output>",
     "<output> is empty: expected one or more <column>"),
    ("output holds columns", '<column title="Cycles" sort="none">\n<value id="CPU_clocks" />\n'
     '</column>', '<row title="Cycles"/>', "<row",
     "<output> may contain only <column> elements (found <row>)"),
    ("column title required", '<column title="Cycles" sort="none">', '<column sort="none">',
     '<column sort="none">', "<column> lacks the required attribute 'title'"),
    ("column sort required", '<column title="Cycles" sort="none">', '<column title="Cycles">',
     '<column title="Cycles">', "<column> lacks the required attribute 'sort'"),
    ("sort values", '<column title="Cycles" sort="none">', '<column title="Cycles" sort="up">',
     '<column title="Cycles"', "sort='up', expected \"none\", \"ascending\" or \"descending\""),
    ("at most one sorted column", '<column title="CPI" sort="none">',
     '<column title="CPI" sort="ascending">', '<column title="CPI"',
     "at most one column may be sorted"),
    ("visible boolean", '<column title="Cycles" sort="none">',
     '<column title="Cycles" sort="none" visible="false">', '<column title="Cycles"',
     "visible='false': booleans must be \"T\" or \"F\""),
    ("column holds one element", '<value id="CPU_clocks" />',
     '<value id="CPU_clocks" />\n<value id="Ret_instructions" />', '<column title="Cycles"',
     "<column> 'Cycles' holds 2 elements: expected exactly one of"),
    ("column not empty", '<value id="CPU_clocks" />\n', "", '<column title="Cycles"',
     "<column> 'Cycles' holds 0 elements"),
    ("column operations", '<ratio left="CPU_clocks" right="Ret_instructions" />',
     '<formula text="CPU_clocks / Ret_instructions" />', "<formula",
     "<column> 'CPI' holds <formula>: expected one of <value>, <sum>"),
    ("value id required", '<value id="CPU_clocks" />', '<value />', "<value />",
     "<value> lacks the required attribute 'id'"),
    ("ratio right required", '<ratio left="CPU_clocks" right="Ret_instructions" />',
     '<ratio left="CPU_clocks" />', '<ratio left="CPU_clocks" />',
     "<ratio> lacks the required attribute 'right'"),
    ("operation is empty", '<value id="CPU_clocks" />', '<value id="CPU_clocks">x</value>',
     '<value id="CPU_clocks">', "<value> must not contain text"),
    ("ids must be defined", '<value id="CPU_clocks" />', '<value id="Clocks" />',
     '<value id="Clocks"', "<value> id='Clocks' names no event of <data>"),
    ("combination needs a value first", None, None, '<ratio left="Ret_instructions"',
     "<ratio> uses event 'CPU_clocks' before any <value id='CPU_clocks'> column"),
    ("no value after a combination", '<column title="CPI" sort="none">',
     '<column title="Again" sort="none">\n<value id="CPU_clocks"/>\n</column>\n'
     '<column title="CPI" sort="none">', '<value id="CPU_clocks"/>',
     "<value id='CPU_clocks'> comes after a combination using 'CPU_clocks'"),
    ("tool_tip not empty", "<tool_tip>\nShow instructions per cycle\n</tool_tip>",
     "<tool_tip>\n   \n</tool_tip>", "<tool_tip>", "<tool_tip> must not be empty"),
    ("description is text only", "Use this view", "<b>Use</b> this view", "<b>",
     "<description> must hold text only (found <b>)"),
    ("no DOCTYPE", "<view_configuration>\n", "<!DOCTYPE view_configuration>\n"
     "<view_configuration>\n", "<!DOCTYPE", "a DOCTYPE is not allowed"),
    ("view names unique", "</view_configuration>", None, None,
     "a second view named 'IPC' in the same file"),
]


def _broken(rule: str, old: str | None, new: str | None) -> str:
    text = seed_ipc_text()
    if old is not None and new is not None:
        assert old in text, (rule, old)
        return text.replace(old, new, 1)
    # the rules that need more than one replacement
    if rule == "root element":
        return text.replace("view_configuration>", "views>")
    if rule == "root not empty":
        start = text.index("<view name")
        end = text.index("</view>") + len("</view>\n")
        return text[:start] + text[end:]
    if rule == "view needs output":
        start = text.index("<output>")
        return text[:start] + text[text.index("</output>") + len("</output>\n"):]
    if rule == "view needs description":
        start = text.index("<description>")
        return text[:start] + text[text.index("</description>") + len("</description>\n"):]
    if rule == "data before output":
        data = text[text.index("<data>"):text.index("</data>") + len("</data>\n")]
        out = text[text.index("<output>"):text.index("</output>") + len("</output>\n")]
        return text.replace(data, "").replace(out, out + data)
    if rule == "data not empty":
        return text[:text.index("<data>") + 7] + text[text.index("</data>"):]
    if rule == "output not empty":
        return text[:text.index("<output>") + 9] + text[text.index("</output>"):]
    if rule == "combination needs a value first":
        cycles = '<column title="Cycles" sort="none">\n<value id="CPU_clocks" />\n</column>\n'
        return text.replace(cycles, "").replace("</output>", cycles + "</output>")
    if rule == "view names unique":
        view = text[text.index("<view name"):text.index("</view>") + len("</view>\n")]
        return text.replace("</view_configuration>", view + "</view_configuration>")
    raise AssertionError(rule)


@pytest.mark.parametrize(("rule", "old", "new", "marker", "fragment"), RULES,
                         ids=[r[0] for r in RULES])
def test_each_rule_broken_gives_a_precise_error(tmp_path: Path, rule: str, old: str | None,
                                                new: str | None, marker: str | None,
                                                fragment: str) -> None:
    text = _broken(rule, old, new)
    path = tmp_path / "broken.xml"
    path.write_text(text)
    with pytest.raises(ViewConfigError) as exc:
        load_view_configs(path)
    err = exc.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}, line ")
    assert fragment in msg, msg
    if rule == "view names unique":
        expected_line = text.count("\n", 0, text.rindex("<view name")) + 1
    else:
        assert marker is not None
        expected_line = line_of(text, marker)
    assert err.line == expected_line, msg


def test_every_rule_variant_is_distinct() -> None:
    texts = [_broken(r[0], r[1], r[2]) for r in RULES]
    assert len(set(texts)) == len(texts)


def test_missing_file() -> None:
    with pytest.raises(ViewConfigError, match=r"absent\.xml: cannot read"):
        load_view_configs("/nonexistent/absent.xml")


def test_empty_file() -> None:
    with pytest.raises(ViewConfigError, match="not well-formed XML"):
        parse_view_configs(b"", "empty.xml")


# ---- accepted variations -------------------------------------------------------------------

MULTI = """<?xml version="1.0" encoding="UTF-8"?>
<view_configuration>
  <view name="One" separate_threads="T" default_view="T">
    <data><event id="c" select="0x76" mask="0"/><event id="t" metric="cpu-clock"/></data>
    <output>
      <column title="C" sort="ascending" visible="F"><value id="c"/></column>
      <column title="T" sort="none"><value id="t"/></column>
      <column title="C+T" sort="none"><sum left="c" right="t"/></column>
      <column title="C-T" sort="none"><difference left="c" right="t"/></column>
      <column title="CxT" sort="none"><product left="c" right="t"/></column>
    </output>
    <tool_tip>  A   tool
       tip\twith   spaces  </tool_tip>
    <description>Line one
line two</description>
  </view>
  <view name="Two">
    <data><event id="x" select="C0" mask="FF"/></data>
    <output><column title="X" sort="none"><value id="x"/></column></output>
    <description>d</description>
    <tool_tip>t</tool_tip>
  </view>
</view_configuration>
"""


def test_several_views_extension_and_whitespace_rules() -> None:
    one, two = parse_view_configs(MULTI, "multi.xml")
    assert one.name == "One" and two.name == "Two"
    assert one.separate_threads and one.default_view and not one.separate_cpus
    assert one.tool_tip == "A tool tip with spaces"
    assert one.description == "Line one line two"
    assert one.events[1].metric == "cpu-clock" and one.events[1].select is None
    assert [c.op for c in one.columns] == ["value", "value", "sum", "difference", "product"]
    assert one.columns[0].visible is False and one.columns[0].sort == "ascending"
    assert (two.events[0].select, two.events[0].mask) == (0xC0, 0xFF)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_damaged_files_fail_only_with_view_config_errors(data: st.DataObject) -> None:
    text = seed_ipc_text()
    pos = data.draw(st.integers(0, len(text) - 1))
    cut = data.draw(st.integers(0, 12))
    insert = data.draw(st.text(alphabet='<>/="\' abcdeilmnorstuvwxyz_0123456789\n&;!-', max_size=8))
    damaged = text[:pos] + insert + text[pos + cut:]
    try:
        views = parse_view_configs(damaged, "damaged.xml")
    except ViewConfigError as err:
        assert "\n" not in str(err)
        return
    assert all(isinstance(v, View) for v in views)


# ---- the event table and matching ---------------------------------------------------------

def test_event_codes() -> None:
    assert lookup_code(0x76, 0x00).family == "cycles"  # type: ignore[union-attr]
    assert lookup_code(0xC0, 0x00).family == "instructions"  # type: ignore[union-attr]
    assert lookup_code(0x7E, 0x07).family == "cache-misses"  # type: ignore[union-attr]
    assert lookup_code(0x2E, 0x41).family == "cache-misses"  # type: ignore[union-attr]
    assert lookup_code(0x2E, 0x4F).family == "cache-references"  # type: ignore[union-attr]
    assert lookup_code(0x2E, 0x12) is None
    assert lookup_code(0x3C, 0x01).family == "ref-cycles"  # type: ignore[union-attr]
    assert lookup_code(0xFFF, 0) is None
    for code in CODES:
        assert code.family in FAMILIES


@pytest.mark.parametrize(("wanted", "have", "found"), [
    ("cycles", ["CPUTIME (sec)", "PAPI_TOT_CYC"], "PAPI_TOT_CYC"),
    ("cycles", ["perf::CYCLES"], "perf::CYCLES"),
    ("instructions", ["INSTRUCTIONS", "cycles"], "INSTRUCTIONS"),
    ("cpu-time", ["CPUTIME (usec)"], "CPUTIME (usec)"),
    ("cpu-time", ["task-clock"], "task-clock"),
    ("cpu-clock", ["CPUTIME (sec)"], "CPUTIME (sec)"),
    ("CPUTIME (sec)", ["cputime (SEC)", "CPUTIME (sec)"], "CPUTIME (sec)"),
    ("my-counter", ["My-Counter"], "My-Counter"),
    ("cache-misses", ["PAPI_L1_DCM"], None),
    ("cycles", [], None),
])
def test_find_metric(wanted: str, have: list[str], found: str | None) -> None:
    assert find_metric(wanted, have) == found


def test_normalize() -> None:
    assert normalize("perf::CYCLES") == "cycles"
    assert normalize(" CPUTIME (sec) ") == "cputime"


def _metric_names(db: Path) -> list[str]:
    return [m.name for m in callpath.open(db).metrics]


def test_views_offered_on_real_databases() -> None:
    views = {v.name: v for v in load_predefined()}
    for db in ("small.d", "loops-cputime-t.d"):
        names = _metric_names(shared_path("hpctoolkit", "dbase", db))
        assert offered(views["CPU time"], names) == (True, "")
        ok, why = offered(views["IPC"], names)
        assert not ok
        assert "view 'IPC' needs event 'CPU_clocks' (select 0x76 mask 0x00" in why
        assert "cycles" in why and "'CPUTIME (sec)'" in why
    cpi = _metric_names(shared_path("hatchet", "hpctoolkit-cpi-database"))
    assert offered(views["CPU time"], cpi)[0]  # CPUTIME (usec)
    assert offered(views["IPC"], ["PAPI_TOT_CYC", "PAPI_TOT_INS"]) == (True, "")
    assert offered(views["IPC"], ["cycles", "instructions"]) == (True, "")


def test_unknown_code_is_not_offered_with_a_reason() -> None:
    [v] = parse_view_configs(MULTI.replace('select="C0" mask="FF"', 'select="9ab" mask="0"'))[1:]
    ok, why = offered(v, ["cycles"])
    assert not ok
    assert "select 0x9ab mask 0x00" in why and "does not know" in why and "metric=" in why


# ---- columns --------------------------------------------------------------------------------

def _ctx(index: int, *ids: tuple[IdKind, int]) -> ExecutionContext:
    return ExecutionContext(index, tuple(Identifier(int(k), v) for k, v in ids))


def _view(**flags: bool) -> View:
    [v] = parse_view_configs(seed_ipc_text())
    return View(v.name, v.events, v.columns, v.tool_tip, v.description, **flags)


def test_aggregate_columns() -> None:
    specs = expand_columns(_view(), [_ctx(1, (IdKind.THREAD, 0))])
    assert [s.title for s in specs] == ["Instructions", "Cycles", "IPC", "CPI"]
    assert [s.operands for s in specs] == [("instructions",), ("cycles",),
                                           ("instructions", "cycles"), ("cycles", "instructions")]
    assert all(s.contexts is None and s.group == "" for s in specs)
    assert [s.sort for s in specs] == [None, None, "descending", None]
    assert specs[2].tooltip == "IPC: Ret_instructions (instructions) / CPU_clocks (cycles)"


def test_operands_are_the_data_sets_metric_names() -> None:
    specs = expand_columns(_view(), [], ["PAPI_TOT_INS", "PAPI_TOT_CYC"])
    assert specs[2].operands == ("PAPI_TOT_INS", "PAPI_TOT_CYC")
    with pytest.raises(CallpathError, match="needs event 'CPU_clocks'"):
        expand_columns(_view(), [], ["CPUTIME (sec)"])


def test_separation_groups_on_synthetic_contexts() -> None:
    ctxs = [
        _ctx(1, (IdKind.NODE, 0), (IdKind.RANK, 0), (IdKind.THREAD, 0), (IdKind.CORE, 3)),
        _ctx(2, (IdKind.NODE, 0), (IdKind.RANK, 0), (IdKind.THREAD, 1), (IdKind.CORE, 2)),
        _ctx(3, (IdKind.NODE, 0), (IdKind.RANK, 1), (IdKind.THREAD, 0), (IdKind.CORE, 3)),
        _ctx(4, (IdKind.NODE, 0), (IdKind.RANK, 1), (IdKind.CORE, 1)),
    ]
    cpus = context_groups(_view(separate_cpus=True), ctxs)
    assert [(g, i.tolist()) for g, i in cpus] == [  # type: ignore[union-attr]
        ("CORE 1", [3]), ("CORE 2", [1]), ("CORE 3", [0, 2])]
    procs = context_groups(_view(separate_processes=True), ctxs)
    assert [(g, i.tolist()) for g, i in procs] == [  # type: ignore[union-attr]
        ("RANK 0", [0, 1]), ("RANK 1", [2, 3])]
    threads = context_groups(_view(separate_threads=True), ctxs)
    assert [(g, i.tolist()) for g, i in threads] == [  # type: ignore[union-attr]
        ("RANK 0 THREAD 0", [0]), ("RANK 0 THREAD 1", [1]), ("RANK 1 THREAD 0", [2]),
        ("RANK 1 no THREAD", [3])]
    both = context_groups(_view(separate_cpus=True, separate_processes=True), ctxs)
    assert [g for g, _ in both] == ["RANK 0 CORE 2", "RANK 0 CORE 3", "RANK 1 CORE 1",
                                    "RANK 1 CORE 3"]
    # nothing to separate by: one aggregate group
    flat = [_ctx(1, (IdKind.THREAD, 0)), _ctx(2, (IdKind.THREAD, 1))]
    assert context_groups(_view(separate_processes=True), flat) == [("", None)]
    specs = expand_columns(_view(separate_threads=True), ctxs)
    assert len(specs) == 4 * 4
    assert [s.sort for s in specs].count("descending") == 1
    assert specs[2].title == "IPC [RANK 0 THREAD 0]" and specs[2].sort == "descending"
    assert specs[6].title == "IPC [RANK 0 THREAD 1]" and specs[6].sort is None


def _values_from(exp: callpath.Experiment, contexts: list[ExecutionContext]):  # type: ignore[no-untyped-def]
    def values(metric: str, idx: np.ndarray | None) -> np.ndarray:
        if idx is None:
            return exp.inclusive(metric)
        total = np.zeros(len(exp.cct.parent))
        for i in idx.tolist():
            total += exp.values_in(contexts[i].index, metric, "execution")
        return total
    return values


@pytest.mark.parametrize(("db_parts", "flag", "groups"), [
    (("hpctoolkit", "dbase", "loops-cputime-t.d"), "separate_threads",
     ["THREAD 0", "THREAD 1", "THREAD 2", "THREAD 3"]),
    (("hpctoolkit", "dbase", "loops-cputime-t.d"), "separate_cpus", ["CORE 0"]),
    (("hpctoolkit", "dbase", "loops-cputime-t.d"), "separate_processes", [""]),
    (("hatchet", "hpctoolkit-cpi-database"), "separate_processes",
     ["RANK 0", "RANK 1", "RANK 2", "RANK 3"]),
    (("hatchet", "hpctoolkit-cpi-database"), "separate_threads",
     ["RANK 0", "RANK 1", "RANK 2", "RANK 3"]),
])
def test_separated_columns_on_real_data_add_up_to_the_aggregate(
        db_parts: tuple[str, ...], flag: str, groups: list[str]) -> None:
    exp = callpath.open(shared_path(*db_parts))
    [per_thread] = [v for v in load_predefined() if v.name == "CPU time"]
    view = View(per_thread.name, per_thread.events, per_thread.columns, per_thread.tool_tip,
                per_thread.description, **{flag: True})
    names = [m.name for m in exp.metrics]
    contexts = exp.contexts
    specs = expand_columns(view, contexts, names, exp.id_names)
    assert [s.group for s in specs] == groups
    values = _values_from(exp, contexts)
    total = sum(evaluate_column(s, values) for s in specs)
    assert np.allclose(total, exp.inclusive(names[0]))
    covered = sorted(i for s in specs if s.contexts is not None for i in s.contexts.tolist())
    assert covered in ([], list(range(len(contexts))))


def test_evaluate_column_operations_and_ratio_by_zero() -> None:
    cols = {"a": np.array([6.0, 1.0, 0.0]), "b": np.array([3.0, 0.0, 0.0])}

    def values(m: str, idx: np.ndarray | None) -> np.ndarray:
        return cols[m]

    def spec(op: str, *ops: str) -> ColumnSpec:
        return ColumnSpec("t", "", op, ops, None, None, True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert evaluate_column(spec("value", "a"), values).tolist() == [6.0, 1.0, 0.0]
        assert evaluate_column(spec("sum", "a", "b"), values).tolist() == [9.0, 1.0, 0.0]
        assert evaluate_column(spec("difference", "a", "b"), values).tolist() == [3.0, 1.0, 0.0]
        assert evaluate_column(spec("product", "a", "b"), values).tolist() == [18.0, 0.0, 0.0]
        r = evaluate_column(spec("ratio", "a", "b"), values)
    assert r[0] == 2.0 and np.isnan(r[1]) and np.isnan(r[2])
    assert evaluate_column(spec("value", "a"), values) is not cols["a"]


def test_ipc_on_a_real_database_with_synthetic_counters() -> None:
    """IPC columns over small.d's tree, with instructions = 2 x CPU time and cycles = 3 x."""
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "small.d"))
    base = exp.inclusive(0)
    data = {"instructions": 2 * base, "cycles": 3 * base}
    specs = expand_columns(_view(), exp.contexts, list(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ipc = evaluate_column(specs[2], lambda m, idx: data[m])
    nz = base != 0
    assert np.allclose(ipc[nz], 2 / 3)
    assert np.isnan(ipc[~nz]).all()
