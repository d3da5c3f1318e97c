"""The pytest plugin's budgets: what a budgeted block costs against the same block without the plugin, and
whether one budget test gives the same verdict and counts run after run on a loaded machine.

- Cost: greedy ``generate()`` of ``--tokens`` new tokens on a Llama built from a config (random weights),
  on the CPU with one torch thread, timed by the thread's CPU time (all of a block's work runs on it; other
  processes on a shared machine disturb it far less than the wall clock). Each round times the plain call
  and the same call inside a budgeted block (``gpuprobe.testing.budget.Measurement`` and the budget check,
  what the ``gpuprobe_budget`` fixture runs), the order alternating; the table gives the median per-round
  ratio with its interquartile range and extremes. The model is not instrumented outside the blocks (a
  block instruments it and gives it back), so a block also pays instrumenting it at its first call.
- Determinism: one budget test file run ``--repeats`` times by pytest in processes of their own, with
  ``--load`` busy processes (``while True: pass``) beside it; each run writes the counts it measured.

Usage::

    python benchmarks/budget_plugin.py [--rounds 11] [--tokens 16] [--repeats 20] [--load 1] [--write benchmarks/RESULTS-budget.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import quartiles, write_section  # noqa: E402

SETS: dict[str, dict[str, Any]] = {
    "syncs per step, recompiles, graph breaks, concatenations": {
        "host_syncs_per_step": {"logits_processor": 0}, "recompiles": 0, "graph_breaks": 0,
        "dynamic_cache_concats": 10**6},
    "host_syncs_per_step": {"host_syncs_per_step": 10**6},
    "dynamic_cache_concats": {"dynamic_cache_concats": 10**6},
    "recompiles, graph_breaks": {"recompiles": 0, "graph_breaks": 0},
    "launches_per_step": {"launches_per_step": 10**6},
    "python_calls_per_step": {"python_calls_per_step": 10**6},
    "every count (a baseline)": {name: 10**9 for name in (
        "host_syncs", "host_syncs_per_step", "host_syncs_all", "host_syncs_per_step_all", "launches_per_step",
        "recompiles", "graph_breaks", "dynamic_cache_concats", "python_calls_per_step", "peak_memory_bytes")},
}
MODELS = {"hidden 64 x 2 layers": (64, 2), "hidden 512 x 8 layers": (512, 8)}


def _model(hidden: int, layers: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                                      num_attention_heads=8 if hidden >= 512 else 4, num_key_value_heads=2,
                                      vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


def cost(rounds: int, tokens: int) -> list[dict[str, Any]]:
    import torch

    from gpuprobe.testing import budget as b

    torch.set_num_threads(1)
    rows = []
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    for model_name, (hidden, layers) in MODELS.items():
        model = _model(hidden, layers)

        def plain() -> None:
            model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None)

        for set_name, budgets in SETS.items():
            parsed = b.parse_budgets(budgets)

            def budgeted() -> None:
                with b.Measurement(tuple(parsed)) as m:
                    plain()
                b.check(parsed, m.results)

            plain(), budgeted()  # warm-up: caches, Dynamo's import, the sync audit's kernels
            ratios, base = [], []
            for r in range(rounds):
                times = {}
                order = (("plain", plain), ("budgeted", budgeted))
                for key, fn in order if r % 2 == 0 else order[::-1]:
                    t0 = time.thread_time_ns()
                    fn()
                    times[key] = time.thread_time_ns() - t0
                ratios.append(times["budgeted"] / times["plain"])
                base.append(times["plain"] / 1e6)
            q1, med, q3 = quartiles(ratios)
            rows.append({"model": model_name, "budgets": set_name, "ratio": med, "q1": q1, "q3": q3,
                         "min": min(ratios), "max": max(ratios), "plain_ms": quartiles(base)[1]})
            print(f"{model_name:22} {set_name:58} {med:.3f}x ({q1:.3f}-{q3:.3f})", flush=True)
    return rows


TEST = '''
import json, os
import torch, transformers

def test_budgets(gpuprobe_budget):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, pad_token_id=0, eos_token_id=2)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with gpuprobe_budget(host_syncs=0, host_syncs_per_step=0, host_syncs_all=100, host_syncs_per_step_all=1,
                         launches_per_step=1000, python_calls_per_step=5000, dynamic_cache_concats=100,
                         recompiles=0, graph_breaks=0) as block:
        model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None)
    with open(os.environ["COUNTS_FILE"], "w") as f:
        json.dump({name: [m.value(), m.components()] for name, m in block.results.items()}
                  | {name + " (expected)": [m.expected.value(), m.expected.components()]
                     for name, m in block.results.items() if m.expected is not None}, f, sort_keys=True)
'''


def determinism(repeats: int, load: int) -> dict[str, Any]:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpuprobe-budget-") as tmp:
            Path(tmp, "test_budgets.py").write_text(textwrap.dedent(TEST), encoding="utf-8")
            for i in range(repeats):
                out = Path(tmp, f"counts-{i}.json")
                env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")},
                       "COUNTS_FILE": str(out)}
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                                       "no:randomly", "test_budgets.py"], cwd=tmp, env=env, capture_output=True,
                                      text=True)
                verdict = "passed" if proc.returncode == 0 else f"exit {proc.returncode}"
                counts = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
                runs.append({"verdict": verdict, "counts": counts, "s": time.perf_counter() - t0})
                print(f"run {i + 1}/{repeats}: {verdict} in {runs[-1]['s']:.1f} s", flush=True)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    first = runs[0]["counts"]
    return {"runs": runs, "verdicts": sorted({r["verdict"] for r in runs}),
            "identical": all(r["counts"] == first for r in runs), "counts": first,
            "load": load, "cpus": os.cpu_count()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds per model and budget set")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per generate() call")
    ap.add_argument("--repeats", type=int, default=20, help="pytest runs of the determinism check")
    ap.add_argument("--load", type=int, default=1, help="busy processes beside them")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--skip-determinism", action="store_true")
    ap.add_argument("--write", type=Path, help="also put the tables in this Markdown file (their own sections)")
    args = ap.parse_args()
    if not args.skip_cost:
        rows = cost(args.rounds, args.tokens)
        lines = ["| model (CPU, 1 thread) | budgets | plain call (ms, thread CPU) | budgeted ÷ plain: median (IQR) "
                 "| min–max | goal <= 1.2x |", "|---|---|---:|---:|---:|---|"]
        for r in rows:
            lines.append(f"| {r['model']} | {r['budgets']} | {r['plain_ms']:.1f} | **{r['ratio']:.3f}x** "
                         f"({r['q1']:.3f}–{r['q3']:.3f}) | {r['min']:.3f}–{r['max']:.3f} | "
                         f"{'yes' if r['ratio'] <= 1.2 else 'no'} |")
        lines += ["", f"greedy generate() of {args.tokens} new tokens from 8; {args.rounds} rounds per row, plain "
                  "and budgeted alternating; thread CPU time; Python " + sys.version.split()[0]
                  + f"; {os.cpu_count()} CPUs, shared with other work."]
        table = "\n".join(lines)
        print(table)
        if args.write:
            write_section(args.write, "What a budgeted block costs", f"python benchmarks/budget_plugin.py "
                          f"--rounds {args.rounds} --tokens {args.tokens} --skip-determinism", table)
    if not args.skip_determinism:
        d = determinism(args.repeats, args.load)
        lines = ["| runs | busy processes beside them | verdicts | counts identical in every run |",
                 "|---:|---:|---|---|",
                 f"| {len(d['runs'])} | {d['load']} (on {d['cpus']} CPUs) | {', '.join(d['verdicts'])} | "
                 f"{'yes' if d['identical'] else 'NO'} |", "",
                 "The counts every run measured (value, and by component):", "", "| count | value | by component |",
                 "|---|---:|---|"]
        for name, (value, parts) in (d["counts"] or {}).items():
            by = ", ".join(f"{k} {v}" for k, v in parts.items()) or "—"
            lines.append(f"| `{name}` | {value} | {by} |")
        runs_s = sorted(r["s"] for r in d["runs"])
        lines += ["", f"One test file (a tiny Llama, 16 new tokens, nine budgets) run by pytest in a process of its "
                  f"own each time; {runs_s[0]:.0f}–{runs_s[-1]:.0f} s a run."]
        table = "\n".join(lines)
        print(table)
        if args.write:
            write_section(args.write, "The same verdict and counts, run after run", "python benchmarks/"
                          f"budget_plugin.py --repeats {args.repeats} --load {args.load} --skip-cost", table)
        if not d["identical"] or d["verdicts"] != ["passed"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
