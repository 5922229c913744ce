"""Checks of a GPU measurement's database, run on the GPU machine (device_check.sh) and by
the GPU-only tests: where the kernels sit, and the GKER total against a reference sum.

``python check_gpu_db.py cuda DB`` / ``python check_gpu_db.py torch DB MEASDIR REF.json``
prints one JSON object of findings (and exits 1 when a check fails).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import callpath
from callpath.formats import measdir_gpu as mdg


def names_up(exp: Any, n: int) -> list[str]:
    """Function names from the root down to node ``n`` (procedure scopes only)."""
    out = []
    cct = exp.cct
    while n > 0:
        f = int(cct.function[n])
        if f >= 0 and int(cct.kind[n]) == 0:
            out.append(exp.functions[f].name)
        n = int(cct.parent[n])
    return out[::-1]


def kernels(exp: Any) -> list[tuple[int, str, float, list[str]]]:
    ex = exp.exclusive(exp.metric("GKER (sec)"))
    return [(int(n), exp.functions[int(exp.cct.function[n])].name, float(ex[n]),
             names_up(exp, int(n))) for n in np.flatnonzero(ex)]


def check_cuda(db: Path) -> dict[str, Any]:
    exp = callpath.open(db)
    out: dict[str, Any] = {"ok": True}
    placed = {}
    for _, name, _t, path in kernels(exp):
        short = name.split("(")[0]
        # each kernel's launch stub (launch_scale/launch_axpy may be tail calls, gone from
        # the stack): scale only under scale's stub, axpy only under axpy's
        placed.setdefault(short, set()).update(p.split("(")[0] for p in path
                                               if p.startswith("__device_stub__"))
        out.setdefault("kernel_paths", {})[short] = " > ".join(path[-8:])
    out["placed"] = {k: sorted(v) for k, v in placed.items()}
    out["ok"] &= placed.get("scale") == {"__device_stub__Z5scalePffi"} and \
        placed.get("axpy") == {"__device_stub__Z4axpyPfPKffi"}
    root = {m: float(exp.inclusive(exp.metric(m))[0]) for m in (
        "GKER (sec)", "GKER:COUNT", "GXCOPY:H2D (B)", "GXCOPY:D2H (B)", "GMSET (sec)",
        "GSYNC (sec)", "GPUOP (sec)")}
    out["totals"] = root
    n = 1 << 22
    out["ok"] &= root["GKER:COUNT"] == 40 and root["GXCOPY:H2D (B)"] == 20 * 4 * n \
        and root["GXCOPY:D2H (B)"] == 20 * 4 * n
    out["streams"] = [c.label(exp.id_names) for c in exp.contexts
                      if any(i.kind == 6 for i in c.ids)]
    out["ok"] &= len(out["streams"]) >= 2
    return out


def check_torch(db: Path, meas: Path, ref: Path) -> dict[str, Any]:
    exp = callpath.open(db)
    out: dict[str, Any] = {}
    gker = float(exp.inclusive(exp.metric("GKER (sec)"))[0])
    count = float(exp.inclusive(exp.metric("GKER:COUNT"))[0])
    recorded = 0.0
    for f in sorted(meas.glob(mdg.GPU_GLOB)):
        g = mdg.read(f)
        for ops in g.ops.values():
            k = ops[ops["kind"] == 1]
            d = k["end"].astype(np.int64) - k["start"].astype(np.int64)
            recorded += float(d.sum()) * 1e-9
    r = json.loads(ref.read_text())
    out.update(gker_s=gker, kernels=count, cupti_same_run_s=recorded,
               torch_profiler_s=r["kernel_s"], torch_profiler_kernels=r["kernels"],
               ratio_vs_torch_profiler=gker / r["kernel_s"] if r["kernel_s"] else None)
    fwd, bwd, other = [], [], []
    for _, name, t, path in kernels(exp):
        if not any(w in name.lower() for w in ("gemm", "xmma", "cutlass")):
            continue
        if "Linear.forward" in path:
            fwd.append((name, t, path))
        elif any("Backward" in p for p in path):
            bwd.append((name, t, path))
        else:
            other.append((name, t, path))
    for key, group, depth in (("gemm_forward", fwd, 6), ("gemm_backward", bwd, 10),
                              ("gemm_elsewhere", other, 12)):
        out[key] = [{"kernel": n[:80], "s": t, "path": " > ".join(p[-depth:])}
                    for n, t, p in group[:6]]
    out["gemm_counts"] = [len(fwd), len(bwd), len(other)]
    out["ok"] = bool(fwd) and abs(gker - recorded) <= 1e-9 * max(gker, 1.0) + 1e-12 and (
        r["kernel_s"] > 0 and abs(gker / r["kernel_s"] - 1) <= 0.02)
    return out


def main() -> None:
    what = sys.argv[1]
    res = check_cuda(Path(sys.argv[2])) if what == "cuda" else \
        check_torch(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    print(json.dumps(res, indent=1, default=str))
    sys.exit(0 if res.get("ok") else 1)


if __name__ == "__main__":
    main()
