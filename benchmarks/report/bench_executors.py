"""The ranks of one run read one after another, by gpuprobe's worker processes, and by Dask, in one run.

``gpuprobe report DIR --format json`` on the same directory of synthetic ranks
(``make_synthetic_trace.py --rank``), each run a fresh process, in rotating order, ``--repeat`` rounds:

- ``serial``: ``--jobs 1``, the ranks one after another in the report's own process;
- ``processes``: the default, one worker process per rank, the CPU count at a time;
- ``dask, local cluster``: ``--executor dask`` without a configured scheduler, so the run starts a local
  Dask cluster (one single-threaded worker process per CPU) and stops it: its start-up is in the time;
- ``dask, running cluster``: ``--executor tcp://...`` against a scheduler and workers started once
  before the rounds (``dask scheduler``, ``dask worker --nworkers CPUs --nthreads 1``), as on a cluster
  that is already up.

The table gives the median wall time, its spread (lowest-highest) and the median ratio to ``serial``
taken per round, and the median CPU time of every process that worked for the run: the report's
process tree (its worker processes, and the local cluster's, are reaped into it) and, for the running
cluster, the CPU its scheduler and workers spent during the run (read from /proc). On a shared
machine the wall times move with the load of others; the CPU times much less, and they show what
each executor costs on top of reading the traces. Every run's report must be the same (checked).
Needs ``dask[distributed]``.

Example:
    python benchmarks/report/bench_executors.py --ranks 8 --size-mb 50 --repeat 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from _results import machine, update_section  # noqa: E402
from make_synthetic_trace import write_trace  # noqa: E402


def _start_cluster(folder: Path, workers: int) -> tuple[str, list[subprocess.Popen[bytes]]]:
    info = folder / "scheduler.json"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(info)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    deadline = time.monotonic() + 60
    while not info.exists() or not info.read_text().strip():
        if time.monotonic() > deadline:
            raise SystemExit("the Dask scheduler did not start")
        time.sleep(0.2)
    address = json.loads(info.read_text())["address"]
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", str(workers), "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(folder)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(workers, timeout=120)
    return address, procs


def _tree_cpu(roots: list[int]) -> float:
    """CPU seconds (user + system) of processes and all their descendants, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    stack = list(roots)
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return total / ticks


def _run(cmd: list[str], cluster: list[int]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the command's process tree and the cluster's) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cluster_before = _tree_cpu(cluster)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime + _tree_cpu(cluster) - cluster_before
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[3:])} failed: {done.stderr[-2000:]}")
    return wall, cpu, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--size-mb", type=float, default=50.0, help="size of each rank's trace (default 50)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update the 'executors' section of RESULTS.md")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpuprobe-executors-"))
    traces = folder / "ranks"
    traces.mkdir()
    cpus = os.cpu_count() or 1
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(args.ranks):
            with open(traces / f"rank-{rank}.json", "w") as f:
                write_trace(f, int(args.size_mb * 1e6), seed=rank, rank=rank, world_size=args.ranks)
        address, procs = _start_cluster(folder, cpus)
        base = [sys.executable, "-m", "gpuprobe", "report", str(traces), "--format", "json", "--no-progress"]
        env_free = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
        os.environ.clear()
        os.environ.update(env_free)  # `--executor dask` must start its own cluster, not find one configured
        variants = {
            "serial (--jobs 1)": base + ["--jobs", "1"],
            f"processes (default, {cpus} at a time)": base,
            "dask, local cluster started by the run (--executor dask)": base + ["--executor", "dask"],
            f"dask, running cluster of {cpus} workers (--executor tcp://...)": base + ["--executor", address],
        }
        names = list(variants)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpu_times: dict[str, list[float]] = {name: [] for name in names}
        ratios: dict[str, list[float]] = {name: [] for name in names}
        cluster = [proc.pid for proc in procs]
        reference = None
        for r in range(args.repeat):
            round_walls = {}
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotating order
                wall, cpu, out = _run(variants[name], cluster if "running cluster" in name else [])
                if reference is None:
                    reference = out
                if out != reference:
                    raise SystemExit(f"{name}: a report different from the others'")
                round_walls[name] = wall
                walls[name].append(wall)
                cpu_times[name].append(cpu)
                print(f"round {r + 1}: {name}: {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
            for name in names:
                ratios[name].append(round_walls[name] / round_walls[names[0]])
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    rows = [
        f"| {name} | {statistics.median(w):.1f} s | {min(w):.1f}–{max(w):.1f} s | {statistics.median(ratios[name]):.2f} "
        f"| {statistics.median(cpu_times[name]):.1f} s |"
        for name, w in walls.items()
    ]
    body = "\n".join([
        "## Executors for several ranks",
        "",
        f"{datetime.date.today()}, {machine()}; {args.ranks} synthetic ranks of {args.size_mb:g} MB each; "
        f"`gpuprobe report DIR --format json`, each run a fresh process, {args.repeat} rounds in rotating order; "
        "`python benchmarks/report/bench_executors.py`",
        "",
        "| executor | wall (median) | spread | ÷ serial (median of the rounds' ratios) | CPU, all processes (median) |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
    print(body)
    if args.write:
        print(f"wrote {update_section('executors', body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
