"""Per-call cost of a probed call with a device span, against what one writes by hand.

Rows, each calling the same one-kernel body (``x.add_(1)`` on a one-element tensor of the device):

- ``bare``: the body alone;
- ``@probe``: ``probe("bench")`` around it; on a GPU with CUDA initialized it records host time and a
  device span (two pooled CUDA events, read at the next drain);
- ``NVTX + 2 events``: a range pushed and popped by hand (``torch.cuda.nvtx``; the ``nvtx`` package on
  a CPU build) around the body, with a start and an end ``torch.cuda.Event(enable_timing=True)``
  recorded from a preallocated ring; on a CPU the events are left out (the row says so);
- ``record_function``: ``torch.profiler.record_function`` with no profiler running.

A row's run is ``calls`` calls, then whatever reads its timings (gpuprobe's drain, which turns the
finished device spans into durations; ``elapsed_time`` of every event pair for the hand-written row),
then a device synchronize: the time a program pays per call, the GPU's share included. Rows alternate
in rotating order for as many rounds as the budget allows; each round gives each row's µs per call
and its ratio to the bare call of the same round. ``calls`` stays under half the event pool (4,096
events) so no device span is dropped; the runtime's ``event_pool_exhausted`` count is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.gpu import _models
from benchmarks.gpu._ab import Budget, alternate, figure


def _rows(calls: int) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    import torch
    from torch.profiler import record_function

    import gpuprobe
    from gpuprobe.runtime import runtime

    dev = _models.device()
    x = torch.zeros(1, device=dev)
    if dev == "cuda":
        torch.cuda.init()  # gpuprobe takes device spans once CUDA is initialized (docs/gpu.md)
    notes: dict[str, str] = {}

    def body() -> None:
        x.add_(1)

    probed = gpuprobe.probe("bench")(body)
    rt = runtime()
    sync = _models.synchronize

    def bare() -> None:
        for _ in range(calls):
            body()
        sync()

    def with_probe() -> None:
        for _ in range(calls):
            probed()
        sync()
        rt.drain()  # turns the device spans into durations: part of what the probe costs

    if dev == "cuda":
        push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]

        def by_hand() -> None:
            for i in range(calls):
                push("bench")
                starts[i].record()
                body()
                ends[i].record()
                pop()
            torch.cuda.synchronize()
            for a, b in zip(starts, ends):
                a.elapsed_time(b)

        hand = "NVTX + 2 events"
    else:
        try:
            import nvtx
        except ImportError:
            nvtx = None
        if nvtx is not None:
            push, pop = nvtx.push_range, nvtx.pop_range
        else:
            push, pop = (lambda message: None), (lambda: None)
            notes["NVTX"] = "no nvtx package and no CUDA build: the hand-written row pushes no range"

        def by_hand() -> None:
            for _ in range(calls):
                push("bench")
                body()
                pop()

        hand = "NVTX (no CUDA: no events)"

    def profiler_range() -> None:
        for _ in range(calls):
            with record_function("bench"):
                body()
        sync()

    rows = {"bare": bare, "@probe": with_probe, hand: by_hand, "record_function": profiler_range}
    notes["device spans"] = "on" if dev == "cuda" else "off (no CUDA): @probe records host time only"
    return rows, notes


def _counts() -> tuple[int, int]:
    """Device spans the ``bench`` probe recorded, and device timings dropped for an exhausted pool."""
    import gpuprobe

    data = gpuprobe.collect()
    spans = sum(p.count for d in data if d.spec.name == "gpuprobe.probe.duration" for p in d.points
                if p.labels.get("probe") == "bench" and p.labels.get("clock") == "device")
    dropped = sum(p.value for d in data if d.spec.name == "gpuprobe.telemetry.dropped" for p in d.points
                  if p.labels.get("reason") == "event_pool_exhausted")
    return int(spans), int(dropped)


def measure(size: str, budget: Budget) -> dict[str, Any]:
    """µs per call of each row, and each row's per-round ratio to the bare call."""
    calls = 1000 if size == "gpu" else 2000
    rows, notes = _rows(calls)
    names = list(rows)
    current: list[Callable[[], None]] = [rows["bare"]]

    def run() -> float:
        t0 = time.perf_counter()
        current[0]()
        return (time.perf_counter() - t0) / calls

    times = alternate(names, lambda v: current.__setitem__(0, rows[v]), run, budget, warmup=2)
    figures = [figure(f"{v} µs/call", [1e6 * t for t in times[v]], "us") for v in names]
    for v in names[1:]:
        figures.append(figure(f"{v} ÷ bare", [t / b for t, b in zip(times[v], times["bare"])], "1"))
    hand = names[2]
    figures.append(figure(f"@probe ÷ {hand}", [p / h for p, h in zip(times["@probe"], times[hand])], "1"))
    spans, dropped = _counts()
    if _models.device() == "cuda" and not spans:
        raise RuntimeError("the @probe row took no device spans: these would be host-only figures")
    return {"figures": figures,
            "setup": {"device": _models.device(), "calls_per_run": calls, "body": "x.add_(1), x: 1 element",
                      "device_spans_recorded": spans, "event_pool_exhausted": dropped, **notes}}
