"""Execution contexts as a person reads them: the NODE identifier is the host's gethostid()
(``NODE 8323328``), which says nothing. Labels leave the node out when every context ran on
one node and print a host id in hex when there are several, in the viewer (trace rows, the
Threads dialog, graphs) and in the CLI (``lines`` columns, ``report --contexts``, exports);
``--threads`` patterns copied from any form still select."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis import lines as L
from callpath.analysis.source import select_contexts
from callpath.formats.measdir import host_id
from callpath.model.contexts import Identifier, IdKind
from conftest import run_cli
from lines_support import lines_experiment
from view_support import get_json, serve

PROGRAM = """
def work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


for _ in range(20):
    work(100000)
"""


@pytest.fixture(scope="module")
def python_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("labels")
    script = d / "busy.py"
    script.write_text(PROGRAM)
    out = d / "busy.d"
    run_cli("profile", "--python", "-t", "-m", str(d / "m"), "-o", str(out), "--",
            str(script), check=True)
    return out


RAW = re.compile(r"NODE \d{5,}")  # a host id printed in decimal


def test_one_node_is_left_out(python_db: Path) -> None:
    exp = callpath.open(python_db)
    (ctx,) = exp.contexts
    node = next(i.logical_id for i in ctx.ids if i.kind == IdKind.NODE)
    assert node == host_id()  # what the measurement recorded: this host's id
    assert exp.context_label(ctx) == "THREAD 0 (MainThread)"
    # the viewer: trace rows and the Threads dialog
    with serve([python_db]) as s:
        meta = get_json(s.url, "/api/db/0/trace/meta")
        assert meta["contexts"] == ["THREAD 0 (MainThread)"]
        listed = get_json(s.url, "/api/db/0/contexts")
        assert [c["label"] for c in listed] == ["THREAD 0 (MainThread)"]
    # the CLI: the Lines columns, the Chrome trace's thread names
    doc = json.loads(run_cli("lines", str(python_db), "-f", "json", check=True).stdout)
    assert doc["contexts"] == ["THREAD 0 (MainThread)"]
    # report --contexts lists every identifier, the host id in hex
    text = run_cli("report", str(python_db), "--contexts", check=True).stdout
    assert f"NODE {node:#x} THREAD 0 (MainThread)" in text and not RAW.search(text), text
    # --threads: a pattern copied from any form selects the thread
    for pattern in (f"NODE {node} THREAD 0", f"NODE {node:#x} THREAD 0", "THREAD 0"):
        assert select_contexts(exp, pattern) == [ctx.index], pattern


def test_chrome_trace_names_threads_readably(python_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    run_cli("export", str(python_db), "-t", "chrome", "-o", str(out), check=True)
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e["args"]["name"] for e in events if e.get("name") == "thread_name"]
    assert names == ["THREAD 0 (MainThread)"]


def test_several_nodes_print_host_ids_in_hex(tmp_path: Path) -> None:
    """Ranks on two hosts (host ids as gethostid() gives them): each label names its host in
    hex, in the contexts' labels, the Lines columns and grouped by node."""
    ticks = np.arange(1, 13, dtype=float).reshape(3, 4)
    exp = lines_experiment(str(tmp_path / "a.c"), ticks, [("f", 1, 3)], rank_ids=True)
    hosts = [0x7F0100, 0xA8C00112]
    profiles = [exp.profiles[0]]
    for k, p in enumerate(exp.profiles[1:]):
        h = hosts[k % 2]
        profiles.append(dataclasses.replace(p, ids=(Identifier(IdKind.NODE, h, h, 1), *p.ids)))
    exp.profiles = profiles
    labels = [exp.context_label(c) for c in exp.contexts]
    assert labels == ["NODE 0x7f0100 RANK 0", "NODE 0xa8c00112 RANK 1",
                      "NODE 0x7f0100 RANK 2", "NODE 0xa8c00112 RANK 3"]
    m = L.build_line_matrix(exp, 0)
    assert sorted(m.labels) == sorted(labels)
    assert L.build_line_matrix(exp, 0, group="node").labels == ["NODE 0x7f0100",
                                                                 "NODE 0xa8c00112"]
    assert not any(RAW.search(x) for x in labels)
