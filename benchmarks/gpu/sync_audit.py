"""The sync audit at N=100 (and N=1) against the audit off, on an instrumented model's ``generate()``.

The variants and the timed call are ``benchmarks/sync_audit.py``'s: ``gpuprobe.configure(sync_audit=N)``
on the same instrumented model, greedy runs of 100 new tokens, every run starting on a step index
that is a multiple of 100, so a run at N=100 holds exactly one audited step.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

from benchmarks import sync_audit as cpu_bench
from benchmarks.gpu import _models
from benchmarks.gpu._ab import Budget, alternate, figure, throughput_ratios

TOKENS = 100


def measure(size: str, budget: Budget) -> dict[str, Any]:
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.runtime import runtime

    model = instrument(_models.llama(size), model_name="bench")
    ids = _models.prompt(model, 16)
    rt = runtime()
    while (rt.steps.index + 1) % 100:  # runs start at a multiple of 100 (earlier parts advanced the clock)
        rt.advance_step()

    def set_variant(v: str) -> None:
        gpuprobe.configure(sync_audit=cpu_bench.VARIANTS[v])

    def run() -> float:
        gc.collect()  # each run pays for its own garbage, not for the previous run's
        tokens_per_s, _ = cpu_bench.run_once(model, ids, TOKENS, cpu_bench.MODES["greedy"])
        return 1 / tokens_per_s

    try:
        with warnings.catch_warnings():
            # The audit reports each new sync site once; the reports are not what is measured.
            warnings.simplefilter("ignore", RuntimeWarning)
            times = alternate(list(cpu_bench.VARIANTS), set_variant, run, budget, warmup=1)
    finally:
        gpuprobe.configure(sync_audit=0)
        uninstrument(model)
    figures = [figure("audit off ms/token", [1e3 * t for t in times["off"]], "ms")]
    figures += [figure(f"tokens/s ratio, {v} ÷ off", r, "1") for v, r in throughput_ratios(times, "off").items()]
    return {"figures": figures,
            "setup": {"model": _models.describe(size), "device": str(model.device), "new_tokens": TOKENS,
                      "baseline": "the same instrumented model with the audit off",
                      "variants": list(cpu_bench.VARIANTS)}}
