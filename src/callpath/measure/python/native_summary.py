"""The launcher's end of ``callpath run --native``: merge every process's capture, say once why
any process kept Python-only paths, and summarise what the merge found."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from callpath.errors import CallpathError
from callpath.formats import measdir as md
from callpath.measure.elfinfo import ElfInfo
from callpath.measure.python import native_merge as merge
from callpath.structure.demangle import demangle


def finish_native(out: Path, top: int = 5, keep_interpreter: bool = False,
                  on_frames: merge.FramesHook | None = None) -> list[str]:
    """Merge the captures in ``out``; returns the summary's lines. Reasons for falling back to
    Python-only paths go to standard error at once, one line per distinct reason. The
    interpreter's frames between Python frames are elided unless ``keep_interpreter``
    (``merge.readable_path``). ``on_frames`` sees each process's unwound frames."""
    results: list[merge.ProcessMerge] = []
    for notes in sorted(out.glob("native-*.json")):
        try:
            results.append(merge.merge_process(out, notes, keep_interpreter, on_frames))
        except Exception as e:  # the program ran: its exit status and Python paths stay
            sys.stderr.write(f"callpath: warning: {notes.name}: native paths not merged "
                             f"({type(e).__name__}: {e}); that process keeps Python-only call "
                             "paths\n")
    for reason in sorted({r.fallback for r in results if r.fallback}):
        sys.stderr.write(f"callpath: warning: --native: {reason}; Python-only call paths for "
                         "those processes\n")
    results = [r for r in results if not r.fallback]
    for reason in merge.fallbacks(out):
        sys.stderr.write(f"callpath: warning: --native: {reason.removeprefix('python only: ')}"
                         "; Python-only call paths for those processes\n")
    if not results:
        return []
    n = sum(r.samples for r in results)
    part = sum(r.partial for r in results)
    unm = sum(r.unmatched for r in results)
    lost = sum(r.lost for r in results)
    threads = sum(r.threads for r in results)
    nat_only = sum(r.native_only_threads for r in results)

    def pct(k: int) -> str:
        return f"{100.0 * k / n:.1f}%" if n else "0%"

    lines = [f"  native: {n} samples merged in {len(results)} process(es), {threads} thread(s) "
             f"({nat_only} running native code only); partial {pct(part)}, unmatched "
             f"{pct(unm)}, lost {lost}"]
    cpu = sum(r.cpu_ns for r in results)
    hns, wns = sum(r.handler_ns for r in results), sum(r.writer_ns for r in results)
    if cpu and n:
        lines.append(f"  capture cost: {hns / n / 1e3:.1f} us a sample in the signal handler, "
                     f"writer thread {wns / 1e6:.0f} ms; {100.0 * (hns + wns) / cpu:.2f}% of "
                     "the program's CPU time")
    reasons: dict[str, int] = {}
    for r in results:
        for k, v in r.reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    if reasons:
        lines.append("  partial native paths: " + ", ".join(
            f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda x: -x[1])))
    hot = hottest_native(out, top)
    if hot:
        lines.append("  hottest native procedures by CPU time (innermost frame):")
        for name, module, secs in hot:
            lines.append(f"    {secs:9.3f} s  {name}  ({module})")
    return lines


def hottest_native(out: Path, top: int) -> list[tuple[str, str, float]]:
    """Procedures whose code was running at the samples (native leaves), by CPU time; none
    asked for (``callpath profile``, whose report follows) reads no symbol table."""
    if top <= 0:
        return []
    acc: dict[tuple[str, str], float] = {}
    for f in sorted(out.glob(md.PROCESS_GLOB)):
        try:
            proc = md.read_process(f)
        except (OSError, CallpathError):
            continue
        for t in proc.threads:
            nodes = t.nodes
            leaf = (nodes["kind"] == md.NodeKind.NATIVE) & (t.values[:, 0] > 0)
            for i in np.flatnonzero(leaf).tolist():
                mod = proc.modules[int(nodes["module"][i])]
                addr = int(nodes["address"][i])
                exact = int(nodes["flags"][i]) & int(md.NodeFlag.EXACT_PC)
                elf = ElfInfo.get(mod.path) if mod.path.startswith("/") and os.path.exists(
                    mod.path) else None
                sym = (elf.symbolize(addr if exact else addr - 1) if elf is not None and
                       elf.ok else None)
                name = demangle(sym) if sym else f"{os.path.basename(mod.path)}+{addr:#x}"
                key = (name, os.path.basename(mod.path))
                acc[key] = acc.get(key, 0.0) + float(t.values[i, 0]) * 1e-9
    ranked = sorted(((k[0], k[1], v) for k, v in acc.items()), key=lambda x: -x[2])
    return ranked[:top]
