"""Instrumented ÷ plain ``generate()`` tokens/s: eager decode, and a CUDA-graph decode.

The variants and the timed call are those of ``benchmarks/generate_overhead.py``: the uninstrumented
model, step-level metrics (``instrument(model)``) and step-level + layers sampled every 8 steps,
greedy decoding of a fixed number of new tokens. The CUDA-graph decode is transformers' own: the
static cache with ``CompileConfig(mode="reduce-overhead", fullgraph=True)``, so each decode step
replays a captured graph and gpuprobe's host work is the largest share of a step it can be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import generate_overhead as cpu_bench
from benchmarks.gpu import _models
from benchmarks.gpu._ab import Budget, alternate, figure, throughput_ratios


def _measure(size: str, budget: Budget, tokens: int, extra: dict[str, Any], warmup: int) -> dict[str, Any]:
    model = _models.llama(size)
    ids = _models.prompt(model, 16)
    mode = {**cpu_bench.MODES["greedy"], **extra}
    set_variant = cpu_bench.setters(model)

    def run() -> float:
        tokens_per_s, _ = cpu_bench.run_once(model, ids, tokens, mode)
        return 1 / tokens_per_s

    graphs = _compiled_graphs()
    warm: list[int | None] = [None]
    try:
        times = alternate(cpu_bench.VARIANTS, lambda v: set_variant[v](), run, budget, warmup=warmup,
                          on_warm=lambda: warm.__setitem__(0, graphs()))
    finally:
        set_variant["baseline"]()
    after = graphs()
    # transformers compiles the decode step (PreTrainedModel.get_compiled_call keeps it as _compiled_call)
    # only where it can (a CUDA device, a compilable cache), and otherwise warns once and runs eagerly.
    compiled = "_compiled_call" in model.__dict__
    if "compile_config" in extra and model.device.type == "cuda" and not compiled:
        raise RuntimeError("transformers did not compile the decode step: these would be eager figures")
    base = times["baseline"]
    figures = [figure("plain ms/token", [1e3 * t for t in base], "ms")]
    for v, ratios in throughput_ratios(times, "baseline").items():
        figures.append(figure(f"tokens/s ratio, {v} ÷ plain", ratios, "1"))
    return {"figures": figures,
            "setup": {"model": _models.describe(size), "device": str(model.device), "new_tokens": tokens,
                      "prompt": 16, "variants": list(cpu_bench.VARIANTS), "generate_kwargs": sorted(extra),
                      "decode_compiled": compiled,
                      # Dynamo graphs compiled after the warm-up: 0, or the rounds include recompilations
                      "graphs_compiled_in_rounds": None if after is None or warm[0] is None else after - warm[0]}}


def _compiled_graphs() -> Callable[[], int | None]:
    """A reader of how many graphs Dynamo has compiled in this process (None where torch does not say)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return lambda: None
    return lambda: int(counters["stats"]["unique_graphs"])


def eager(size: str, budget: Budget) -> dict[str, Any]:
    """Eager decode (dynamic cache, no compilation)."""
    return _measure(size, budget, tokens=32 if size == "gpu" else 8, extra={}, warmup=2 if size == "gpu" else 1)


def graph(size: str, budget: Budget) -> dict[str, Any]:
    """CUDA-graph decode: static cache + reduce-overhead compile (captures in the warm-up runs)."""
    import transformers

    compiled = {"cache_implementation": "static",
                "compile_config": transformers.CompileConfig(mode="reduce-overhead", fullgraph=True)}
    return _measure(size, budget, tokens=64, extra=compiled, warmup=3)
