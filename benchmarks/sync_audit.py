"""Overhead of the sync audit on generate() throughput (tokens/s), on CPU.

A small Llama built from a config (no download), instrumented, generates with the sync audit off
(the baseline) and on at N=100 and N=1 (``gpuprobe.configure(sync_audit=N)``; ``--variants`` adds
others). Runs of every variant are interleaved, in an order shuffled anew for every block (seeded), so
slow drifts of a shared machine hit every variant alike and no variant always follows the same one. Each run generates a multiple of 100 tokens, and every run (baseline included) advances the
global step counter by as many steps, so a run at N=100 always holds the same number of audited
steps. Each repetition gives one ratio per variant (its tokens/s over the baseline's of the same
repetition); the table reports the median ratio and the interquartile range of those ratios (and a
95% bootstrap interval of the median), by the wall clock and by the CPU time of the generating thread
(``time.thread_time``; with one torch thread all the work runs there). Each repetition keeps the best
of a few adjacent runs per variant.

From N=1 (every step audited) the cost of one audited step follows; the expected overhead at N is
that cost divided by N. On a shared machine the runs' tokens/s drift by several percent from run to
run, more than the 1 % to resolve at N=100, so a second, paired measurement is made inside runs: with
N=100, every step's host duration is read back in order (``gpuprobe.step.duration``, from an
in-memory exporter), and each audited step, and the three steps after it, are compared with the
median of the unaudited decode steps around them (±12 steps); these runs are shifted by half a period,
so that the audited steps are decode steps. Their extra time over the run's total is the
overhead at N=100, free of drifts slower than a few steps.

Run::

    python benchmarks/sync_audit.py                               # full run (~10 minutes)
    python benchmarks/sync_audit.py --quick                       # a smoke run
    python benchmarks/sync_audit.py --markdown benchmarks/RESULTS-sync-audit.md

Goal: ratio >= 0.99 at N=100.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {"off": 0, "N=100": 100, "N=1": 1}

MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sampling": {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1},
}


def build_model(hidden: int, layers: int, vocab: int) -> Any:
    """A small Llama with random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        max_position_embeddings=4096)).eval()


def run_once(model: Any, ids: Any, tokens: int, mode: dict[str, Any]) -> tuple[float, float]:
    """Tokens per second of one generate() call: by the wall clock, and by this thread's CPU time."""
    c0, t0 = time.thread_time(), time.perf_counter()
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0, **mode)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    n = (out.shape[1] - ids.shape[1]) * out.shape[0]
    assert n == tokens
    return n / wall, n / max(cpu, 1e-9)


def quantiles(xs: list[float]) -> tuple[float, float, float, float, float]:
    """First quartile, median, third quartile, and a 95% bootstrap interval of the median."""
    import random

    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(2000))
    return q[0], statistics.median(xs), q[2], meds[50], meds[1949]


def bench(model: Any, mode_name: str, reps: int, block: int, tokens: int, prompt: int) -> list[dict[str, Any]]:
    """Interleaved runs of every variant; one ratio per repetition and variant."""
    import random

    import torch

    import gpuprobe
    from gpuprobe.runtime import runtime

    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, prompt), generator=torch.Generator().manual_seed(1))
    mode = MODES[mode_name]
    names = list(VARIANTS)

    def set_variant(v: str) -> None:
        gpuprobe.configure(sync_audit=VARIANTS[v])

    for v in names:  # warm-up: first calls allocate and fill caches, the audit builds its operator set
        set_variant(v)
        run_once(model, ids, 100, mode)
    wall: dict[str, list[float]] = {v: [] for v in names}
    cpu: dict[str, list[float]] = {v: [] for v in names}
    rng = random.Random(0)
    for r in range(reps):
        best_w = dict.fromkeys(names, 0.0)
        best_c = dict.fromkeys(names, 0.0)
        for b in range(block):
            # Why shuffled, not rotated: a rotation keeps the cyclic order, so each variant would always
            # follow the same one (an N=1 run leaves the most garbage behind for the next run's collector).
            for v in rng.sample(names, len(names)):
                set_variant(v)
                assert runtime().steps.index % 100 == 99  # every run starts at a multiple of 100
                gc.collect()  # each run pays for its own garbage, not for the previous run's
                w, c = run_once(model, ids, tokens, mode)
                # Why the best of a block: on a shared machine a run is only ever slowed down by
                # others; the best of a few adjacent runs is the least disturbed one.
                best_w[v] = max(best_w[v], w)
                best_c[v] = max(best_c[v], c)
        for v in names:
            wall[v].append(best_w[v])
            cpu[v].append(best_c[v])
    set_variant("off")
    rows = []
    for v in names:
        row = {"mode": mode_name, "variant": v, "tokens_per_s": statistics.median(wall[v]),
               "step_ms": 1e3 / statistics.median(wall[v]), "reps": reps}
        for clock, tps in (("wall", wall), ("cpu", cpu)):
            row[clock] = quantiles([a / b for a, b in zip(tps[v], tps["off"])])
        rows.append(row)
    return rows


def paired(model: Any, mode_name: str, runs: int, tokens: int, prompt: int) -> dict[str, Any]:
    """Overhead at N=100 from the step durations of the same runs (see the module docstring)."""
    import torch

    import gpuprobe
    from gpuprobe.runtime import runtime
    from gpuprobe.testing import InMemoryExporter

    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, prompt), generator=torch.Generator().manual_seed(1))
    gpuprobe.configure(sync_audit=100)
    # Shift the runs by half a period, so the audited steps are decode steps in the middle of runs (a
    # prefill is longer than the decode steps around it, and would pass for audit overhead).
    for _ in range(50):
        gpuprobe.step()
    base = runtime().steps.index + 1
    runtime().drain()  # the steps of earlier runs must not reach the exporter
    with InMemoryExporter() as exp:
        for _ in range(runs):
            gc.collect()
            run_once(model, ids, tokens, MODES[mode_name])
        steps = [ob.value for ob in exp.observations("gpuprobe.step.duration", clock="host")]
    gpuprobe.configure(sync_audit=0)
    for _ in range(50):  # back to runs that start at a multiple of 100
        gpuprobe.step()
    assert len(steps) == runs * tokens

    def plain(j: int) -> bool:  # a decode step that is neither audited nor among the 3 after one
        return j % tokens != 0 and (base + j) % 100 > 3

    audited, after = [], []
    for j in range(len(steps)):
        if (base + j) % 100 != 0:
            continue
        ref = statistics.median(steps[k] for k in range(max(0, j - 12), min(len(steps), j + 13)) if plain(k))
        audited.append(steps[j] - ref)
        after.append(sum(steps[k] - ref for k in range(j + 1, min(len(steps), j + 4))))
    decode = [steps[j] for j in range(len(steps)) if j % tokens != 0]
    extra = sum(audited) + sum(after)
    return {"mode": mode_name, "steps": len(steps), "audited": len(audited), "step_ms": 1e3 * statistics.median(decode),
            "audited_ms": 1e3 * statistics.median(audited), "after_ms": 1e3 * statistics.median(after),
            "overhead": extra / (sum(steps) - extra)}


def paired_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| mode | steps (audited) | median decode step (ms) | audited step: extra (ms, median) "
             "| next 3 steps: extra (ms, median) | overhead at N=100 |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['steps']} ({r['audited']}) | {r['step_ms']:.2f} | {r['audited_ms']:.2f} "
                     f"({r['audited_ms'] / r['step_ms']:.2f} steps) | {r['after_ms']:.2f} | **{r['overhead']:.2%}** |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | sync audit | tokens/s (wall, median) | ms/token | ratio, wall clock: median (IQR) [95% CI] "
        "| ratio, thread CPU time: median (IQR) [95% CI] |",
        "|---|---|---:|---:|---|---|",
    ]
    for r in rows:
        cells = []
        for clock in ("wall", "cpu"):
            q1, med, q3, lo, hi = r[clock]
            cells.append("1 (reference)" if r["variant"] == "off"
                         else f"**{med:.4f}** ({q1:.4f} – {q3:.4f}) [{lo:.4f} – {hi:.4f}]")
        lines.append(f"| {r['mode']} | {r['variant']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.2f} | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """The cost of one audited step (from N=1) and the overhead it predicts at N=100."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        by = {r["variant"]: r for r in rows if r["mode"] == mode}
        every = by["N=1"]["cpu"][1]
        step_ms = by["off"]["step_ms"]
        extra = 1 / every - 1  # an audited step costs (1 + extra) steps
        predicted = 1 / (1 + extra / 100)
        measured = by["N=100"]["cpu"][1]
        out.append(f"- {mode}: an audited step costs {1 + extra:.2f} plain steps (+{extra * step_ms:.2f} ms on a "
                   f"{step_ms:.2f} ms step), which predicts a ratio of {predicted:.4f} at N=100; measured "
                   f"{measured:.4f} (thread CPU time), goal >= 0.99: **{'met' if measured >= 0.99 else 'missed'}**.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; returns 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=30, help="interleaved repetitions per mode")
    p.add_argument("--block", type=int, default=2, help="runs of each variant per repetition (the best counts)")
    p.add_argument("--tokens", type=int, default=200, help="new tokens per generate() call (a multiple of 100)")
    p.add_argument("--prompt", type=int, default=16, help="prompt length")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 keeps a shared machine quieter)")
    p.add_argument("--modes", default="greedy,sampling")
    p.add_argument("--variants", default="", help="more audit periods to measure, e.g. 10,1000")
    p.add_argument("--paired-runs", type=int, default=30, help="runs at N=100 for the paired measurement")
    p.add_argument("--quick", action="store_true", help="2 repetitions of 100 tokens (a smoke run)")
    p.add_argument("--markdown", help="also write the table to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.block, args.tokens = 2, 1, 100
    if args.tokens % 100:
        p.error("--tokens must be a multiple of 100")
    for n in filter(None, args.variants.split(",")):
        VARIANTS[f"N={int(n)}"] = int(n)

    import torch
    import transformers

    import gpuprobe
    from gpuprobe.integrations.transformers import instrument
    from gpuprobe.testing import reset

    # The audit reports each new sync site once; the reports are not what is measured.
    warnings.simplefilter("ignore", RuntimeWarning)
    torch.set_num_threads(args.threads)
    reset()
    model = instrument(build_model(args.hidden, args.layers, args.vocab), model_name="bench")
    rows = []
    pairs = []
    for mode in args.modes.split(","):
        rows.extend(bench(model, mode, args.reps, args.block, args.tokens, args.prompt))
        pairs.append(paired(model, mode, 4 if args.quick else args.paired_runs, args.tokens, args.prompt))
        print(f"{mode} done", file=sys.stderr)
    header = (f"gpuprobe {gpuprobe.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
              f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
              f"{args.threads} torch thread(s); Llama: hidden {args.hidden}, {args.layers} layers, vocab "
              f"{args.vocab}; {args.tokens} new tokens after a {args.prompt}-token prompt per run; {args.reps} "
              f"interleaved repetitions, each the best of {args.block} runs per variant. Baseline: the same "
              f"instrumented model with the audit off.")
    text = (header + "\n\nBetween runs (tokens/s ratios):\n\n" + table(rows) + "\n\n" + summary(rows)
            + f"\n\nInside runs (step durations at N=100, {args.paired_runs if not args.quick else 4} runs per mode):"
            + "\n\n" + paired_table(pairs))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
