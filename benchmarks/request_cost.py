"""What a request's record and its span cost the program, against the same run without them.

Three figures, each in fresh interpreters (``python -I``), a 2-layer Llama (hidden 64) on the CPU, one torch
thread, greedy ``generate()``:

- **Python calls per decode step** on the step's thread, counted with ``sys.setprofile`` (C calls not
  counted): ``2T`` against ``T`` new tokens, divided by ``T``, with traces off and on. Counts: one run each.
- **Tokens per second**, traces off against traces on (spans over OTLP/HTTP to a local receiver that
  decodes them): in each of ``--rounds`` interpreters, ``--pairs`` pairs of blocks of ``--calls`` calls,
  traces off and on in turn (``configure()`` between them): one interpreter's speed differs from the next
  one's by up to ±20 % on the shared 2-core VM, which drowned the ratio when each variant had interpreters
  of its own. The ratio per pair: median, quartiles and range. Beside it, what traces on add to a request
  in CPU time (the record's extra and the exporter thread's time) against a request's duration: the same
  question, without the machine's drift.
- **The program's time per finished request**: the record (``ModelState.request_record`` and
  ``RequestLog.add``, on the request's thread) timed over ``--requests`` requests, in ``--record-rounds``
  interpreters a mode (the median one, and the range); with traces on, that
  plus the exporter thread's own CPU time per exported request (the CPU clock of ``gpuprobe-traces``, and
  the final flushes' time on the calling thread), which is what the interpreter lock lends it: read from
  the end of the first tenth of the requests (100 at most) on, so the thread's start and first connection
  are left out (shown beside it with them), for one-token requests and for ``--long-requests`` of 16 tokens
  (15 step events on the decode span).

Goals: +0 Python calls per decode step with traces on; tokens/s with traces on >= 0.98x off; a record
<= 20 us, a record and its exported span <= 30 us + the record.

Run::

    python benchmarks/request_cost.py --rounds 4 --write benchmarks/RESULTS-requests.md
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section  # noqa: E402

CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/tests")
mode, what, n, CALLS, TOKENS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
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
elif what == "paired":
    # traces off and on in turn in this one interpreter (configure() between blocks): an interpreter's own
    # speed differs from the next one's by up to ±20 % on a shared VM, the blocks of one by far less
    pairs = []
    for r in range(n):
        block = {}
        for traces in (("off", "on") if r % 2 == 0 else ("on", "off")):
            gpuprobe.configure(traces=traces)
            gen(16)
            t0 = time.perf_counter()
            for _ in range(CALLS):
                gen(16)
            block[traces] = 16 * CALLS / (time.perf_counter() - t0)
        pairs.append(block)
    out["pairs"] = pairs
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
    warm = min(100, n // 10)  # requests before the exporter's time is read: its start, the first connection
    if mode == "on":
        from gpuprobe.exporters.traces import TraceExporter
        ex = next(i for i in runtime().lifecycle.items() if isinstance(i, TraceExporter))
        clock = time.pthread_getcpuclockid(ex._thread.ident)
    flushing = 0.0
    def exporter_cpu():
        # the exporter thread's CPU time, from its own CPU clock (ns; /proc's ticks are 10 ms), and what the
        # flushes on this thread spent sending the rest (flush() sends on its caller's thread)
        global flushing
        t = time.thread_time()
        ex.flush()
        flushing += time.thread_time() - t
        return time.clock_gettime(clock) + flushing, ex.exported
    for i in range(n):
        if mode == "on" and i == warm:
            cpu0, exported0 = exporter_cpu()
        gen(TOKENS)
    if mode == "on":
        cpu1, exported1 = exporter_cpu()
        out["exported"] = exported1 - exported0
        out["exporter_us_per_request"] = (cpu1 - cpu0) / max(1, exported1 - exported0) * 1e6
        out["exporter_us_with_start"] = cpu1 / max(1, exported1) * 1e6
    out["record_us"] = spent[0] / n / 1e3
print(json.dumps(out))
if receiver is not None:
    receiver.close()
"""


def run(mode: str, what: str, n: int, calls: int = 0, tokens: int = 1) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run([sys.executable, "-I", "-c", f"ROOT = {str(ROOT)!r}\n" + CHILD, mode, what,
                               str(n), str(calls), str(tokens)], capture_output=True, text=True, env=env, cwd=work, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="interpreters for the speed pairs")
    parser.add_argument("--pairs", type=int, default=12, help="pairs of blocks per interpreter")
    parser.add_argument("--calls", type=int, default=5, help="generate() calls per block")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--long-requests", type=int, default=500, help="16-token requests for the span's time")
    parser.add_argument("--record-rounds", type=int, default=3, help="interpreters a mode for the record's time")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    calls = {m: run(m, "calls", 0)["calls_per_step"] for m in ("off", "on")}
    pairs = [p for _ in range(args.rounds) for p in run("on", "paired", args.pairs, args.calls)["pairs"]]
    ratios = sorted(p["on"] / p["off"] for p in pairs)
    speeds = {m: sorted(p[m] for p in pairs) for m in ("off", "on")}
    # records in --record-rounds interpreters a mode, the modes in turn: the median run, and the range
    runs = {"off": [], "on": []}
    for _ in range(args.record_rounds):
        for m in ("off", "on"):
            runs[m].append(run(m, "record", args.requests))
    cost = {m: sorted(rs, key=lambda r: r["record_us"])[len(rs) // 2] for m, rs in runs.items()}
    spread = {m: f"{min(r['record_us'] for r in rs):.1f}-{max(r['record_us'] for r in rs):.1f}" for m, rs in runs.items()}
    long = run("on", "record", args.long_requests, tokens=16)
    # What traces on add to a request, from the CPU times themselves: the record's extra on its thread and
    # the exporter thread's time, against a 16-token request's duration (traces off, median speed).
    added_us = cost["on"]["record_us"] - cost["off"]["record_us"] + long["exporter_us_per_request"]
    request_us = 16 / statistics.median(speeds["off"]) * 1e6
    quartiles = statistics.quantiles(ratios, n=4)
    lines = [
        f"{args.rounds} interpreters, each with {args.pairs} pairs of blocks (traces off and on in turn, "
        f"configure() between them, the first of each pair alternating) of {args.calls} calls of 16 new "
        f"tokens; {args.requests} one-token requests for the time per request and {args.long_requests} of 16 tokens "
        f"for the spans' (the exporter's time read from the end of the first tenth, 100 at most, on); Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs.", "",
        "| figure | traces off | traces on | goal |", "|---|---:|---:|---|",
        f"| gpuprobe's Python calls per decode step | {calls['off']:.2f} | {calls['on']:.2f} | +0 |",
        f"| tokens/s, median (range) | {statistics.median(speeds['off']):.0f} ({speeds['off'][0]:.0f}-"
        f"{speeds['off'][-1]:.0f}) | {statistics.median(speeds['on']):.0f} ({speeds['on'][0]:.0f}-"
        f"{speeds['on'][-1]:.0f}) | |",
        f"| on ÷ off, per pair: median (IQR; range) | | {statistics.median(ratios):.3f} ({quartiles[0]:.3f}-"
        f"{quartiles[2]:.3f}; {ratios[0]:.3f}-{ratios[-1]:.3f}) | >= 0.98 |",
        f"| what traces on add per 16-token request (CPU: record's extra + exporter) ÷ its duration | | "
        f"{added_us:.0f} µs ÷ {request_us / 1e3:.1f} ms = {added_us / request_us * 100:.2f} % | <= 2 % (>= 0.98x) |",
        f"| a finished request's record, µs on its thread: median of {args.record_rounds} interpreters (range) | "
        f"{cost['off']['record_us']:.1f} ({spread['off']}) | {cost['on']['record_us']:.1f} ({spread['on']}) | <= 20 |",
        f"| its spans, µs of the exporter thread per request: 1 token (3 spans) | | "
        f"{cost['on']['exporter_us_per_request']:.1f} ({cost['on']['exported']} exported; "
        f"{cost['on']['exporter_us_with_start']:.1f} with the thread's start) | <= 30 |",
        f"| the same, 16 tokens (3 spans, 15 step events) | | {long['exporter_us_per_request']:.1f} "
        f"({long['exported']} exported; {long['exporter_us_with_start']:.1f} with the thread's start) | <= 30 |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        write_section(args.write, "Requests: records and spans", "python benchmarks/request_cost.py " +
                      " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
