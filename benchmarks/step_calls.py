"""Python calls and CUDA event records per decode step of an instrumented generate(), this tree against another revision.

Both figures are counts, not timings: no machine noise moves them, so one run of each tree is the
measurement. Each tree runs in its own interpreter (the other revision extracted with ``git archive``).

- Python calls: counted with ``sys.setprofile`` (C calls not counted) during greedy ``generate()`` of a
  small Llama (random weights, built from a config) on the CPU; per decode step = the difference
  between a call of ``2 * T`` and one of ``T`` new tokens, divided by ``T`` (what a call's set-up and end
  cost cancels out; ``T`` a multiple of 8 holds the same number of layer-sampled steps). Reported: the
  calls whose code is gpuprobe's (its files, and the wrappers it generates), and all calls against the
  uninstrumented run (negative where gpuprobe saves transformers work: its stand-ins carry a ready
  signature that transformers would otherwise parse on every step).
- Event records: ``torch.cuda.Event.record`` calls per decode step on the simulated CUDA
  (``gpuprobe.testing.simcuda``, every CPU tensor taken as living on cuda:0), the same difference.
- Host time per decode step (a timing, so interleaved): each tree's own ``seam_cost`` of
  ``benchmarks/generate_overhead.py`` (the seams driven around no-op originals, aggregation included),
  one interpreter per tree and round, the trees alternating, timed by the thread's CPU time; medians,
  interquartile ranges and the per-round difference. On a GPU this is what a CUDA-graph decode step pays for the instrumentation.

Usage::

    python benchmarks/step_calls.py --against 451a150 [--tokens 16] [--rounds 6] [--write benchmarks/RESULTS-probe.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import git_archive, quartiles, write_section  # noqa: E402

CHILD = r"""
import json, os, sys
sys.path.insert(0, TREE)
tokens = int(sys.argv[1])
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import gpuprobe
from gpuprobe.integrations.transformers import instrument, uninstrument
assert gpuprobe.__file__.startswith(TREE), gpuprobe.__file__

torch.manual_seed(0)
torch.set_num_threads(1)
model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=256, bos_token_id=1, eos_token_id=2,
    pad_token_id=0)).eval()
ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
where = os.path.dirname(gpuprobe.__file__)

def count(fn, only):
    n = 0
    def prof(frame, event, arg):
        nonlocal n
        if event == "call":
            f = frame.f_code.co_filename
            if not only or f.startswith(where) or f.startswith("<gpuprobe"):
                n += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n

MODES = {"greedy": {}, "greedy, min_new_tokens": "min"}

def generate(n, mode):
    kw = {"min_new_tokens": n} if mode == "min" else {}
    out = model.generate(ids, max_new_tokens=n, pad_token_id=0, do_sample=False, **kw)
    assert out.shape[1] - ids.shape[1] == n, "stopped early: choose another prompt"

def per_step(mode, only):
    def one(n):
        gpuprobe.collect()  # an empty buffer: no drain inside the counted call
        return count(lambda: generate(n, mode), only)
    one(tokens)  # warm-up
    return (one(2 * tokens) - one(tokens)) / tokens

VARIANTS = {"steps": {}, "steps + layers every 8": {"layers": True, "layer_every": 8}}
out = {"calls": {}, "records": {}}
for mode_name, mode in MODES.items():
    uninstrument(model)
    plain = per_step(mode, False)
    for v, kw in VARIANTS.items():
        instrument(model, model_name="bench", **kw)
        out["calls"][f"{mode_name} | {v}"] = [per_step(mode, True), per_step(mode, False) - plain]
uninstrument(model)

from gpuprobe.testing import reset
from gpuprobe.testing.simcuda import simulated_cuda
with simulated_cuda(1, cpu_tensors_on=0) as sim:
    reset()
    torch.cuda.current_device()
    for v, kw in {**VARIANTS, "steps + layers every step": {"layers": True, "layer_every": 1}}.items():
        instrument(model, model_name="bench", **kw)
        def recs(n):
            before = sim.stats.calls["Event.record"]
            generate(n, None)
            return sim.stats.calls["Event.record"] - before
        recs(tokens)
        out["records"][v] = (recs(2 * tokens) - recs(tokens)) / tokens
        uninstrument(model)
    reset()
print(json.dumps(out))
"""


COST = r"""
import json, sys
sys.path[:0] = [TREE, TREE + "/benchmarks"]
from generate_overhead import seam_cost
import time
import gpuprobe.integrations.transformers  # gpuprobe's own clock is bound at import: the host clock
assert gpuprobe.__file__.startswith(TREE), gpuprobe.__file__
# Why the thread's CPU time for seam_cost's own timing: other processes on a shared machine then
# disturb it far less than the wall clock (all of the loop's work runs on this thread).
time.perf_counter_ns = time.thread_time_ns
print(json.dumps(seam_cost(steps=int(sys.argv[1]), rounds=int(sys.argv[2]))))
"""


def child(tree: Path, source: str, *argv: object) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_"))}
    env["PYTHONPATH"] = str(tree)
    code = f"TREE = {str(tree)!r}\n" + source
    out = subprocess.run([sys.executable, "-c", code, *map(str, argv)], env=env, capture_output=True, text=True,
                         check=True, cwd=str(tree))
    return json.loads(out.stdout.strip().splitlines()[-1])




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD", help="the other revision (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=16, help="T: calls of T and 2T new tokens (a multiple of 8)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating interpreters per tree for the host time")
    ap.add_argument("--steps", type=int, default=3000, help="decode steps per seam_cost round")
    ap.add_argument("--write", type=Path, help="also put the tables in this Markdown file (its own section)")
    args = ap.parse_args()
    cost: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="gpuprobe-against-") as tmp:
        base = git_archive(args.against, Path(tmp), "gpuprobe", "benchmarks")
        old = child(base, CHILD, args.tokens)
        new = child(ROOT, CHILD, args.tokens)
        for r in range(args.rounds):
            order = [("old", base), ("new", ROOT)]
            for name, tree in order if r % 2 == 0 else order[::-1]:  # neither tree always runs first
                cost[name].append(child(tree, COST, args.steps, 3)["added_us"])
    rev = args.against
    lines = [f"| decoding | variant | gpuprobe's calls per step, {rev} | this tree | all calls vs plain, {rev} "
             "| this tree |", "|---|---|---:|---:|---:|---:|"]
    for key, (mine, total) in new["calls"].items():
        o_mine, o_total = old["calls"][key]
        mode, variant = key.split(" | ")
        lines.append(f"| {mode} | {variant} | {o_mine:+.2f} | **{mine:+.2f}** | {o_total:+.2f} | {total:+.2f} |")
    lines += ["", f"| variant | event records per decode step (simulated CUDA), {rev} | this tree |", "|---|---:|---:|"]
    for key, n in new["records"].items():
        lines.append(f"| {key} | {old['records'][key]:.2f} | **{n:.2f}** |")
    lines += ["", f"| host time added per decode step, no model (us, thread CPU time) | {rev} | this tree | difference per round |",
              "|---|---:|---:|---:|"]
    q_old, q_new = quartiles(cost["old"]), quartiles(cost["new"])
    q_diff = quartiles([n - o for n, o in zip(cost["new"], cost["old"])])
    lines.append(f"| median (IQR) | {q_old[1]:.2f} ({q_old[0]:.2f}–{q_old[2]:.2f}) | **{q_new[1]:.2f}** "
                 f"({q_new[0]:.2f}–{q_new[2]:.2f}) | {q_diff[1]:+.2f} ({q_diff[0]:+.2f}–{q_diff[2]:+.2f}) |")
    goal_steps = max(new["calls"]["greedy | steps"]) <= 10  # gpuprobe's own calls, and all against plain
    goal_layers = max(new["calls"]["greedy | steps + layers every 8"]) <= 20
    lines += ["", "| goal | met |", "|---|---|",
              f"| greedy, steps: <= +10 Python calls per decode step (gpuprobe's own, and all against plain) | {'yes' if goal_steps else 'NO'} |",
              f"| greedy, steps + layers every 8: <= +20 | {'yes' if goal_layers else 'NO'} |",
              "", f"Counts (deterministic), one interpreter per tree; T = {args.tokens} new tokens; Python "
              f"{sys.version.split()[0]}; 2-layer Llama (hidden 64) on the CPU ({os.cpu_count()} CPUs, shared). "
              f"Host time: {args.rounds} alternating interpreters per tree, each the median of 3 rounds of "
              f"{args.steps} steps."]
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_section(args.write, f"Python calls and event records per decode step, against {rev}",
                      f"python benchmarks/step_calls.py --against {rev} --tokens {args.tokens} --rounds "
                      f"{args.rounds} --steps {args.steps}", table)
    return 0 if goal_steps and goal_layers else 1


if __name__ == "__main__":
    sys.exit(main())
