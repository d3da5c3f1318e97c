"""Would splitting one trace's pass over two processes pay on this machine? An upper bound, before any merge.

For each plain kineto trace given, in alternating rounds (medians, spread in brackets):

- **one process**: the report's pass (``KinetoTrace.field_batches`` into ``TraceScan.consume_batches``) over the
  whole file;
- **two processes at once**: the same pass over the head and over the tail of the file (split at the
  first element of ``traceEvents`` after the middle byte, read with ``Part``), each then pickling its scan
  (what handing it back to a parent would cost). The wall time is until both are done.

Merging the two scans (the name tables renumbered, the columns appended) would only add to the second
figure, so ``two ÷ one`` is the best a split could do. Where it is above about 0.8, a split does not pay
for the merge it needs and the pickles it moves.

Run::

    python benchmarks/report/bench_split.py /tmp/gpuprobe-real-0.2gb.json /tmp/gpuprobe-synth-0.2gb.json --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import pickle, sys, time
sys.path.insert(0, sys.argv[1])
from gpuprobe.report._kineto import KinetoTrace
from gpuprobe.report._split import Part
from gpuprobe.report._scan import TraceScan
path, which, at = sys.argv[2], sys.argv[3], int(sys.argv[4])
trace = KinetoTrace(path, "kineto-json")
scan = TraceScan()
t0 = time.process_time()
if which == "whole":
    trace.feed(scan)
    size = 0
else:
    from gpuprobe.report._events import TraceInfo
    trace.info = TraceInfo("kineto")
    part = Part(which == "tail", at, "{")
    scan.consume_batches(trace.field_batches(part=part, meta={}))
    size = len(pickle.dumps(scan, protocol=pickle.HIGHEST_PROTOCOL))
print("cpu_s", time.process_time() - t0, "pickle_mb", size / 2**20, "ops", len(scan.ops))
"""

_ELEMENT = re.compile(rb"\},\s*\{\s*\"ph\"")


def split_point(path: Path) -> int:
    """The byte where an element of ``traceEvents`` starts, at or after the middle of the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(size // 2)
        window = f.read(1 << 20)
    found = _ELEMENT.search(window)
    if found is None:
        raise SystemExit(f"{path}: no element start within 1 MB after the middle")
    return size // 2 + found.start() + window[found.start():].index(b"{")


def run(path: Path, which: str, at: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), str(path), which, str(at)],
                            stdout=subprocess.PIPE, text=True)


def one_round(path: Path, at: int) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    whole = run(path, "whole", at)
    out_whole = whole.communicate()[0]
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    head, tail = run(path, "head", at), run(path, "tail", at)
    outs = [head.communicate()[0], tail.communicate()[0]]
    two = time.perf_counter() - t0
    if whole.returncode or head.returncode or tail.returncode:
        raise SystemExit(f"{path}: a pass failed")
    return one, two, " | ".join(o.strip() for o in [out_whole, *outs])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the start")
    print("| trace | one process (s) | two processes at once, before any merge (s) | two ÷ one |")
    print("|---|---|---|---|")
    for path in args.traces:
        at = split_point(path)
        ones, twos = [], []
        for _ in range(args.rounds):
            one, two, detail = one_round(path, at)
            ones.append(one)
            twos.append(two)
            print(f"  {path.name}: one {one:.2f} s, two {two:.2f} s ({detail})", file=sys.stderr)
        ratios = [t / o for o, t in zip(ones, twos)]
        print(f"| {path.name} ({path.stat().st_size / 2**20:.0f} MB) | {statistics.median(ones):.2f} "
              f"({min(ones):.2f}–{max(ones):.2f}) | {statistics.median(twos):.2f} ({min(twos):.2f}–{max(twos):.2f}) "
              f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
