"""Report kineto traces of 200 MB to 2 GB against a bare streaming scan and HTA, in one run.

The traces are written streaming (under /tmp by default, never in the repository), plain and, with
``--gzip``, gzip-compressed, in one or both shapes (``--shape``): ``synthetic`` by
``make_synthetic_trace.py``, ``real`` by ``make_real_shaped_trace.py`` (real public kineto traces of
several eras replicated with shifted times and ids). The shapes of one size are measured side by side. Each report runs in its own child process
(``gpuprobe report --format json``, every section), which prints its CPU time and peak RSS
(``getrusage(RUSAGE_SELF)``) as it exits; the wall time is taken around it. The floor it is measured
against is a bare streaming scan of the same file: ijson's C backend building every element of
``traceEvents`` and nothing more, in its own child. Report and scan alternate, ``--repeat`` rounds
(their order swapped each round); the table gives medians and the spread (lowest–highest) of the
report's wall time. With ``--hta``, HolisticTraceAnalysis reads each plain trace once
(``TraceAnalysis`` + ``get_gpu_kernel_breakdown``), in its own venv, its address space capped by
``--hta-memory-gb`` and its time by ``--hta-timeout``: a run that exceeds either is reported as such.
The figures go into RESULTS.md.

Example:
    python benchmarks/report/bench_large.py --size-gb 0.2 1 2 --gzip --hta
"""

from __future__ import annotations

import argparse
import datetime
import gzip
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
from make_real_shaped_trace import write_trace as write_real  # noqa: E402
from make_synthetic_trace import write_trace as write_synthetic  # noqa: E402

WRITERS = {"synthetic": write_synthetic, "real": write_real}

LIMIT_MB = 500
LIMIT_S = 30.0  # the goal for 2 GB
LIMIT_RATIO = 1.2  # report CPU over the bare scan's
LIMIT_GROWTH = 2.1  # the 2 GB wall time over the 1 GB one (linear, with room for the fixed start-up)
CHILD = (
    "import resource, sys; from gpuprobe.report.cli import main_report; "
    "rc = main_report([sys.argv[1], '--format', 'json', '--output', sys.argv[2], '--no-progress', *sys.argv[3:]]); "
    "u = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN); "
    # VmHWM: this process's own peak (ru_maxrss keeps the parent's at exec: a large parent showed as 536 MB);
    # the children's: the second process that reads the tail of a split trace (started small, from here)
    "hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')] or [u.ru_maxrss]; "
    "print('peak_kib', hwm[0], 'child_peak_kib', c.ru_maxrss, "
    "'cpu_s', u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime); sys.exit(rc)"
)
# The floor a streaming report is measured against: a bare scan of the same file's events with ijson's
# C backend (every element of traceEvents built as Python objects, nothing done with them).
SCAN = (
    "import gzip, resource, sys, ijson; backend = ijson.get_backend('yajl2_c'); "
    "f = (gzip.open if sys.argv[1].endswith('.gz') else open)(sys.argv[1], 'rb'); "
    "n = sum(1 for _ in backend.items(f, 'traceEvents.item')); "
    "u = resource.getrusage(resource.RUSAGE_SELF); print('cpu_s', u.ru_utime + u.ru_stime, 'items', n)"
)


def _field(stdout: str, name: str) -> float:
    return float(stdout.split(name)[-1].split()[0])


def ensure_trace(path: Path, size_gb: float, shape: str = "synthetic") -> None:
    """Write the trace of ``shape`` at ``path`` unless a large enough one is there."""
    target = int(size_gb * 1e9)
    if path.exists() and path.with_suffix(path.suffix + ".size").exists():
        if int(path.with_suffix(path.suffix + ".size").read_text()) >= target:
            return
    t0 = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    # gzip's default level 6, as `gzip` writes it (Python's own default, 9, takes twice as long here)
    with (gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) if path.name.endswith(".gz")
          else open(tmp, "w", encoding="utf-8")) as out:
        steps, events = WRITERS[shape](out, target)
    tmp.replace(path)
    path.with_suffix(path.suffix + ".size").write_text(str(target))
    print(f"wrote {path}: {steps:,} steps, {events:,} events in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[2][:40]}... failed ({proc.returncode}): {proc.stderr[-800:]}")
    return wall, proc.stdout


def measure(path: Path, repeat: int, env: dict[str, str], jobs: int | None = None) -> dict[str, object]:
    """Report and scan ``path`` ``repeat`` times, alternating; medians and the report's spread."""
    out_json = Path(tempfile.gettempdir()) / "gpuprobe-synthetic-report.json"
    report: list[tuple[float, float, float]] = []  # wall, cpu, peak MB
    scan: list[tuple[float, float]] = []  # wall, cpu
    for i in range(repeat):
        order = ("report", "scan") if i % 2 == 0 else ("scan", "report")
        for what in order:
            if what == "report":
                wall, stdout = run_child([sys.executable, "-c", CHILD, str(path), str(out_json),
                                          *(["--jobs", str(jobs)] if jobs else [])], env)
                # both processes' peaks added: they run at once (an upper bound of the two together)
                report.append((wall, _field(stdout, "cpu_s"),
                               (_field(stdout, "peak_kib") + _field(stdout, "child_peak_kib")) / 1024))
            else:
                wall, stdout = run_child([sys.executable, "-c", SCAN, str(path)], env)
                scan.append((wall, _field(stdout, "cpu_s")))
    summary = json.loads(out_json.read_text())["summary"]
    out_json.unlink()
    walls = [r[0] for r in report]
    ratios = [r[1] / s[1] for r, s in zip(report, scan)]  # per round
    return {
        "events": sum(summary["events"].values()),
        "steps": summary["step_count"],
        "wall": statistics.median(walls),
        "wall_low": min(walls),
        "wall_high": max(walls),
        "cpu": statistics.median(r[1] for r in report),
        "peak_mb": max(r[2] for r in report),
        "scan_wall": statistics.median(s[0] for s in scan),
        "scan_cpu": statistics.median(s[1] for s in scan),
        "ratio": statistics.median(ratios),
        "ratio_low": min(ratios),
        "ratio_high": max(ratios),
    }


def measure_hta(path: Path, memory_gb: float, timeout_s: float) -> str:
    """One HTA run over a folder holding ``path``: wall and peak RSS, or why it did not finish."""
    from bench_vs_hta import HTA_CHILD, hta_python

    try:
        python = hta_python()
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        return f"not run: {exc}"
    cap = int(memory_gb * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    with tempfile.TemporaryDirectory(dir=path.parent) as tmp, tempfile.TemporaryFile() as err:
        try:
            os.link(path, Path(tmp) / "rank-0.json")
        except OSError:
            shutil.copy(path, Path(tmp) / "rank-0.json")
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(python), "-c", HTA_CHILD, tmp], stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=limit)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                os.wait4(proc.pid, 0)
                return f"stopped after {timeout_s:.0f} s"
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            text = err.read().decode(errors="replace")
            if "MemoryError" in text or "Cannot allocate" in text or "bad_alloc" in text or proc.returncode < 0:
                return f"out of memory under a {memory_gb:g} GB cap after {wall:.0f} s"
            last = text.strip().splitlines()[-1][:80] if text.strip() else ""
            return f"failed ({proc.returncode}): {last}"
        return f"{wall:.1f} s, {usage.ru_maxrss / 1024:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=os.path.join(tempfile.gettempdir(), "gpuprobe-{shape}-{size}gb.json"),
                        help="where the traces are written; {size} is replaced by the size in GB, {shape} by the shape")
    parser.add_argument("--shape", choices=sorted(WRITERS), action="append",
                        help="synthetic or real (repeatable; default: both, side by side)")
    parser.add_argument("--size-gb", type=float, nargs="+", default=[0.2, 1.0, 2.0])
    parser.add_argument("--gzip", action="store_true", help="also the .json.gz of each size")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of report and scan per trace (default 3)")
    parser.add_argument("--hta", action="store_true", help="also HolisticTraceAnalysis on each plain trace")
    parser.add_argument("--hta-memory-gb", type=float, default=16.0)
    parser.add_argument("--hta-timeout", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep the traces for the next run")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument("--jobs", type=int, default=None,
                        help="the report's --jobs (default: not given, the report's own default: the CPU count)")
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    walls: dict[tuple[str, bool, float], float] = {}
    all_ok = True
    shapes = args.shape or ["synthetic", "real"]
    for size_gb, shape in [(size, shape) for size in args.size_gb for shape in shapes]:
        plain = Path(args.path.replace("{size}", f"{size_gb:g}").replace("{shape}", shape))
        paths = [plain] + ([plain.with_name(plain.name + ".gz")] if args.gzip else [])
        for path in paths:
            ensure_trace(path, size_gb, shape)
            m = measure(path, max(1, args.repeat), env, args.jobs)
            hta = measure_hta(path, args.hta_memory_gb, args.hta_timeout) if args.hta and path is plain else "–"
            walls[(shape, path.name.endswith(".gz"), size_gb)] = float(m["wall"])  # type: ignore[arg-type]
            ok = (float(m["peak_mb"]) < LIMIT_MB and (size_gb < 2 or float(m["wall"]) <= LIMIT_S)
                  and float(m["ratio"]) <= LIMIT_RATIO)
            all_ok = all_ok and ok
            row = (
                f"| {size_gb:g} GB {'.json.gz' if path.name.endswith('.gz') else '.json'}, {shape} | {m['events']:,} | {m['steps']:,} "
                f"| {m['wall']:.1f} s ({m['wall_low']:.1f}–{m['wall_high']:.1f}) | {size_gb * 1e3 / float(m['wall']):.0f} MB/s "
                f"| {m['peak_mb']:.0f} MB | {float(m['peak_mb']) * 2**20 / int(m['events']):.0f} B | {m['cpu']:.1f} s "
                f"| {m['scan_wall']:.1f} s / {m['scan_cpu']:.1f} s | {m['ratio']:.2f}x ({m['ratio_low']:.2f}–{m['ratio_high']:.2f}) "
                f"| {hta} | {'ok' if ok else 'EXCEEDED'} |"
            )
            print(row, file=sys.stderr)
            rows.append(row)
            if not args.keep:
                path.unlink()
                path.with_suffix(path.suffix + ".size").unlink(missing_ok=True)
    growth = []
    for (shape, gz, size_gb), wall in sorted(walls.items()):
        half = walls.get((shape, gz, size_gb / 2))
        if half:
            fine = wall / half <= LIMIT_GROWTH
            all_ok = all_ok and fine
            growth.append(f"- {shape}{' .json.gz' if gz else ''}: {size_gb:g} GB takes {wall / half:.2f}x the time of "
                          f"{size_gb / 2:g} GB ({'ok' if fine else 'EXCEEDED'}: {LIMIT_GROWTH}x or less)")
    sizes = " ".join(f"{x:g}" for x in args.size_gb)
    flags = ((" --gzip" if args.gzip else "") + (" --hta" if args.hta else "") + f" --repeat {args.repeat}"
             + "".join(f" --shape {x}" for x in args.shape or ()) + (f" --jobs {args.jobs}" if args.jobs else ""))
    lines = [
        "## Large traces (synthetic and real-shaped kineto, streaming)",
        "",
        f"{datetime.date.today()}, {machine()}; `python benchmarks/report/bench_large.py --size-gb {sizes}{flags}`",
        "",
        "Each report runs in its own child process (`gpuprobe report --format json`, every section, the default "
        "engine, `--jobs` as given, else the report's default: the CPU count, so that a plain trace of 256 MB or more "
        "is read by two processes at once), which reports its CPU time and peak RSS with those of the second process "
        "(`getrusage`, self and children; the peaks added). Shapes: synthetic "
        "(`make_synthetic_trace.py`) and real (`make_real_shaped_trace.py`: the real traces of tests/data/kineto "
        "listed there, replicated with shifted times and ids). Events used: kernels, copies, "
        "sets, runtime calls, CPU operators and ranges (flow and metadata events are read and dropped). Per event: "
        "peak RSS / events used, the interpreter and imports included. Bare scan: ijson's C backend building every "
        "element of `traceEvents` and nothing more, in its own child process (wall / CPU); report ÷ scan: the "
        "report's CPU time over the scan's, per round. Report and scan alternate; medians of the rounds, the spread "
        "in brackets (lowest–highest). HTA: `TraceAnalysis(trace_dir=...)` + `get_gpu_kernel_breakdown()` once, "
        "wall and peak RSS, its address space capped. Goals: peak RSS under "
        f"{LIMIT_MB} MB, a 2 GB trace (plain or gzip) in {LIMIT_S:.0f} s or less, report ÷ scan {LIMIT_RATIO}x or "
        f"less, and twice the size in {LIMIT_GROWTH}x the time or less.",
        "",
        "| trace | events used | steps | wall time | throughput | peak RSS | per event | report CPU "
        "| bare scan | report ÷ scan | HTA | goals |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        *rows,
        *([""] + growth if growth else []),
    ]
    print("\n".join(lines))
    if not args.no_write:
        update_section("large", "\n".join(lines))
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
