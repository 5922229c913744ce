"""Filters reproduce the seed's three figures (node C elided, with children D and E) and
persist as a global set; the `callpath filters` command manages that set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from callpath.analysis.source import tree_source
from callpath.analysis.topdown import TopDownView
from callpath.analysis.tree_filters import (
    Filter,
    FilterType,
    apply_filters,
    load_filters,
    save_filters,
)
from callpath.analysis.view_by_name import make_view
from callpath.errors import CallpathError
from conftest import run_cli, shared_path
from seedtrees import filter_experiment


def _tree(view: TopDownView) -> dict[str, tuple[float, float, list[str]]]:
    """label -> (inclusive, exclusive, child labels) for every node."""
    vi, ve = view.inclusive(0), view.exclusive(0)
    return {view.node_name(i): (float(vi[i]), float(ve[i]),
                                [view.node_name(int(c)) for c in view.children(i)])
            for i in range(len(view))}


def test_unfiltered_tree() -> None:
    t = _tree(TopDownView(tree_source(filter_experiment())))
    assert t["A"] == (15.0, 1.0, ["B", "C"])
    assert t["C"] == (12.0, 3.0, ["D", "E"])


def test_self_only_hands_children_and_cost_to_the_parent() -> None:
    src = apply_filters(tree_source(filter_experiment()), [Filter("C", FilterType.SELF_ONLY)])
    t = _tree(TopDownView(src))
    assert "C" not in t
    assert t["A"] == (15.0, 1.0 + 3.0, ["B", "D", "E"])
    assert t["D"][:2] == (4.0, 4.0) and t["E"][:2] == (5.0, 5.0)


def test_descendants_only_keeps_the_node_and_absorbs_its_subtree() -> None:
    src = apply_filters(tree_source(filter_experiment()),
                        [Filter("C", FilterType.DESCENDANTS_ONLY)])
    t = _tree(TopDownView(src))
    assert "D" not in t and "E" not in t
    assert t["C"] == (12.0, 3.0 + 4.0 + 5.0, [])
    assert t["A"] == (15.0, 1.0, ["B", "C"])


def test_self_and_descendants_moves_everything_to_the_parent() -> None:
    src = apply_filters(tree_source(filter_experiment()),
                        [Filter("C", FilterType.SELF_AND_DESCENDANTS)])
    t = _tree(TopDownView(src))
    assert {"C", "D", "E"}.isdisjoint(t)
    assert t["A"] == (15.0, 1.0 + 3.0 + 4.0 + 5.0, ["B"])


def test_globs_disabled_filters_and_other_views() -> None:
    exp = filter_experiment()
    base = tree_source(exp)
    assert apply_filters(base, [Filter("[DE]", FilterType.SELF_ONLY)]).cct is not base.cct
    assert apply_filters(base, [Filter("?", FilterType.SELF_ONLY, enabled=False)]) is base
    src = apply_filters(base, [Filter("[DE]", FilterType.SELF_ONLY)])
    flat = make_view("flat", src)
    names = {flat.node_name(i) for i in range(len(flat))}
    assert "D" not in names and "E" not in names
    # the cost of D and E now belongs to C (their parent), in every view
    c = next(i for i in range(len(flat)) if flat.node_name(i) == "C"
             and flat.nodes.kind[i] == 4)
    assert flat.exclusive(0)[c] == 3.0 + 4.0 + 5.0


def test_filter_set_persists_in_the_config_dir(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_filters() == []
    fs = [Filter("MPI_*", FilterType.DESCENDANTS_ONLY), Filter("__GI_*", enabled=False)]
    path = save_filters(fs)
    assert path == tmp_path / "callpath" / "filters.json"
    assert load_filters() == fs
    path.write_text("{not json")
    with pytest.raises(CallpathError, match=r"filters\.json: not a callpath filter set"):
        load_filters()
    path.write_text(json.dumps({"version": 1, "filters": [{"pattern": "x", "type": "odd"}]}))
    with pytest.raises(CallpathError, match="filter type 'odd'"):
        load_filters()


def test_filters_command_and_report(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    db = str(shared_path("hpctoolkit", "dbase", "small.d"))
    assert run_cli("filters", "add", "spinsleep", "--type", "self-and-descendants", env=env,
                   check=True).returncode == 0
    listing = run_cli("filters", "list", env=env, check=True).stdout
    assert "spinsleep" in listing and "self-and-descendants" in listing
    out = run_cli("report", db, "--unsorted", env=env, check=True).stdout
    assert "spinsleep" not in out and "loop at" not in out
    first = out.splitlines()[1]
    assert first.split()[0] == "1.21e+00"  # inclusive at the root is unchanged
    run_cli("filters", "disable", "1", env=env, check=True)
    assert "spinsleep" in run_cli("report", db, env=env, check=True).stdout
    run_cli("filters", "remove", "1", env=env, check=True)
    assert "no filters" in run_cli("filters", "list", env=env, check=True).stdout
    bad = run_cli("filters", "remove", "7", env=env)
    assert bad.returncode == 2 and "no filter 7" in bad.stderr
    # an ad-hoc filter on the command line, not saved
    out = run_cli("report", db, "--filter", "caller:self", env=env, check=True).stdout
    assert "caller" not in out
