"""Writer of HPCToolkit's sparse database format v4 (``../specs/hpctoolkit-FORMATS.md``).

``write_v4(exp, directory)`` writes ``meta.db``, ``profile.db``, ``cct.db``, ``trace.db`` (when the
experiment has traces), ``metrics/default.yaml`` and a ``src/`` folder of copied source files.

Design: every big array is laid out with numpy and written with one buffer write; there is no
Python loop over values, and none over contexts either:

- ``meta.db``: the context tree is laid out as sibling groups (the children of one parent are one
  contiguous array, in preorder), ordered by the parent's preorder index. Record sizes follow from
  the flags (flex words), so every record's position, every ``pChildren``/``szChildren`` and the
  flex sub-fields are computed for all nodes at once and stored into one array of u64 words.
- ``profile.db`` and ``cct.db`` are streamed (:mod:`callpath.formats.v4.stream`, whose phases
  are :mod:`~callpath.formats.v4.spool` and :mod:`~callpath.formats.v4.transpose`): each
  profile's block is written as soon as it is produced, straight into ``profile.db`` behind
  its fixed-size head for the first chunk of profiles, to a spool file for the others;
  their values are then read back by context range, put in ``cct.db``'s order one range at
  a time and written in place (offsets follow from counts taken while spooling), and the
  spooled bytes are written into ``profile.db`` on the way. The summary block comes last
  (it may depend on the transpose). Memory stays bounded by a block and a range, and an
  experiment that computes its blocks on demand (``callpath prof``) has them computed,
  written and transposed in parallel workers.

Files are written under temporary names in the target directory and renamed into place only
once all of them are complete, so a failure never leaves a half-written database behind the
real names. Layout choices where the specification leaves freedom follow the files hpcprof
writes (section order, 8-byte aligned sections and footers) and are listed in
``docs/formats-v4.md``.

This module holds the order of the steps, the checks of the experiment, ``metrics/`` and
``src/``; each file's layout has its own module: :mod:`~callpath.formats.v4.meta_db`,
:mod:`~callpath.formats.v4.value_dbs` (the fixed parts of ``profile.db``, ``cct.db`` and
``trace.db``), with the framing they share in :mod:`~callpath.formats.v4.framing`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path, PurePosixPath

import numpy as np

from callpath.errors import CallpathError
from callpath.formats.v4 import entry, names, spool, stream, transpose
from callpath.formats.v4.blocks import sorted_block
from callpath.formats.v4.meta_db import TreeLayout, meta_db_bytes
from callpath.formats.v4.value_dbs import (
    ProfileHead,
    fill_infos,
    write_cct_db,
    write_profile_db,
    write_trace_db,
)
from callpath.model.cct import NodeKind
from callpath.model.experiment import Experiment
from callpath.model.metrics import Combine
from callpath.model.tables import SourceFile

__all__ = ["check_output_directory", "write_v4"]


# ==== the public entry point ============================================================


def check_output_directory(directory: str | os.PathLike[str]) -> Path:
    """The database directory to write, refused (:class:`CallpathError`) when it is the empty
    string (which ``Path`` reads as the current directory: '-o ""' scattered a database among
    the user's files) or a directory that holds other data a database would be mixed into: a
    measurement (its files stay, but 'prof -o MEASDIR MEASDIR' left a directory that is both)
    or an experiment.xml database (meta.db beside it would hide it from every reader).
    Callers that work long before writing call it first, so a mistake costs no time."""
    if not os.fspath(directory):
        raise CallpathError("database directory '': expected a directory path")
    out = Path(directory)
    if out.is_dir():
        if (out / "measurement.json").exists() or any(out.glob("*.hpcrun")):
            raise CallpathError(f"{out}: holds a measurement; expected a new or database "
                                "directory for the database")
        if (out / "experiment.xml").exists() and not (out / "meta.db").exists():
            raise CallpathError(f"{out}: holds an experiment.xml database; expected a new or "
                                "v4 database directory")
    return out


def write_v4(exp: Experiment, directory: str | os.PathLike[str], *,
             copy_sources: bool = True) -> Path:
    """Write ``exp`` as an HPCToolkit v4 database into ``directory`` (created if needed).

    Existing database files in the directory are replaced; a ``trace.db`` left from an earlier
    database is removed when ``exp`` has no traces. With ``copy_sources``, source files that
    exist on this machine are copied under ``src/`` and marked ``copied``. Returns the directory.
    Raises :class:`CallpathError` when the experiment cannot be represented (e.g. profile 0 is
    not a summary profile) or the directory cannot be written.
    """
    out = check_output_directory(directory)
    _check_experiment(exp)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CallpathError(f"{out}: cannot create the database directory: "
                            f"{e.strerror or e}") from None
    if not out.is_dir():
        raise CallpathError(f"{out}: not a directory")
    if not os.access(out, os.W_OK | os.X_OK):
        raise CallpathError(f"{out}: the database directory is not writable")

    temps: dict[str, Path] = {}

    def temp(name: str) -> Path:
        p = out / f".{name.replace('/', '_')}.{os.getpid()}.tmp"
        temps[name] = p
        return p

    spool_dir = out / f".spool.{os.getpid()}.tmp"
    copies: _SourceCopies | None = None
    try:
        files, origins = _prepare_sources(exp, out, copy_sources)
        source = stream.value_source(exp)
        transposed = np.array([not p.is_summary for p in exp.profiles], dtype=bool)
        summary = (None if source.summary is not None
                   else sorted_block(source.block(0), 0))
        n0 = max(exp.n_ctx_slots, int(exp.cct.ctx_id.max()) + 1)
        if summary is not None and len(summary.ctx_ids):
            n0 = max(n0, int(summary.ctx_ids[-1]) + 1)
        synthetic = -1
        if entry.needs_synthetic_entry(exp):
            synthetic, n0 = n0, n0 + 1
            source = entry.with_entry_values(exp, source, synthetic)
            if summary is not None:
                summary = sorted_block(source.block(0), 0)
        n_ids = len({i.prop_metric_id for m in exp.metrics for i in m.scope_insts})
        bounds = transpose.bucket_bounds(n0, int(transposed.sum()), n_ids)
        head = ProfileHead.of(exp)
        spool_dir.mkdir(exist_ok=True)
        with open(temp("profile.db"), "wb"):
            pass  # the first chunk of profiles is written into it behind the head
        spools = spool.spool_profiles(source, spool_dir, transposed, bounds, n0,
                                      (temps["profile.db"], head.data_base))
        blocks_end = spool.place_spools(spools, head.data_base, temps["profile.db"],
                                        spool_dir)
        fill_infos(head, spools)
        n_slots = max([n0, *(sp.top_ctx for sp in spools)])
        if n_slots > 0xFFFFFFFF:
            raise CallpathError(f"{n_slots} contexts; v4 allows at most 2^32-1")
        tree = TreeLayout.build(exp, n_slots, synthetic)
        with open(temp("meta.db"), "wb") as f:
            f.write(meta_db_bytes(exp, files, tree))
        layout = transpose.ContextLayout.of(spools, tree.n_slots)
        with open(temp("cct.db"), "wb") as f:
            data_base = write_cct_db(f, layout)
        groups = transpose.transpose_buckets(source, spools, bounds, layout, temps["cct.db"],
                                             data_base, temps["profile.db"])
        spool.copy_uncopied(temps["profile.db"], spools)
        spool.remove_spools(spool_dir)
        if summary is None:
            assert source.summary is not None
            summary = sorted_block(source.summary(groups), 0)
            if len(summary.ctx_ids) and int(summary.ctx_ids[-1]) >= n_slots:
                raise CallpathError(f"the summary profile has a value at context "
                                    f"{int(summary.ctx_ids[-1])}, beyond the {n_slots} "
                                    "contexts of the database")
        with open(temps["profile.db"], "r+b") as pf:
            write_profile_db(pf, head, summary, blocks_end)
        if exp.traces is not None:
            with open(temp("trace.db"), "wb") as f:
                write_trace_db(f, exp.traces, len(exp.profiles))
        (out / "metrics").mkdir(exist_ok=True)
        yaml_text = exp.metrics_yaml if exp.metrics_yaml is not None else default_metrics_yaml(exp)
        temp("metrics/default.yaml").write_text(yaml_text, encoding="utf-8")
        # thread names have no place in v4: beside the database (formats.v4.names)
        names_doc = names.names_document(exp.profiles)
        if names_doc is not None:
            (out / names.RELPATH).parent.mkdir(exist_ok=True)
            temp(str(names.RELPATH)).write_text(names_doc, encoding="utf-8")
        # copied last, not beside the writing: on two busy cores the copying threads' turns
        # at the GIL slowed the writer by more than the copies took
        copies = _SourceCopies(out, files, origins)
        copies.wait()
        for name, p in temps.items():
            os.replace(p, out / name)
        temps.clear()
        if exp.traces is None and (out / "trace.db").exists():
            (out / "trace.db").unlink()
        if names_doc is None:
            (out / names.RELPATH).unlink(missing_ok=True)  # an earlier database's names
    except OSError as e:
        what = e.filename or out
        raise CallpathError(f"{what}: cannot write the database: {e.strerror or e}") from None
    finally:
        if copies is not None:
            with contextlib.suppress(OSError):
                copies.wait()
        for p in temps.values():
            with contextlib.suppress(OSError):
                p.unlink()
        spool.remove_spools(spool_dir)
    return out


# ==== consistency checks ================================================================


def _check_experiment(exp: Experiment) -> None:
    if not exp.profiles or not exp.profiles[0].is_summary:
        raise CallpathError("cannot write a v4 database: profile 0 must be the summary profile "
                            "(build experiments with callpath.model.build_experiment)")
    for i, p in enumerate(exp.profiles):
        if p.index != i:
            raise CallpathError(f"profile at position {i} has index {p.index}: profiles must be "
                                "listed in index order")
    if len(exp.values) != len(exp.profiles):
        raise CallpathError(f"{len(exp.values)} value blocks for {len(exp.profiles)} profiles")
    if len(exp.id_names) > 255:
        raise CallpathError(f"{len(exp.id_names)} identifier kinds; v4 allows at most 255")
    if len(exp.scopes) > 0xFFFF:
        raise CallpathError(f"{len(exp.scopes)} propagation scopes; v4 allows at most 65535")
    cct = exp.cct
    if cct.ctx_id[0] != 0 or cct.kind[0] != NodeKind.ROOT:
        raise CallpathError("the tree's first node must be the global context (ctx 0, ROOT)")
    if len(cct) > 1:
        if np.any(cct.ctx_id[1:] == 0):
            raise CallpathError("context identifier 0 is reserved for the global context")
        ids = cct.ctx_id
        top = int(ids.max())
        counts = (np.bincount(ids, minlength=top + 1) if top < 8 * len(ids)
                  else np.unique(ids, return_counts=True)[1])
        if int(counts.max()) > 1:
            raise CallpathError("context identifiers in the tree are not unique")
        kind = cct.kind[1:]
        par = cct.parent[1:]
        if np.any((kind == NodeKind.ENTRY) & (par != 0)):
            raise CallpathError("an entry point is not a child of the global context")
        if np.any(kind == NodeKind.ROOT):
            raise CallpathError("the global context (ROOT) appears below the top of the tree")
        if np.any(kind > NodeKind.ROOT):
            raise CallpathError(f"unknown node kind {int(kind.max())}")


# ==== metrics/default.yaml ==============================================================


def default_metrics_yaml(exp: Experiment) -> str:
    """A METRICS.yaml taxonomy with one root per metric: inclusive = sum over the
    ``execution`` scope, exclusive = sum over the ``function`` scope (those that exist)."""
    inputs: list[str] = []
    roots: list[str] = []
    for k, m in enumerate(exp.metrics):
        refs: dict[str, str] = {}
        for scope in ("execution", "function"):
            if m.stat_id(exp.scopes, scope, Combine.SUM) is None:
                continue
            anchor = f"metric{k}-sum-{scope}"
            refs[scope] = anchor
            inputs += [f"  - &{anchor}", f"    metric: {json.dumps(m.name)}",
                       f"    scope: {json.dumps(scope)}", "    formula: $$",
                       "    combine: sum"]
        if not refs:
            continue
        render = "[number, percent]" if "execution" in refs else "number"
        roots += [f"  - name: {json.dumps(m.name)}",
                  f"    description: {json.dumps(m.description or m.name)}",
                  "    variants:", "      Sum:", f"        render: {render}",
                  "        formula:"]
        if "execution" in refs:
            roots += ["          inclusive:", f"            standard: *{refs['execution']}"]
        if "function" in refs:
            roots += ["          exclusive:", f"            standard: *{refs['function']}"]
    lines = ["version: 0"]
    lines += ["inputs:", *inputs] if inputs else ["inputs: []"]
    lines += ["roots:", *roots] if roots else ["roots: []"]
    return "\n".join(lines) + "\n"


# ==== source files ======================================================================


def _inside(out: Path, rel: str) -> Path:
    dest = (out / rel).resolve()
    root = out.resolve()
    if dest != root and root not in dest.parents:
        raise CallpathError(f"source file path {rel!r} leads outside the database directory")
    return dest


def _copied_name(path: str | os.PathLike[str]) -> str:
    """``src/`` + the absolute path without its leading slash (hpcprof's convention)."""
    rest = os.path.abspath(path).lstrip("/")
    return "src/" + rest if rest else "src"


def _prepare_sources(exp: Experiment, out: Path, copy_sources: bool
                     ) -> tuple[list[SourceFile], list[str | None]]:
    """The source file table as written: copied files stay copied when their copy can be
    found (in the source database or already in ``out``); with ``copy_sources``, files that
    exist on this machine become copied ones. Nothing is copied yet: the second list says
    where each file's copy is to come from (None: nothing to copy). Paths are strings and
    each file is looked at once (``stat``): a PyTorch run names ~900 sources, and
    ``pathlib`` objects made and parsed five times over each cost a quarter of a second."""
    result: list[SourceFile] = []
    origins: list[str | None] = []
    base = os.fspath(exp.path) if exp.path is not None else None
    for sf in exp.files:
        if sf.copied:
            have = os.path.join(base, sf.path) if base is not None else None
            if have is not None and os.path.isfile(have):
                result.append(sf)
                origins.append(have)
                continue
            if _inside(out, sf.path).is_file():
                result.append(sf)
                origins.append(None)
                continue
            # The copy is lost: fall back to the original location, as a plain reference.
            rel = PurePosixPath(sf.path)
            orig = ("/" + str(PurePosixPath(*rel.parts[1:]))
                    if rel.parts[:1] == ("src",) and len(rel.parts) > 1 else sf.path)
            result.append(SourceFile(orig, False, sf.flags & ~1))
            origins.append(None)
            continue
        if copy_sources and sf.path:
            cand = _source_file(exp, sf)
            if cand is not None:
                name = sf.path if sf.path in exp.source_copies else cand
                result.append(SourceFile(_copied_name(name), True, sf.flags | 1))
                origins.append(cand)
                continue
        result.append(sf)
        origins.append(None)
    return result, origins


def _source_file(exp: Experiment, sf: SourceFile) -> str | None:
    """Where the text of a source that is not copied is on this machine, a file: its path
    (relative ones to the database), else a copy the experiment knows of
    (``source_copies``); None where neither is a file."""
    p = sf.path
    cand = p if os.path.isabs(p) else (os.path.join(exp.path, p) if exp.path is not None
                                       else None)
    if cand is not None and os.path.isfile(cand):
        return cand
    if p in exp.source_copies:
        copy = os.fspath(exp.source_copies[p])
        return copy if os.path.isfile(copy) else None
    return None


class _SourceCopies:
    """The copies of the sources, by a few threads (the kernel copies; the GIL is free
    meanwhile). Destinations are checked against the database directory by
    their normalised path (``..`` cannot leave it) and each directory is made once, before
    any copy starts."""

    THREADS = 4

    def __init__(self, out: Path, files: list[SourceFile], origins: list[str | None]) -> None:
        root = os.fspath(out.resolve())
        inside = root if root.endswith(os.sep) else root + os.sep
        made: set[str] = set()
        todo: list[tuple[str, str]] = []
        for sf, src in zip(files, origins, strict=True):
            if not sf.copied:
                continue
            dest = os.path.normpath(os.path.join(root, sf.path))
            if dest != root and not dest.startswith(inside):
                raise CallpathError(f"source file path {sf.path!r} leads outside the "
                                    "database directory")
            if src is None:
                continue
            parent = os.path.dirname(dest)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            todo.append((src, dest))
        self.errors: list[OSError] = []
        self.threads = [threading.Thread(target=self._copy, args=(todo[i::self.THREADS],),
                                         daemon=True)
                        for i in range(min(self.THREADS, len(todo)))]
        for t in self.threads:
            t.start()

    def _copy(self, todo: list[tuple[str, str]]) -> None:
        for src, dest in todo:
            try:
                try:
                    if os.path.samefile(src, dest):
                        continue  # the database's own copy (written over in place)
                except FileNotFoundError:
                    pass
                shutil.copyfile(src, dest)
            except FileNotFoundError as e:
                if os.path.isfile(src):
                    self.errors.append(e)
                    return
                # the source went away since it was looked at: not copied, as a source that
                # was never there
            except OSError as e:
                self.errors.append(e)
                return

    def wait(self) -> None:
        """Wait for every copy; the first that failed is raised."""
        for t in self.threads:
            t.join()
        self.threads = []
        if self.errors:
            raise self.errors[0]


# ==== meta.db ===========================================================================
