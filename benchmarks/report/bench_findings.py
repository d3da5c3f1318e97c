"""Report time with findings (and the idle and FLOPs sections they read) against the report
without them, on real traces and a synthetic decode trace.

Three variants, each run a fresh ``gpuprobe report --format json`` process, interleaved:

- ``before``: the full report of an earlier revision (``--against REV``, default ``a155300``, the
  last one without findings), run from a git worktree of it;
- ``without``: this tree's report with every section but the findings (``--sections``);
- ``with``: this tree's default report, findings included.

The figures are medians of CPU time; the goal is ``with`` ÷ ``without`` at most 1.1x (``with`` ÷ ``before`` is shown too).

Example:
    python benchmarks/report/bench_findings.py --repeat 7 --size-mb 200
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _results import machine, update_section  # noqa: E402
from make_synthetic_trace import write_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REAL = [
    ROOT / "tests/data/kineto/hta_sampled_rank-0.json.gz",
    ROOT / "tests/data/kineto/hta_cudagraph_nccl_rank0.json.gz",
    ROOT / "tests/data/kineto/tracelens_h100_timesformer_eager_attn.json.gz",
]
sys.path.insert(0, str(ROOT))
from gpuprobe.report.schema import SECTIONS  # noqa: E402

# every section of this tree's report but the findings (ranks: several traces only)
_WITHOUT = ",".join(s for s in SECTIONS if s not in ("findings", "ranks"))


def run(path: Path, variant: str, before_tree: Path | None) -> float:
    cmd = [sys.executable, "-m", "gpuprobe", "report", str(path), "--format", "json", "--output", os.devnull]
    if variant == "without":
        cmd += ["--sections", _WITHOUT]
    cwd = before_tree if variant == "before" else ROOT  # `python -m` imports gpuprobe from the cwd
    # CPU time (user + system) of the report process: on a shared 2-CPU machine its wall time moves by
    # ±30 % from run to run with the neighbours' load, its CPU time much less
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, cwd=cwd)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size-mb", type=float, default=200.0, help="synthetic trace size (0: none)")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument("--against", default="a155300", help="revision without findings (default a155300)")
    args = parser.parse_args(argv)
    before_tree = Path(tempfile.mkdtemp()) / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before_tree), args.against], cwd=ROOT, check=True,
                   capture_output=True)
    traces = list(REAL)
    tmp = None
    if args.size_mb > 0:
        tmp = Path(tempfile.mkdtemp()) / f"synthetic-{args.size_mb:g}mb.json"
        with open(tmp, "w") as f:
            write_trace(f, int(args.size_mb * 1e6))
        traces.append(tmp)
    rows = []
    variants = ["before", "without", "with"]
    try:
        for path in traces:
            times: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.repeat):
                for v in variants[r % 3 :] + variants[: r % 3]:  # interleaved, order rotating
                    times[v].append(run(path, v, before_tree))
            before, without, found = (statistics.median(times[v]) for v in variants)
            size = path.stat().st_size / 1e6
            rows.append(
                f"| {path.name} | {size:.1f} MB | {before:.2f} s | {without:.2f} s | {found:.2f} s | "
                f"{found / without:.3f}x | {found / before:.3f}x |"
            )
            print(rows[-1], flush=True)
    finally:
        if tmp is not None:
            tmp.unlink()
        subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT, capture_output=True)
    body = "\n".join(
        [
            "## Findings: report time with and without them",
            "",
            f"{datetime.date.today()}, {machine()}; medians of {args.repeat} interleaved runs, each a fresh "
            "`gpuprobe report --format json` process, CPU time (user + system) of that process; "
            "`python benchmarks/report/bench_findings.py`",
            "",
            f"Before: the full report of revision `{args.against}` (no findings, nor the idle, FLOPs and "
            "communication sections). Without: this tree's report with every section but the findings "
            "(`--sections`). With: this tree's default report. Ratios: with ÷ without (what the findings cost), "
            "and with ÷ before (what a report costs now against then, its new sections included; on the smallest "
            "trace mostly the start-up of a fresh process).",
            "",
            "| trace | file size | before | without findings | with findings | with ÷ without | with ÷ before |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Goal: with ÷ without 1.1x or less.",
        ]
    )
    if not args.no_write:
        print(f"wrote {update_section('findings', body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
