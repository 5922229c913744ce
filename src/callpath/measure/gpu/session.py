"""``-e gpu=nvidia`` around a measured run: check, build and inject the CUPTI library before
the program starts; convert what it recorded after the program ends."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from callpath.errors import CallpathError
from callpath.formats import measdir_header as md
from callpath.measure.gpu import library

GPU_KINDS = ("nvidia",)


def split_events(events: list[str]) -> tuple[list[str], str | None]:
    """The sampling events and the GPU kind of ``-e`` options (``gpu=nvidia``, as hpcrun
    spells it); one line naming the problem for an unknown kind."""
    rest, kind = [], None
    for e in events:
        if e.startswith("gpu="):
            k = e[4:]
            if k not in GPU_KINDS:
                raise CallpathError(f"event {e!r}: unknown GPU kind {k!r} (expected "
                                    f"{', '.join('gpu=' + x for x in GPU_KINDS)})")
            kind = k
        else:
            rest.append(e)
    return rest, kind


def prepare(out: Path, native: bool = False) -> None:
    """Make this process's environment load the CUPTI library into every CUDA process it
    starts (CUDA_INJECTION64_PATH is read by the driver at cuInit), writing into ``out``;
    with ``native`` (``--native``), launches from Python record their native frames too, to
    be merged with the Python ones. Raises the one-line reason when this machine cannot
    measure NVIDIA GPUs."""
    reason = library.unavailable()
    if reason:
        raise CallpathError(f"-e gpu=nvidia: {reason}")
    cupti = library.find_cupti()
    assert cupti is not None
    lib = library.build(cupti)
    out.mkdir(parents=True, exist_ok=True)
    if os.environ.get("CUDA_INJECTION64_PATH") not in (None, "", str(lib)):
        raise CallpathError("-e gpu=nvidia: CUDA_INJECTION64_PATH is already set (to "
                            f"{os.environ['CUDA_INJECTION64_PATH']}): another tool injects "
                            "itself into CUDA; unset it to measure with callpath")
    os.environ["CUDA_INJECTION64_PATH"] = str(lib)
    os.environ["CALLPATH_GPU_DIR"] = str(out.resolve())
    os.environ["CALLPATH_GPU_NATIVE"] = "1" if native else "0"


def finish(out: Path, trace: bool, keep_interpreter: bool = False) -> list[str]:
    """Convert the raw GPU records of ``out`` into companion files and note them in the
    header; returns lines for the user: what was measured and what measuring it cost, then
    any problem (another CUPTI subscriber, nothing launched)."""
    from callpath.measure.gpu import convert, summary  # numpy: after the program only

    notes = convert.summary_notes(out)
    t0 = time.perf_counter()
    made = convert.convert_all(out, trace=trace, keep_interpreter=keep_interpreter)
    took = time.perf_counter() - t0
    held = summary.summarize(made)
    header_path = out / md.HEADER_FILE
    try:
        header = json.loads(header_path.read_text())
    except (OSError, ValueError):
        header = None
    if isinstance(header, dict):
        header["gpu"] = {"kind": "nvidia", "trace": trace, "files": [p.name for p in made],
                         "summary": held, "convert_s": round(took, 3)}
        tmp = out / f".{md.HEADER_FILE}.{os.getpid()}.gpu.tmp"
        tmp.write_text(json.dumps(header, indent=1) + "\n")
        os.replace(tmp, header_path)
    if not made:
        notes.append("-e gpu=nvidia: no process of the program launched GPU work (or CUDA "
                     "was never initialised)")
        return notes
    return summary.lines(held, took) + notes
