"""Cost of one probed call, in ns and as a ratio to a bare call measured in the same process.

Rows: bare call; ``@probe`` disabled by ``GPUPROBE_DISABLE=1``; run-time disabled; enabled (host timer +
NVTX + aggregate, no NVTX tool attached); enabled with the NVTX capture library attached; ``nvtx.annotate``
(with and without a tool); ``torch.profiler.record_function`` with no profiler running; an OpenTelemetry
``histogram.record``.

Each configuration runs in its own interpreter (the env switch and NVTX injection act at import).
Within a process, rows are interleaved round-robin, ``--repeats`` times, and the median is kept.

Usage::

    python benchmarks/probe_overhead.py [--calls 200000] [--repeats 15] [--write benchmarks/RESULTS-probe.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, ROOT)
calls, repeats, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import gpuprobe
from gpuprobe import probe

def bare(): return None

rows = {"bare call": bare}
if mode == "env_disabled":
    rows["@probe disabled by env"] = probe(bare)
else:
    rt_off = probe("rt_off")(bare)
    enabled = probe("enabled")(bare)
    def runtime_disabled():
        return rt_off()
    rows["@probe runtime-disabled"] = rt_off
    rows["@probe enabled"] = enabled
    import nvtx
    rows["nvtx.annotate"] = nvtx.annotate("bench", domain="bench")(bare)
    if mode == "plain":
        import torch
        from torch.profiler import record_function
        def rf():
            with record_function("bench"):
                return None
        rows["torch record_function (no profiler)"] = rf
        from opentelemetry.sdk.metrics import MeterProvider
        hist = MeterProvider().get_meter("bench").create_histogram("bench", unit="s")
        attrs = {"probe": "bench"}
        def otel():
            hist.record(1e-6, attrs)
        rows["OTel histogram.record"] = otel

def run(fn, n):
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        fn()
    return (pc() - t0) / n

samples = {k: [] for k in rows}
for r in range(repeats):
    for name, fn in rows.items():
        if name == "@probe runtime-disabled":
            gpuprobe.disable()
        n = calls // 20 if ("OTel" in name or "record_function" in name) else calls
        samples[name].append(run(fn, n))
        if name == "@probe runtime-disabled":
            gpuprobe.enable()  # (with GPUPROBE_DISABLE=1, enable() refuses: nothing was installed)
print(json.dumps({"info": gpuprobe.info(), "median_ns": {k: statistics.median(v) for k, v in samples.items()},
                  "spread_ns": {k: (min(v), max(v)) for k, v in samples.items()}}))
"""


def child(mode: str, calls: int, repeats: int, env: dict[str, str]) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_"))}
    full.update(env)
    code = "ROOT = %r\n" % str(ROOT) + CHILD
    out = subprocess.run([sys.executable, "-c", code, str(calls), str(repeats), mode], env=full,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--write", type=Path, help="also write the table (Markdown) to this file")
    args = ap.parse_args()

    plain = child("plain", args.calls, args.repeats, {})
    env_off = child("env_disabled", args.calls, args.repeats, {"GPUPROBE_DISABLE": "1"})
    captured = None
    try:
        sys.path.insert(0, str(ROOT))
        from gpuprobe.testing.nvtx_capture import build_injection_library

        lib = build_injection_library()
        capture_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuprobe-bench-nvtx-{os.getpid()}.txt"
        captured = child("captured", args.calls // 4, args.repeats,
                         {"NVTX_INJECTION64_PATH": str(lib), "GPUPROBE_NVTX_CAPTURE_FILE": str(capture_file)})
        capture_file.unlink(missing_ok=True)
    except Exception as exc:  # the capture library needs gcc and NVTX headers
        print(f"(NVTX capture rows skipped: {exc})", file=sys.stderr)

    rows: list[tuple[str, float, float]] = []

    def add(label: str, result: dict, key: str) -> None:
        med = result["median_ns"]
        rows.append((label, med[key], med[key] / med["bare call"]))

    add("bare call", plain, "bare call")
    add("@probe disabled by env (GPUPROBE_DISABLE=1)", env_off, "@probe disabled by env")
    add("@probe runtime-disabled (gpuprobe.disable())", plain, "@probe runtime-disabled")
    add("@probe enabled (host timer + NVTX + aggregate; no NVTX tool)", plain, "@probe enabled")
    if captured:
        add("@probe enabled, NVTX capture library attached", captured, "@probe enabled")
        add("nvtx.annotate, NVTX capture library attached", captured, "nvtx.annotate")
    add("nvtx.annotate (no tool: returns the function)", plain, "nvtx.annotate")
    add("torch.profiler.record_function (no profiler)", plain, "torch record_function (no profiler)")
    add("OTel histogram.record", plain, "OTel histogram.record")

    med = plain["median_ns"]
    enabled = med["@probe enabled"]
    goals = [
        ("disabled-by-env <= 1.1x bare", env_off["median_ns"]["@probe disabled by env"]
         <= 1.1 * env_off["median_ns"]["bare call"]),
        ("runtime-disabled <= bare + 100 ns", med["@probe runtime-disabled"] <= med["bare call"] + 100),
        ("enabled <= 0.15x record_function", enabled <= 0.15 * med["torch record_function (no profiler)"]),
        ("enabled <= 0.15x OTel histogram.record", enabled <= 0.15 * med["OTel histogram.record"]),
    ]
    lines = ["| what | ns per call | ratio to bare |", "|---|---:|---:|"]
    lines += [f"| {label} | {ns:,.0f} | {ratio:.2f}x |" for label, ns, ratio in rows]
    lines += ["", "| goal | met |", "|---|---|"]
    lines += [f"| {g} | {'yes' if ok else 'NO'} |" for g, ok in goals]
    lines += ["", f"enabled / record_function = {enabled / med['torch record_function (no profiler)']:.3f}; "
              f"enabled / OTel record = {enabled / med['OTel histogram.record']:.3f}",
              f"backends: {plain['info']['timing']}, NVTX {plain['info']['nvtx']}"
              + (f" (with capture: NVTX {captured['info']['nvtx']})" if captured else ""),
              f"{args.calls:,} calls x {args.repeats} interleaved repeats, median; Python {sys.version.split()[0]}"]
    table = "\n".join(lines)
    print(table)
    if args.write:
        # The file's other sections (## ..., written by the comparison benchmarks) are kept.
        old = args.write.read_text(encoding="utf-8") if args.write.exists() else ""
        cut = old.find("\n## ")
        rest = old[cut:] if cut >= 0 else ""
        args.write.write_text("# probe overhead\n\nGenerated by `python benchmarks/probe_overhead.py`.\n\n" + table
                              + "\n" + rest)
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
