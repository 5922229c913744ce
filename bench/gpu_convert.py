"""Benchmark: what ``callpath run -e gpu=nvidia`` writes per launch and how long it then works
on the launches after the program ends (the conversion of the CUPTI library's raw file into a
companion file), as a training loop's launch count grows. Needs CUPTI's headers and library
(nvidia-cuda-cupti or a CUDA toolkit), not a GPU.

The launches are the library's own, CUPTI's side made up (``callpath_cupti_fake_launches``,
as in ``gpu_launch_cost.py``): each a runtime call with its driver call and its kernel's
activity record, under ``--depth`` Python frames, in three configurations:

* ``python``: launches from Python (PyTorch's forward pass);
* ``python+native``: the same with ``--native``: ~``--native-depth`` C frames too;
* ``native thread``: a thread without Python (PyTorch's autograd engine).

For each launch count (``--launches``, several allowed): the raw file's size per launch and
the conversion's wall time (``convert.convert``: reading, attributing, writing), medians of
``--repeat``. ``--before SRC`` runs the same with another source tree's library and
conversion (``git archive REV | tar -x -C SRC``), in the same run, for the comparison.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One measurement, run in a fresh interpreter with the tree's src/ first on sys.path.
_ONE = r"""
import ctypes, json, os, sys, time
from pathlib import Path
tree, out, n, mode, depth, ndepth = (Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]),
                                     sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
sys.path.insert(0, str(tree / "src"))
from callpath.measure.gpu import convert, library
lib = ctypes.CDLL(str(library.build(library.find_cupti(), out.parent / "cache")))
os.environ["CALLPATH_GPU_NATIVE"] = "1" if mode == "python+native" else "0"
raw = out / "gpu-77.raw"
def nest(k):
    if k:
        return nest(k - 1)
    return lib.callpath_cupti_fake_launches(str(raw).encode(), n,
                                            0 if mode == "python" else ndepth,
                                            int(mode == "native thread"))
assert nest(depth) == 0
size = raw.stat().st_size
t0 = time.perf_counter()
convert.convert(raw, out, trace=True, generation=0)
print(json.dumps({"bytes_per_launch": size / n, "convert_s": time.perf_counter() - t0}))
"""


def one(tree: Path, tmp: Path, n: int, mode: str, depth: int, ndepth: int) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    res = subprocess.run([sys.executable, "-c", _ONE, str(tree), str(out), str(n), mode,
                          str(depth), str(ndepth)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{tree}: {mode} {n}: {res.stderr[-2000:]}")
    got: dict[str, float] = json.loads(res.stdout.splitlines()[-1])
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, nargs="+", default=[20000, 200000])
    ap.add_argument("--depth", type=int, default=40, help="more Python frames (default 40)")
    ap.add_argument("--native-depth", type=int, default=100,
                    help="more C frames for the native paths (default 100)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", metavar="SRC", type=Path,
                    help="another source tree, measured the same way in the same run")
    args = ap.parse_args()
    trees = {"callpath": ROOT}
    if args.before:
        trees["before"] = args.before.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="callpath-convert-bench-"))
    modes = ("python", "python+native", "native thread")
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for _ in range(args.repeat):
        for n in args.launches:
            for mode in modes:
                for name, tree in trees.items():
                    runs.setdefault((name, mode, n), []).append(
                        one(tree, tmp, n, mode, args.depth, args.native_depth))
    out: dict[str, object] = {"python_depth": args.depth, "native_depth": args.native_depth,
                              "repeat": args.repeat}
    table: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for (name, mode, n), got in runs.items():
        entry = {k: round(statistics.median(r[k] for r in got), 4) for k in got[0]}
        entry["us_per_launch"] = round(entry["convert_s"] / n * 1e6, 2)
        table.setdefault(name, {}).setdefault(mode, {})[str(n)] = entry
    out.update(table)
    print(json.dumps(out, indent=1))
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
