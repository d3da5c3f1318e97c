"""Report a synthetic kineto trace of 1 GB or more and check peak memory stays under 500 MB.

The trace is written streaming by ``make_synthetic_trace.py`` (under /tmp by default, never in the
repository). The report runs in a child process (``gpuprobe report --format json``); its peak RSS
is read with ``resource.getrusage(RUSAGE_CHILDREN)`` once it has exited (the only child of this
process), and the wall time around it. The figures go into RESULTS.md.

Example:
    python benchmarks/report/bench_large.py --size-gb 1.0
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
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

LIMIT_MB = 500
CHILD = (
    "import sys; from gpuprobe.report.cli import main_report; "
    "sys.exit(main_report([sys.argv[1], '--format', 'json', '--output', sys.argv[2], '--no-progress']))"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=os.path.join(tempfile.gettempdir(), "gpuprobe-synthetic-1gb.json"))
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--keep", action="store_true", help="keep the trace for the next run")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args(argv)
    target = int(args.size_gb * 1e9)
    path = Path(args.path)
    if not path.exists() or path.stat().st_size < target:
        t0 = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            steps, events = write_trace(out, target)
        tmp.replace(path)
        print(f"wrote {path}: {steps:,} steps, {events:,} events in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    size = path.stat().st_size
    out_json = Path(tempfile.gettempdir()) / "gpuprobe-synthetic-report.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(out_json)], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    import json

    summary = json.loads(out_json.read_text())["summary"]
    events = sum(summary["events"].values())
    out_json.unlink()
    if not args.keep:
        path.unlink()
    ok = peak_mb < LIMIT_MB
    lines = [
        "## Large trace (synthetic kineto, streaming)",
        "",
        f"{datetime.date.today()}, {machine()}; `python benchmarks/report/bench_large.py --size-gb {args.size_gb:g}`",
        "",
        "The report runs in a child process (`gpuprobe report --format json`, every section); peak RSS from "
        "`getrusage(RUSAGE_CHILDREN)`. Events used: kernels, copies, sets, runtime calls, CPU operators and "
        "ranges (flow and metadata events are read and dropped).",
        "",
        "| trace size | events used | steps | wall time | throughput | peak RSS | limit |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {size / 1e9:.2f} GB | {events:,} | {summary['step_count']:,} | {wall:.1f} s | {size / 1e6 / wall:.0f} MB/s "
        f"| {peak_mb:.0f} MB | {LIMIT_MB} MB {'(ok)' if ok else '(EXCEEDED)'} |",
    ]
    print("\n".join(lines))
    if not args.no_write:
        update_section("large", "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
