"""Overhead of gpuprobe's continuous-batching integration on throughput (tokens/s), on CPU.

Two Llamas built from configs (no download): *small* (hidden 256, 4 layers), whose steps take a few
milliseconds, and *tiny* (hidden 32, 1 layer), where transformers' own scheduling and bookkeeping
dominate each step — the case where gpuprobe's per-step work weighs most. Each run sends a batch of
requests (prompts of 16-48 tokens; small: 32 requests of 32 new tokens, tiny: 64 of 96, so that a run
lasts about a second) through a paged cache with room for all of them and 128 tokens per step, so steps
mix prefill and decode and requests wait for their turn; it is timed from their arrival to the last
result (the manager is started before and stopped after). Runs are interleaved — uninstrumented,
instrumented — in alternating order, so slow drifts of a shared machine hit both alike; each repetition
gives one ratio (instrumented tokens/s over the uninstrumented run of the same repetition); the table
reports the median ratio, its interquartile range and a 95% bootstrap interval of the median, from
wall-clock time (what a user sees) and from the process's CPU time (``time.process_time``: every
thread, gpuprobe's own work included; with one torch thread, machine noise disturbs it less). Each
repetition keeps the best of a few adjacent runs per variant.

A last table measures the integration's own host cost per step without a model: the real seams
driven around no-op stand-ins for transformers' batch processor, for 1, 8 and 64 requests a step
(decoding, streaming their outputs), against the same stand-ins uninstrumented; the runtime's
aggregation of the records is included.

Run::

    python benchmarks/continuous_batching.py            # full run (~6 minutes)
    python benchmarks/continuous_batching.py --quick    # a smoke run
    python benchmarks/continuous_batching.py --markdown benchmarks/RESULTS-serving.md

Goal: ratio >= 0.98.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("baseline", "instrumented")
# model -> its size and the requests of one run (sized so that a run lasts about a second on a CPU core)
MODELS = {"small": {"hidden": 256, "layers": 4, "requests": 32, "tokens": 32},
          "tiny": {"hidden": 32, "layers": 1, "requests": 64, "tokens": 96}}


def build(hidden: int, layers: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=2048, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)).eval()


def workload(requests: int, new: int) -> tuple[list[list[int]], Any, Any]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    prompts = [[3 + (i * 31 + j * 7) % 2000 for j in range(16 + (i * 11) % 33)] for i in range(requests)]
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cache = ContinuousBatchingConfig(num_blocks=1024, page_size=16, max_batch_tokens=128)
    return prompts, gen, cache


def run_once(model: Any, prompts: list[list[int]], gen: Any, cache: Any) -> tuple[float, float]:
    """Tokens per second of one batch of requests, from their arrival to the last result: by the wall
    clock, and by the process's CPU time.

    The manager is started before and stopped after the timed part: its set-up and tear-down (a garbage
    collection, a wait of up to 0.1 s for the loop to notice the stop) would otherwise weigh as much as
    the generation itself.
    """
    with model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cache,
                                                   block=True, timeout=10) as manager:
        c0, t0 = time.process_time(), time.perf_counter()
        manager.add_requests(prompts, max_new_tokens=gen.max_new_tokens)
        tokens = finished = 0
        while finished < len(prompts):
            result = manager.get_result(timeout=30)
            if result is None:
                raise RuntimeError("continuous batching stopped before every request finished")
            if result.is_finished():
                finished += 1
                tokens += len(result.generated_tokens)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return tokens / wall, tokens / max(cpu, 1e-9)


def quantiles(xs: list[float]) -> tuple[float, float, float, float, float]:
    """First quartile, median, third quartile, and a 95% bootstrap interval of the median."""
    import random

    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(2000))
    return q[0], statistics.median(xs), q[2], meds[50], meds[1949]


def bench(name: str, model: Any, reps: int, block: int, requests: int, new: int) -> list[dict[str, Any]]:
    """Interleaved runs of both variants; one ratio per repetition."""
    from gpuprobe.integrations.transformers import instrument, uninstrument

    prompts, gen, cache = workload(requests, new)
    set_variant = {"baseline": lambda: uninstrument(model),
                   "instrumented": lambda: instrument(model, model_name="bench")}
    for v in VARIANTS:  # warm-up: first calls allocate and fill caches
        set_variant[v]()
        run_once(model, prompts[:4], gen, cache)
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(reps):
        best_w = dict.fromkeys(VARIANTS, 0.0)
        best_c = dict.fromkeys(VARIANTS, 0.0)
        for b in range(block):
            order = VARIANTS if (r * block + b) % 2 == 0 else VARIANTS[::-1]  # no variant always first
            for v in order:
                set_variant[v]()
                w, c = run_once(model, prompts, gen, cache)
                # Why the best of a block: on a shared machine a run is only ever slowed down by others;
                # the best of a few adjacent runs is the least disturbed one.
                best_w[v] = max(best_w[v], w)
                best_c[v] = max(best_c[v], c)
        for v in VARIANTS:
            wall[v].append(best_w[v])
            cpu[v].append(best_c[v])
    set_variant["baseline"]()
    rows = []
    for v in VARIANTS:
        row = {"model": name, "variant": v, "tokens_per_s": statistics.median(wall[v]), "reps": reps}
        for clock, tps in (("wall", wall), ("cpu", cpu)):
            row[clock] = quantiles([a / b for a, b in zip(tps[v], tps["baseline"])])
        rows.append(row)
    return rows


def steps_per_call(model: Any, requests: int, new: int) -> int:
    """Scheduler steps of one run (counted by gpuprobe itself)."""
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.testing import reset

    reset()
    instrument(model, model_name="count")
    try:
        run_once(model, *workload(requests, new))
        return sum(p.count for d in gpuprobe.collect() if d.spec.name == "gpuprobe.batch.requests" for p in d.points)
    finally:
        uninstrument(model)
        reset()


# -- the integration's own cost per step, without a model ------------------------------------------------

class _Router:
    def deliver(self, output: Any) -> None:
        pass

    def deliver_batch(self, outputs: list[Any]) -> None:
        pass


class _Ledger:
    cached_blocks: dict[int, None] = {}


class _Allocator:
    index, bytes_per_block, ledger = 0, 4096, _Ledger()


class _Pool:
    def __init__(self) -> None:
        self.free_sectors = list(range(100))

    def count_free_blocks(self, index: int) -> int:
        return 7


class _Cache:
    num_sectors, bytes_per_sector, num_blocks = 1000, 4096, 1000

    def __init__(self) -> None:
        self.pool = _Pool()
        self.cache_allocators = {"full_attention": _Allocator()}


class _Scheduler:
    def __init__(self, batch: list[Any]) -> None:
        self.batch = batch
        self.active_requests = {fs.state.request_id: fs.state for fs in batch}
        self.waiting_requests: dict[str, Any] = {}

    def schedule_batch(self, token_budget: int, cache_budget: int) -> tuple[list[Any], bool, int, int]:
        return self.batch, True, len(self.batch), 0

    def set_request_cancellation(self, request_id: str) -> None:
        pass


class _Processor:
    """Stands in for transformers' ContinuousBatchProcessor: decoding ``n`` streaming requests a step."""

    def __init__(self, n: int, router: _Router) -> None:
        from transformers.generation.continuous_batching.requests import (FutureRequestState, RequestState,
                                                                          RequestStatus)

        states = []
        for i in range(n):
            state = RequestState(request_id=f"r{i}", initial_tokens=list(range(3, 19)), streaming=True,
                                 max_new_tokens=10**9)
            state._status = RequestStatus.DECODING
            state.generated_tokens = [5]
            state.position_offset = 17
            states.append(state)
        self.batch = [FutureRequestState(s, True, {}, 1) for s in states]
        self.scheduler = _Scheduler(self.batch)
        self.cache = _Cache()
        self.model_device = None
        self.router = router
        self.outputs = [s.to_generation_output() for s in states]

    def prepare_next_batch(self) -> bool:
        self.scheduler.schedule_batch(128, 0)
        for fs in self.batch:
            fs.state.position_offset += 1
        return True

    def _generation_step(self, model: Any) -> None:
        pass

    def update_batch(self) -> None:
        self.router.deliver_batch(self.outputs)


class _Manager:
    def __init__(self, n: int) -> None:
        self.output_router = _Router()
        self.processor = _Processor(n, self.output_router)
        self.batch_processor = None

    def _create_batch_processor(self) -> Any:
        return self.processor

    def _run_generation_loop(self) -> None:
        pass


def seam_cost(n: int, steps: int, rounds: int) -> dict[str, float]:
    """Host microseconds per step: the observed stand-ins against the plain ones (medians of ``rounds``)."""
    from gpuprobe.integrations._transformers.continuous import ServingState
    from gpuprobe.integrations._transformers.series import RequestSeries
    from gpuprobe.runtime import runtime

    rt = runtime()
    serving = ServingState(rt, "seams", RequestSeries(rt, "seams"))

    def loop(manager: Any) -> float:
        bp = manager._create_batch_processor()
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            bp.prepare_next_batch()
            bp._generation_step(None)
            bp.update_batch()
        rt.drain()
        return (time.perf_counter_ns() - t0) / steps / 1e3

    observed, plain = [], []
    for _ in range(rounds):
        manager = serving.observe(_Manager(n))
        manager.__dict__["_gpuprobe_loop"].begin()
        observed.append(loop(manager))
        plain.append(loop(_Manager(n)))
    serving.close()
    return {"observed_us": statistics.median(observed), "plain_us": statistics.median(plain),
            "added_us": statistics.median(a - b for a, b in zip(observed, plain))}


def table(rows: list[dict[str, Any]], steps: dict[str, int]) -> str:
    lines = [
        "| model | variant | tokens/s (wall, median) | ms/step | ratio, wall clock: median (IQR) [95% CI] "
        "| ratio, process CPU time: median (IQR) [95% CI] |",
        "|---|---|---:|---:|---|---|",
    ]
    for r in rows:
        cells = []
        for clock in ("wall", "cpu"):
            q1, med, q3, lo, hi = r[clock]
            cells.append("1 (reference)" if r["variant"] == "baseline"
                         else f"**{med:.3f}** ({q1:.3f} – {q3:.3f}) [{lo:.3f} – {hi:.3f}]")
        size = MODELS[r["model"]]
        step_ms = size["requests"] * size["tokens"] / r["tokens_per_s"] / steps[r["model"]] * 1e3
        lines.append(f"| {r['model']} | {r['variant']} | {r['tokens_per_s']:.0f} | {step_ms:.2f} | {cells[0]} | "
                     f"{cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; returns 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15, help="interleaved repetitions per model")
    p.add_argument("--block", type=int, default=3, help="runs of each variant per repetition (the best counts)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 keeps a shared machine quieter)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--quick", action="store_true", help="2 repetitions of one run (a smoke run)")
    p.add_argument("--markdown", help="also write the tables to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.block = 2, 1

    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    import gpuprobe
    from gpuprobe.testing import reset

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    reset()
    rows, steps = [], {}
    for name in args.models.split(","):
        size = MODELS[name]
        model = build(size["hidden"], size["layers"])
        steps[name] = steps_per_call(model, size["requests"], size["tokens"])
        rows.extend(bench(name, model, args.reps, args.block, size["requests"], size["tokens"]))
        print(f"{name} done", file=sys.stderr)
    header = (f"gpuprobe {gpuprobe.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
              f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
              f"{args.threads} torch thread(s). Each run: prompts of 16-48 tokens, at most 128 tokens a step; "
              + "; ".join(f"{n}: {MODELS[n]['requests']} requests of {MODELS[n]['tokens']} new tokens in {s} steps"
                          for n, s in steps.items())
              + f". {args.reps} interleaved repetitions, each the best of {args.block} runs per variant.")
    costs = {n: seam_cost(n, steps=200 if args.quick else 2000, rounds=3 if args.quick else 7) for n in (1, 8, 64)}
    cost_lines = ["| requests per step | observed stand-ins, µs/step | plain stand-ins, µs/step | added, µs/step |",
                  "|---:|---:|---:|---:|"]
    cost_lines += [f"| {n} | {c['observed_us']:.1f} | {c['plain_us']:.1f} | **{c['added_us']:.1f}** |"
                   for n, c in costs.items()]
    text = (header + "\n\n" + table(rows, steps)
            + "\n\nThe integration's own host cost per step, without a model (decoding requests that stream their "
              "outputs, aggregation included):\n\n" + "\n".join(cost_lines))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
