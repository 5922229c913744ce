"""Turn ``raw.perf`` into the measurement directory's process files (post-mortem).

Why post-mortem: the launcher must keep up with the rings while the program runs, so it only
copies bytes; decoding, unwinding and tree building run once at the end, vectorised, over all
samples (``unwind``), and can be redone from the raw file (``callpath run --finish DIR``) if the
launcher was killed before finishing.

Address spaces (*images*) are followed through the sideband records in time order: ``exec``
starts a new image of the pid (generation + 1) with an empty load map, ``fork`` of a new process
starts one whose load map is a copy of its parent's, and executable ``mmap``s change the load
map in their own range only (``loadmap``: patched pages, libraries unloaded and replaced).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError, FormatError
from callpath.formats import measdir
from callpath.measure import cfi, loadmap, offcpu, recipes, unwind
from callpath.measure import perf_records as records
from callpath.measure.elfinfo import ElfInfo
from callpath.measure.loadmap import Mapping
from callpath.measure.perf_launch import GAPS_FILE, PROCS_FILE, RAW_FILE
from callpath.structure.demangle import demangle

PROT_EXEC = 4
STAGING = ".finishing"
USER_LIMIT = 1 << 56  # user-space addresses are below (x86-64: 2^47, or 2^56 with LA57)
_FILE_IDS: dict[str, int] = {}  # small integer per module file: part of the unwinder's keys


@dataclass
class Image:
    pid: int
    generation: int
    start_time: int
    ppid: int = 0
    forked_from: int | None = None
    parent_image: int | None = None  # for a fork without exec: the image it copies
    mappings: list[Mapping] = field(default_factory=list)
    thread_birth: dict[int, int] = field(default_factory=dict)  # tid -> fork time
    comm: str = ""
    #: tid -> the thread's name (comm) as last set: the creating thread's at birth, then the
    #: COMM records of prctl(PR_SET_NAME) / pthread_setname_np; the main thread's is ``comm``
    thread_names: dict[int, str] = field(default_factory=dict)

    def thread_name(self, tid: int) -> str:
        """What /proc/PID/task/TID/comm read at the thread's last rename (or birth)."""
        return self.thread_names.get(tid, self.comm)


@dataclass
class ThreadSummary:
    pid: int
    tid: int
    index: int
    rank: int | None
    samples: int
    partial: int
    program: str = ""  # the process's executable (basename): names launchers in the summary
    name: str = ""  # the thread's name (comm), as the database's context carries it
    time: offcpu.ThreadTime | None = None  # -e REALTIME: its wall, CPU and off-CPU time


@dataclass
class Result:
    threads: list[ThreadSummary]
    samples: int
    partial: int
    lost: int
    throttled: int
    bad: int
    flat: list[tuple[str, str, int]]  # (procedure, module, samples) of metric 0
    partial_reasons: dict[str, int]
    #: frames found per source (CFI, recipes, ...) and the recipe analyses of this run
    frame_sources: dict[str, int] = field(default_factory=dict)
    recipe_log: list[recipes.Computed] = field(default_factory=list)
    #: -e REALTIME: context-switch samples and the switches they stand for (more switches
    #: than samples: the kernel sampled 1 in N, the cap was reached)
    switch_samples: int = 0
    switches: int = 0


def _images(side: list[records.Sideband]) -> tuple[list[Image], dict[int, list[tuple[int, int]]]]:
    images: list[Image] = []
    current: dict[int, int] = {}
    gen: dict[int, int] = {}
    history: dict[int, list[tuple[int, int]]] = {}

    def new(img: Image) -> None:
        images.append(img)
        current[img.pid] = len(images) - 1
        history.setdefault(img.pid, []).append((img.start_time, len(images) - 1))

    for sb in side:
        if sb.kind == "exec":
            g = gen.get(sb.pid, -1) + 1
            gen[sb.pid] = g
            old = current.get(sb.pid)
            ppid = images[old].ppid if old is not None else 0
            new(Image(sb.pid, g, sb.time, ppid, comm=sb.fields["comm"]))
        elif sb.kind == "fork":
            ppid = int(sb.fields["ppid"])
            if sb.pid != ppid:
                gen[sb.pid] = 0
                parent = current.get(ppid)
                maps = list(images[parent].mappings) if parent is not None else []
                img = Image(sb.pid, 0, sb.time, ppid,
                            forked_from=ppid if parent is not None else None,
                            parent_image=parent, mappings=maps,
                            comm=images[parent].comm if parent is not None else "")
                if parent is not None:  # the child's thread is named as the forking one
                    img.thread_names[sb.pid] = images[parent].thread_name(
                        int(sb.fields["ptid"]))
                new(img)
            elif sb.pid in current:
                img = images[current[sb.pid]]
                img.thread_birth.setdefault(sb.tid, sb.time)
                # a new thread inherits its creator's name (the kernel copies comm)
                img.thread_names.setdefault(sb.tid, img.thread_name(int(sb.fields["ptid"])))
        elif sb.kind == "comm" and sb.pid in current:
            # a rename (the process's comm stays the exec's: it names the program)
            images[current[sb.pid]].thread_names[sb.tid] = sb.fields["comm"]
        elif (sb.kind == "mmap" and sb.fields["prot"] & PROT_EXEC and sb.fields["len"] > 0
              and sb.fields["addr"] + sb.fields["len"] <= USER_LIMIT
              and sb.fields["pgoff"] < USER_LIMIT):
            if sb.pid not in current:
                new(Image(sb.pid, gen.setdefault(sb.pid, 0), sb.time))
            f = sb.fields
            images[current[sb.pid]].mappings.append(
                Mapping(sb.time, f["addr"], f["addr"] + f["len"], f["pgoff"], f["path"],
                        f["build_id"]))
    return images, history


def module_map(kept: list[Mapping], out: Path,
                vdso: str) -> tuple[unwind.ModuleMap, list[measdir.Module], list[str]]:
    """The unwinder's map, the module records and the module names of one load map
    (``loadmap.pieces``); also ``callpath run --native``'s, from its ``/proc`` snapshots."""
    elves: list[ElfInfo | None] = []
    mods: list[measdir.Module] = []
    names: list[str] = []
    bias = []
    file_ids = []
    for i, m in enumerate(kept):
        saved = ""
        path = m.path
        if m.path == "[vdso]" and vdso:
            saved = vdso
            path = os.path.abspath(out / vdso)  # `-o m` is relative: still a file
        elf: ElfInfo | None = None
        if path.startswith("/") and os.path.exists(path):
            elf = ElfInfo.get(path)
            if not elf.ok or (m.build_id and elf.build_id and m.build_id != elf.build_id):
                elf = None  # not ELF, or the file changed since the run
        vaddr = m.pgoff
        if elf is not None:
            la = elf.link_address(m.pgoff, executable=True)
            vaddr = la if la is not None else m.pgoff
        build_id = m.build_id or (elf.build_id if elf else "")
        name = loadmap.module_name(m.path)
        mods.append(measdir.Module(i, name, m.start, m.end, m.pgoff, vaddr, build_id, saved))
        elves.append(elf)
        names.append(name)
        bias.append(vaddr - m.start)
        file_ids.append(_FILE_IDS.setdefault(path, len(_FILE_IDS)))
    mm = unwind.ModuleMap(np.array([m.start for m in kept], dtype=np.uint64),
                          np.array([m.end for m in kept], dtype=np.uint64),
                          np.array(bias, dtype=np.int64), elves,
                          np.array(file_ids, dtype=np.int64))
    return mm, mods, names


def _remap(module: npt.NDArray[np.int64],
           table: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Module indices of an epoch's map → indices into the image's list (-1 stays -1)."""
    if not len(table):
        return np.full(len(module), -1, dtype=np.int64)
    return np.where(module >= 0, table[np.maximum(module, 0)], -1)


def _unwind_epochs(img: Image, s: records.Samples, col: dict[str, int], words: Any,
                   out: Path, vdso: str, compiler: cfi.Compiler,
                   ) -> tuple[unwind.Frames, unwind.ModuleMap, list[measdir.Module], list[str]]:
    """Unwind an image's samples, each with the load map of the time it was taken.

    Returns the frames (module indices into one list of modules: every piece of every epoch,
    each distinct piece once) and that list as a map for symbolisation.
    """
    eps = loadmap.epochs(img.mappings)
    which = loadmap.epoch_of([t for t, _ in eps], s.time)
    all_pieces: list[Mapping] = []
    index: dict[tuple[int, int, int, str, str], int] = {}
    parts: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], unwind.Frames]] = []
    for e, (_t0, kept) in enumerate(eps):
        glob: list[int] = []
        for m in kept:
            key = (m.start, m.end, m.pgoff, m.path, m.build_id)
            if key not in index:
                index[key] = len(all_pieces)
                all_pieces.append(m)
            glob.append(index[key])
        sel = np.nonzero(which == e)[0] if len(eps) > 1 else np.arange(len(s), dtype=np.int64)
        if not len(sel) and len(eps) > 1:
            continue
        mm, _mods, _names = module_map(kept, out, vdso)
        sub = s.take(sel) if len(eps) > 1 else s
        saved_regs = sub.regs[:, [col[r] for r in ("bx", "bp", "r12", "r13", "r14", "r15")]]
        fr = unwind.unwind_parallel(words, sub.regs[:, col["ip"]], sub.regs[:, col["sp"]],
                                    saved_regs, sub.stack0, sub.stack_words, mm, compiler)
        parts.append((sel, np.array(glob, dtype=np.int64), fr))
    order = sorted(range(len(all_pieces)), key=lambda i: (all_pieces[i].start, i))
    rank = np.empty(len(all_pieces), dtype=np.int64)
    rank[order] = np.arange(len(order))
    mm, mods, names = module_map([all_pieces[i] for i in order], out, vdso)
    if len(parts) == 1 and len(parts[0][0]) == len(s):
        _sel, g, fr = parts[0]
        fr.module = _remap(fr.module, rank[g])
        return fr, mm, mods, names
    n = len(s)
    complete = np.zeros(n, dtype=bool)
    nframes = np.zeros(n, dtype=np.int64)
    reason = np.zeros(n, dtype=np.int64)
    for sel, _glob, fr in parts:
        complete[sel] = fr.complete
        nframes[sel] = fr.nframes
        reason[sel] = fr.reason
    cat: Any = np.concatenate
    return unwind.Frames(
        cat([sel[fr.sample] for sel, _g, fr in parts]),
        cat([fr.depth for _s, _g, fr in parts]),
        cat([_remap(fr.module, rank[g]) for _s, g, fr in parts]),
        cat([fr.address for _s, _g, fr in parts]), cat([fr.exact for _s, _g, fr in parts]),
        complete, nframes, reason), mm, mods, names


def unwind_mode() -> str:
    """``CALLPATH_UNWIND``: ``cfi`` (default: CFI, recipes where it has none or fails),
    ``recipes`` (recipes first: compares them with CFI on the same samples) or ``cfi-only``."""
    mode = os.environ.get("CALLPATH_UNWIND", "cfi") or "cfi"
    if mode not in cfi.MODES:
        raise CallpathError(f"CALLPATH_UNWIND={mode}: expected one of {', '.join(cfi.MODES)}")
    return mode


def _build_tree(fr: unwind.Frames, n: int, thread_of: npt.NDArray[np.int64],
                n_threads: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64],
                                         npt.NDArray[np.int64]]:
    """Level-by-level tree building for all threads at once.

    Returns the global node array (thread roots first), the thread of each node and the leaf
    node of each sample. Each level is one ``np.unique`` over (parent, frame) keys, so a parent
    always gets a smaller id than its children.
    """
    partial = ~fr.complete
    level = fr.nframes[fr.sample] - 1 - fr.depth + partial[fr.sample].astype(np.int64)
    # one int64 key per frame: (module + 1) << 50 | exact << 49 | 48-bit address (user space)
    fkey = (((fr.module + 1) << 50) | (fr.exact.astype(np.int64) << 49)
            | (fr.address.astype(np.int64) & ((1 << 48) - 1)))
    ukeys, fid = np.unique(fkey, return_inverse=True)
    fid = fid.reshape(-1).astype(np.int64)
    um = (ukeys >> 50) - 1
    uframes = np.zeros(len(ukeys), dtype=[("k", "u1"), ("x", "u1"), ("m", "<i8"), ("a", "<u8")])
    uframes["k"] = np.where(um >= 0, measdir.NodeKind.NATIVE, measdir.NodeKind.UNKNOWN)
    uframes["x"] = (ukeys >> 49) & 1
    uframes["m"] = um
    uframes["a"] = (ukeys & ((1 << 48) - 1)).astype(np.uint64)
    # pseudo-frame for PARTIAL markers
    partial_fid = len(uframes)
    nf = len(uframes) + 1
    nodes_parent = [np.full(n_threads, -1, dtype=np.int64)]
    nodes_frame = [np.full(n_threads, -1, dtype=np.int64)]
    nodes_thread = [np.arange(n_threads, dtype=np.int64)]
    cur = thread_of.astype(np.int64).copy()  # thread roots are nodes 0..n_threads-1
    next_id = n_threads
    order = np.lexsort((fr.depth, level))
    lv_sorted = level[order]
    maxlevel = int(lv_sorted[-1]) if len(lv_sorted) else -1
    bounds = np.searchsorted(lv_sorted, np.arange(maxlevel + 2))
    for lv in range(maxlevel + 1):
        idx = order[bounds[lv]:bounds[lv + 1]]
        s = fr.sample[idx]
        f = fid[idx]
        if lv == 0:
            ps = np.nonzero(partial)[0]
            s = np.concatenate([s, ps])
            f = np.concatenate([f, np.full(len(ps), partial_fid, dtype=np.int64)])
        if not len(s):
            continue
        key = cur[s] * nf + f
        uk, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        nodes_parent.append(uk // nf)
        nodes_frame.append(uk % nf)
        nodes_thread.append(thread_of[s][np.unique(inv, return_index=True)[1]])
        cur[s] = next_id + inv
        next_id += len(uk)
    parent = np.concatenate(nodes_parent)
    frame = np.concatenate(nodes_frame)
    nthread = np.concatenate(nodes_thread)
    nodes = np.zeros(len(parent), dtype=measdir.NODE_DTYPE)
    nodes["parent"] = parent
    nodes["module"] = -1
    is_frame = (frame >= 0) & (frame < len(uframes))
    uf = uframes[np.where(is_frame, frame, 0)]
    nodes["kind"] = np.where(frame < 0, measdir.NodeKind.ROOT,
                             np.where(frame == partial_fid, measdir.NodeKind.PARTIAL, uf["k"]))
    nodes["flags"] = np.where(is_frame & (uf["x"] == 1), measdir.NodeFlag.EXACT_PC, 0)
    nodes["module"] = np.where(is_frame, uf["m"], -1)
    nodes["address"] = np.where(is_frame, uf["a"], 0)
    return nodes, nthread, cur


def finish(out: Path, progress: Callable[[str], None] | None = None) -> Result:
    """Decode, unwind and write the process files of a measurement directory; drop raw.perf."""
    header_path = out / measdir.HEADER_FILE
    try:
        header = json.loads(header_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError(header_path, f"cannot read the measurement header ({e})") from None
    raw_info = records.check_raw_info(header_path, header.get("raw"))
    if not (out / RAW_FILE).exists():
        raise CallpathError(f"{out}: no {RAW_FILE} to process (already finished?)")
    try:
        metrics = [measdir.MetricInfo.from_json(m) for m in header["metrics"]]
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(header_path, f"expected a list of metric descriptors ({e})") from None
    if not metrics:
        raise FormatError(header_path, "no metrics: the run opened no event")
    nmet = len(metrics)
    raw = records.decode(out / RAW_FILE, raw_info)
    # process files are written aside and moved in at the end, so that finishing again after
    # an interruption (the raw file is kept until then) starts from scratch
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    images, history = _images(raw.sideband)
    facts = _read_facts(out / PROCS_FILE)
    sm = raw.samples
    # image of each sample: the last image of its pid that started before it
    img_of = np.full(len(sm), -1, dtype=np.int64)
    for pid in np.unique(sm.pid).tolist():
        sel = np.nonzero(sm.pid == pid)[0]
        hist = history.get(pid)
        if not hist:
            images.append(Image(pid, 0, 0))
            hist = history.setdefault(pid, [(0, len(images) - 1)])
        times = np.array([h[0] for h in hist], dtype=np.uint64)
        k = np.searchsorted(times, sm.time[sel], side="right") - 1
        img_of[sel] = np.array([h[1] for h in hist])[np.maximum(k, 0)]
    regs = list(raw_info["regs"])
    col = {r: regs.index(r) for r in ("ip", "sp", "bx", "bp", "r12", "r13", "r14", "r15")}
    rt = raw_info.get("realtime")
    switch_metric = int(rt["switch_metric"]) if isinstance(rt, dict) else -1
    oc = offcpu.compute(sm, switch_metric, raw.switches, _thread_life(raw.sideband),
                        _switch_gaps(out), int(rt["cpu_metric"])) \
        if isinstance(rt, dict) and raw.switches is not None else None
    if oc is not None and oc.duplicate.any():
        keep = ~oc.duplicate
        oc.take(keep)
        sm = sm.take(keep)
        img_of = img_of[keep]
    table = cfi.RowTable()
    store = recipes.RecipeStore()
    mode = unwind_mode()
    compiler = cfi.Compiler(table, recipes=store.get, mode=mode, cache=cfi.row_cache(mode))
    node_id = int(header.get("node_id", 0))
    trace = bool(raw_info.get("trace"))
    vdso = str(raw_info.get("vdso", ""))
    summaries: list[ThreadSummary] = []
    flat: dict[tuple[str, str], int] = {}
    reasons: dict[str, int] = {}
    throttled = sum(1 for s in raw.sideband if s.kind == "throttle")
    used_names: set[tuple[int, int]] = set()
    total_partial = 0
    image_facts: list[dict[str, Any]] = []
    for img in images:
        # a fork without exec has its parent's environment and executable; the facts read
        # from /proc for it may already be those of a later exec
        if img.parent_image is not None:
            image_facts.append(image_facts[img.parent_image])
        else:
            image_facts.append(_facts_for(facts, img))
    for ii, img in enumerate(images):
        sel = np.nonzero(img_of == ii)[0]
        if not len(sel):
            continue  # an image without samples (a fork that exec'd at once): no file
        s = sm.take(sel)
        if progress:
            progress(f"unwinding {len(s)} samples of process {img.pid}")
        fr, mm, mods, names = _unwind_epochs(img, s, col, raw.words, out, vdso, compiler)
        if len(s):
            # samples without user registers (kernel threads) cannot be unwound
            fr.complete &= s.has_regs
        # threads: main thread first, then by birth
        tids = np.unique(s.tid).tolist()
        births = img.thread_birth
        # every thread of a sampled image is a context, even one that got no sample
        known = set(tids) | set(births) | ({img.pid} if img.start_time else set())
        order = sorted(known, key=lambda t: (t != img.pid, births.get(t, 1 << 62), t))
        tindex = {t: i for i, t in enumerate(order)}
        thread_of = np.array([tindex[t] for t in s.tid.tolist()], dtype=np.int64)
        nodes, nthread, leaf = _build_tree(fr, len(s), thread_of, len(order))
        value = s.period.astype(np.float64)
        run_leaf = leaf
        if oc is not None:
            value[s.metric == switch_metric] = oc.charged[sel][s.metric == switch_metric]
            nodes, nthread, leaf, run_leaf = _placeholders(nodes, nthread, leaf, fr, s, mm,
                                                           switch_metric, oc.preempted[sel])
        gen = img.generation
        while (img.pid, gen) in used_names:
            gen += 1
        used_names.add((img.pid, gen))
        f = image_facts[ii] if ii < len(image_facts) else {}
        rank = f.get("rank")
        with measdir.ProcessWriter(staging, img.pid, gen) as w:
            w.process(pid=img.pid, ppid=img.ppid, generation=gen, exe=f.get("exe", ""),
                      comm=img.comm, rank=rank, host=header.get("host", ""), node_id=node_id,
                      forked_from=img.forked_from)
            w.metrics(metrics)
            w.modules(mods)
            new_id = np.full(len(nodes), -1, dtype=np.int64)
            for t, tid in enumerate(order):
                mine = np.nonzero(nthread == t)[0]  # ascending: parents before children
                new_id[mine] = np.arange(len(mine))
                tn = nodes[mine].copy()
                tn["parent"] = np.where(tn["parent"] >= 0,
                                        new_id[np.maximum(tn["parent"], 0)], -1)
                ts = np.nonzero(thread_of == t)[0]
                w.thread(t, tid=tid, ids=measdir.context_ids(node_id, rank, t), index=t,
                         name=img.thread_name(tid))
                w.nodes(t, tn)
                c_node, c_met = new_id[leaf[ts]], s.metric[ts]
                c_val, c_n = value[ts], np.ones(len(ts), dtype=np.int64)
                tt = oc.threads.get((img.pid, tid)) if oc is not None else None
                if oc is not None:
                    # REALTIME (metric 0) = CPU time + time off CPU, at the same contexts;
                    # off-CPU time without a call path (before the thread first ran): at
                    # its root
                    un = tt.unattributed if tt is not None else 0.0
                    nr = 2 if un > 0 else 0
                    c_node = np.concatenate([c_node, c_node, [0, 0][:nr]])
                    c_met = np.concatenate([c_met, np.zeros(len(ts), dtype=np.int64),
                                            [switch_metric, 0][:nr]])
                    c_val = np.concatenate([c_val, c_val, [un, un][:nr]])
                    c_n = np.concatenate([c_n, c_n, [0, 0][:nr]])
                lk = c_node * nmet + c_met
                uk, inv = np.unique(lk, return_inverse=True)
                cnt = np.zeros(len(uk), dtype=measdir.COUNT_DTYPE)
                cnt["node"] = uk // nmet
                cnt["metric"] = uk % nmet
                cnt["samples"] = np.bincount(inv.reshape(-1), weights=c_n, minlength=len(uk))
                cnt["value"] = np.bincount(inv.reshape(-1), weights=c_val, minlength=len(uk))
                w.counts(t, cnt)
                if trace:
                    tr = np.zeros(len(ts), dtype=measdir.TRACE_DTYPE)
                    tr["time"] = s.time[ts]
                    tr["node"] = new_id[leaf[ts]]
                    tr["metric"] = s.metric[ts]
                    if oc is not None:
                        # a switch-out opens a blocked interval (its placeholder) that ends
                        # when the thread runs again, back in the frame where it stopped
                        sws = ts[s.metric[ts] == switch_metric]
                        back = np.zeros(len(sws), dtype=measdir.TRACE_DTYPE)
                        back["time"] = oc.resume[sel][sws]
                        back["node"] = new_id[run_leaf[sws]]
                        back["metric"] = switch_metric
                        tr = np.concatenate([tr, back])
                    w.trace(t, tr[np.argsort(tr["time"], kind="stable")])
                npart = int(np.count_nonzero(~fr.complete[ts]))
                total_partial += npart
                extra: dict[str, Any] = {}
                if tt is not None:
                    extra = {"wall_ns": tt.wall, "cpu_ns": tt.cpu, "offcpu_ns": round(tt.off),
                             "blocked_ns": round(tt.blocked),
                             "switch_samples": tt.switch_samples, "switches": tt.switches}
                    if tt.estimated:  # above the cap: how much off-CPU time was estimated
                        extra.update(offcpu_estimated_ns=round(tt.estimated_off),
                                     estimated_span_ns=tt.estimated,
                                     estimated_from_ns=tt.estimated_from - tt.start)
                w.stats(t, samples=len(ts), partial=npart, **extra)
                summaries.append(ThreadSummary(img.pid, tid, t, rank, len(ts), npart,
                                               os.path.basename(str(f.get("exe", "")))
                                               or img.comm, img.thread_name(tid), tt))
        for code, cnt_ in zip(*np.unique(fr.reason[~fr.complete], return_counts=True),
                              strict=True):
            name = unwind.REASONS.get(int(code), "no user registers")
            reasons[name] = reasons.get(name, 0) + int(cnt_)
        _flat(flat, fr, s, mm, names, 1 if oc is not None else 0)
    for done in sorted(staging.iterdir()):
        os.replace(done, out / done.name)
    staging.rmdir()
    (out / RAW_FILE).unlink()
    (out / PROCS_FILE).unlink(missing_ok=True)
    if compiler.cache is not None:
        compiler.cache.save()
    ranked = sorted(((k[0], k[1], v) for k, v in flat.items()), key=lambda x: -x[2])
    return Result(summaries, len(sm), total_partial, raw.lost, throttled, raw.bad_samples,
                  ranked, reasons,
                  {cfi.SOURCES[i]: v for i, v in enumerate(compiler.frame_sources) if v},
                  store.log,
                  sum(x.switch_samples for x in oc.threads.values()) if oc else 0,
                  sum(x.switches for x in oc.threads.values()) if oc else 0)


def _switch_gaps(out: Path) -> npt.NDArray[np.int64]:
    """-e REALTIME: when the launcher turned the switch records off (``launch.GAPS_FILE``)."""
    try:
        rows = json.loads((out / GAPS_FILE).read_text())
    except (OSError, ValueError):
        rows = []
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def _thread_life(side: list[records.Sideband]) -> offcpu.Life:
    """When each thread started (its fork; the exec that enabled the events for the measured
    program's first thread) and when it exited."""
    life = offcpu.Life()
    for sb in side:
        if sb.kind in ("fork", "exec"):
            life.starts.setdefault((sb.pid, sb.tid), sb.time)
        elif sb.kind == "exit":
            life.exits[(sb.pid, sb.tid)] = sb.time
    return life


def _placeholders(nodes: npt.NDArray[Any], nthread: npt.NDArray[np.int64],
                  leaf: npt.NDArray[np.int64], fr: unwind.Frames, s: records.Samples,
                  mm: unwind.ModuleMap, switch_metric: int, preempted: npt.NDArray[np.int8]
                  ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64],
                             npt.NDArray[np.int64]]:
    """Below the leaf of every context-switch sample, a PLACEHOLDER node: PREEMPTED when its
    switch record says the thread was preempted (it stayed runnable), else BLOCKED. Where no
    record matched (``preempted`` -1), BLOCKED when the leaf pc follows a ``syscall``
    instruction (the thread was in the system call its wrapper made). Returns the new nodes, their
    threads, each sample's leaf (the placeholder for switch samples) and its frame leaf."""
    sw = np.flatnonzero(s.metric == switch_metric)
    if not len(sw):
        return nodes, nthread, leaf, leaf
    code = np.full(len(s), int(measdir.Placeholder.PREEMPTED), dtype=np.int64)
    unmatched = np.zeros(len(s), dtype=bool)
    unmatched[sw[preempted[sw] < 0]] = True
    top = (fr.depth == 0) & unmatched[fr.sample]  # leaves to look at: those without a record
    fs, fm, fa = fr.sample[top], fr.module[top], fr.address[top]
    in_syscall: dict[tuple[int, int], bool] = {}
    for m, a in set(zip(fm.tolist(), fa.tolist(), strict=True)):
        elf = mm.elves[m] if 0 <= m < len(mm.elves) else None
        in_syscall[(m, a)] = elf is not None and a >= 2 and \
            elf.read_code(a - 2, a) == b"\x0f\x05"
    hit = np.array([in_syscall[(m, a)] for m, a in zip(fm.tolist(), fa.tolist(), strict=True)],
                   dtype=bool)
    code[fs[hit]] = int(measdir.Placeholder.BLOCKED)
    verdict = preempted[sw]
    known = verdict >= 0
    code[sw[known]] = np.where(verdict[known] == 1, int(measdir.Placeholder.PREEMPTED),
                               int(measdir.Placeholder.BLOCKED))
    key = leaf[sw] * 4 + code[sw]
    uk, inv = np.unique(key, return_inverse=True)
    extra = np.zeros(len(uk), dtype=measdir.NODE_DTYPE)
    extra["parent"] = uk // 4
    extra["kind"] = measdir.NodeKind.PLACEHOLDER
    extra["module"] = -1
    extra["address"] = (uk % 4).astype(np.uint64)
    new_leaf = leaf.copy()
    new_leaf[sw] = len(nodes) + inv.reshape(-1)
    return (np.concatenate([nodes, extra]), np.concatenate([nthread, nthread[uk // 4]]),
            new_leaf, leaf)


def _flat(acc: dict[tuple[str, str], int], fr: unwind.Frames, s: records.Samples,
          mm: unwind.ModuleMap, names: list[str], metric: int = 0) -> None:
    """Leaf samples of the first sampled metric (``metric``: REALTIME's is its CPU clock)
    per procedure (symbol tables of the modules)."""
    leaf = (fr.depth == 0) & (s.metric[fr.sample] == metric) if len(s) else fr.depth == 0
    mods, addrs = fr.module[leaf], fr.address[leaf]
    if not len(mods):
        return
    pairs = np.stack([mods, addrs.astype(np.int64)], axis=1)
    up, counts = np.unique(pairs, axis=0, return_counts=True)
    for (m, a), c in zip(up.tolist(), counts.tolist(), strict=True):
        if m < 0:
            key = ("[unknown]", "")
        else:
            elf = mm.elves[m]
            sym = elf.symbolize(a) if elf is not None else None
            key = (demangle(sym) if sym else f"{os.path.basename(names[m])}+{a:#x}",
                   os.path.basename(names[m]))
        acc[key] = acc.get(key, 0) + c


def _read_facts(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line
    except OSError:
        pass
    return out


def _facts_for(facts: list[dict[str, Any]], img: Image) -> dict[str, Any]:
    """The /proc facts noted when this image started (same pid, nearest time after)."""
    exact = [f for f in facts if f.get("pid") == img.pid and f.get("time") == img.start_time]
    if exact:
        return exact[0]
    best: dict[str, Any] = {}
    for f in facts:
        if (f.get("pid") == img.pid and int(f.get("time", 0)) >= img.start_time
                and (not best or int(f["time"]) < int(best["time"]))):
            best = f
    if not best:
        same = [f for f in facts if f.get("pid") == img.pid]
        best = same[-1] if same else {}
    return best
