"""Instrumented ÷ plain tokens/s of continuous batching under ``generate_batch``.

The requests are ``benchmarks/continuous_batching.py``'s workload (prompts of 16-48 tokens, greedy,
a paged cache with room for all of them, 128 tokens a step); a run is one ``generate_batch()`` call
(``warmup=False``: the manager of each call is sized and started inside the timed call, in both
variants alike), timed to its return. Variants: the model uninstrumented and ``instrument(model)``.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import continuous_batching as cpu_bench
from benchmarks.gpu import _models
from benchmarks.gpu._ab import Budget, alternate, figure, throughput_ratios

WORKLOADS = {"gpu": {"requests": 64, "tokens": 64}, "tiny": {"requests": 4, "tokens": 4}}


def measure(size: str, budget: Budget) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from gpuprobe.integrations.transformers import instrument, uninstrument

    hf_logging.set_verbosity_error()
    model = _models.llama(size)
    work = WORKLOADS[size]
    prompts, gen, cache = cpu_bench.workload(work["requests"], work["tokens"])
    set_variant = {"baseline": lambda: uninstrument(model),
                   "instrumented": lambda: instrument(model, model_name="bench")}

    def run() -> float:
        t0 = time.perf_counter()
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cache, warmup=False)
        _models.synchronize()
        elapsed = time.perf_counter() - t0
        tokens = sum(len(r.generated_tokens) for r in out.values())
        if tokens != len(prompts) * gen.max_new_tokens:
            raise RuntimeError(f"generate_batch returned {tokens} tokens, expected "
                               f"{len(prompts) * gen.max_new_tokens}")
        return elapsed / tokens

    try:
        times = alternate(cpu_bench.VARIANTS, lambda v: set_variant[v](), run, budget, warmup=1)
    finally:
        uninstrument(model)
    return {"figures": [figure("plain ms/token (whole batch)", [1e3 * t for t in times["baseline"]], "ms"),
                        *(figure(f"tokens/s ratio, {v} ÷ plain", r, "1")
                          for v, r in throughput_ratios(times, "baseline").items())],
            "setup": {"model": _models.describe(size), "device": str(model.device), **work,
                      "max_batch_tokens": cache.max_batch_tokens, "page_size": cache.page_size,
                      "num_blocks": cache.num_blocks}}
