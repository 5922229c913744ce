"""The measurement directory format: round trip, incremental writes, truncation, bad input."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callpath.errors import CallpathError, FormatError
from callpath.formats import measdir as md
from callpath.model.contexts import IdKind

METRICS = [md.MetricInfo("cpu-clock", "ns", 1_000_000, 0, "CPU time", "cpu-clock"),
           md.MetricInfo("page-faults", "events", 1, 0, "", "page-faults")]


def _write_sample_dir(d: Path, close: bool = True) -> md.ProcessWriter:
    md.write_header(d, METRICS, command=["prog"], status="complete")
    w = md.ProcessWriter(d, 1234, 0)
    w.process(pid=1234, ppid=1, generation=0, exe="/bin/prog", rank=3)
    w.metrics(METRICS)
    w.modules([md.Module(0, "/bin/prog", 0x1000, 0x2000, 0x1000, 0x1000, "ab12")])
    w.modules([md.Module(1, "[vdso]", 0x7000, 0x8000, 0, 0, "", "vdso-x.so")])
    w.pycode([md.PyCode("a.py", "f", 3)])
    w.thread(0, tid=1234, ids=md.context_ids(7, 3, 0), index=0)
    first = w.nodes(0, md.make_nodes([-1, 0], [md.NodeKind.ROOT, md.NodeKind.NATIVE],
                                     [-1, 0], [0, 0x1100]))
    assert first == 0
    second = w.nodes(0, md.make_nodes([1, 1], [md.NodeKind.NATIVE, md.NodeKind.PYTHON],
                                      [0, 0], [0x1234, 7], [md.NodeFlag.EXACT_PC, 0]))
    assert second == 2
    cnt = np.zeros(3, dtype=md.COUNT_DTYPE)
    cnt["node"] = [2, 2, 3]
    cnt["metric"] = [0, 0, 1]
    cnt["samples"] = [1, 2, 5]
    cnt["value"] = [1e6, 2e6, 5]
    w.counts(0, cnt)
    tr = np.zeros(2, dtype=md.TRACE_DTYPE)
    tr["time"] = [10, 20]
    tr["node"] = [2, 3]
    w.trace(0, tr)
    w.stats(0, samples=8, partial=0)
    if close:
        w.close()
    return w


def test_round_trip(tmp_path: Path) -> None:
    _write_sample_dir(tmp_path)
    m = md.read(tmp_path)
    assert [x.name for x in m.metrics] == ["cpu-clock", "page-faults"]
    (p,) = m.processes
    assert p.complete and not p.truncated and p.pid == 1234 and p.info["rank"] == 3
    assert [mod.path for mod in p.modules] == ["/bin/prog", "[vdso]"]
    assert p.modules[1].saved == "vdso-x.so"
    assert p.pycode == [md.PyCode("a.py", "f", 3)]
    (t,) = p.threads
    assert t.tid == 1234
    assert [i.kind for i in t.ids] == [IdKind.NODE, IdKind.RANK, IdKind.THREAD]
    assert t.ids[1].logical_id == 3
    assert list(t.nodes["parent"]) == [-1, 0, 1, 1]
    assert t.samples[2, 0] == 3 and t.values[2, 0] == 3e6 and t.samples[3, 1] == 5
    assert int(t.samples.sum()) == 8
    assert list(t.trace["node"]) == [2, 3]
    assert t.stats == {"samples": 8, "partial": 0}
    assert t.path_of(3) == [0, 1, 3]


def test_killed_writer_keeps_flushed_chunks(tmp_path: Path) -> None:
    w = _write_sample_dir(tmp_path, close=False)
    # simulate a kill in the middle of a chunk: append half a chunk by hand
    w._f.write(b"\x04\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00abc")
    w._f.flush()
    m = md.read(tmp_path)
    (p,) = m.processes
    assert not p.complete and p.truncated
    assert int(p.threads[0].samples.sum()) == 8


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(CallpathError, match="not a measurement directory"):
        md.read(tmp_path / "nope")
    with pytest.raises(FormatError, match="missing"):
        md.read(tmp_path)
    (tmp_path / md.HEADER_FILE).write_text("{")
    with pytest.raises(FormatError, match="JSON"):
        md.read(tmp_path)
    (tmp_path / md.HEADER_FILE).write_text(json.dumps({"format": md.FORMAT_NAME, "version": 99}))
    with pytest.raises(FormatError, match="unsupported version"):
        md.read(tmp_path)
    md.write_header(tmp_path, METRICS)
    (tmp_path / "process-1-0.cpm").write_bytes(b"NOTMAGIC" + bytes(8))
    with pytest.raises(FormatError, match="bad magic"):
        md.read(tmp_path)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_process_file(tmp_path: Path, data: st.DataObject) -> None:
    """Corrupting bytes of a valid file gives either a result or a FormatError, nothing else."""
    d = tmp_path / "fz"
    if not (d / "process-1234-0.cpm").exists():
        _write_sample_dir(d)
    good = (d / "process-1234-0.cpm").read_bytes()
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    f = tmp_path / "process-9-0.cpm"
    f.write_bytes(bytes(buf[:cut]))
    with contextlib.suppress(FormatError):
        md.read_process(f, 2)


def test_a_process_killed_before_its_header_leaves_an_empty_truncated_file(tmp_path: Path
                                                                           ) -> None:
    from callpath.formats import measdir as md

    for size in (0, 5, 15):
        f = tmp_path / f"process-{size + 1}-0.cpm"
        f.write_bytes(md.MAGIC + b"\x01\x00\x00\x00\x00\x00\x00\x00"[:max(0, size - 8)]
                      if size > 8 else md.MAGIC[:size])
        prof = md.read_process(f)
        assert prof.truncated and not prof.complete and prof.threads == []
    bad = tmp_path / "process-99-0.cpm"
    bad.write_bytes(b"NOTMAGIC")
    with pytest.raises(CallpathError, match="16-byte file header"):
        md.read_process(bad)
