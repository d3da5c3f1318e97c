"""Report a synthetic kineto trace of 1 GB or more and check peak memory stays under 500 MB.

The trace is written streaming by ``make_synthetic_trace.py`` (under /tmp by default, never in the
repository). Each report runs in its own child process (``gpuprobe report --format json``), which
prints its peak RSS (``getrusage(RUSAGE_SELF)``) as it exits; the wall time is taken around it.
Several sizes give one row each. The figures go into RESULTS.md.

Example:
    python benchmarks/report/bench_large.py --size-gb 1 2
"""

from __future__ import annotations

import argparse
import datetime
import os
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
    "import resource, sys; from gpuprobe.report.cli import main_report; "
    "rc = main_report([sys.argv[1], '--format', 'json', '--output', sys.argv[2], '--no-progress']); "
    "u = resource.getrusage(resource.RUSAGE_SELF); "
    "print('peak_kib', u.ru_maxrss, 'cpu_s', u.ru_utime + u.ru_stime); sys.exit(rc)"
)
# The floor a streaming report is measured against: a bare scan of the same file's events with ijson's
# C backend (every element of traceEvents built as Python objects, nothing done with them).
SCAN = (
    "import resource, sys, ijson; backend = ijson.get_backend('yajl2_c'); "
    "f = open(sys.argv[1], 'rb'); n = sum(1 for _ in backend.items(f, 'traceEvents.item')); "
    "u = resource.getrusage(resource.RUSAGE_SELF); print('cpu_s', u.ru_utime + u.ru_stime, 'items', n)"
)


def _cpu(stdout: str) -> float:
    return float(stdout.split("cpu_s")[-1].split()[0])


def run_one(path: Path, size_gb: float, keep: bool) -> tuple[str, bool] | int:
    """Write the trace if needed, report it in a child; the table row and whether it kept the limit."""
    target = int(size_gb * 1e9)
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
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    t1 = time.perf_counter()
    scan = subprocess.run([sys.executable, "-c", SCAN, str(path)], env=env, capture_output=True, text=True, check=True)
    scan_wall = time.perf_counter() - t1
    report_cpu, scan_cpu = _cpu(proc.stdout), _cpu(scan.stdout)
    peak_mb = int(proc.stdout.split("peak_kib")[-1].split()[0]) / 1024  # KiB on Linux
    import json

    summary = json.loads(out_json.read_text())["summary"]
    events = sum(summary["events"].values())
    out_json.unlink()
    if not keep:
        path.unlink()
    ok = peak_mb < LIMIT_MB
    row = (
        f"| {size / 1e9:.2f} GB | {events:,} | {summary['step_count']:,} | {wall:.1f} s | {size / 1e6 / wall:.0f} MB/s "
        f"| {peak_mb:.0f} MB | {peak_mb * 2**20 / events:.0f} B | {LIMIT_MB} MB {'(ok)' if ok else '(EXCEEDED)'} "
        f"| {report_cpu:.1f} s | {scan_wall:.1f} s / {scan_cpu:.1f} s | {report_cpu / scan_cpu:.2f}x |"
    )
    print(row, file=sys.stderr)
    return row, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=os.path.join(tempfile.gettempdir(), "gpuprobe-synthetic-{size}gb.json"),
                        help="where the trace is written; {size} is replaced by the size in GB")
    parser.add_argument("--size-gb", type=float, nargs="+", default=[1.0])
    parser.add_argument("--keep", action="store_true", help="keep the traces for the next run")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args(argv)
    rows = []
    all_ok = True
    for size_gb in args.size_gb:
        got = run_one(Path(args.path.replace("{size}", f"{size_gb:g}")), size_gb, args.keep)
        if isinstance(got, int):
            return got
        rows.append(got[0])
        all_ok = all_ok and got[1]
    sizes = " ".join(f"{x:g}" for x in args.size_gb)
    lines = [
        "## Large trace (synthetic kineto, streaming)",
        "",
        f"{datetime.date.today()}, {machine()}; `python benchmarks/report/bench_large.py --size-gb {sizes}`",
        "",
        "Each report runs in its own child process (`gpuprobe report --format json`, every section), which "
        "reports its peak RSS (`getrusage(RUSAGE_SELF)`). Events used: kernels, copies, sets, runtime calls, "
        "CPU operators and ranges (flow and metadata events are read and dropped). Per event: peak RSS / "
        "events used, the interpreter and imports included. Bare scan: ijson's C backend building every "
        "element of `traceEvents` and nothing more, in its own child process (wall / CPU); the ratio is "
        "the report's CPU time over the scan's.",
        "",
        "| trace size | events used | steps | wall time | throughput | peak RSS | per event | limit | report CPU "
        "| bare scan | report ÷ scan |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    print("\n".join(lines))
    if not args.no_write:
        update_section("large", "\n".join(lines))
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
