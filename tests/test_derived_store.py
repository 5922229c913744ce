"""Derived metrics saved with a real database, reloaded, and the read-only fallback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis.derived import (
    DerivedMetric,
    db_store_path,
    fallback_store_path,
    load_derived,
    read_store,
    save_derived,
)
from callpath.analysis.formula import FormulaError
from callpath.errors import CallpathError, FormatError
from conftest import shared_path

METRICS = [
    DerivedMetric("CPU ms", "$0 * 1000", "%.1f"),
    DerivedMetric("share", "100 * $0 / @0", "percent"),
    DerivedMetric("scaled", "sqrt($0) / avg($0, @0)", "default", percent=True),
]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private copy of small.d (never write into ../shared) and a private config home."""
    src = shared_path("hpctoolkit", "dbase", "small.d")
    dst = tmp_path / "small.d"
    shutil.copytree(src, dst)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    yield dst
    for p in [dst, *dst.rglob("*")]:  # undo any read-only bits so tmp_path can be removed
        if p.is_dir():
            p.chmod(0o755)


def test_save_reopen_same_metrics(db: Path) -> None:
    written = save_derived(db, METRICS)
    assert written == db / "callpath" / "derived-metrics.json"
    doc = json.loads(written.read_text())
    assert doc["format"] == "callpath-derived-metrics" and doc["version"] == 1
    assert doc["database"] == str(db.resolve())
    assert [p.name for p in written.parent.iterdir()] == ["derived-metrics.json"]  # no temp left

    exp = callpath.open(db)  # the extra folder does not disturb the database reader
    assert load_derived(db) == METRICS
    assert load_derived(exp.path or db) == METRICS

    # the reloaded formulas evaluate against the reopened database
    inc = exp.inclusive(0)
    root = float(inc[0])
    for m in load_derived(db):
        f = m.parsed
        f.check_references(range(len(exp.metrics)))
        out = f.evaluate(lambda n: exp.inclusive(n), lambda n: root, len(inc))
        assert out.shape == inc.shape
    share = load_derived(db)[1].parsed.evaluate(lambda n: exp.inclusive(n), lambda n: root,
                                                len(inc))
    assert share[0] == pytest.approx(100.0)
    assert np.allclose(share, 100 * inc / root)


def test_save_replaces_the_previous_set(db: Path) -> None:
    save_derived(db, METRICS)
    save_derived(db, METRICS[:1])
    assert load_derived(db) == METRICS[:1]
    save_derived(db, [])
    assert load_derived(db) == []


def test_nothing_saved_is_an_empty_list(db: Path) -> None:
    assert load_derived(db) == []


def test_duplicate_names_are_refused(db: Path) -> None:
    with pytest.raises(CallpathError, match="'CPU ms' is defined twice"):
        save_derived(db, [METRICS[0], DerivedMetric("CPU ms", "$0")])


def test_not_a_database_directory(tmp_path: Path) -> None:
    with pytest.raises(CallpathError, match="not a database directory"):
        save_derived(tmp_path / "absent.d", METRICS)


def _make_read_only(path: Path) -> bool:
    """Make ``path`` unwritable even for root where the system allows it; False if not."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    proc = subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False)
    return proc.returncode == 0


def _undo_read_only(path: Path) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)
    path.chmod(0o755)


def test_read_only_database_falls_back_to_the_config_directory(db: Path,
                                                                tmp_path: Path) -> None:
    if not _make_read_only(db):
        pytest.skip("running as root on a file system without immutable files (chattr +i): "
                    "cannot make a directory read-only")
    try:
        written = save_derived(db, METRICS)
        expected = fallback_store_path(db)
        assert written == expected
        assert expected.parent == tmp_path / "config" / "callpath" / "derived"
        assert len(expected.stem) == 16
        assert not db_store_path(db).exists()
        assert load_derived(db) == METRICS
    finally:
        _undo_read_only(db)


def test_unwritable_store_location_falls_back(db: Path) -> None:
    # a plain file where the callpath/ folder should be: no one, not even root, can write there
    (db / "callpath").write_text("in the way\n")
    written = save_derived(db, METRICS[:2])
    assert written == fallback_store_path(db)
    assert load_derived(db) == METRICS[:2]


def test_fallback_key_is_the_absolute_path(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(db.parent)
    assert fallback_store_path(Path("small.d")) == fallback_store_path(db)
    assert fallback_store_path(db) != fallback_store_path(db.parent)


def test_default_config_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fallback_store_path(tmp_path).parent == tmp_path / ".config" / "callpath" / "derived"


def test_the_newer_file_wins(db: Path) -> None:
    save_derived(db, METRICS[:1])
    fb = fallback_store_path(db)
    fb.parent.mkdir(parents=True)
    shutil.copy(db_store_path(db), fb)
    doc = json.loads(fb.read_text())
    doc["metrics"][0]["formula"] = "$0 * 2"
    fb.write_text(json.dumps(doc))
    old = db_store_path(db).stat().st_mtime_ns
    os.utime(fb, ns=(old + 10**9, old + 10**9))
    assert load_derived(db)[0].formula == "$0 * 2"
    os.utime(db_store_path(db), ns=(old + 2 * 10**9, old + 2 * 10**9))
    assert load_derived(db)[0].formula == "$0 * 1000"


@pytest.mark.parametrize(("content", "fragment"), [
    (b"{not json", "not valid JSON (line 1, column 2)"),
    (b"\xff\xfe", "not UTF-8 text"),
    (b"[]", "not a derived-metrics file"),
    (b'{"format": "other"}', "not a derived-metrics file"),
    (b'{"format": "callpath-derived-metrics", "version": 7, "metrics": []}',
     "unsupported version 7: expected 1"),
    (b'{"format": "callpath-derived-metrics", "version": 1, "metrics": {}}',
     '"metrics" must be a list'),
    (b'{"format": "callpath-derived-metrics", "version": 1, "metrics": [3]}',
     "metrics[0] must be an object"),
    (b'{"format": "callpath-derived-metrics", "version": 1, "metrics": [{"name": "x"}]}',
     'metrics[0] needs string "name" and "formula"'),
    (b'{"format": "callpath-derived-metrics", "version": 1, '
     b'"metrics": [{"name": "x", "formula": "$0", "percent": "yes"}]}',
     '"percent" true or false'),
    (b'{"format": "callpath-derived-metrics", "version": 1, '
     b'"metrics": [{"name": "x", "formula": "$0 +"}]}',
     "metrics[0]: formula '$0 +', column 5: expected a number"),
    (b'{"format": "callpath-derived-metrics", "version": 1, '
     b'"metrics": [{"name": "x", "formula": "$0", "format": "%s"}]}',
     "metrics[0]: display format '%s'"),
])
def test_corrupt_files_are_one_line_errors_naming_the_file(db: Path, content: bytes,
                                                           fragment: str) -> None:
    path = db_store_path(db)
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(FormatError) as exc:
        load_derived(db)
    msg = str(exc.value)
    assert msg.startswith(str(path) + ": ")
    assert fragment in msg
    assert "\n" not in msg


def test_read_store_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read"):
        read_store(tmp_path / "nope.json")


def test_metric_validation() -> None:
    with pytest.raises(FormulaError):
        DerivedMetric("bad", "1 +* 2")
    with pytest.raises(CallpathError, match="name must not be empty"):
        DerivedMetric("  ", "$0")
    with pytest.raises(CallpathError, match="display format"):
        DerivedMetric("x", "$0", "%s")
    m = DerivedMetric.from_assignment(" IPC = $1/$0 ", "%.2f", True)
    assert m == DerivedMetric("IPC", "$1/$0", "%.2f", True)
    assert m.value_format.format(1.234) == "1.23"
    with pytest.raises(CallpathError, match="expected NAME=FORMULA"):
        DerivedMetric.from_assignment("$1/$0")
