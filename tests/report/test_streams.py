"""The streams section: each stream's busy time and the part of it beside another stream, checked against
a count over every elementary time segment of the raw events (real traces from tests/data/kineto)."""

from __future__ import annotations

import bisect
import json
import random
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze
from gpuprobe.report._ranks import analyze_ranks
from gpuprobe.report.cli import main_report
from gpuprobe.report.sections.streams import stream_overlap

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def _counted(streams: dict[Any, list[tuple[int, int]]]) -> tuple[int, int, dict[Any, tuple[int, int]]]:
    """Busy, concurrent and per-stream (own, beside another) time by counting, on every segment between two
    consecutive boundaries, how many operations of each stream cover it."""
    bounds = sorted({t for pairs in streams.values() for a, b in pairs for t in (a, b)})
    cover = {key: [0] * len(bounds) for key in streams}
    for key, pairs in streams.items():
        diff = cover[key]
        for a, b in pairs:
            diff[bisect.bisect_left(bounds, a)] += 1
            diff[bisect.bisect_left(bounds, b)] -= 1
        running = 0
        for i, d in enumerate(diff):
            running += d
            diff[i] = running
    busy = concurrent = 0
    per = {key: [0, 0] for key in streams}
    for i in range(len(bounds) - 1):
        span = bounds[i + 1] - bounds[i]
        on = [key for key in streams if cover[key][i] > 0]
        if on:
            busy += span
        if len(on) > 1:
            concurrent += span
        for key in on:
            per[key][0] += span
            if len(on) > 1:
                per[key][1] += span
    return busy, concurrent, {key: (own, both) for key, (own, both) in per.items()}


def _raw_streams(path: Path) -> dict[int, dict[int, list[tuple[int, int]]]]:
    """The GPU operations of a kineto trace, by device and stream, read with plain json."""
    out: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for e in read_trace(path)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            args = e.get("args", {})
            start = to_ns(e["ts"])
            device, stream = args.get("device", e["pid"]), args.get("stream", e["tid"])
            out.setdefault(device, {}).setdefault(stream, []).append((start, start + to_ns(e["dur"])))
    return out


def test_random_streams_against_a_count_of_every_segment() -> None:
    rng = random.Random(7)
    for _ in range(200):
        streams = {key: [(a, a + rng.randint(0, 30)) for a in (rng.randint(0, 200) for _ in range(rng.randint(1, 8)))]
                   for key in rng.sample(range(100), rng.randint(1, 5))}
        assert stream_overlap(streams) == _counted(streams), streams


@pytest.mark.parametrize("name", ["hta_sampled_rank-0.json.gz", "hta_cudagraph_nccl_rank0.json.gz",
                                  "tracelens_mi300_ddp_resnet_rccl.json.gz"])
def test_each_stream_of_a_real_trace_as_counted_from_its_raw_events(name: str) -> None:
    path = KINETO / name
    section = analyze(path, sections=["streams"]).streams
    raw = _raw_streams(path)
    assert section is not None and section.streams == sum(len(s) for s in raw.values()) > 1
    busy_all = concurrent_all = 0
    for device, streams in raw.items():
        busy, concurrent, per = _counted(streams)
        busy_all += busy
        concurrent_all += concurrent
        rows = {r.stream: r for r in section.rows if r.device == device}
        assert set(rows) == set(streams)
        for stream, (own, both) in per.items():
            assert (rows[stream].busy_ns, rows[stream].concurrent_ns) == (own, both), (device, stream)
            assert rows[stream].kernels + rows[stream].copies == len(streams[stream])
            assert rows[stream].share == pytest.approx(own / busy)
    assert (section.busy_ns, section.concurrent_ns) == (busy_all, concurrent_all)
    assert section.concurrent_ns > 0  # these traces run a side stream beside the main one


def test_asked_for_only_and_shown_in_every_format(capsys: pytest.CaptureFixture[str]) -> None:
    path = KINETO / "hta_sampled_rank-0.json.gz"
    assert analyze(path).streams is None  # not a default section
    assert main_report([str(path), "--sections", "streams", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"summary", "streams"} and "kernels" not in doc
    assert doc["streams"]["rows"][0].keys() >= {"device", "stream", "busy_ns", "concurrent_ns", "share"}
    assert main_report([str(path), "--sections", "streams", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "GPU streams" in out and "| device |" in out


def test_every_rank_s_streams_with_their_rank() -> None:
    dlrm = KINETO / "param_dlrm_8rank"
    merged, results = analyze_ranks([dlrm], jobs=1, sections=["streams"])
    assert merged.streams is not None and merged.kernels is not None  # the defaults as well
    for result in results:
        own = result.report.streams
        rows = [r for r in merged.streams.rows if r.rank == result.rank]
        assert [(r.device, r.stream, r.busy_ns) for r in rows] == [(r.device, r.stream, r.busy_ns) for r in own.rows]
    assert merged.streams.busy_ns == sum(r.report.streams.busy_ns for r in results)
    plain, _ = analyze_ranks([dlrm], jobs=1)
    assert plain.streams is None
