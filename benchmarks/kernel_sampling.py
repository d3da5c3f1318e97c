"""Amortized cost of live kernel categories (profile one step in N), on a tiny Llama's decode steps.

Blocks of N decode steps alternate: A blocks run plain (``gpuprobe.step()`` + forward), B blocks have a
``KernelSampler(N)`` attached, so each B block holds exactly one sampled step (started, stopped,
read and exported). Interleaving A and B blocks many times cancels the machine's drift; reported:
the median B/A block-time ratio with its spread, and the fixed cost of one sample in ms
(median of paired B − A), from which the overhead at any step time follows. Goal: <= 1 % at N=100.

Usage::

    python benchmarks/kernel_sampling.py [--every 100] [--blocks 30] [--hidden 512] [--layers 8]
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
    ap.add_argument("--blocks", type=int, default=30, help="A/B block pairs")
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

    def block(sampled: bool) -> float:
        # Align the step counter so a B block's first step is the sampled one.
        rt = gpuprobe.collector.runtime()
        rt.step_index = ((rt.step_index // args.every) + 1) * args.every - 1
        sampler = KernelSampler(args.every).attach() if sampled else None
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(args.every):
                gpuprobe.step()
                model(ids)
        if sampler is not None:
            sampler.detach()  # finishes and exports the sample: part of the block's cost
        return time.perf_counter() - t0

    block(False)
    block(True)  # warm-up: the first profiler start loads kineto
    a_times, b_times, ratios = [], [], []
    for r in range(args.blocks):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {s: block(s) for s in order}
        a_times.append(got[False])
        b_times.append(got[True])
        ratios.append(got[True] / got[False])
    step_ms = 1e3 * statistics.median(a_times) / args.every
    med = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4)
    sample_ms = 1e3 * statistics.median(b - a for a, b in zip(a_times, b_times))  # paired: drift cancels
    print(f"kernel sampling every {args.every} steps; {args.blocks} interleaved A/B blocks of {args.every} steps; "
          f"Llama hidden {args.hidden} x {args.layers} layers, step {step_ms:.2f} ms (CPU, 1 thread)")
    print(f"block time sampled/plain: median {med:.4f}, IQR {q[0]:.4f}-{q[2]:.4f}")
    print(f"one sample costs {sample_ms:.1f} ms -> overhead at N={args.every}: "
          f"{100 * sample_ms / (args.every * step_ms):.2f} % of {args.every} steps of {step_ms:.2f} ms; "
          f"<= 1 % needs steps >= {max(sample_ms, 0) / args.every / 0.01:.1f} ms at N={args.every} "
          f"or N >= {max(sample_ms, 0) / step_ms / 0.01:.0f} at this step time")
    return 0 if med <= 1.01 else 1


if __name__ == "__main__":
    sys.exit(main())
