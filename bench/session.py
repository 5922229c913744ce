"""Benchmark: one shared viewer session with N participants (headless WebSocket clients) on
loopback, the leader changing its view state R times a second for D seconds.

Measures, per change, the latency from the leader's send to the arrival at EVERY follower
(median and p99 over all (change, follower) pairs), and the server process's CPU time and
memory (peak RSS) over the run. The server is a real ``callpath view DB --share`` in its own
process (so its CPU and memory are its own); the clients share one asyncio process, so
their own scheduling is included in the latencies (a pessimistic figure).

Peer measured in the same run: a bare relay (the ``websockets`` package's server, no
callpath code: each message is parsed as JSON and re-sent to every other client), with the
same clients and load. The ratio callpath / bare shows what the hub's rules (validation,
latest-wins outboxes, per-participant state) cost above the floor of Python + WebSockets.

    python bench/session.py                 # 50 participants, 10 changes/s, 30 s
    python bench/session.py --duration 5    # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT.parent / "shared" / "data" / "hpctoolkit" / "dbase" / "small.d"
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_mem(pid: int) -> tuple[float, float]:
    """(RSS, peak RSS) in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    return rss / 1024, hwm / 1024


# ---- the bare relay (the peer) -----------------------------------------------------------


async def bare_relay(port: int) -> None:
    from websockets.asyncio.server import serve

    clients: set[Any] = set()

    async def handler(ws: Any) -> None:
        clients.add(ws)
        try:
            async for text in ws:
                msg = json.loads(text)
                out = json.dumps(msg)
                for c in list(clients):
                    if c is not ws:
                        try:
                            await c.send(out)
                        except Exception:
                            clients.discard(c)
        finally:
            clients.discard(ws)

    async with serve(handler, "127.0.0.1", port, max_size=1 << 16):
        print("ready", flush=True)
        await asyncio.Future()


# ---- the clients -------------------------------------------------------------------------


async def run_clients(url: str, n: int, rate: float, duration: float, hub: bool
                      ) -> list[float]:
    from websockets.asyncio.client import connect

    latencies: list[float] = []
    sent: dict[int, int] = {}
    done = asyncio.Event()

    async def follower(i: int, ready: asyncio.Event) -> None:
        async with connect(url, max_size=1 << 20) as ws:
            if hub:
                await ws.send(json.dumps({"t": "hello", "name": f"f{i}"}))
            ready.set()
            while not done.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), 1.0)
                except TimeoutError:
                    continue
                now = time.perf_counter_ns()
                msg = json.loads(text)
                if msg.get("t") == "set" and isinstance(msg.get("value"), dict):
                    seq = msg["value"].get("i")
                    if seq in sent:
                        latencies.append((now - sent[seq]) / 1e6)

    async with connect(url) as leader:
        if hub:
            await leader.send(json.dumps({"t": "hello", "name": "leader"}))
        readies = [asyncio.Event() for _ in range(n - 1)]
        tasks = [asyncio.create_task(follower(i, r)) for i, r in enumerate(readies)]
        await asyncio.gather(*(r.wait() for r in readies))
        await asyncio.sleep(1.0)  # every welcome delivered
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < duration:
            i += 1
            value = {"i": i, "exp": [f"t{k}" for k in range(i % 20)], "sel": f"t{i}"}
            sent[i] = time.perf_counter_ns()
            await leader.send(json.dumps({"t": "set", "path": "s.dbs.0.views.top-down",
                                          "value": value}))
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        await asyncio.sleep(1.0)  # the last messages arrive
        done.set()
        await asyncio.gather(*tasks)
    expected = i * (n - 1)
    if len(latencies) != expected:
        print(f"  note: {len(latencies)} of {expected} (change, follower) arrivals "
              "(latest-wins coalescing drops superseded changes for a follower that lags)")
    return latencies


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def measure(name: str, cmd: list[str], url_of: Any, args: argparse.Namespace, hub: bool
            ) -> dict[str, float]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            url = url_of(line)
            if url:
                break
        if url is None:
            raise SystemExit(f"{name}: the server did not start: {proc.stderr.read()[:400]}")
        time.sleep(0.3)
        cpu0 = proc_cpu(proc.pid)
        t0 = time.perf_counter()
        lat = asyncio.run(run_clients(url, args.participants, args.rate, args.duration, hub))
        wall = time.perf_counter() - t0
        cpu = proc_cpu(proc.pid) - cpu0
        rss, hwm = proc_mem(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    return {"median": statistics.median(lat), "p99": pct(lat, 99), "max": max(lat),
            "n": len(lat), "cpu": cpu, "cpu_share": cpu / wall, "rss": rss, "hwm": hwm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--participants", type=int, default=50)
    ap.add_argument("--rate", type=float, default=10.0, help="leader's changes per second")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of changes")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--db", default=str(DB))
    ap.add_argument("--bare-relay", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_relay is not None:
        asyncio.run(bare_relay(args.bare_relay))
        return
    print(f"{args.participants} participants, {args.rate:g} changes/s for {args.duration:g} s "
          f"(machine: {os.cpu_count()} CPUs, possibly shared)")
    ws_port = args.port

    def hub_url(line: str) -> str | None:
        m = re.search(r"shared session: http://([^/]+)/\?session=([\w-]+)", line)
        return f"ws://{m.group(1)}/api/share/ws?session={m.group(2)}" if m else None

    hub = measure("callpath", [sys.executable, "-m", "callpath", "view", args.db,
                               "--no-browser", "--share", "--port", str(ws_port)],
                  hub_url, args, True)
    bare = measure("bare relay", [sys.executable, __file__, "--bare-relay", str(ws_port + 1)],
                   lambda line: f"ws://127.0.0.1:{ws_port + 1}/" if "ready" in line else None,
                   args, False)
    print(f"{'':12} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'arrivals':>9} "
          f"{'CPU s':>7} {'CPU %':>6} {'RSS MiB':>8} {'peak MiB':>9}")
    for name, r in (("callpath", hub), ("bare relay", bare)):
        print(f"{name:12} {r['median']:10.2f} {r['p99']:8.2f} {r['max']:8.2f} {r['n']:9d} "
              f"{r['cpu']:7.2f} {100 * r['cpu_share']:6.1f} {r['rss']:8.1f} {r['hwm']:9.1f}")
    print(f"ratios callpath / bare: median {hub['median'] / bare['median']:.2f}, "
          f"p99 {hub['p99'] / bare['p99']:.2f}, CPU {hub['cpu'] / max(bare['cpu'], 1e-9):.2f}")
    print(f"target p99 < 100 ms: {'met' if hub['p99'] < 100 else 'NOT met'} "
          f"({hub['p99']:.1f} ms)")


if __name__ == "__main__":
    main()
