"""What distinct names cost: memory, ``collect()`` and an idle exporter after a program made up many names.

Each row runs in a fresh interpreter (``python -I``, in a temporary folder): gpuprobe is imported and
warmed up (200 names, one ``collect()``), VmRSS is read from ``/proc/self/status`` after ``gc.collect()``,
then the row's names are used once each and VmRSS is read again. Then ``collect()`` is timed twice (the
first aggregates what the names recorded, the second is what every later scrape pays), and a JSONL
exporter is attached and the process's CPU time (``time.process_time()``, every thread) is read over an
idle wait: what the background thread spends while nothing happens.

Rows:

- ``with probe(name)``: ``with probe(f"name{i}"):`` once per name;
- ``@probe functions``: a function per name (``__qualname__`` set), decorated, called once, dropped;
- ``exception types``: one probe whose call raises an exception of a new type name each time;
- ``model names``: one tiny transformers model (built from a config) instrumented under a new
  ``model_name`` each time (``--models`` of them; each instrument() prepares every series of a model).

With ``--against REV`` the same rows run on the tree of that revision too (``git archive``).

Usage::

    python benchmarks/name_bounds.py [--names 200000] [--models 3000] [--idle 10] [--against HEAD]
        [--write benchmarks/RESULTS-names.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, git_archive, write_section  # noqa: E402

CHILD = r"""
import gc, json, os, sys, time
sys.path.insert(0, TREE)
row, n, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def rss_mb():
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

import gpuprobe
from gpuprobe import probe

def with_names(prefix, count):
    for i in range(count):
        with probe(f"{prefix}{i}"):
            pass

def functions(prefix, count):
    for i in range(count):
        def f(x, y=2):
            return x + y
        f.__qualname__ = f"{prefix}{i}"
        probe(f)(1)

class Failure(Exception):
    pass

failing = probe("failing")
def error_types(prefix, count):
    for i in range(count):
        Failure.__qualname__ = f"{prefix}{i}"
        try:
            with failing:
                raise Failure()
        except Failure:
            pass

if row == "model names":
    import torch, transformers
    from gpuprobe.integrations.transformers import instrument
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, max_position_embeddings=64))
    ids = torch.tensor([[1, 2, 3]])
    def models(prefix, count):
        for i in range(count):
            instrument(model, model_name=f"{prefix}{i}")
        model.generate(ids, max_new_tokens=2, do_sample=False)
    use = models
else:
    use = {"with probe(name)": with_names, "@probe functions": functions, "exception types": error_types}[row]

use("warm", 200)
gpuprobe.collect()
before = rss_mb()
t0 = time.perf_counter()
use("name", n)
used_s = time.perf_counter() - t0
grown = rss_mb() - before
collects = []
for _ in range(2):
    t0 = time.perf_counter()
    gpuprobe.collect()
    collects.append((time.perf_counter() - t0) * 1e3)
from gpuprobe.exporters.jsonl import JsonlExporter
exporter = JsonlExporter(os.path.join(os.getcwd(), "idle.jsonl")).attach()
cpu0 = time.process_time()
time.sleep(idle)
idle_cpu = time.process_time() - cpu0
exporter.close()
print(json.dumps({"rss_mb": grown, "per_name_kb": grown * 1024 / n, "used_us": used_s / n * 1e6,
                  "collect_first_ms": collects[0], "collect_ms": collects[1], "idle_cpu_s": idle_cpu}))
"""

ROWS = ("with probe(name)", "@probe functions", "exception types", "model names")


def measure(tree: Path, row: str, n: int, idle: float) -> dict[str, float]:
    """One row in a fresh isolated interpreter importing gpuprobe from ``tree``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_"))}
    with tempfile.TemporaryDirectory(prefix="gpuprobe-names-") as cwd:
        out = subprocess.run([sys.executable, "-I", "-c", f"TREE = {str(tree)!r}\n" + CHILD, row, str(n), str(idle)],
                             env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{row} on {tree}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=200_000, help="distinct names per row (default: %(default)s)")
    ap.add_argument("--models", type=int, default=3_000, help="distinct model names (default: %(default)s)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle exporter measured (default: %(default)s)")
    ap.add_argument("--against", help="also measure this revision's tree")
    ap.add_argument("--rows", nargs="*", choices=ROWS, default=list(ROWS), help="the rows to run (default: all)")
    ap.add_argument("--write", type=Path, help="also put the table (Markdown) in this file, in its own section")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpuprobe-baseline-") as tmp:
        trees = [("this tree", ROOT)]
        if args.against:
            trees.append((args.against, git_archive(args.against, Path(tmp), "gpuprobe")))
        lines = ["| tree | what | names | RSS growth MB | KB per name | us per name | first collect() ms | "
                 "collect() ms | idle JSONL exporter CPU s / wait |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for row in args.rows:
            n = args.models if row == "model names" else args.names
            for label, tree in trees:
                r = measure(tree, row, n, args.idle)
                lines.append(f"| {label} | {row} | {n:,} | {r['rss_mb']:.1f} | {r['per_name_kb']:.3f} | "
                             f"{r['used_us']:.1f} | {r['collect_first_ms']:.2f} | {r['collect_ms']:.2f} | "
                             f"{r['idle_cpu_s']:.3f} / {args.idle:g} s |")
                print(lines[-1], flush=True)
    lines += ["", f"VmRSS after gc.collect(), before and after the names (after a warm-up of 200 names); idle: "
              f"time.process_time() over {args.idle:g} s with a JSONL exporter attached "
              f"(collect_interval 0.5 s); Python {sys.version.split()[0]}"]
    table = "\n".join(lines)
    print(table)
    if args.write:
        command = "python benchmarks/name_bounds.py" + (f" --against {args.against}" if args.against else "")
        write_section(args.write, "distinct names", command, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
