"""The streaming part of the v4 writer (``callpath.formats.v4.stream``): however the values are
split (spool chunks, buckets, transposed pieces, forked workers), the files are the same
bytes; the transpose agrees with a plain sort; blocks are written as they come, not held."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.attribute.forked import map_chunks
from callpath.errors import CallpathError
from callpath.formats.v4 import spool, stream, transpose
from callpath.formats.v4.reader import read_v4
from callpath.formats.v4.writer import write_v4
from callpath.model import ExecutionContext, Experiment, ProfileBlock
from callpath.model.values import BlockStore
from compare import small_experiment
from conftest import shared_path

DB_FILES = ("meta.db", "profile.db", "cct.db", "trace.db")


def _files(d: Path) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in DB_FILES if (d / n).exists()}


def _in_chunks(size: int) -> stream.Mapper:
    """A mapper that runs here, in chunks of ``size`` items (as many workers would split;
    the weights are a hint that a mapper may ignore)."""
    def mapper(fn: Callable[[Sequence[int]], Any], items: Sequence[int], /,
               weights: Sequence[float] | None = None) -> list[Any]:
        return [fn(items[i:i + size]) for i in range(0, len(items), size)]
    return mapper


class _Streamed(Experiment):
    """An experiment that carries a value source, as ``callpath prof``'s do."""

    value_source: stream.ValueSource | None = None


def _with_source(exp: Experiment, source: stream.ValueSource) -> Experiment:
    out = _Streamed(**{k: getattr(exp, k) for k in exp.__dataclass_fields__})
    out.value_source = source
    return out


@pytest.fixture(params=["small_experiment", "loops-cputime-t.d", "small.d"])
def experiment(request: pytest.FixtureRequest) -> Experiment:
    if request.param == "small_experiment":
        return small_experiment()
    return read_v4(shared_path("hpctoolkit", "dbase", request.param))


def test_any_split_gives_the_same_files(experiment: Experiment, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One chunk and one bucket vs. one profile per chunk, tiny buckets and pieces, and
    forked workers: byte-identical databases."""
    write_v4(experiment, tmp_path / "plain.d", copy_sources=False)
    plain = _files(tmp_path / "plain.d")
    monkeypatch.setattr(transpose, "VALUES_PER_BUCKET", 7)
    monkeypatch.setattr(transpose, "MAX_BUCKETS", 5)
    mappers: list[tuple[str, stream.Mapper]] = [
        ("chunks", _in_chunks(1)), ("chunks3", _in_chunks(3)),
        ("forked", functools.partial(map_chunks, workers=2))]
    for name, mapper in mappers:
        exp = _with_source(experiment, stream.ValueSource(experiment.values.__getitem__,
                                                          mapper))
        write_v4(exp, tmp_path / f"{name}.d", copy_sources=False)
        assert _files(tmp_path / f"{name}.d") == plain, name
        assert [p.name for p in (tmp_path / f"{name}.d").iterdir()
                if p.name.startswith(".")] == []


@pytest.mark.parametrize("error", ["exact", "over", "under", "mixed"])
def test_blocks_go_where_their_bounds_say(experiment: Experiment, tmp_path: Path, error: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With size bounds, every chunk is written in place where the bounds predict: exact
    bounds leave it there; a bound too large puts the chunks behind it elsewhere (they are
    moved, and nothing is left where they were); a bound too small would overrun the next
    chunk's place, so that chunk switches to a spool file. Always the same bytes."""
    write_v4(experiment, tmp_path / "plain.d", copy_sources=False)
    plain = _files(tmp_path / "plain.d")
    monkeypatch.setattr(transpose, "VALUES_PER_BUCKET", 7)
    n = len(experiment.profiles)

    def bound(i: int) -> tuple[int, int]:
        blk = experiment.values[i]
        nv, nc = len(blk.values), len(blk.ctx_ids)
        if error == "over" or (error == "mixed" and i == n // 2):
            return nv + 3, nc + 1
        if error == "under" or (error == "mixed" and i == 1):
            return max(nv - 3, 0), max(nc - 1, 0)
        return nv, nc

    seen: list[str] = []
    place = spool.place_spools

    def spy(spools: list[spool.Spool], *args: Any) -> int:
        seen.extend("in place" if sp.in_place else "spooled" for sp in spools)
        return place(spools, *args)

    monkeypatch.setattr(spool, "place_spools", spy)
    mappers: list[tuple[str, stream.Mapper]] = [
        ("chunks1", _in_chunks(1)), ("chunks2", _in_chunks(2)),
        ("forked", functools.partial(map_chunks, workers=2))]
    for name, mapper in mappers:
        seen.clear()
        source = stream.ValueSource(experiment.values.__getitem__, mapper, bound=bound)
        write_v4(_with_source(experiment, source), tmp_path / f"{name}.d", copy_sources=False)
        assert _files(tmp_path / f"{name}.d") == plain, name
        assert [p.name for p in (tmp_path / f"{name}.d").iterdir()
                if p.name.startswith(".")] == []
        if error == "exact":
            assert seen and set(seen) == {"in place"}, name
        if error == "under" and name == "chunks1" and n > 3:
            assert "spooled" in seen


def test_blocks_outside_cct_db_are_placed_too(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Spooled blocks reach profile.db through the transpose's reads, except those it does
    not read: a second summary-flagged profile (not in cct.db) and a block with a context
    index but no value. Those are copied whole; every split gives the same bytes, and they
    read back as written."""
    import dataclasses

    base = small_experiment()
    b1, b2 = base.values[1], base.values[2]
    empty = ProfileBlock(np.array([3, 7], np.uint32), np.zeros(2, np.uint64),
                         np.zeros(0, np.uint16), np.zeros(0, np.float64))
    blocks = [base.values[0], b1, empty, b2, b1, empty, b2]
    profiles = [base.profiles[0], base.profiles[1],
                dataclasses.replace(base.profiles[2], index=2)]
    ids = base.profiles[1].ids
    profiles += [ExecutionContext(3, ids, True, 1), ExecutionContext(4, ids),
                 ExecutionContext(5, ids), ExecutionContext(6, ids, True, 1)]
    exp = dataclasses.replace(base, profiles=profiles, values=BlockStore.of(blocks),
                              traces=None)
    write_v4(exp, tmp_path / "plain.d", copy_sources=False)
    plain = _files(tmp_path / "plain.d")
    monkeypatch.setattr(transpose, "VALUES_PER_BUCKET", 5)
    mappers: list[tuple[str, stream.Mapper]] = [
        ("chunks1", _in_chunks(1)), ("chunks2", _in_chunks(2)),
        ("forked", functools.partial(map_chunks, workers=3))]
    for name, mapper in mappers:
        write_v4(_with_source(exp, stream.ValueSource(blocks.__getitem__, mapper)),
                 tmp_path / f"{name}.d", copy_sources=False)
        assert _files(tmp_path / f"{name}.d") == plain, name
    back = read_v4(tmp_path / "chunks2.d")
    for i, blk in enumerate(blocks):
        got = back.values[i]
        assert np.array_equal(got.ctx_ids, blk.ctx_ids), i
        assert np.array_equal(got.starts, blk.starts), i
        assert np.array_equal(got.metric_ids, blk.metric_ids), i
        assert np.array_equal(got.values, blk.values), i


def test_blocks_are_written_as_they_come(tmp_path: Path) -> None:
    """The writer keeps no block of the source alive once it is written: at most one exists
    at any time (the source here makes each block fresh, as ``callpath prof`` does)."""
    exp = read_v4(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"))
    stored = [exp.values[i] for i in range(len(exp.profiles))]
    alive: set[int] = set()
    most = [0]

    def block(i: int) -> ProfileBlock:
        b = stored[i]
        fresh = ProfileBlock(b.ctx_ids.copy(), b.starts.copy(), b.metric_ids.copy(),
                             b.values.copy())
        alive.add(i)
        most[0] = max(most[0], len(alive))
        weakref.finalize(fresh, alive.discard, i)
        return fresh

    write_v4(_with_source(exp, stream.ValueSource(block)), tmp_path / "s.d", copy_sources=False)
    write_v4(exp, tmp_path / "plain.d", copy_sources=False)
    assert _files(tmp_path / "s.d") == _files(tmp_path / "plain.d")
    assert len(exp.profiles) > 2 and most[0] == 1


def test_a_failing_source_leaves_no_spool(tmp_path: Path) -> None:
    exp = small_experiment()

    def block(i: int) -> ProfileBlock:
        if i == 2:
            raise CallpathError("profile 2: cannot be computed")
        return exp.values[i]

    out = tmp_path / "db.d"
    with pytest.raises(CallpathError, match="profile 2"):
        write_v4(_with_source(exp, stream.ValueSource(block)), out)
    assert [p.name for p in out.iterdir()] in ([], ["metrics"])


def _reference(ctx: np.ndarray, met: np.ndarray, prof: np.ndarray, val: np.ndarray
               ) -> tuple[np.ndarray, ...]:
    order = np.lexsort((prof, met, ctx))
    return ctx[order], met[order], prof[order], val[order]


@st.composite
def runs(draw: st.DrawFn) -> tuple[Any, ...]:
    """Runs of records, one or two per profile (a profile's records of two buckets),
    profiles ascending; each run sorted by (context, metric) with distinct pairs."""
    wide = draw(st.booleans())  # wide: many metric ids over many contexts (sparse path)
    c0 = draw(st.integers(0, 50))
    width = draw(st.integers(1, 300_000 if wide else 40))
    metrics = draw(st.lists(st.integers(0, 65535 if wide else 9), min_size=1, max_size=30,
                            unique=True))
    n_prof = draw(st.integers(0, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    ctxs, mets, vals, prof, lens = [], [], [], [], []
    for p in range(n_prof):
        k = int(rng.integers(0, 40))
        ctx = rng.integers(c0, c0 + width, size=k)
        met = rng.choice(metrics, size=k)
        key = np.unique((ctx.astype(np.uint64) << np.uint64(16)) | met.astype(np.uint64))
        cut = int(rng.integers(0, len(key) + 1))
        for part in (key[:cut], key[cut:]):
            if len(part) == 0:
                continue
            ctxs.append((part >> np.uint64(16)).astype(np.uint32))
            mets.append((part & np.uint64(0xFFFF)).astype(np.uint16))
            vals.append(rng.standard_normal(len(part)))
            prof.append(p + 1)
            lens.append(len(part))
    def cat(parts: list[np.ndarray], dt: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dt)
    return (cat(ctxs, np.uint32), cat(mets, np.uint16), cat(vals, np.float64),
            np.array(prof, dtype=np.int64), np.array(lens, dtype=np.int64), c0, c0 + width)


@settings(max_examples=60, deadline=None)
@given(runs())
def test_transpose_is_a_stable_sort(case: tuple[Any, ...]) -> None:
    c, m, val, run_prof, run_len, c0, c1 = case
    g = transpose._transpose(c, m, val, run_prof, run_len, c0, c1)
    prof = np.repeat(run_prof, run_len)
    ctx, met, p, v = _reference(c.astype(np.int64), m.astype(np.int64), prof, val)
    sizes = np.diff(g.starts)
    assert np.array_equal(np.repeat(g.ctx, sizes), ctx)
    assert np.array_equal(np.repeat(g.metric, sizes), met)
    assert np.array_equal(g.prof, p) and np.array_equal(g.values, v)
    pairs = (g.ctx.astype(np.int64) << 16) | g.metric
    assert np.all(np.diff(pairs) > 0)  # each pair once, in order
