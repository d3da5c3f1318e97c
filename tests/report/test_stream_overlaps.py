"""Kernels that overlap on one stream, and events of a phase the report does not read.

One CUDA (or HIP) stream runs its kernels one after another, so kernels of the same device and stream
that overlap in time are a trace holding some kernels twice (or kernels that overlap by design): the
report says how many, where and how much kernel time that counts twice, in every format, and computes
every figure as before. Kernels written as ``B``/``E`` pairs, which the report does not read, are counted
as left out with their phase. Expected values come from the raw events (``tracefiles``), by a plain
sweep written here.
"""

from __future__ import annotations

import gzip
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze, load, render
from gpuprobe.report import _split as split
from gpuprobe.report._analysis import Options, build_report
from gpuprobe.report._events import Event
from gpuprobe.report._scan import TraceScan

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
ALEXNET = KINETO / "hta_alexnet_syncs.json.gz"  # 79 kernels on two streams, none overlapping
ENGINES = ("msgspec", "stdlib", "ijson")
BACKENDS = ("python", "numpy")


def _kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
            and str(e.get("cat")).lower() == "kernel"]


def expected_overlaps(doc: dict[str, Any]) -> tuple[int, int, int, list[tuple[int, int]]]:
    """(kernels that overlap an earlier one of their stream, of them duplicates, kernel time counted more
    than once, the (device, stream) pairs) of a trace read with Decimal times, by a sweep per stream."""
    by_stream: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for k in _kernels(doc):
        start, dur = to_ns(k["ts"]), to_ns(k["dur"])
        if dur > 0:
            args = k.get("args", {})
            by_stream.setdefault((args.get("device", k["pid"]), args.get("stream", k["tid"])), []).append(
                (start, start + dur, k["name"]))
    count = dup = extra = 0
    where = []
    for key, spans in sorted(by_stream.items()):
        spans.sort()
        union, cover, found = 0, None, 0
        for a, b, _ in spans:
            if cover is not None and a < cover:
                found += 1
            union += b - a if cover is None or a >= cover else max(0, b - cover)
            cover = b if cover is None else max(cover, b)
        if found:
            count += found
            dup += len(spans) - len({(a, b, n) for a, b, n in spans})
            extra += sum(b - a for a, b, _ in spans) - union
            where.append(key)
    return count, dup, extra, where


def _shown(ns: int) -> str:
    """Nanoseconds as the report shows them: ns, µs or ms with three decimals."""
    if ns < 1_000:
        return f"{ns} ns"
    return f"{ns / 1e3:.3f} µs" if ns < 1_000_000 else f"{ns / 1e6:.3f} ms"


def _decimal_json(text: str) -> dict[str, Any]:
    return json.loads(text, parse_float=Decimal)


def _numbers_json(doc: dict[str, Any], path: Path) -> Path:
    """Write ``doc`` with its Decimal times as JSON numbers (json writes them as strings otherwise)."""
    text = json.dumps(doc, default=lambda d: f"@@{d}@@")
    path.write_text(text.replace('"@@', "").replace('@@"', ""))
    return path


def _overlap_line(report: dict[str, Any]) -> list[str]:
    return [w for w in report["summary"]["warnings"] if "overlap an earlier kernel of the same stream" in w
            or "overlaps an earlier kernel of the same stream" in w]


def test_kernels_written_twice_are_warned_with_their_count_and_the_time_counted_twice(tmp_path: Path) -> None:
    doc = read_trace(ALEXNET)
    kernels = _kernels(doc)
    streams = sorted({(k["args"]["device"], k["args"]["stream"]) for k in kernels})
    device, stream = max(streams, key=lambda s: sum((k["args"]["device"], k["args"]["stream"]) == s for k in kernels))
    twice = [k for k in kernels if (k["args"]["device"], k["args"]["stream"]) == (device, stream)]
    original = _numbers_json(doc, tmp_path / "original.json")
    doc["traceEvents"] = doc["traceEvents"] + [dict(k) for k in twice]
    path = _numbers_json(doc, tmp_path / "twice.json")
    count, dup, extra, where = expected_overlaps(_decimal_json(path.read_text()))
    positive = [k for k in twice if to_ns(k["dur"]) > 0]
    assert (count, dup, where) == (len(positive), len(positive), [(device, stream)]) and len(positive) > 10
    assert extra == sum(to_ns(k["dur"]) for k in positive)
    said = f"{count:,} kernels overlap an earlier kernel of the same stream (device {device} stream {stream}), " \
           f"{dup:,} of them the same kernel twice (name, start and duration): {_shown(extra)} of kernel " \
           "time is counted more than once"
    before = json.loads(render(analyze(original, backend="python"), "json"))["summary"]
    assert _overlap_line({"summary": before}) == []
    for engine in ENGINES:
        for backend in BACKENDS:
            report = analyze(path, engine=engine, backend=backend)
            summary = json.loads(render(report, "json"))["summary"]
            lines = _overlap_line({"summary": summary})
            assert len(lines) == 1 and lines[0].startswith(said), (engine, backend, lines)
            # every figure as before: kernel time counts the copies, the GPU's busy time does not
            assert summary["kernel_ns"] == before["kernel_ns"] + sum(to_ns(k["dur"]) for k in twice)
            assert summary["gpu_busy_ns"] == before["gpu_busy_ns"]
            for fmt in ("text", "md"):
                assert said in render(report, fmt), (engine, backend, fmt)


def test_a_kernel_started_before_the_previous_one_ended_is_an_overlap_not_a_duplicate(tmp_path: Path) -> None:
    doc = read_trace(ALEXNET)
    kernels = [k for k in _kernels(doc) if to_ns(k["dur"]) >= 4]
    late = []
    for k in kernels[:5]:  # a copy half a duration later, and a copy inside the kernel
        late.append({**k, "ts": Decimal(k["ts"]) + Decimal(to_ns(k["dur"]) // 2) / 1000})
        late.append({**k, "name": k["name"] + "_inner", "ts": Decimal(k["ts"]) + Decimal("0.001"),
                     "dur": Decimal("0.002")})
    doc["traceEvents"] = doc["traceEvents"] + late
    path = _numbers_json(doc, tmp_path / "late.json")
    count, dup, extra, where = expected_overlaps(_decimal_json(path.read_text()))
    assert count >= 10 and dup == 0 and extra > 0  # each copy, and whatever kernel a late copy runs into
    for backend in BACKENDS:
        lines = _overlap_line(json.loads(render(analyze(path, backend=backend), "json")))
        assert len(lines) == 1, backend
        assert lines[0].startswith(f"{count:,} kernels overlap an earlier kernel of the same stream (device ")
        assert "the same kernel twice" not in lines[0]
        assert f": {_shown(extra)} of kernel time is counted more than once" in lines[0]


TRACES = ["tracelens_b200_vllm_prefill.json.gz", "tracelens_mi300_vllm_piecewise_graphs.json.gz",
          "hta_alexnet_syncs.json.gz", "hta_cudagraph_nccl_rank0.json.gz", "tracelens_mi300_ddp_resnet_rccl.json.gz"]


@pytest.mark.parametrize("name", TRACES)
def test_real_traces_are_warned_exactly_when_their_streams_overlap(name: str) -> None:
    """Two real traces do overlap on a stream: the B200 one (programmatic dependent launch of MoE
    kernels, a few µs each) and one ROCm trace (two kernels of one graph launch)."""
    count, dup, extra, where = expected_overlaps(read_trace(KINETO / name))
    for backend in BACKENDS:
        lines = _overlap_line(json.loads(render(analyze(KINETO / name, backend=backend), "json")))
        if not count:
            assert lines == [], backend
            continue
        assert len(lines) == 1, backend
        s = "s" if count != 1 else ""
        assert lines[0].startswith(f"{count:,} kernel{s} overlap{'' if s else 's'} an earlier kernel of the same "
                                   f"stream ({', '.join(f'device {d} stream {t}' for d, t in where)})")
        assert f": {_shown(extra)} of kernel time is counted more than once" in lines[0]
    assert (name in TRACES[:2]) == bool(count)


def test_the_numpy_and_python_columns_find_the_same_overlaps_as_a_sweep() -> None:
    from gpuprobe.report._columns_numpy import NumpyColumns
    from gpuprobe.report._columns_python import PythonColumns

    rng = random.Random(7)
    for _ in range(400):
        events = []
        for i in range(rng.randrange(0, 30)):
            kind = rng.choice(["kernel", "kernel", "kernel", "memcpy"])
            events.append(Event(kind, rng.choice("abc"), rng.randrange(0, 300), rng.choice([0, rng.randrange(1, 60)]),
                                0, 0, i, 8, rng.randrange(3), rng.randrange(2)))
        if events and rng.random() < 0.3:
            events += [events[0]] * rng.randrange(1, 3)
        rng.shuffle(events)
        doc = {"traceEvents": [{"ph": "X", "cat": e.kind, "name": e.name, "pid": 0, "tid": 0,
                                "ts": Decimal(e.start_ns) / 1000, "dur": Decimal(e.dur_ns) / 1000,
                                "args": {"device": e.device, "stream": e.stream}} for e in events]}
        count, dup, extra, where = expected_overlaps(doc)
        scan = TraceScan()
        scan.consume(events)
        names = [0] * len(scan.gpu_names)
        for cols in (PythonColumns(scan, names, 0, 0), NumpyColumns(scan, names, 0, 0)):
            got = cols.stream_overlaps()
            assert (got.kernels, got.duplicates, got.extra_ns) == (count, dup, extra), type(cols).__name__
            assert sorted(list(scan.streams)[s] for s in got.stream_ids) == where


def _begin_end(doc: dict[str, Any], n: int) -> tuple[dict[str, Any], int]:
    """The trace with its first ``n`` kernels written as B/E pairs instead of complete events."""
    out, done = [], 0
    for e in doc["traceEvents"]:
        if done < n and isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "kernel":
            begin = {k: v for k, v in e.items() if k != "dur"}
            out.append({**begin, "ph": "B"})
            out.append({**begin, "ph": "E", "ts": Decimal(e["ts"]) + Decimal(e["dur"])})
            done += 1
        else:
            out.append(e)
    return {**doc, "traceEvents": out}, done


def test_kernels_written_as_begin_and_end_events_are_counted_as_left_out_with_their_phase(tmp_path: Path) -> None:
    doc = read_trace(ALEXNET)
    kernels = len(_kernels(doc))
    changed, n = _begin_end(doc, 12)
    path = _numbers_json(changed, tmp_path / "begin_end.json")
    said = (f"{2 * n} events were left out for their phase ({n} kernel events of phase 'B', {n} kernel events "
            "of phase 'E'): only complete events")
    before = json.loads(render(analyze(ALEXNET), "json"))["summary"]
    assert before["skipped_events"] == 0  # its flow, metadata and instant events are no report's: not counted
    for engine in ENGINES:
        report = analyze(path, engine=engine)
        summary = json.loads(render(report, "json"))["summary"]
        assert summary["skipped_events"] == 2 * n, engine
        assert summary["kernel_count"] == kernels - n
        assert [w for w in summary["warnings"] if "for their phase" in w][0].startswith(said), engine
        assert not any("malformed" in w for w in summary["warnings"])
        assert said in render(report, "text") and said in render(report, "md")


def test_the_raw_pass_and_the_events_count_the_same_phases(tmp_path: Path) -> None:
    doc, n = _begin_end(read_trace(ALEXNET), 5)
    doc["traceEvents"].append({"ph": "i", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "s": "t"})
    doc["traceEvents"].append({"ph": 7, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 5})
    path = _numbers_json(doc, tmp_path / "phases.json")
    for engine in ENGINES:
        infos = []
        for raw in (False, True):
            trace = load(path, engine=engine)
            scan = TraceScan(keep_longest=20)
            if raw:
                trace.feed(scan)  # the kineto reader's fast path
            else:
                scan.consume(trace.events())
            infos.append((trace.info.skipped_phases, render(build_report(scan, Options(top=20), trace.path, trace.info),
                                                            "json")))
        assert infos[0] == infos[1], engine
        assert infos[0][0] == {"kernel events of phase 'B'": n, "kernel events of phase 'E'": n,
                               "cpu_op events of phase 'i'": 1, "runtime events whose phase is not a string": 1}


def test_a_trace_read_by_two_processes_counts_the_phases_of_both_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gzip.open(ALEXNET, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    events = doc["traceEvents"]
    first_op = next(i for i, e in enumerate(events) if e.get("cat") == "cpu_op")  # CPU events come first
    last_kernel = max(i for i, e in enumerate(events) if e.get("cat") == "kernel")
    assert first_op < len(events) // 4 and last_kernel > 3 * len(events) // 4  # in the head and in the tail
    for i in (first_op, last_kernel):
        events[i] = {**events[i], "ph": "B"}
    path = _numbers_json(doc, tmp_path / "two_parts.json")
    one = render(analyze(path, jobs=1), "json")
    made: list[bool] = []
    real = split.feed_in_two
    monkeypatch.setattr(split, "feed_in_two", lambda *args: made.append(real(*args)) or made[-1])
    monkeypatch.setattr(split, "MIN_BYTES", 0)
    two = render(analyze(path, jobs=2), "json")
    assert made == [True]
    assert two == one
    assert json.loads(two)["summary"]["skipped_events"] == 2
    assert "2 events were left out for their phase (1 cpu_op events of phase 'B', 1 kernel events of phase 'B')" in two
