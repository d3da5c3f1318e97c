"""/metrics under load: scrape latency, errors, server threads, and what scrapes cost the program.

The program: a tiny Llama built from a config (no download), instrumented by gpuprobe's transformers
integration, calls ``generate()`` (8 new tokens, greedy) in a loop on its main thread with one torch
thread, while ``serve()`` serves /metrics on a free port with its default limits (answered by its front
process; ``--in-process``: by the program's own threads, for comparison). The
scrapers run in another process (this script with ``--scraper``): real HTTP clients (``http.client``),
a new connection per scrape, sending what Prometheus sends (its ``Accept`` header, ``gzip``):

- ``none``: no scraper (the baseline);
- ``paced``: 50 clients each scraping once a second (50 scrapes/s), their phases spread over the second;
- ``back-to-back``: one client scraping again as soon as it is answered;
- ``flood``: 50 clients back to back, plus 600 connections that each send half a request head and then
  nothing (reopened as soon as the server cuts one).

Where the machine has three CPUs or more, the scrapers run on the last one and the program on the
others (``--no-pin`` leaves both to the scheduler), so that the clients' own work does not count as
what the server costs. (On two CPUs nothing is pinned: a program confined to one core with its server's
threads pays a context switch for every hand-over of the interpreter lock, which no real deployment
with cores to spare does.)

Each repetition runs every scenario for ``--seconds`` in a rotating order (so slow drifts of a shared
machine hit every scenario alike), each once the connections the one before left in the listen queue
are gone (a flood leaves hundreds, taken at ``Limits.rate`` a second); a scenario's throughput ratio is its ``generate()`` calls per second
over the baseline's in the same repetition. Reported per scenario: scrapes/s answered; latency p50,
p99 and max over every scrape of every repetition; errors (no HTTP answer) and 503s; the server's
threads (most seen); the CPU time of the server's threads per answered request (from
``/proc/self/task/*/schedstat``, and its user-mode part from ``stat``); renderings of the body per
second; the share of the window the generating thread and the server's threads were on a CPU; the
throughput ratio (median, and the range over repetitions); and the program's time a scrape takes,
``(1 - ratio) / requests answered a second``.

Goals: paced: p99 <= 100 ms and a ratio >= 0.97; a scrape costs the program <= 0.5 ms; flood: a
ratio >= 0.8.

Run::

    python benchmarks/metrics_load.py --markdown benchmarks/RESULTS-metrics.md   # full run (~6 minutes)
    python benchmarks/metrics_load.py --quick                                   # a smoke run (~1 minute)

Take the figures on a quiet machine: on a shared one, other processes' CPU use moves the ratios by
several percent from one window to the next.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS = ("none", "paced", "back-to-back", "flood")
# What Prometheus 3 sends (scrape_protocols' default order) and asks for: OpenMetrics first, gzip.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,"
                     "text/plain;version=1.0.0;escaping=underscores;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "Prometheus/3.0 (metrics_load)"}
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the head's closing blank line never comes
SCRAPE_TIMEOUT = 30.0


# -- the scrapers (another process) ------------------------------------------------------------------

class Tally:
    """What the clients of one scraper process saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []  # seconds, answered scrapes (any status)
        self.ok = 0
        self.refused = 0  # 503
        self.other_status = 0
        self.errors: dict[str, int] = {}  # no HTTP answer, by exception type
        self.cut = 0  # half-sent connections the server closed

    def scrape(self, host: str, port: int) -> None:
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=SCRAPE_TIMEOUT)
            try:
                conn.request("GET", "/metrics", headers=HEADERS)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            finally:
                conn.close()
        except Exception as exc:  # counted, never raised: a benchmark of a server under load
            with self.lock:
                self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
            return
        elapsed = time.perf_counter() - t0
        with self.lock:
            self.latencies.append(elapsed)
            if status == 200:
                self.ok += 1
            elif status == 503:
                self.refused += 1
            else:
                self.other_status += 1


def paced_client(tally: Tally, host: str, port: int, phase: float, stop: threading.Event) -> None:
    """One scrape a second, at ``phase`` seconds into each second (as a Prometheus target's offset)."""
    due = time.monotonic() + phase
    while not stop.is_set():
        wait = due - time.monotonic()
        if wait > 0 and stop.wait(wait):
            return
        tally.scrape(host, port)
        due += 1.0
        due = max(due, time.monotonic())  # a scrape longer than the interval: the next one at once


def eager_client(tally: Tally, host: str, port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        tally.scrape(host, port)


def half_sent_holder(tally: Tally, host: str, port: int, count: int, stop: threading.Event) -> None:
    """Keep ``count`` connections open with half a request head sent; reopen each one the server cuts."""
    sel = selectors.DefaultSelector()

    def open_one() -> None:
        try:
            s = socket.create_connection((host, port), timeout=SCRAPE_TIMEOUT)
            s.sendall(HALF_REQUEST)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        except OSError as exc:
            with tally.lock:
                name = "half-sent " + type(exc).__name__
                tally.errors[name] = tally.errors.get(name, 0) + 1

    for _ in range(count):
        if stop.is_set():
            break
        open_one()
    while not stop.is_set():
        for key, _ in sel.select(0.2):
            s = key.fileobj
            try:
                data = s.recv(4096)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data or data.startswith(b"HTTP/"):
                sel.unregister(s)
                s.close()  # type: ignore[union-attr]
                with tally.lock:
                    tally.cut += 1
                if not stop.is_set():
                    open_one()
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def scraper_main(scenario: str, host: str, port: int, clients: int, half_open: int, cpus: list[int]) -> None:
    """Run ``scenario``'s clients until standard input closes, then print what they saw as JSON."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    tally, stop = Tally(), threading.Event()
    threads: list[threading.Thread] = []
    if scenario == "paced":
        threads += [threading.Thread(target=paced_client, args=(tally, host, port, i / clients, stop), daemon=True)
                    for i in range(clients)]
    elif scenario == "back-to-back":
        threads.append(threading.Thread(target=eager_client, args=(tally, host, port, stop), daemon=True))
    elif scenario == "flood":
        threads.append(threading.Thread(target=half_sent_holder, args=(tally, host, port, half_open, stop),
                                        daemon=True))
        threads += [threading.Thread(target=eager_client, args=(tally, host, port, stop), daemon=True)
                    for _ in range(clients)]
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the program's window starts: count from here
    with tally.lock:
        tally.latencies, tally.ok, tally.refused, tally.other_status, tally.errors, tally.cut = [], 0, 0, 0, {}, 0
    sys.stdin.read()  # until the program closes it
    t0 = time.monotonic()
    with tally.lock:  # what was seen in the window; scrapes still under way are left out
        result = {"latencies": list(tally.latencies), "ok": tally.ok, "refused": tally.refused,
                  "other_status": tally.other_status, "errors": dict(tally.errors), "cut": tally.cut}
    stop.set()
    for t in threads:
        t.join(max(0.0, 5.0 - (time.monotonic() - t0)))
    print(json.dumps(result), flush=True)


# -- the program --------------------------------------------------------------------------------------

def build_model() -> tuple[Any, Any]:
    """A tiny Llama with random weights, instrumented, and a prompt."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gpuprobe.integrations.transformers import instrument

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    instrument(model, model_name="bench")
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, ids


def generate(model: Any, ids: Any) -> None:
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)


def server_cpu() -> tuple[float, float]:
    """CPU seconds of the server's threads so far (Linux): in all (``schedstat``, nanoseconds), and in
    user mode (``stat``, clock ticks): the interpreter's share; the rest is the kernel's TCP work."""
    total, user = 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for t in threading.enumerate():
        if t.name.startswith("gpuprobe-metrics") and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
                with open(f"/proc/self/task/{t.native_id}/stat") as f:
                    user += int(f.read().rsplit(")", 1)[1].split()[11]) / tick
            except (OSError, ValueError, IndexError):
                pass
    return total, user


def front_cpu(server: Any) -> float:
    """CPU seconds of the front process so far, all its threads (Linux; 0 without a front)."""
    pid = server.front_pid
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def measure(model: Any, ids: Any, server: Any, seconds: float) -> dict[str, Any]:
    """generate() in a loop for ``seconds``: calls/s, the server's threads (most seen), its CPU and counts."""
    before, cpu0, front0 = server.stats(), server_cpu(), front_cpu(server)
    calls, most_threads, next_look = 0, 0, 0.0
    t0, main0 = time.perf_counter(), time.thread_time()
    end = t0 + seconds
    while (now := time.perf_counter()) < end:
        generate(model, ids)
        calls += 1
        if now >= next_look:
            most_threads = max(most_threads, server.stats()["threads"])
            next_look = now + 0.2
    elapsed, main_cpu = time.perf_counter() - t0, time.thread_time() - main0
    after, cpu1, front1 = server.stats(), server_cpu(), front_cpu(server)
    most_threads = max(most_threads, after["threads"])
    diff = {k: after[k] - before[k] for k in after if k != "threads"}
    return {"calls_per_s": calls / elapsed, "elapsed": elapsed, "threads": most_threads, "main_cpu_s": main_cpu,
            "server_cpu_s": cpu1[0] - cpu0[0], "server_user_s": cpu1[1] - cpu0[1], "front_cpu_s": front1 - front0,
            **diff}


def settle(server: Any) -> None:
    """Wait until connections a scenario left in the listen queue are gone (the server takes them at
    ``Limits.rate`` a second): one scrape, answered after them."""
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=120)
    try:
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    finally:
        conn.close()


def run_scenario(scenario: str, model: Any, ids: Any, server: Any, seconds: float, clients: int,
                 half_open: int, cpus: list[int]) -> dict[str, Any]:
    if scenario == "none":
        return {**measure(model, ids, server, seconds), "scrapes": None}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--scraper", scenario, "--host", server.addr, "--port", str(server.port),
         "--clients", str(clients), "--half-open", str(half_open), "--cpus", ",".join(map(str, cpus))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the {scenario} scraper did not start: {line!r}")
        time.sleep(0.5)  # the clients reach their steady pace
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = measure(model, ids, server, seconds)
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {**result, "scrapes": json.loads(out)}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) by the nearest-rank method (a p99 of 100 values is the 99th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(runs: dict[str, list[dict[str, Any]]], base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for scenario in SCENARIOS:
        rs = runs[scenario]
        ratios = [r["calls_per_s"] / b["calls_per_s"] for r, b in zip(rs, base)]
        row: dict[str, Any] = {"scenario": scenario, "calls_per_s": statistics.median(r["calls_per_s"] for r in rs),
                               "ratios": ratios, "threads": max(r["threads"] for r in rs),
                               "main_share": sum(r["main_cpu_s"] for r in rs) / sum(r["elapsed"] for r in rs),
                               "server_share": sum(r["server_cpu_s"] for r in rs) / sum(r["elapsed"] for r in rs),
                               "renders_per_s": sum(r["renders"] for r in rs) / sum(r["elapsed"] for r in rs)}
        if scenario != "none":
            lat = [x for r in rs for x in r["scrapes"]["latencies"]]
            answered = sum(r["answered"] for r in rs)
            errors: dict[str, int] = {}
            for r in rs:
                for k, v in r["scrapes"]["errors"].items():
                    errors[k] = errors.get(k, 0) + v
            row.update({
                "scrapes_per_s": sum(r["scrapes"]["ok"] for r in rs) / sum(r["elapsed"] for r in rs),
                # The program's time a scrape takes: the share of throughput lost over the scrapes a second.
                "cost_ms": 1e3 * (1 - statistics.median(ratios)) / max(
                    sum(r["answered"] for r in rs) / sum(r["elapsed"] for r in rs), 1e-9),
                "p50": percentile(lat, 0.5) if lat else float("nan"), "p99": percentile(lat, 0.99) if lat else float("nan"),
                "max": max(lat) if lat else float("nan"), "errors": errors,
                "refused": sum(r["scrapes"]["refused"] for r in rs), "other": sum(r["scrapes"]["other_status"] for r in rs),
                "cpu_per_scrape_ms": 1e3 * sum(r["server_cpu_s"] for r in rs) / max(answered, 1),
                "user_per_scrape_ms": 1e3 * sum(r["server_user_s"] for r in rs) / max(answered, 1),
                "front_per_scrape_ms": 1e3 * sum(r["front_cpu_s"] for r in rs) / max(answered, 1),
                # The program's time a scrape takes by its own CPU accounting, per repetition: what the
                # generating thread lost on CPU against the baseline, plus what the program's server threads
                # used beyond it, over the requests answered (the machine's other processes do not enter).
                "cpu_cost_ms": [1e3 * ((b["main_cpu_s"] / b["elapsed"] - r["main_cpu_s"] / r["elapsed"])
                                       + (r["server_cpu_s"] / r["elapsed"] - b["server_cpu_s"] / b["elapsed"]))
                                / max(r["answered"] / r["elapsed"], 1e-9) for r, b in zip(rs, base)],
                "cut": sum(r["scrapes"]["cut"] for r in rs), "timed_out": sum(r["timed_out"] for r in rs),
                "evicted": sum(r["evicted"] for r in rs)})
        rows.append(row)
    return rows


GOALS = {"paced": "p99 ≤ 100 ms, ratio ≥ 0.97, ≤ 0.5 ms a scrape", "back-to-back": "≤ 0.5 ms a scrape",
         "flood": "ratio ≥ 0.8"}


def verdict(row: dict[str, Any]) -> str:
    s = row["scenario"]
    if s == "none":
        return ""
    median = statistics.median(row["ratios"])
    checks = [row["cost_ms"] <= 0.5]
    if s == "paced":
        checks += [row["p99"] * 1e3 <= 100, median >= 0.97]
    if s == "flood":
        checks = [median >= 0.8]
    return "met" if all(checks) else "**not met**"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| scenario | scrapes/s answered | latency p50 / p99 / max (ms) | errors | 503 | server threads (most) "
            "| program's server CPU per scrape, ms: all (user) | front process CPU per scrape, ms | renders/s | on CPU: generating thread, server threads "
            "| generate() calls/s | throughput ratio: median (range) | program time per scrape (ms) "
            "| program time per scrape by CPU accounting (ms): median (range) | goal | |")
    lines = [head, "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|---|---|"]
    for row in rows:
        ratios = row["ratios"]
        ratio = ("1 (reference)" if row["scenario"] == "none" else
                 f"**{statistics.median(ratios):.3f}** ({min(ratios):.3f} – {max(ratios):.3f})")
        if row["scenario"] == "none":
            lines.append(f"| none | – | – | – | – | {row['threads']} | – | – | {row['renders_per_s']:.1f} "
                         f"| {row['main_share']:.1%}, {row['server_share']:.1%} | {row['calls_per_s']:.0f} | {ratio} | – "
                         "| – | | |")
            continue
        errors = ", ".join(f"{v} {k}" for k, v in sorted(row["errors"].items())) or "0"
        # In the flood most of the server's work is cutting half-sent connections, not answering scrapes.
        cost = "–" if row["scenario"] == "flood" else f"{row['cost_ms']:.2f}"
        c = row["cpu_cost_ms"]
        cpu_cost = "–" if row["scenario"] == "flood" else f"{statistics.median(c):.2f} ({min(c):.2f} – {max(c):.2f})"
        lines.append(
            f"| {row['scenario']} | {row['scrapes_per_s']:.1f} | {row['p50'] * 1e3:.1f} / {row['p99'] * 1e3:.1f} / "
            f"{row['max'] * 1e3:.1f} | {errors} | {row['refused']} | {row['threads']} "
            f"| {row['cpu_per_scrape_ms']:.3f} ({row['user_per_scrape_ms']:.3f}) | {row['front_per_scrape_ms']:.3f} "
            f"| {row['renders_per_s']:.1f} | {row['main_share']:.1%}, {row['server_share']:.1%} "
            f"| {row['calls_per_s']:.0f} | {ratio} | {cost} | {cpu_cost} | {GOALS.get(row['scenario'], '')} "
            f"| {verdict(row)} |")
    return "\n".join(lines)


def environment(args: argparse.Namespace) -> str:
    import torch
    import transformers

    import gpuprobe

    end = os.getloadavg()[0]
    return (f"gpuprobe {gpuprobe.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"{torch.get_num_threads()} torch thread(s); "
            + (f"the program on CPU {','.join(map(str, args.program_cpus))}, the scrapers on CPU "
               f"{','.join(map(str, args.scraper_cpus))}. " if args.program_cpus else "no CPU pinning. ")
            + ("/metrics answered by the program's own threads (`--in-process`); " if args.in_process else
               "/metrics answered by the front process (the default; the program renders for it once per interval); ")
            + f"{args.repeats} interleaved repetitions of "
            f"{args.seconds:g} s per scenario; {args.clients} clients; {args.half_open} half-sent connections "
            f"in the flood; default `Limits` (100 connections a second, 10 % of a core, 2 workers, 64 waiting, "
            f"5 s read timeout) and `collect_interval` (0.5 s). Load average (1 min) {args.load[0]:.1f} at the start, "
            f"{end:.1f} at the end"
            + (": above the CPU count, other processes shared the machine and the ratios are theirs as much as the "
               "server's." if max(args.load[0], end) > (os.cpu_count() or 1) else
               " (the run's own processes: nothing else ran)."))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (default 5)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per scenario and repetition (default 15)")
    parser.add_argument("--clients", type=int, default=50, help="scrapers in paced and flood (default 50)")
    parser.add_argument("--half-open", type=int, default=600, help="half-sent connections in the flood (default 600)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 repetitions of 4 s")
    parser.add_argument("--markdown", type=Path, help="write the results file here (e.g. benchmarks/RESULTS-metrics.md)")
    parser.add_argument("--no-pin", action="store_true", help="leave the program and the scrapers on any CPU")
    parser.add_argument("--in-process", action="store_true",
                        help="serve from the program's own threads (serve(in_process=True)) instead of a front process")
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--scraper", choices=SCENARIOS[1:], help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scraper:
        scraper_main(args.scraper, args.host, args.port, args.clients, args.half_open,
                     [int(c) for c in args.cpus.split(",") if c])
        return 0
    if args.quick:
        args.repeats, args.seconds = 2, 4.0
    args.load = os.getloadavg()

    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) >= 3 and not args.no_pin:
        args.program_cpus, args.scraper_cpus = available[:-1], available[-1:]
        os.sched_setaffinity(0, args.program_cpus)
    else:
        args.program_cpus, args.scraper_cpus = [], []

    import torch

    from gpuprobe.exporters.prometheus import serve

    torch.set_num_threads(1)
    model, ids = build_model()
    server = serve(port=0, in_process=args.in_process)
    for _ in range(20):  # warm up: the first calls build caches
        generate(model, ids)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
    for rep in range(args.repeats):
        order = SCENARIOS[rep % len(SCENARIOS):] + SCENARIOS[:rep % len(SCENARIOS)]
        for scenario in order:
            settle(server)
            result = run_scenario(scenario, model, ids, server, args.seconds, args.clients, args.half_open,
                                  args.scraper_cpus)
            runs[scenario].append(result)
            print(f"repetition {rep + 1}/{args.repeats} {scenario:>12}: {result['calls_per_s']:.0f} calls/s, "
                  f"threads {result['threads']}", file=sys.stderr, flush=True)
    server.close()
    rows = summarize(runs, runs["none"])
    command = " ".join(["python benchmarks/metrics_load.py", *(sys.argv[1:] if argv is None else argv)])
    text = "\n".join([
        "# /metrics under load: scrape latency and what scrapes cost the program",
        "",
        f"Generated by `{command}` (see the script's docstring for what runs and how the ratios are taken).",
        "",
        environment(args),
        "",
        table(rows),
        "",
        "Per repetition, throughput ratios against the baseline of the same repetition:",
        "",
        *[f"- {row['scenario']}: {', '.join(f'{x:.3f}' for x in row['ratios'])}" for row in rows[1:]],
        "",
        "Program time per scrape is what the goal of 0.5 ms is about: the throughput lost (1 − the median",
        "ratio) over the requests answered a second, i.e. the generating thread's time one request takes. It is",
        "more than the server's own CPU time (the column before, in brackets its user-mode part, the rest the",
        "kernel's TCP work): the interpreter lock changes hands at each socket call the server makes, and each",
        "hand-over costs the generating thread too. \"On CPU\" is the share of the wall-clock window the",
        "generating thread and the server's threads ran: when the generating thread's share falls by more than",
        "the server's, other processes took the difference (the machine, not the server). A negative time or a",
        "ratio above 1 is noise larger than the effect measured. With the front process (the default), the",
        "program's server threads only answer the front's requests (one per interval and format); the front's",
        "own CPU, in a process of its own, is the column after them. The program's time per scrape by CPU",
        "accounting is the generating thread's loss of time on CPU against the baseline of the same repetition",
        "plus the CPU its server threads used beyond the baseline's, over the requests answered a second: what",
        "the server takes from the program, without what the machine's other processes (the scrapers, the",
        "front) take from the CPU the program runs on, which the throughput ratio also holds on a machine of",
        "two CPUs.",
        "In the flood, half-sent connections cut by the server (read timeout, or past the connection bound): "
        + ", ".join(f"{row['cut']} seen by the clients ({row['timed_out']} timed out, {row['evicted']} evicted)"
                    for row in rows if row["scenario"] == "flood") + ".",
        "",
    ])
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
