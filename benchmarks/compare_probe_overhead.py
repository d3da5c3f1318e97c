"""Probe overhead of this tree against another revision, both measured in the same processes.

The baseline revision is extracted with ``git archive`` and renamed ``gpuprobe_baseline`` (its absolute
``gpuprobe`` imports rewritten), so one interpreter imports both and times the same rows of each,
interleaved round-robin: a bare call, a run-time-disabled probe, an enabled probe, a ``with probe()``
block. Per row, the table gives each tree's median and the median of the per-round ratios (this tree
/ baseline), with their interquartile range; ratios taken side by side in one process are what the
goals are checked on. ``GPUPROBE_DISABLE=1`` is read at import, so the disabled-by-env rows run in
their own interpreters.

With ``--cuda sim`` both trees run on the simulated CUDA of this tree (``gpuprobe.testing.simcuda``),
installed and initialized before either is imported, so an enabled call with a device span records a
pair of device events; no GPU work is queued, so each event is complete once recorded and the pools
never run dry. Two more rows then: what a hand-written NVTX range with two ``torch.cuda.Event``
records adds (``nvtx.push_range``, two events made once and recorded around the call, never read), and
a probe that takes a device span on every call (``device_every=1`` where the tree has it). The device
span's cost is given as a ratio of what each adds over a bare call, per round: ``(probe - bare) /
(hand-written - bare)``, with its interquartile range. On the simulation an event record is Python
code of the simulation, so the ratio says how gpuprobe's own work compares; real-GPU figures are
measured on a GPU (``tests/cuda``, ``docs/gpu.md``).

Usage::

    python benchmarks/compare_probe_overhead.py --against HEAD [--processes 4] [--rounds 15]
        [--calls 50000] [--cuda sim] [--write benchmarks/RESULTS-runtime.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import git_archive, quartiles, write_section  # noqa: E402

CHILD = r"""
import json, statistics, sys, time
sys.path[:0] = [ROOT, BASE]
calls, rounds, mode, cuda = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if cuda == "sim":
    import torch
    from gpuprobe.testing.simcuda import SimulatedCuda
    sim = SimulatedCuda(devices=2).install()
    torch.cuda.current_device()
import gpuprobe
import gpuprobe_baseline

def bare(): return None

rows = {}  # (tree, row) -> callable
for tree, pkg in (("this tree", gpuprobe), ("baseline", gpuprobe_baseline)):
    def bare_here(): return None
    rows[(tree, "bare call")] = bare_here
    if mode == "env_disabled":
        rows[(tree, "@probe disabled by env")] = pkg.probe(bare)
        continue
    rows[(tree, "@probe runtime-disabled")] = pkg.probe("rt_off")(bare)
    rows[(tree, "@probe enabled")] = pkg.probe("enabled")(bare)
    block = pkg.probe("block")
    def with_block(block=block):
        with block:
            return None
    rows[(tree, "with probe() block")] = with_block
    if cuda == "sim":
        try:
            every = pkg.probe("every_call", device_every=1)
        except TypeError:  # a tree without device sampling: every call takes a span
            every = pkg.probe("every_call")
        rows[(tree, "@probe, a device span every call")] = every(bare)
        import nvtx, torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        def hand_written(push=nvtx.push_range, pop=nvtx.pop_range, start=start, end=end):
            push("hand", domain="bench")
            start.record()
            try:
                return bare()
            finally:
                end.record()
                pop(domain="bench")
        rows[(tree, "hand-written NVTX + 2 events")] = hand_written

def run(fn, n):
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        fn()
    return (pc() - t0) / n

samples = {k: [] for k in rows}
for r in range(rounds):
    for key, fn in rows.items():
        tree, row = key
        pkg = gpuprobe if tree == "this tree" else gpuprobe_baseline
        if row == "@probe runtime-disabled":
            pkg.disable()
        samples[key].append(run(fn, calls))
        if row == "@probe runtime-disabled":
            pkg.enable()
        pkg.collect()
print(json.dumps({"samples": [[t, r, v] for (t, r), v in samples.items()],
                  "timing": {"this tree": gpuprobe.info()["timing"], "baseline": gpuprobe_baseline.info()["timing"]}}))
"""


def extract(rev: str, into: Path) -> Path:
    """``gpuprobe`` at ``rev``, as the package ``gpuprobe_baseline`` under ``into``."""
    git_archive(rev, into, "gpuprobe")
    package = into / "gpuprobe_baseline"
    (into / "gpuprobe").rename(package)
    absolute = re.compile(r"\b(from|import) gpuprobe\b")
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(absolute.sub(r"\1 gpuprobe_baseline", text), encoding="utf-8")
    return into


def child(base: Path, mode: str, calls: int, rounds: int, cuda: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_"))}
    if mode == "env_disabled":
        env["GPUPROBE_DISABLE"] = "1"
    code = f"ROOT = {str(ROOT)!r}\nBASE = {str(base)!r}\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code, str(calls), str(rounds), mode, cuda], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD", help="the baseline revision (default: %(default)s)")
    ap.add_argument("--processes", type=int, default=4, help="interpreters per mode")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds in each interpreter")
    ap.add_argument("--calls", type=int, default=50_000, help="calls per row and round")
    ap.add_argument("--cuda", choices=("none", "sim"), default="none")
    ap.add_argument("--write", type=Path, help="also put the table (Markdown) in this file, in its own section")
    args = ap.parse_args()

    times: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, list[float]] = {}
    added: dict[tuple[str, str], list[float]] = {}  # (tree, row) -> per round: (row - bare) / (hand - bare)
    timing: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpuprobe-baseline-") as tmp:
        base = extract(args.against, Path(tmp))
        for mode in ("plain", "env_disabled"):
            for _ in range(args.processes):
                res = child(base, mode, args.calls, args.rounds, args.cuda)
                timing = res["timing"]
                per = {(tree, row): values for tree, row, values in res["samples"]}
                for (tree, row), values in per.items():
                    name = f"{row} ({mode})" if row == "bare call" else row
                    times.setdefault((tree, name), []).extend(values)
                    if tree == "this tree":
                        old = per[("baseline", row)]
                        ratios.setdefault(name, []).extend(n / o for n, o in zip(values, old))
                    hand = per.get((tree, "hand-written NVTX + 2 events"))
                    if hand is not None and row.startswith("@probe"):
                        bare_values = per[(tree, "bare call")]
                        added.setdefault((tree, row), []).extend(
                            (v - b) / (h - b) for v, b, h in zip(values, bare_values, hand))
    lines = [f"| what | {args.against} ns | this tree ns | ratio this / {args.against} (median, IQR) |",
             "|---|---:|---:|---:|"]
    med: dict[str, tuple[float, float]] = {}
    for name, rs in ratios.items():
        old, new = statistics.median(times[("baseline", name)]), statistics.median(times[("this tree", name)])
        med[name] = (old, new)
        lo, mid, hi = quartiles(rs)
        lines.append(f"| {name} | {old:,.0f} | {new:,.0f} | {mid:.3f} ({lo:.3f}–{hi:.3f}) |")
    bare = med["bare call (plain)"][1]
    enabled_ratio = quartiles(ratios["@probe enabled"])
    goals = [
        ("disabled by env <= 1.1x bare", med["@probe disabled by env"][1] <= 1.1 * med["bare call (env_disabled)"][1]),
        ("runtime-disabled <= bare + 100 ns", med["@probe runtime-disabled"][1] <= bare + 100),
        (f"enabled not slower than {args.against} (median ratio <= 1.05)", enabled_ratio[1] <= 1.05),
    ]
    if args.cuda == "sim":
        lines += ["", "| tree | what | added over bare / added by hand-written NVTX + 2 events (median, IQR) |",
                  "|---|---|---:|"]
        for tree, label in (("baseline", args.against), ("this tree", "this tree")):
            for row in ("@probe enabled", "@probe, a device span every call"):
                lo, mid, hi = quartiles(added[(tree, row)])
                lines.append(f"| {label} | {row} | {mid:.3f} ({lo:.3f}–{hi:.3f}) |")
        span = quartiles(added[("this tree", "@probe, a device span every call")])[1]
        default = quartiles(added[("this tree", "@probe enabled")])[1]
        goals.append(("a hot probe, default device sampling, adds <= 0.6x hand-written NVTX + 2 events "
                      "(simulated CUDA)", default <= 0.6))
        goals.append(("a device span every call adds <= 0.6x hand-written NVTX + 2 events (simulated CUDA)",
                      span <= 0.6))
    lines += ["", "| goal | met |", "|---|---|"] + [f"| {g} | {'yes' if ok else 'NO'} |" for g, ok in goals]
    lines += ["", f"device timing: {args.against}: {timing.get('baseline')}; this tree: {timing.get('this tree')} "
              f"(CUDA: {args.cuda})",
              f"{args.processes} interpreters per mode x {args.rounds} interleaved rounds x {args.calls:,} calls; "
              f"both trees in every interpreter; Python {sys.version.split()[0]}"]
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_section(args.write, f"this tree against {args.against}, CUDA: {args.cuda}",
                      f"python benchmarks/compare_probe_overhead.py --against {args.against} --cuda {args.cuda} "
                      f"--processes {args.processes} --rounds {args.rounds} --calls {args.calls}", table)
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
