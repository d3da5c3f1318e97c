"""/metrics under attack: scrapes while clients drip request bodies, and the program's CPU under a flood of
requests that the front process cannot answer from its copy.

The program is a child process (``python -I``) that imports torch, serves /metrics on a free port (by
its front process, the default, or ``in_process=True``) and otherwise sleeps, so that every CPU second
it spends is the server's. The attackers and the scraper run in this process.

- ``drip``: ``--drippers`` connections each send a request head with ``Content-Length: 60000`` and then
  one byte of body every 0.2 s (reconnecting when cut), while one scraper scrapes 10 times a second.
  Reported: scrapes answered of those sent, and the scrape latency p50 / p99 / max. Goal: every scrape
  answered, p99 <= 100 ms.
- ``flood``: ``--flooders`` client threads send, back to back, requests that go to the program: queries
  of some series (``GET /metrics?name[]=...``), and, with ``--with-captures``, capture requests as well.
  Reported: the program's CPU time (``utime + stime`` of its own threads, from ``/proc/PID/stat``; the
  front process is another process) over the window's wall time, from the flood's second second on (the
  first has the burst of 0.05 s the limit allows at once), against ``Limits.cpu_share`` (0.1).
  Also: a flood of queries that do not change the body (``/metrics?x=N``), answered from the copy.

Each repetition runs every scenario in both modes, in a rotating order; the figures are the median and
the range over repetitions.

Run::

    python benchmarks/metrics_hostile.py --repeats 3 --seconds 6 --markdown benchmarks/RESULTS-metrics-hostile.md
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import sys, time
sys.path.insert(0, sys.argv[1])
import torch  # a program that takes steps has imported torch: a capture's first import is not the server's cost
import gpuprobe
server = gpuprobe.serve(port=0, in_process=sys.argv[2] == "in_process")
print(server.port, flush=True)
sys.stdin.readline()
server.close()
"""


def start_program(mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    proc = subprocess.Popen([sys.executable, "-I", "-c", PROGRAM, str(ROOT), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, port


def stop_program(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: its own threads


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def drip(port: int, drippers: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()

    def dripper() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"POST /gpuprobe/profile HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Gpuprobe-Capture: 1\r\n"
                              b"Content-Length: 60000\r\n\r\n")
                    while not stop.is_set():
                        s.sendall(b"x")
                        time.sleep(0.2)
            except OSError:
                time.sleep(0.05)  # cut by the server: connect again

    threads = [threading.Thread(target=dripper, daemon=True) for _ in range(drippers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the drippers are in
    latencies: list[float] = []
    statuses: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        statuses.append(request(port, "GET", "/metrics"))
        latencies.append(time.perf_counter() - t0)
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
    stop.set()
    for t in threads:
        t.join(5)
    latencies.sort()
    return {"sent": len(statuses), "answered": statuses.count(200), "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "max_ms": 1e3 * latencies[-1]}


def flood(port: int, pid: int, flooders: int, seconds: float, path: str, captures: bool) -> dict[str, Any]:
    stop = threading.Event()
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def flooder(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            if captures and i % 2:
                status = request(port, "POST", "/gpuprobe/profile?steps=1", {"X-Gpuprobe-Capture": "1"})
            else:
                status = request(port, "GET", path.format(n=n))
            with lock:
                counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=flooder, args=(i,), daemon=True) for i in range(flooders)]
    time.sleep(0.5)
    for t in threads:
        t.start()
    time.sleep(1.0)  # the share over time: read once the burst the limit allows at first (0.05 s) is spent
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, wall1 = cpu_seconds(pid), time.monotonic()
    stop.set()
    for t in threads:
        t.join(10)
    return {"share": (cpu1 - cpu0) / (wall1 - wall0), "requests": sum(counts.values()), "statuses": dict(counts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--drippers", type=int, default=2)
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()

    scenarios = [("drip", dict(drippers=args.drippers)), ("drip", dict(drippers=50)),
                 ("flood", dict(path="/metrics?name[]=gpuprobe_build_info&n={n}", captures=False)),
                 ("flood", dict(path="/metrics?name[]=gpuprobe_build_info&n={n}", captures=True)),
                 ("flood", dict(path="/metrics?x={n}", captures=False))]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        order = [(i, m) for i in range(len(scenarios)) for m in ("front", "in_process")]
        shift = rep % len(order)
        for i, mode in order[shift:] + order[:shift]:
            kind, opts = scenarios[i]
            proc, port = start_program(mode)
            try:
                if kind == "drip":
                    out = drip(port, opts["drippers"], args.seconds)
                else:
                    out = flood(port, proc.pid, args.flooders, args.seconds, opts["path"], opts["captures"])
            finally:
                stop_program(proc)
            results.setdefault((i, mode), []).append(out)
            print(kind, opts, mode, out, flush=True)

    def spread(values: list[float], fmt: str) -> str:
        return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    lines = [f"# /metrics under attack ({args.repeats} repetitions of {args.seconds:g} s, "
             f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]})", "",
             "Made by `python benchmarks/metrics_hostile.py`; median (range) over repetitions.", "",
             "| scenario | mode | scrapes answered / sent | p50 ms | p99 ms (goal <= 100) | max ms |", "|---|---|---|---|---|---|"]
    for (i, mode), runs in sorted(results.items()):
        kind, opts = scenarios[i]
        if kind != "drip":
            continue
        lines.append(f"| {opts['drippers']} clients dripping a body | {mode} | "
                     f"{sum(r['answered'] for r in runs)} / {sum(r['sent'] for r in runs)} | "
                     f"{spread([r['p50_ms'] for r in runs], '.1f')} | {spread([r['p99_ms'] for r in runs], '.1f')} | "
                     f"{spread([r['max_ms'] for r in runs], '.1f')} |")
    lines += ["", "| flood | mode | program's CPU share (goal <= 0.1) | requests | answers |", "|---|---|---|---|---|"]
    for (i, mode), runs in sorted(results.items()):
        kind, opts = scenarios[i]
        if kind != "flood":
            continue
        statuses: dict[int, int] = {}
        for r in runs:
            for k, v in r["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        what = ("`name[]` queries and captures" if opts["captures"] else
                "`name[]` queries" if "name[]" in opts["path"] else "queries that do not change the body")
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
        lines.append(f"| {args.flooders} clients, {what} | {mode} | {spread([r['share'] for r in runs], '.3f')} | "
                     f"{sum(r['requests'] for r in runs)} | {shown} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
