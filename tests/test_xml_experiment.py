"""The experiment.xml + metric-db reader, checked against Hatchet's reading of the same database.

Hatchet's CSV (one row per procedure frame or statement and rank) is an independent oracle for
the per-rank values; the XML itself, parsed here with ElementTree, is the oracle for the tree.
Error tests copy the database to a temporary directory and break one thing at a time: each must
give a one-line FormatError that names the culprit file, never a stray Python exception.
"""

from __future__ import annotations

import csv
import re
import struct
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from callpath.errors import CallpathError, FormatError
from callpath.formats.detect import open_experiment
from callpath.formats.xml_experiment import read_metric_db, read_xml_experiment
from callpath.model import Experiment, IdKind, NodeKind, Relation

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
HATCHET = SHARED / "data" / "hatchet"
DB = HATCHET / "hpctoolkit-cpi-database"
CSV = HATCHET / "hpctoolkit-cpi-graphframe.csv"
METRIC = "CPUTIME (usec)"
RANK0 = "1.cpi-000000-000-a8c00270-160443-0.metric-db"


def _need_data() -> None:
    if not (DB / "experiment.xml").is_file() or not CSV.is_file():
        pytest.skip(f"shared test data absent: expected {DB} and {CSV} (the ../shared checkout "
                    "next to the repository)")


@pytest.fixture(scope="module")
def exp() -> Experiment:
    _need_data()
    return read_xml_experiment(DB)


@pytest.fixture(scope="module")
def xml_scopes() -> dict[int, tuple[str, int, dict[str, str]]]:
    """XML id -> (tag, parent XML id, attributes), straight from the document (1 = root)."""
    _need_data()
    data = ET.parse(DB / "experiment.xml").getroot().find(".//SecCallPathProfileData")
    assert data is not None
    out: dict[int, tuple[str, int, dict[str, str]]] = {}

    def walk(elem: ET.Element, parent_id: int) -> None:
        for child in elem:
            if child.tag == "M":
                continue
            ident = int(child.attrib["i"])
            out[ident] = (child.tag, parent_id, dict(child.attrib))
            walk(child, ident)

    walk(data, 1)
    return out


@pytest.fixture(scope="module")
def hatchet_rows() -> list[dict[str, str]]:
    _need_data()
    with CSV.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _profile_of_rank(exp: Experiment) -> dict[int, int]:
    out = {}
    for p in exp.contexts:
        kinds = {i.kind: i.logical_id for i in p.ids}
        assert kinds[IdKind.THREAD] == 0
        out[kinds[IdKind.RANK]] = p.index
    return out


def _node_of(exp: Experiment) -> dict[int, int]:
    return {int(c): i for i, c in enumerate(exp.cct.ctx_id)}


# ---- the tree ---------------------------------------------------------------------------------


def test_tree_mirrors_the_xml(exp: Experiment,
                              xml_scopes: dict[int, tuple[str, int, dict[str, str]]]) -> None:
    cct = exp.cct
    assert len(cct) == len(xml_scopes) + 1 == 60
    assert cct.kind[0] == NodeKind.ROOT and cct.ctx_id[0] == 0
    node_of = _node_of(exp)
    expected_kind = {"PF": NodeKind.FUNCTION, "C": NodeKind.LINE, "S": NodeKind.LINE}
    for ident, (tag, parent_id, attrs) in xml_scopes.items():
        node = node_of[ident]
        parent_ctx = 0 if parent_id == 1 else parent_id
        assert cct.ctx_id[cct.parent[node]] == parent_ctx, ident
        assert cct.kind[node] == expected_kind[tag], ident
        assert cct.relation[node] == (Relation.CALL if tag == "PF" else Relation.LEXICAL)
        assert cct.line[node] == int(attrs["l"])
    # document order is preorder: ids increase along the preorder node numbering here
    assert list(cct.ctx_id[1:]) == sorted(xml_scopes)


def test_tables(exp: Experiment) -> None:
    assert exp.title == "cpi" and exp.format == "experiment.xml" and exp.path == DB
    main = next(f for f in exp.functions if f.name == "main")
    assert exp.modules[main.module].path == "cpi"
    src = exp.files[main.file]
    assert (src.path, src.copied, main.line) == ("src/cpi.c", True, 19)
    assert (DB / src.path).is_file()
    assert not any(f.path == "<unknown file>" for f in exp.files)
    assert sum(f.copied for f in exp.files) == 1
    # a call site inside main is a line of main's file
    node = _node_of(exp)[5]
    assert (exp.cct.file[node], exp.cct.line[node]) == (main.file, 27)


def test_contexts(exp: Experiment) -> None:
    assert [p.label(exp.id_names) for p in exp.profiles] == [
        "summary", "RANK 0 THREAD 0", "RANK 1 THREAD 0", "RANK 2 THREAD 0", "RANK 3 THREAD 0"]
    assert [p.short_label(exp.id_names) for p in exp.contexts] == ["0.0", "1.0", "2.0", "3.0"]


def test_metric_is_one_inclusive_exclusive_pair(exp: Experiment) -> None:
    assert [m.name for m in exp.metrics] == [METRIC]
    m = exp.metric(METRIC)
    assert m.prop_id(exp.scopes, "point") is None  # not in this format
    assert m.prop_id(exp.scopes, "execution") is not None
    assert m.prop_id(exp.scopes, "function") is not None


# ---- values against Hatchet ----------------------------------------------------------------------


def test_values_match_hatchet(exp: Experiment, hatchet_rows: list[dict[str, str]],
                              xml_scopes: dict[int, tuple[str, int, dict[str, str]]]) -> None:
    cct = exp.cct
    node_of = _node_of(exp)
    prof = _profile_of_rank(exp)
    inc = {r: exp.values_in(p, METRIC, "execution") for r, p in prof.items()}
    exc = {r: exp.values_in(p, METRIC, "function") for r, p in prof.items()}

    # Hatchet keeps procedure frames and statements, drops call sites, and has every rank.
    kept = {i for i, (tag, _, _) in xml_scopes.items() if tag in ("PF", "S")}
    assert {(int(r["nid"]), int(r["rank"])) for r in hatchet_rows} == {
        (i, rank) for i in kept for rank in range(4)}
    assert len(hatchet_rows) == 4 * len(kept)

    # Hatchet puts exclusive time on statements only; HPCToolkit's exclusive time of a frame is
    # the sum over the statements it contains directly. Rebuild that from Hatchet's rows.
    frame_exclusive: dict[tuple[int, int], float] = {}
    for row in hatchet_rows:
        nid, rank = int(row["nid"]), int(row["rank"])
        node = node_of[nid]
        assert inc[rank][node] == float(row["time (inc)"]), (nid, rank)
        assert cct.line[node] == int(row["line"])
        if row["type"] == "S":
            assert cct.kind[node] == NodeKind.LINE
            assert exc[rank][node] == float(row["time"]), (nid, rank)
            assert row["name"].endswith(f":{cct.line[node]}")
            owner = int(cct.parent[node])
            while cct.kind[owner] != NodeKind.FUNCTION:
                owner = int(cct.parent[owner])
            key = (int(cct.ctx_id[owner]), rank)
            frame_exclusive[key] = frame_exclusive.get(key, 0.0) + float(row["time"])
            continue
        assert row["type"] == "PF"
        assert (cct.kind[node], cct.relation[node]) == (NodeKind.FUNCTION, Relation.CALL)
        assert float(row["time"]) == 0.0
        fn = exp.functions[cct.function[node]]
        # Hatchet prefixes a frame's name with the line of the call site above it, if known.
        parent = int(cct.parent[node])
        call_line = int(cct.line[parent]) if cct.kind[parent] == NodeKind.LINE else 0
        assert row["name"] == (f"{call_line}:{fn.name}" if call_line else fn.name)
        assert fn.line == int(row["line"])
        assert exp.modules[fn.module].path == row["module"]
        want_file = None if row["file"] == "<unknown file>" else row["file"].removeprefix("./")
        assert (exp.files[fn.file].path if fn.file >= 0 else None) == want_file

    for row in hatchet_rows:
        if row["type"] == "PF":
            nid, rank = int(row["nid"]), int(row["rank"])
            assert exc[rank][node_of[nid]] == frame_exclusive.get((nid, rank), 0.0), (nid, rank)
    assert any(v > 0 for v in frame_exclusive.values())


def test_summary_is_the_sum_over_ranks(exp: Experiment) -> None:
    inc = exp.inclusive(METRIC)
    exc = exp.exclusive(METRIC)
    per_inc = np.array([exp.values_in(p.index, METRIC, "execution") for p in exp.contexts])
    per_exc = np.array([exp.values_in(p.index, METRIC, "function") for p in exp.contexts])
    assert inc[0] == per_inc[:, 0].sum() == 999238 + 999390 + 1000306 + 999308
    np.testing.assert_array_equal(inc, per_inc.sum(axis=0))
    np.testing.assert_array_equal(exc, per_exc.sum(axis=0))
    # HPCToolkit's exclusive cost of the frames partitions the whole run, rank by rank
    frames = exp.cct.kind == NodeKind.FUNCTION
    np.testing.assert_array_equal(per_exc[:, frames].sum(axis=1), per_inc[:, 0])
    # and the XML's own (rounded) summary at the root agrees
    root_m = ET.parse(DB / "experiment.xml").getroot().find(".//SecCallPathProfileData/M")
    assert root_m is not None
    assert inc[0] == pytest.approx(float(root_m.attrib["v"]), rel=1e-5)


def test_metric_db_decoding() -> None:
    _need_data()
    dense = read_metric_db(DB / RANK0, n_nodes=60, n_metrics=2)
    assert dense.shape == (60, 2) and dense.dtype == np.float64
    assert dense[0, 0] == 999238.0 and dense[0, 1] == 0.0  # the implicit root, id 1
    assert dense[59].tolist() == [59960.0, 59960.0]  # S i=60


def test_open_experiment_detects_the_format() -> None:
    _need_data()
    e = open_experiment(DB / "experiment.xml")
    assert e.format == "experiment.xml" and len(e.contexts) == 4


# ---- scopes the sample lacks: loops, inlined code, literal names, scopes without ids ---------

SYNTHETIC_XML = """<?xml version="1.0"?>
<HPCToolkitExperiment version="2.2">
<Header n="synthetic"><Info/></Header>
<SecCallPathProfile i="0" n="ignored">
<SecHeader>
  <MetricDBTable>
    <MetricDB i="0" n="CYCLES (I)" t="inclusive" partner="1" db-glob="*.metric-db" db-id="0"
              db-num-metrics="3" db-header-sz="24"/>
    <MetricDB i="1" n="CYCLES (E)" t="exclusive" partner="0" db-glob="*.metric-db" db-id="2"
              db-num-metrics="3" db-header-sz="24"/>
    <MetricDB i="2" n="RATIO" db-glob="*.metric-db" db-id="1" db-num-metrics="3"/>
  </MetricDBTable>
  <TraceDBTable><TraceDB i="0" u="1000"/></TraceDBTable>
  <LoadModuleTable><LoadModule i="5" n="/bin/app"/></LoadModuleTable>
  <FileTable><File i="6" n="/home/u/app.c"/><File i="7" n="./src/vec.h"/></FileTable>
  <ProcedureTable><Procedure i="8" n="main"/><Procedure i="9" n="dot"/></ProcedureTable>
</SecHeader>
<SecCallPathProfileData>
  <PF i="2" n="8" lm="5" f="6" l="10-40">
    <L i="3" l="12">
      <S i="4" l="13"><M n="0" v="1"/></S>
      <Pr i="5" n="9" f="7" l="3" a="1">
        <S i="6" l="4"/>
      </Pr>
    </L>
    <C i="7" l="20">
      <PF i="8" n="helper" lm="libm.so" l="0">
        <S l="1"/>
      </PF>
    </C>
    <A n="9" f="7" l="5"><S i="9" l="6"/></A>
  </PF>
</SecCallPathProfileData>
</SecCallPathProfile>
</HPCToolkitExperiment>
"""


def _write_metric_db(path: Path, rows: list[list[float]]) -> None:
    head = b"HPCPROF-metricdb__00.10b" + struct.pack(">II", len(rows), len(rows[0]))
    path.write_bytes(head + np.asarray(rows, dtype=">f8").tobytes())


def test_synthetic_scopes(tmp_path: Path) -> None:
    (tmp_path / "experiment.xml").write_text(SYNTHETIC_XML)
    # ids 1..9, columns: CYCLES (I), RATIO, CYCLES (E)
    rows: list[list[float]] = [[10, 0.5, 0], [10, 0, 2], [6, 0, 1], [1, 0, 1], [5, 0, 5],
                               [5, 0, 5], [2, 0, 0], [2, 0, 2], [0, 0, 0]]
    _write_metric_db(tmp_path / "app-000000-001-0-1-0.metric-db", rows)
    _write_metric_db(tmp_path / "app-000000-000-0-1-0.metric-db", [[2 * v for v in r]
                                                                   for r in rows])
    exp = read_xml_experiment(tmp_path / "experiment.xml")
    cct = exp.cct
    assert exp.title == "synthetic"
    assert [p.label(exp.id_names) for p in exp.contexts] == ["RANK 0 THREAD 0",
                                                              "RANK 0 THREAD 1"]
    # preorder; the scopes without ``i`` (a statement, the alien) are numbered after the
    # largest XML id, 9, so they can never pick up a metric-db row
    assert cct.ctx_id.tolist() == [0, 2, 3, 4, 5, 6, 7, 8, 10, 11, 9]
    kinds = [NodeKind(k).name for k in cct.kind]
    rels = [Relation(r).name for r in cct.relation]
    assert kinds == ["ROOT", "FUNCTION", "LOOP", "LINE", "FUNCTION", "LINE", "LINE", "FUNCTION",
                     "LINE", "FUNCTION", "LINE"]
    assert rels == ["NONE", "CALL", "LEXICAL", "LEXICAL", "INLINED_CALL", "LEXICAL", "LEXICAL",
                    "CALL", "LEXICAL", "INLINED_CALL", "LEXICAL"]
    assert cct.parent.tolist() == [-1, 0, 1, 2, 2, 4, 1, 6, 7, 1, 9]
    assert cct.line.tolist() == [0, 10, 12, 13, 3, 4, 20, 0, 1, 5, 6]
    files = [exp.files[f].path if f >= 0 else None for f in cct.file]
    # lines and loops inherit the enclosing procedure's file; inlined code has its own; a
    # called frame without ``f`` has no file, not its caller's
    assert files == [None, "/home/u/app.c", "/home/u/app.c", "/home/u/app.c", "src/vec.h",
                     "src/vec.h", "/home/u/app.c", None, None, "src/vec.h", "src/vec.h"]
    modules = [exp.modules[m].path if m >= 0 else None for m in cct.module]
    assert modules == [None] + ["/bin/app"] * 6 + ["libm.so"] * 2 + ["/bin/app"] * 2
    names = [exp.functions[f].name if f >= 0 else None for f in cct.function]
    assert names == [None, "main", None, None, "dot", None, None, "helper", None, "dot", None]
    assert [f.copied for f in exp.files] == [False, True]

    assert [m.name for m in exp.metrics] == ["CYCLES", "RATIO"]
    ratio = exp.metric("RATIO")
    assert ratio.prop_id(exp.scopes, "function") is None
    assert exp.inclusive("RATIO")[0] == pytest.approx(1.5)
    inc = exp.inclusive("CYCLES")
    exc = exp.exclusive("CYCLES")
    assert inc.tolist() == [30, 30, 18, 3, 15, 15, 6, 6, 0, 0, 0]
    assert exc.tolist() == [0, 6, 3, 3, 15, 15, 0, 6, 0, 0, 0]
    t1 = exp.contexts[1].index
    assert exp.values_in(t1, "CYCLES", "execution").tolist() == [10, 10, 6, 1, 5, 5, 2, 2, 0,
                                                                 0, 0]


# ---- errors --------------------------------------------------------------------------------------


def _copy_db(tmp_path: Path) -> Path:
    """A writable copy (the shared data is read-only, and copying modes would keep it so)."""
    _need_data()
    dst = tmp_path / "db"
    for src in DB.rglob("*"):
        target = dst / src.relative_to(DB)
        if src.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
    return dst


def _edit_xml(old: str, new: str) -> Callable[[Path], str]:
    def edit(db: Path) -> str:
        path = db / "experiment.xml"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
        return "experiment.xml"
    return edit


def _drop_metric_db_table(db: Path) -> str:
    path = db / "experiment.xml"
    text, n = re.subn(r"<MetricDBTable>.*</MetricDBTable>", "", path.read_text(), flags=re.S)
    assert n == 1
    path.write_text(text)
    return "experiment.xml"


def _truncate_xml(db: Path) -> str:
    path = db / "experiment.xml"
    path.write_bytes(path.read_bytes()[:9000])
    return "experiment.xml"


def _truncate_metric_db(db: Path) -> str:
    path = db / RANK0
    path.write_bytes(path.read_bytes()[:-10])
    return RANK0


def _bad_magic(db: Path) -> str:
    path = db / RANK0
    data = path.read_bytes()
    path.write_bytes(b"HPCPROF-profiledb_00.10b" + data[24:])
    return RANK0


def _no_metric_db(db: Path) -> str:
    for p in db.glob("*.metric-db"):
        p.unlink()
    return "*.metric-db"


def _header_counts(nodes: int, metrics: int) -> Callable[[Path], str]:
    def edit(db: Path) -> str:
        path = db / RANK0
        data = path.read_bytes()
        body = bytes(8 * nodes * metrics)
        path.write_bytes(data[:24] + struct.pack(">II", nodes, metrics) + body)
        return RANK0
    return edit


def _unnamed_metric_db(db: Path) -> str:
    (db / RANK0).rename(db / "stray.metric-db")
    return "stray.metric-db"


CORRUPTIONS: dict[str, tuple[Callable[[Path], str], str]] = {
    "malformed-xml": (_truncate_xml, "malformed XML at line"),
    "mismatched-tag": (_edit_xml('<S i="25" s="504" l="0"/>', '<S i="25" s="504" l="0">'),
                       "mismatched tag"),
    "unknown-element": (_edit_xml('<S i="25" s="504" l="0"/>', '<Q i="25" s="504" l="0"/>'),
                        "unknown element <Q>"),
    "bad-module-ref": (_edit_xml('lm="507"', 'lm="9999"'), "refers to no entry of the "
                       "LoadModuleTable"),
    "bad-procedure-ref": (_edit_xml('n="509"', 'n="4242"'), "ProcedureTable"),
    "bad-file-ref": (_edit_xml('f="508"', 'f="1234"'), "FileTable"),
    "duplicate-id": (_edit_xml('<S i="25"', '<S i="24"'), "scope id used twice"),
    "root-id": (_edit_xml('<S i="25"', '<S i="1"'), "implicit root"),
    "bad-line": (_edit_xml('l="27"', 'l="twenty-seven"'), "line number"),
    "bad-metric-type": (_edit_xml('t="inclusive" partner="1"', 't="sideways" partner="1"'),
                        "expected inclusive, exclusive or nil"),
    "bad-partner": (_edit_xml('partner="1" db-glob', 'partner="7" db-glob'), "partner 7"),
    "no-metric-db-table": (_drop_metric_db_table, "no MetricDB entries"),
    "bad-version": (_edit_xml('version="2.0"', 'version="4.0"'), "unsupported"),
    "truncated-metric-db": (_truncate_metric_db, "truncated"),
    "wrong-magic": (_bad_magic, "bad magic"),
    "missing-metric-db": (_no_metric_db, "no metric-db file matches"),
    "node-count": (_header_counts(61, 2), "holds 61 node rows"),
    "metric-count": (_header_counts(60, 3), "holds 3 metrics"),
    "unnamed-metric-db": (_unnamed_metric_db, "rank and thread"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_is_a_one_line_format_error(tmp_path: Path, case: str) -> None:
    corrupt, expected = CORRUPTIONS[case]
    db = _copy_db(tmp_path)
    culprit = corrupt(db)
    with pytest.raises(FormatError) as info:
        read_xml_experiment(db)
    message = str(info.value)
    assert culprit in message and expected in message, message
    assert "\n" not in message
    assert info.value.path.endswith(culprit)


def test_xml_errors_give_line_and_column(tmp_path: Path) -> None:
    db = _copy_db(tmp_path)
    _edit_xml('lm="507"', 'lm="9999"')(db)
    with pytest.raises(FormatError, match=r"experiment\.xml: line \d+, column \d+: <PF "):
        read_xml_experiment(db)


def test_missing_experiment_xml(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"experiment\.xml: no such file"):
        read_xml_experiment(tmp_path)


def test_not_an_experiment(tmp_path: Path) -> None:
    (tmp_path / "experiment.xml").write_text("<?xml version='1.0'?><html><body/></html>")
    with pytest.raises(CallpathError, match=r"root element is <html>"):
        read_xml_experiment(tmp_path)


def test_trailing_bytes_in_metric_db(tmp_path: Path) -> None:
    db = _copy_db(tmp_path)
    path = db / RANK0
    path.write_bytes(path.read_bytes() + b"\0" * 8)
    with pytest.raises(FormatError, match=re.escape(RANK0) + r" at offset 0x3e0: trailing"):
        read_xml_experiment(db)
