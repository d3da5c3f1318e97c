"""What a request's record and its span cost the program, against the same run without them.

Three figures, each in fresh interpreters (``python -I``), a 2-layer Llama (hidden 64) on the CPU, one torch
thread, greedy ``generate()``:

- **Python calls per decode step** on the step's thread, counted with ``sys.setprofile`` (C calls not
  counted): ``2T`` against ``T`` new tokens, divided by ``T``, with traces off and on. Counts: one run each.
- **Tokens per second**, traces off against traces on (spans over OTLP/HTTP to a local receiver that
  decodes them): interleaved rounds, one interpreter per round and variant, ``--rounds`` of each; the
  ratio's median and range.
- **The program's time per finished request**: the record (``ModelState.request_record`` and
  ``RequestLog.add``, on the request's thread) timed over ``--requests`` requests; with traces on, that
  plus the exporter thread's own CPU time per exported request (the CPU clock of ``gpuprobe-traces``),
  which is what the interpreter lock lends it.

Goals: +0 Python calls per decode step with traces on; tokens/s with traces on >= 0.98x off; a record
<= 20 us, a record and its exported span <= 30 us + the record.

Run::

    python benchmarks/request_cost.py --rounds 6 --write benchmarks/RESULTS-requests.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section  # noqa: E402

CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/tests")
mode, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
receiver = None
if mode == "on":
    from otlp_receiver import Receiver
    receiver = Receiver(signal="traces")
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = receiver.url
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
from transformers import LlamaConfig, LlamaForCausalLM
import gpuprobe
from gpuprobe.integrations.transformers import instrument
from gpuprobe.runtime import runtime
gpuprobe.configure(traces="on" if mode == "on" else "off")
model = instrument(LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=256, bos_token_id=1, eos_token_id=2,
    pad_token_id=0)).eval(), model_name="cost")
ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
def gen(tokens):
    return model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
gen(4)
out = {}
if what == "calls":
    where = os.path.dirname(gpuprobe.__file__)
    def count(tokens):
        calls = 0
        def prof(frame, event, arg):
            nonlocal calls
            if event == "call" and frame.f_code.co_filename.startswith(where):
                calls += 1
        sys.setprofile(prof)
        try:
            gen(tokens)
        finally:
            sys.setprofile(None)
        return calls
    T = 16
    out["calls_per_step"] = (count(2 * T) - count(T)) / T
elif what == "speed":
    t0 = time.perf_counter()
    for _ in range(n):
        gen(16)
    out["tokens_per_s"] = 16 * n / (time.perf_counter() - t0)
elif what == "record":
    state = model.__dict__["_gpuprobe_state"] if "_gpuprobe_state" in model.__dict__ else None
    from gpuprobe.integrations._transformers.generate import state as state_mod
    st = next(v for v in model.__dict__.values() if isinstance(v, state_mod.ModelState))
    spent = [0.0]
    original = st.request_record
    def timed(*a, **k):
        t = time.perf_counter_ns()
        record = original(*a, **k)
        spent[0] += time.perf_counter_ns() - t
        return record
    st.request_record = timed
    log = runtime().requests
    add = log.add
    def timed_add(record):
        t = time.perf_counter_ns()
        add(record)
        spent[0] += time.perf_counter_ns() - t
    log.add = timed_add
    exporter_cpu = 0.0
    for _ in range(n):
        gen(1)
    if mode == "on":
        from gpuprobe.exporters.traces import TraceExporter
        ex = next(i for i in runtime().lifecycle.items() if isinstance(i, TraceExporter))
        thread = ex._thread
        ex.flush()
        # the exporter thread's CPU time, from its own CPU clock (ns; /proc's ticks are 10 ms)
        exporter_cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        flushed = ex.exported
        out["exported"] = flushed
        out["exporter_us_per_request"] = exporter_cpu / max(1, flushed) * 1e6
    out["record_us"] = spent[0] / n / 1e3
print(json.dumps(out))
if receiver is not None:
    receiver.close()
"""


def run(mode: str, what: str, n: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run([sys.executable, "-I", "-c", f"ROOT = {str(ROOT)!r}\n" + CHILD, mode, what,
                               str(n)], capture_output=True, text=True, env=env, cwd=work, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=20, help="generate() calls per speed round")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    calls = {m: run(m, "calls", 0)["calls_per_step"] for m in ("off", "on")}
    ratios, speeds = [], {"off": [], "on": []}
    for r in range(args.rounds):
        pair = {}
        for m in (("off", "on") if r % 2 == 0 else ("on", "off")):
            pair[m] = run(m, "speed", args.calls)["tokens_per_s"]
            speeds[m].append(pair[m])
        ratios.append(pair["on"] / pair["off"])
    cost = {m: run(m, "record", args.requests) for m in ("off", "on")}
    lines = [
        f"{args.rounds} interleaved rounds of {args.calls} calls of 16 new tokens each per variant; "
        f"{args.requests} one-token requests for the time per request; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs.", "",
        "| figure | traces off | traces on | goal |", "|---|---:|---:|---|",
        f"| gpuprobe's Python calls per decode step | {calls['off']:.2f} | {calls['on']:.2f} | +0 |",
        f"| tokens/s, median (range) | {statistics.median(speeds['off']):.0f} ({min(speeds['off']):.0f}-"
        f"{max(speeds['off']):.0f}) | {statistics.median(speeds['on']):.0f} ({min(speeds['on']):.0f}-"
        f"{max(speeds['on']):.0f}) | |",
        f"| on ÷ off, per round: median (range) | | {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
        f"{max(ratios):.3f}) | >= 0.98 |",
        f"| a finished request's record, µs on its thread | {cost['off']['record_us']:.1f} | "
        f"{cost['on']['record_us']:.1f} | <= 20 |",
        f"| its span, µs of the exporter thread per request | | {cost['on'].get('exporter_us_per_request', 0):.1f} "
        f"({int(cost['on'].get('exported', 0))} exported) | <= 30 |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        write_section(args.write, "Requests: records and spans", "python benchmarks/request_cost.py " +
                      " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
