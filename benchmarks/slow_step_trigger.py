"""Per-step cost of the slow-step trigger (``GPUPROBE_PROFILE_SLOW_STEP``), on CPU.

The trigger is a step hook: at every step start it reads the clock, keeps the start time per thread
and compares the previous step's time with a threshold decided beforehand (a fixed time, or a
percentile recomputed on the background thread). This measures ``runtime.advance_step()`` — what the
transformers integration calls at every step start — without the trigger, with a fixed threshold and
with a percentile one, as the best of several blocks of many steps; and the background recomputation
of a percentile over the last 1,000 steps.

Run::

    python benchmarks/slow_step_trigger.py
    python benchmarks/slow_step_trigger.py --markdown benchmarks/RESULTS-slow-step.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuprobe  # noqa: E402
from gpuprobe._on_demand import _instances  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402
from gpuprobe.testing import reset  # noqa: E402

VARIANTS = {
    "off": {},
    "fixed (250ms)": {"profile_slow_step": "250ms"},
    # No background round during the measurement: the threshold stays out of reach, so no capture
    # starts, and every step still pays the comparison.
    "percentile (p99)": {"profile_slow_step": "p99", "collect_interval": 3600},
}


def per_step_ns(steps: int, blocks: int) -> float:
    advance = runtime().advance_step
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            advance()
        best = min(best, (time.perf_counter_ns() - t0) / steps)
    return best


def tick_us(repeat: int) -> float:
    reset(profile_signal="off", profile_slow_step="p99", collect_interval=3600)
    for _ in range(2000):
        gpuprobe.step()
    slow = _instances[runtime()].slow
    assert slow is not None
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        slow.tick()  # type: ignore[attr-defined]
        best = min(best, (time.perf_counter_ns() - t0) / 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--markdown", help="write the results table to this file")
    args = ap.parse_args()
    rows = []
    base = None
    for name, settings in VARIANTS.items():
        reset(profile_signal="off", **settings)
        ns = per_step_ns(args.steps, args.blocks)
        base = ns if base is None else base
        rows.append(f"| {name} | {ns:.0f} | {ns - base:+.0f} |")
    tick = tick_us(200)
    reset()
    lines = [
        "# Slow-step trigger: cost per step",
        "",
        f"`python benchmarks/slow_step_trigger.py` — Python {platform.python_version()}, {platform.machine()}, "
        f"best of {args.blocks} blocks of {args.steps:,} steps.",
        "",
        "| trigger | `advance_step()` ns | extra ns per step |",
        "|---|---|---|",
        *rows,
        "",
        f"Recomputing a p99 threshold over the last 1,000 steps (background thread, every "
        f"`collect_interval`): {tick:.0f} µs.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
