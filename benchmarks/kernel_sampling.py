"""Amortized cost of live kernel categories (profile one step in N), on a tiny Llama's decode steps.

A: plain decode steps with ``gpuprobe.step()``; B: the same with ``KernelSampler(N)`` attached.
Rounds alternate A and B (order flipped every round); the ratio is B/A per round, median and spread
reported. Goal: <= 1.01 at N=100.

Usage::

    python benchmarks/kernel_sampling.py [--every 100] [--steps 400] [--rounds 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch
    import transformers

    import gpuprobe
    from gpuprobe.profiling import KernelSampler

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=2048)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 2048, (1, 1))

    def run(sampled: bool) -> float:
        sampler = KernelSampler(args.every).attach() if sampled else None
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(args.steps):
                gpuprobe.step()
                model(ids)
        elapsed = time.perf_counter() - t0
        if sampler is not None:
            sampler.detach()
        return elapsed

    run(False)
    run(True)  # warm-up: the first profiler start loads kineto
    ratios = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {s: run(s) for s in order}
        ratios.append(times[True] / times[False])
    med = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), med, max(ratios)]
    print(f"kernel sampling every {args.every} steps, {args.steps} decode steps x {args.rounds} rounds")
    print(f"sampled/plain time: median {med:.4f}, IQR {q[0]:.4f}-{q[2]:.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"overhead: {100 * (med - 1):+.2f} % (goal <= 1 %)")
    return 0 if med <= 1.01 else 1


if __name__ == "__main__":
    sys.exit(main())
