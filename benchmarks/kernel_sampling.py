"""Amortized cost of live kernel categories (profile one step in N), on a tiny Llama's decode steps.

Two designs, both interleaving A (plain) and B (sampled) many times so the machine's drift cancels:

- ``segments`` (default): short segments of ``--segment`` steps. A B segment's first step is the
  sampled one; the segment ends once the worker thread has read and exported the sample, so the
  segment holds the whole cost: starting the profiler, recording the step, stopping it, and the
  worker competing for the GIL with the next steps. The cost of one sample is the median paired
  difference B − A (with a bootstrap 95 % interval); the N − segment other steps of a period pay only
  the step hook's check, measured separately. Overhead at N = (sample + (N − 1) × hook) / (N × step).
  Short segments keep the noise of each difference small, so the estimate resolves well under 1 %.
- ``blocks``: whole periods of N steps, A plain and B with one sample; reports the median B/A ratio.
  Direct, but on a shared VM the block-to-block spread (several %) can hide a 1 % effect.

``--recorder`` compares the CPU recorders (``legacy``: autograd profiler CPU state, ``kineto``:
torch.profiler's CPU activity) interleaved in the same run; the default is the one gpuprobe picks.

Usage::

    python benchmarks/kernel_sampling.py [--every 100] [--pairs 120] [--segment 8]
        [--recorder auto|legacy|kineto|both] [--design segments|blocks] [--hidden 512] [--layers 8]

Exit status 0 when the estimated overhead at N=--every is <= 1 % (upper end of the interval).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _bootstrap_median(xs: list[float], rounds: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds)]


def measure(model: Any, ids: Any, *, every: int, segment: int, design: str, rounds: Iterable[int],
            recorders: dict[str, Callable[[], Any] | None]) -> dict[str, Any]:
    """Interleaved plain and sampled runs of ``model(ids)`` steps; the timings of each variant.

    Args:
        model, ids: one step is ``model(ids)`` under ``torch.no_grad()``.
        every: the sampling period N.
        segment: steps per run in the ``segments`` design (``blocks`` runs N steps).
        design: ``segments`` or ``blocks`` (the module docstring).
        rounds: round indices (``range(reps)``, or a time budget's rounds).
        recorders: variant name → a factory of the sampler's recorder (``None``: gpuprobe's pick).

    Returns:
        ``steps`` per run, ``times`` (variant → seconds of each round's run; ``None`` is the plain
        variant) and ``hook_ns``, the step hook's cost on a step that is not sampled.
    """
    import torch

    import gpuprobe
    from gpuprobe import profiling
    from gpuprobe.runtime import runtime

    rt = runtime()
    cuda = ids.is_cuda
    variants: list[str | None] = [None, *recorders]

    def run(variant: str | None, steps: int) -> float:
        # Align the step counter so the first step of the run is a sampled one.
        while (rt.steps.index + 1) % every:
            rt.advance_step()  # no sampler attached yet: only counts
        sampler = None
        if variant is not None:
            sampler = profiling.KernelSampler(every)
            make = recorders[variant]
            if make is not None:
                sampler._recorder = make()
            sampler.attach(rt)
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(steps):
                gpuprobe.step()
                model(ids)
        if sampler is not None:
            sampler.detach()  # finishes the sample if still open and waits for the worker: all counted
            assert sampler.samples == 1, "the sample was not taken"
        if cuda:
            torch.cuda.synchronize()  # the run ends when its kernels have
        return time.perf_counter() - t0

    steps = segment if design == "segments" else every
    for v in variants:  # warm-up: the first profiler start loads its libraries
        run(v, steps)
    times: dict[str | None, list[float]] = {v: [] for v in variants}
    for r in rounds:
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            times[v].append(run(v, steps))

    # The hook's cost on a step that is not sampled: an owner check, one modulo and a compare.
    sampler = profiling.KernelSampler(every)
    hook_ns = min(timeit.repeat(lambda: sampler.on_step(1), number=100_000, repeat=5)) / 100_000 * 1e9
    return {"steps": steps, "times": times, "hook_ns": hook_ns}


def overhead(times: list[float], plain: list[float], *, every: int, steps: int, hook_ns: float) -> dict[str, float]:
    """One sample's cost (median paired difference, 95 % interval) and the overhead it gives at N=``every``.

    For the ``segments`` design: overhead = (sample + (N − 1) × hook) / (N × step).
    """
    diffs = [b - a for a, b in zip(plain, times)]  # paired: drift cancels
    med = statistics.median(diffs)
    lo, hi = _bootstrap_median(diffs)
    step_ms = 1e3 * statistics.median(plain) / steps
    period_ms = every * step_ms
    fixed = (every - 1) * hook_ns / 1e6
    return {"sample_ms": 1e3 * med, "sample_ms_lo": 1e3 * lo, "sample_ms_hi": 1e3 * hi, "step_ms": step_ms,
            "overhead_pct": 100 * (1e3 * med + fixed) / period_ms,
            "overhead_pct_hi": 100 * (1e3 * hi + fixed) / period_ms}


def main() -> int:
    import torch
    import transformers

    from gpuprobe import _kernel_sampler

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=120, help="A/B pairs (segments design)")
    ap.add_argument("--segment", type=int, default=8, help="steps per segment")
    ap.add_argument("--blocks", type=int, default=20, help="A/B block pairs (blocks design)")
    ap.add_argument("--design", choices=("segments", "blocks"), default="segments")
    ap.add_argument("--recorder", choices=("auto", "legacy", "kineto", "both"), default="auto")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                                   num_hidden_layers=args.layers, num_attention_heads=8,
                                   num_key_value_heads=4, vocab_size=8192)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 8192, (1, 1))

    factories: dict[str, Callable[[], Any] | None] = {
        "legacy": lambda: _kernel_sampler._CpuLegacyRecorder(torch),
        "kineto": lambda: _kernel_sampler._KinetoRecorder(torch, cuda=False),
        "auto": _kernel_sampler._recorder,
    }
    names = ["legacy", "kineto"] if args.recorder == "both" else [args.recorder]
    reps = args.pairs if args.design == "segments" else args.blocks
    result = measure(model, ids, every=args.every, segment=args.segment, design=args.design, rounds=range(reps),
                     recorders={n: factories[n] for n in names})
    times, steps, hook_ns = result["times"], result["steps"], result["hook_ns"]

    step_ms = 1e3 * statistics.median(times[None]) / steps
    kind = "CUDA" if torch.cuda.is_available() else "CPU, 1 thread"
    print(f"kernel sampling at N={args.every}; design {args.design}: {reps} interleaved rounds of "
          f"{steps} steps; Llama hidden {args.hidden} x {args.layers} layers, step {step_ms:.2f} ms ({kind}); "
          f"hook on an unsampled step {hook_ns:.0f} ns")
    worst = 0.0
    for v in names:
        diffs = [b - a for a, b in zip(times[None], times[v])]  # paired: drift cancels
        ratios = [b / a for a, b in zip(times[None], times[v])]
        med = statistics.median(diffs)
        lo, hi = _bootstrap_median(diffs)
        q = statistics.quantiles(ratios, n=4)
        chosen = f" (auto picks {type(_kernel_sampler._recorder()).__name__})" if v == "auto" else ""
        if args.design == "segments":
            est = overhead(times[v], times[None], every=args.every, steps=steps, hook_ns=hook_ns)
            print(f"  {v}{chosen}: one sample costs {est['sample_ms']:.2f} ms (95 % CI {est['sample_ms_lo']:.2f}-"
                  f"{est['sample_ms_hi']:.2f}); segment ratio median {statistics.median(ratios):.4f}, "
                  f"IQR {q[0]:.4f}-{q[2]:.4f}")
            print(f"    overhead at N={args.every}: {est['overhead_pct']:.2f} % (upper {est['overhead_pct_hi']:.2f} %) "
                  f"of {args.every} steps of {step_ms:.2f} ms; <= 1 % needs N >= "
                  f"{max(est['sample_ms_hi'], 0) / step_ms / 0.01:.0f} at this step time")
            worst = max(worst, est["overhead_pct_hi"])
        else:
            rmed = statistics.median(ratios)
            print(f"  {v}{chosen}: block time sampled/plain median {rmed:.4f}, IQR {q[0]:.4f}-{q[2]:.4f}; "
                  f"paired B-A {1e3 * med:.1f} ms (95 % CI {1e3 * lo:.1f}-{1e3 * hi:.1f})")
            worst = max(worst, 100 * (rmed - 1))
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
