"""Multi-rank reports: 8 ranks of a large synthetic trace each, read in parallel, against one rank
alone and against HolisticTraceAnalysis (``TraceAnalysis(trace_dir=...)`` +
``get_comm_comp_overlap()``) on the same directory.

Every run is a fresh process; its peak memory is the peak, over time, of the summed RSS of the whole
process tree (sampled every 20 ms from /proc), so the worker processes count. Runs alternate.
HTA runs in its own venv (``benchmarks/report/.venv-hta``, see ``bench_vs_hta.py``).

Example:
    python benchmarks/report/bench_ranks.py --size-mb 200 --repeat 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _results import machine, update_section  # noqa: E402
from bench_vs_hta import hta_python  # noqa: E402
from make_synthetic_trace import write_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HTA_OVERLAP = (
    "import sys; from hta.trace_analysis import TraceAnalysis; "
    "a = TraceAnalysis(trace_dir=sys.argv[1]); print(a.get_comm_comp_overlap())"
)


def _tree_rss_kb(root: int) -> int:
    """Summed VmRSS of a process and all its descendants."""
    total = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def measure(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak process-tree RSS (MB) of a command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {err.decode(errors='replace')[-2000:]}")
    return wall, peak / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of each rank's trace (default 200)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpuprobe-ranks-"))
    try:
        for rank in range(args.ranks):
            with open(folder / f"rank-{rank}.json", "w") as f:
                write_trace(f, int(args.size_mb * 1e6), seed=rank, rank=rank, world_size=args.ranks)
        gp = [sys.executable, "-m", "gpuprobe", "report", "--format", "json", "--output", os.devnull, "--no-progress"]
        variants = {
            "gpuprobe, 1 rank": gp + [str(folder / "rank-0.json")],
            f"gpuprobe, {args.ranks} ranks": gp + [str(folder)],
        }
        if not args.no_hta:
            variants[f"HTA, {args.ranks} ranks"] = [str(hta_python()), "-c", HTA_OVERLAP, str(folder)]
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        names = list(variants)
        for r in range(args.repeat):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotating order
                samples[name].append(measure(variants[name], ROOT))
                print(name, samples[name][-1], flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in samples.items()}
    one, many = med[names[0]], med[names[1]]
    rows = [f"| {k} | {w:.1f} s | {m:,.0f} MB |" for k, (w, m) in med.items()]
    lines = [
        "## Several ranks in parallel",
        "",
        f"{datetime.date.today()}, {machine()}; {args.ranks} synthetic ranks of {args.size_mb:g} MB each "
        f"(`make_synthetic_trace.py --rank`); medians of {args.repeat} runs in rotating order, each a fresh "
        "process; peak RSS of the whole process tree; `python benchmarks/report/bench_ranks.py`",
        "",
        "gpuprobe: `gpuprobe report DIR --format json` (every section, the ranks section included; workers: the "
        "CPU count). HTA: `TraceAnalysis(trace_dir=DIR)` + `get_comm_comp_overlap()`.",
        "",
        "| run | wall | peak RSS (process tree) |",
        "|---|---:|---:|",
        *rows,
        "",
        f"- {args.ranks} ranks take {many[0] / one[0]:.2f}x the time of one rank ({os.cpu_count()} CPUs).",
    ]
    if not args.no_hta:
        hta = med[names[2]]
        lines.append(
            f"- Against HTA: {hta[0] / many[0]:.1f}x faster, {many[1] / hta[1]:.2f}x its peak RSS "
            "(goal: 3x or more, 0.25x or less)."
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        print(f"wrote {update_section('ranks', body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
