"""Many small ranks: a directory of N small kineto traces, one per rank, reported with the default
``--jobs`` (the CPU count) against ``--jobs 1`` (one after another in the report's process), and
against the pool of worker processes forced (``IN_PROCESS_BYTES = 0``, as the default takes for ranks
of more text in all).

Each rank is a small synthetic trace of about ``--size-kb`` KB (a ``ProfilerStep`` range, CPU operators
launching GEMM and elementwise kernels, an NCCL all-reduce on a second stream, ``distributedInfo.rank``).
Every run is a fresh ``gpuprobe report DIR --format json`` process; the variants run interleaved, in
rotating order, ``--repeat`` rounds; a run longer than ``--timeout`` seconds is stopped and shown as
such. The JSON reports of the variants must be the same, byte for byte.

Example:
    python benchmarks/report/bench_many_ranks.py --ranks 1000 --size-kb 10 --repeat 3
    python benchmarks/report/bench_many_ranks.py --tree /tmp/base --no-pool --no-write  # another checkout
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _results import machine, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# The report of a directory with the worker pool forced, as main_report gives it.
_POOL = (
    "import sys; from gpuprobe.report import _ranks; _ranks.IN_PROCESS_BYTES = 0; "
    "from gpuprobe.report.cli import main_report; raise SystemExit(main_report(sys.argv[1:]))"
)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def small_rank(rank: int, world_size: int, target_bytes: int) -> str:
    """A kineto trace of rank ``rank`` of about ``target_bytes`` characters (steps of 8 kernels)."""
    events: list[str] = []
    size = 0
    t, corr, step = 1_000_000 + rank * 7_000, 1, 0
    while size < target_bytes - 400 or step == 0:
        step_start = t
        batch = []
        gpu_t = t + 10_000
        for k in range(8):
            name = ("sm90_xmma_gemm_bf16bf16_bf16f32" if k % 2 == 0 else
                    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >")
            dur = 5_000 + (k * 997 + step * 131 + rank * 17) % 4_000
            batch.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::{"mm" if k % 2 == 0 else "add"}", "pid": 1, '
                         f'"tid": 1, "ts": {_us(t)}, "dur": {_us(4_000)}}}')
            batch.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                         f'"ts": {_us(t + 500)}, "dur": {_us(2_500)}, "args": {{"correlation": {corr}}}}}')
            gpu_t = max(gpu_t, t + 3_500)
            batch.append(f'{{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7, "ts": {_us(gpu_t)}, '
                         f'"dur": {_us(dur)}, "args": {{"device": 0, "stream": 7, "correlation": {corr}}}}}')
            gpu_t += dur + 300
            t += 4_500
            corr += 1
        batch.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                     f'"ts": {_us(t)}, "dur": {_us(3_000)}, "args": {{"correlation": {corr}}}}}')
        batch.append(f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, '
                     f'"tid": 20, "ts": {_us(gpu_t - 8_000)}, "dur": {_us(30_000 + rank * 200)}, '
                     f'"args": {{"device": 0, "stream": 20, "correlation": {corr}}}}}')
        corr += 1
        t = max(t, gpu_t) + 40_000
        batch.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 1, "tid": 1, '
                     f'"ts": {_us(step_start)}, "dur": {_us(t - step_start - 1_000)}}}')
        events.extend(batch)
        size += sum(len(e) + 2 for e in batch)
        step += 1
    head = (f'{{"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world_size}}}, '
            '"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": [\n')
    return head + ",\n".join(events) + "\n]}\n"


def run(cmd: list[str], env: dict[str, str], timeout: float, out: Path) -> float | None:
    """Wall seconds of one run (its JSON written to ``out``), or None past ``timeout``.

    The run's working folder is ``out``'s, so that ``--tree`` (first on PYTHONPATH) is the gpuprobe it
    imports, not the checkout's that ``python -m`` and ``-c`` would find in their working folder.
    """
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    assert out.exists()
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--size-kb", type=float, default=10.0, help="size of each rank's trace (default 10)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take (default 300)")
    parser.add_argument("--tree", default=str(ROOT), help="the source tree to run (default: this one)")
    parser.add_argument("--no-pool", action="store_true", help="leave out the forced worker pool")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="gpuprobe-many-ranks-"))
    env = dict(os.environ, PYTHONPATH=str(Path(args.tree).resolve()))
    try:
        ranks = folder / "ranks"
        ranks.mkdir()
        for rank in range(args.ranks):
            (ranks / f"rank-{rank:05d}.json").write_text(small_rank(rank, args.ranks, int(args.size_kb * 1000)))
        sizes = [p.stat().st_size for p in ranks.iterdir()]
        common = ["report", str(ranks), "--format", "json", "--no-progress"]
        variants = {
            "default --jobs": [sys.executable, "-m", "gpuprobe", *common],
            "--jobs 1": [sys.executable, "-m", "gpuprobe", *common, "--jobs", "1"],
        }
        if not args.no_pool:
            variants["worker pool forced"] = [sys.executable, "-c", _POOL, *common[1:]]
        names = list(variants)
        samples: dict[str, list[float | None]] = {k: [] for k in names}
        outputs: dict[str, bytes] = {}
        for r in range(args.repeat):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotating order
                out = folder / f"{names.index(name)}.json"
                out.unlink(missing_ok=True)
                wall = run([*variants[name], "--output", str(out)], env, args.timeout, out)
                samples[name].append(wall)
                if wall is not None:
                    outputs.setdefault(name, out.read_bytes())
                print(f"round {r + 1}: {name}: " + (f"{wall:.2f} s" if wall is not None else
                                                     f"stopped after {args.timeout:g} s"), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    same = len(set(outputs.values())) <= 1
    if outputs:
        merged = json.loads(next(iter(outputs.values())))
        assert merged["ranks"]["count"] == args.ranks, merged["ranks"]["count"]

    def cell(values: list[float | None]) -> str:
        done = sorted(v for v in values if v is not None)
        if not done:
            return f"over {args.timeout:g} s (all {len(values)} runs stopped)"
        text = f"{statistics.median(done):.2f} s ({done[0]:.2f}–{done[-1]:.2f})"
        stopped = len(values) - len(done)
        return text + (f", {stopped} of {len(values)} runs over {args.timeout:g} s" if stopped else "")

    serial = [v for v in samples["--jobs 1"] if v is not None]
    rows = []
    for name in names:
        done = [v for v in samples[name] if v is not None]
        ratio = (f"{statistics.median(done) / statistics.median(serial):.2f}x" if done and serial
                 and len(done) == len(samples[name]) else "–")
        rows.append(f"| {name} | {cell(samples[name])} | {ratio} |")
    lines = [
        "## Many small ranks",
        "",
        f"{datetime.date.today()}, {machine()}; {args.ranks:,} synthetic ranks of "
        f"{statistics.median(sizes) / 1e3:.1f} KB "
        f"each ({sum(sizes) / 1e6:.1f} MB in all); `gpuprobe report DIR --format json`, each run a fresh process; "
        f"medians of {args.repeat} interleaved runs in rotating order, the spread in brackets (lowest–highest); "
        f"load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after (other processes sharing the CPUs "
        "slow every variant); `python benchmarks/report/bench_many_ranks.py`",
        "",
        "Default: `--jobs` not given (the CPU count; ranks of less than `IN_PROCESS_BYTES` of text in all are read "
        "in the report's process). `--jobs 1`: one after another in the report's process. Worker pool forced: "
        "the default with `IN_PROCESS_BYTES = 0`, so the ranks go to the pool of worker processes.",
        "",
        "| run | wall | ÷ `--jobs 1` |",
        "|---|---:|---:|",
        *rows,
        "",
        f"- The JSON reports of the variants are {'the same, byte for byte' if same else 'NOT the same'}.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        print(f"wrote {update_section('many-ranks', body)}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
