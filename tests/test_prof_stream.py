"""``callpath prof`` streams its per-context values: blocks are computed in the writer's workers
and ``-M stats`` partials come out of the transpose. The database must not depend on the
number of workers, and the streamed summary must equal the one computed in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from callpath.attribute.hpctk import prof_hpctoolkit
from callpath.formats.v4.reader import read_v4
from conftest import run_cli, shared_path

DB_FILES = ("meta.db", "profile.db", "cct.db", "trace.db")


def test_stats_do_not_depend_on_workers(tmp_path: Path) -> None:
    meas = shared_path("hpctoolkit", "meas", "loops-cputime-t.m")
    for j in (1, 2, 3):
        run_cli("prof", str(meas), "-M", "stats", "-j", str(j), "-o", str(tmp_path / f"j{j}"),
                check=True)
    for j in (2, 3):
        for name in DB_FILES:
            assert (tmp_path / "j1" / name).read_bytes() == \
                (tmp_path / f"j{j}" / name).read_bytes(), (j, name)


def test_streamed_summary_equals_the_in_memory_one(tmp_path: Path) -> None:
    """The experiment ``callpath prof`` builds answers in memory too (its summary's stats
    then come from a transpose done in memory); the written database has the same values,
    to the last bit, for the summary and every execution context."""
    meas = shared_path("hpctoolkit", "meas", "loops-cputime-t.m")
    exp = prof_hpctoolkit([meas], [], workers=2, stats=True)
    assert exp is not None
    run_cli("prof", str(meas), "-M", "stats", "-j", "2", "-o", str(tmp_path / "db"),
            check=True)
    db = read_v4(tmp_path / "db")
    assert len(db.profiles) == len(exp.profiles) > 2
    for i in range(len(exp.profiles)):
        a, b = exp.values[i], db.values[i]
        assert np.array_equal(a.ctx_ids, b.ctx_ids), i
        assert np.array_equal(a.metric_ids, b.metric_ids), i
        assert np.array_equal(a.values, b.values), i
    # the stats columns are there: more summary metric ids than propagated ones
    assert int(db.values[0].metric_ids.max()) >= 4 * 4 * len(exp.metrics)


def test_block_bounds_are_exact_on_real_measurements() -> None:
    """The bounds that let the writer place each chunk of profiles before computing it are
    the blocks' exact sizes here (values are positive), so every chunk is written in place
    with no move (``tests/test_v4_writer_stream.py`` covers wrong bounds)."""
    from callpath.formats.v4.blocks import sorted_block
    from callpath.formats.v4.stream import value_source

    for name in ("loops-cputime-t.m", "small.m"):
        exp = prof_hpctoolkit([shared_path("hpctoolkit", "meas", name)], [], workers=1)
        assert exp is not None
        source = value_source(exp)
        bound = source.bound
        assert bound is not None
        exact = {}
        for i in range(1, len(exp.profiles)):
            blk = sorted_block(source.block(i), i)
            exact[i] = (len(blk.values), len(blk.ctx_ids))
            assert bound(i) == exact[i], (name, i)
        # the bounds are kept per pattern of sampled nodes: asked again, in another order,
        # they come from what was kept and still match; one entry per distinct pattern
        values = bound.__self__  # type: ignore[attr-defined]
        for i in reversed(range(1, len(exp.profiles))):
            assert bound(i) == exact[i], (name, i)
        patterns = {tuple(np.flatnonzero(p).tobytes() for p in values.points(th))
                    for th in values.threads}
        assert len(values._bounds) == len(patterns), name


def test_samples_respilled_by_the_receiving_rank_give_the_same_database(tmp_path: Path) -> None:
    """What ``--mpi`` does, without MPI: each share reduced with its samples spilled by its
    own rank; the other rank's samples read back and spilled again, one thread at a time,
    into the receiving rank's spill (as rank 0 does when they arrive), then merged and
    written; byte-identical to ``-j 1``. No spill directory is left behind."""
    import tempfile

    from callpath.attribute import hpctk, samples
    from callpath.attribute.build import finish
    from callpath.attribute.forked import STATE
    from callpath.attribute.hpctk import load_structures
    from callpath.attribute.reduce import merge
    from callpath.formats.v4.writer import write_v4

    meas = shared_path("hpctoolkit", "meas", "loops-cputime-t.m")
    run_cli("prof", str(meas), "-j", "1", "-o", str(tmp_path / "j1"), check=True)
    files = sorted(meas.glob("*.hpcrun"))
    before = set(Path(tempfile.gettempdir()).glob("callpath-prof-*"))
    STATE["structures"] = load_structures(sorted((meas / "structs").glob("*.hpcstruct")))
    receiving = samples.spill_directory()
    parts = []
    try:
        for k, share in enumerate((files[:1], files[1:])):
            d = receiving if k == 0 else samples.spill_directory()
            STATE["spill"] = d
            try:
                part = hpctk.reduce_hpcrun_files(share)
                assert all(th.samples.data is None for th in part.threads)  # spilled
                if k:
                    held = [th.samples for th in part.threads]
                    for th, s in zip(part.threads, held, strict=True):
                        th.samples = samples.spill(receiving, *s.arrays())
                    samples.release(held)
            finally:
                if k:
                    samples.remove_directory(d)
            parts.append(part)
        part = merge(parts)
        samples.adopt([th.samples for th in part.threads])
    finally:
        STATE.pop("structures", None)
        STATE.pop("spill", None)
        samples.remove_directory(receiving)
    exp = finish(part.tb, part.tables, part.threads, part.metrics, title=part.program,
                 description="callpath prof of HPCToolkit measurements")
    write_v4(exp, tmp_path / "mpi", copy_sources=True)
    for name in DB_FILES:
        assert (tmp_path / "j1" / name).exists() == (tmp_path / "mpi" / name).exists()
        if (tmp_path / "j1" / name).exists():
            assert (tmp_path / "j1" / name).read_bytes() == \
                (tmp_path / "mpi" / name).read_bytes(), name
    assert set(Path(tempfile.gettempdir()).glob("callpath-prof-*")) == before
