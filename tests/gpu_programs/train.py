"""A small PyTorch training loop for GPU measurement checks (callpath run -e gpu=nvidia).

``--torch-profiler FILE`` runs the same loop under torch.profiler and writes the sum and the
number of the CUDA kernels it recorded (the reference for the database's GKER total);
every run prints the wall time of its steps as ``steps_s=...`` for bench/gpu_overhead.py, and
the wall-clock time at which the program started (before ``import torch``) as
``start_time=...`` and at which its loop ended as ``loop_end_time=...``.
"""

import time

START_TIME = time.time()

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--torch-profiler", metavar="FILE")
    ap.add_argument("--device", default="cuda", help="cpu: the loop without a GPU")
    dev = (args := ap.parse_args()).device  # (lines kept where tests/gpu_data recorded them)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024)
    y = torch.randint(0, 10, (512,))

    def step() -> float:
        xb, yb = x.to(dev), y.to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return float(loss.detach().cpu())

    prof = None
    if args.torch_profiler:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else []))
        prof.__enter__()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize() if dev == "cuda" else None
    steps_s = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        trace = args.torch_profiler + ".trace.json"
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        with open(args.torch_profiler, "w") as f:
            json.dump({"kernel_s": sum(float(e["dur"]) for e in kernels) * 1e-6,
                       "kernels": len(kernels)}, f)
    print(f"steps_s={steps_s:.4f}", flush=True)
    print(f"start_time={START_TIME:.4f}\nloop_end_time={time.time():.4f}", flush=True)


if __name__ == "__main__":
    main()
