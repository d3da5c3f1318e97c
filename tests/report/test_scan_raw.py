"""The kineto reader's fast path (``KinetoTrace.feed``: its records read into plain tuples of an event's
fields, :func:`~gpuprobe.report._kineto.fields_batches`) gives the fields and the report of the events
:func:`~gpuprobe.report._kineto.to_event` makes of them (``TraceScan.consume``), on
every kineto trace of tests/data, on traces recorded here, on every engine, and on elements of every
odd shape the fast path must hand over to ``to_event`` (times with more than three decimals or an
exponent, strings where numbers go, negative durations, unknown categories, missing fields).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprobe.report import load, render
from gpuprobe.report._analysis import Options, build_report
from gpuprobe.report._events import event_fields
from gpuprobe.report._kineto import DurationReadAsZero, MalformedEventError, fields_batches, to_event
from gpuprobe.report._scan import TraceScan

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted(p for p in (DATA / "kineto").glob("*.json*")) + [DATA / "kineto_min.json"]
ENGINES = ("msgspec", "stdlib", "ijson")


def both(path: Path, engine: str) -> tuple[str, str]:
    """The JSON report of the trace through ``consume`` of its events and through the reader's fast path."""
    out = []
    for raw in (False, True):
        trace = load(path, engine=engine)
        scan = TraceScan(correlation_by_process=trace.info.correlation_by_process, keep_longest=20)
        if raw:
            trace.feed(scan)
        else:
            scan.consume(trace.events())
        out.append(render(build_report(scan, Options(top=20), trace.path, trace.info), "json"))
    return out[0], out[1]


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_the_raw_pass_gives_the_report_of_the_events_on_every_test_trace(path: Path) -> None:
    events, raw = both(path, "msgspec")
    assert json.loads(raw)["summary"]["events"], "the trace has events"
    assert raw == events


@pytest.mark.parametrize("engine", ENGINES)
def test_the_raw_pass_agrees_on_every_engine(engine: str, cpu_traces: dict[str, Path]) -> None:
    for path in [*cpu_traces.values(), DATA / "kineto" / "hta_alexnet_syncs.json.gz"]:
        events, raw = both(path, engine)
        assert raw == events, (path, engine)


def odd_trace() -> dict[str, object]:
    """Kernels, copies, runtime calls and CPU operators with correlations, and around them elements
    of every shape the fast path refuses to read itself."""
    events: list[dict[str, object]] = []
    for i in range(40):
        t = 1000 + i * 50
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7,
                       "ts": t, "dur": 4, "args": {"correlation": i}})
        events.append({"ph": "X", "cat": "kernel", "name": f"gemm_{i % 3}", "pid": 0, "tid": 7, "ts": t + 10,
                       "dur": 20, "args": {"correlation": i, "stream": 7, "device": 0}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 7, "ts": t - 2, "dur": 9,
                       "args": {"External id": i}})
    events += [
        {"ph": "X", "cat": "kernel", "name": "k_frac", "pid": 0, "tid": 7, "ts": 3000.1234567, "dur": 1.5,
         "args": {"correlation": 900}},  # more than three decimals
        {"ph": "X", "cat": "kernel", "name": "k_exp", "pid": 0, "tid": 7, "ts": 3.0e3, "dur": 2e0,
         "args": {"correlation": 901}},  # exponents
        {"ph": "X", "cat": "kernel", "name": "k_neg", "pid": 0, "tid": 7, "ts": 3100, "dur": -3},
        {"ph": "X", "cat": "kernel", "name": "k_strpid", "pid": "GPU 0", "tid": "stream 7", "ts": 3200, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "k_noargs", "pid": 0, "tid": 7, "ts": 3300, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "k_badcorr", "pid": 0, "tid": 7, "ts": 3400, "dur": 3,
         "args": {"correlation": "x", "stream": 1.5, "device": None}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 3500,
         "dur": 6, "args": {"correlation": 902, "bytes": 4096}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 3600, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 7, "ts": 3700,
         "dur": 30},
        {"ph": "X", "cat": "user_annotation", "name": "decode", "pid": 1, "tid": 7, "ts": 900, "dur": 3000},
        {"ph": "X", "cat": "something_new", "name": "?", "pid": 1, "tid": 7, "ts": 10, "dur": 1},
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 10, "dur": 1},  # no name
        {"ph": "X", "cat": "kernel", "name": "k_nots", "pid": 0, "tid": 7, "dur": 1},  # no ts
        {"ph": "X", "cat": "kernel", "name": 7, "pid": 0, "tid": 7, "ts": 10, "dur": 1},  # a number as name
        {"ph": "X", "cat": "kernel", "name": "k_list_pid", "pid": [0], "tid": 7, "ts": 10, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k_str_ts", "pid": 0, "tid": 7, "ts": "12", "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k_huge", "pid": 0, "tid": 7, "ts": 10**30, "dur": 1},
        {"ph": "i", "cat": "kernel", "name": "instant", "pid": 0, "tid": 7, "ts": 10},
        {"ph": "X", "cat": None, "name": "no_cat", "pid": 0, "tid": 7, "ts": 10, "dur": 1},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 0, "tid": 7, "ts": 10, "bp": "e"},
        "not an object",
        [1, 2],
    ]
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_raw_pass_hands_every_odd_element_to_to_event(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(odd_trace()))
    events, raw = both(path, engine)
    assert raw == events
    report = json.loads(raw)
    assert report["summary"]["warnings"], "the odd elements are counted and said"


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_the_fast_path_gives_the_fields_of_to_event_element_by_element(path: Path) -> None:
    """Every element the fast path reads itself becomes the fields of the Event ``to_event`` makes of it."""
    trace = load(path, engine="msgspec")
    fast = slow = 0
    for batch in trace.raw_batches():
        for element in batch:
            (made,) = fields_batches([[element]], trace.refused)
            try:
                expected = to_event(element)
            except (MalformedEventError, DurationReadAsZero):
                continue  # refused: counted by the trace, the same way on both paths
            if expected is None:
                assert made == []
                continue
            assert len(made) == 1
            if type(made[0]) is tuple:
                fast += 1
                assert made[0] == event_fields(expected)
            else:
                slow += 1
                assert made[0] == expected
    assert fast > slow, (fast, slow)  # the usual records take the fast path
