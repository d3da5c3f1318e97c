"""Kernel sampling at N=100 on decode-sized steps: one sample's cost and the overhead it gives.

The measurement is ``benchmarks/kernel_sampling.py``'s ``segments`` design: short runs of 8 steps
(``model(ids)`` on one token), plain and with a sampler whose first step is the sampled one,
interleaved; the median paired difference is what one sample costs (profiler start and stop, the
recorded step, the worker reading it). On a GPU the recorder is gpuprobe's own pick (a CUDA-only
``torch.profiler`` session) and each run ends with a device synchronize.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import kernel_sampling as cpu_bench
from benchmarks.gpu import _models
from benchmarks.gpu._ab import Budget, figure

EVERY = 100
SEGMENT = 8


def measure(size: str, budget: Budget) -> dict[str, Any]:
    model = _models.llama(size)
    ids = _models.prompt(model, 1)
    result = cpu_bench.measure(model, ids, every=EVERY, segment=SEGMENT, design="segments",
                               rounds=budget.rounds(), recorders={"sampled": None})
    plain, sampled = result["times"][None], result["times"]["sampled"]
    est = cpu_bench.overhead(sampled, plain, every=EVERY, steps=SEGMENT, hook_ns=result["hook_ns"])
    from gpuprobe import _kernel_sampler

    return {"figures": [
        figure("plain ms/step", [1e3 * t / SEGMENT for t in plain], "ms"),
        figure("segment time ratio, sampled ÷ plain", [b / a for a, b in zip(plain, sampled)], "1"),
        figure("one sample's cost", [1e3 * (b - a) for a, b in zip(plain, sampled)], "ms",
               ci95=[est["sample_ms_lo"], est["sample_ms_hi"]]),
        {"name": f"overhead at N={EVERY}", "unit": "%", "median": est["overhead_pct"],
         "upper95": est["overhead_pct_hi"], "rounds": len(plain),
         "how": "(median sample cost + (N-1) x hook) / (N x median plain step); upper95 from the sample cost's "
                "bootstrap interval"},
    ], "setup": {"model": _models.describe(size), "device": str(model.device), "every": EVERY,
                 "segment_steps": SEGMENT, "step": "model(ids) on 1 token, no cache",
                 "recorder": type(_kernel_sampler._recorder()).__name__, "hook_ns": result["hook_ns"],
                 "plain_step_ms_median": 1e3 * statistics.median(plain) / SEGMENT}}
