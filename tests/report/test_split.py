"""A trace read by two processes at once (its head here, its tail in a second process, the tail's scan
merged in) gives the report one pass gives: on every kineto trace of tests/data, on both engines that can
read a part; and where the split cannot be made (a cut inside an element, a tail that is malformed) the
report, or the error, is the one pass's. The merge itself is checked table by table against one scan of
the same events, on random events whose durations tie often."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import ReportInputError, analyze, render
from gpuprobe.report import _split as split
from gpuprobe.report._events import CPU_OP, KERNEL, MEMCPY, RANGE, RUNTIME, Event
from gpuprobe.report._scan import TraceScan

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted((DATA / "kineto").glob("*.json.gz")) + [DATA / "kineto_min.json"]


@pytest.fixture
def splits(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Split every trace whatever its size; the list says, per split tried, whether it was made."""
    made: list[bool] = []
    real = split.feed_in_two

    def spy(*args: Any) -> bool:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(split, "MIN_BYTES", 0)
    monkeypatch.setattr(split, "feed_in_two", spy)
    return made


def plain(path: Path, tmp_path: Path) -> Path:
    """The trace as a plain JSON file (a part is read from a plain file only)."""
    if path.suffix != ".gz":
        return path
    out = tmp_path / path.name.removesuffix(".gz")
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_two_processes_give_the_report_of_one_on_every_test_trace(path: Path, tmp_path: Path, splits: list[bool]) -> None:
    trace = plain(path, tmp_path)
    for engine in ("msgspec", "stdlib"):
        one = render(analyze(trace, engine=engine, jobs=1), "json")
        assert splits == []
        two = render(analyze(trace, engine=engine, jobs=2), "json")
        assert splits == [True], "the split was not made"  # a cut found after the middle, the tail merged
        assert two == one
        splits.clear()


def _write(path: Path, events: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(json.dumps(e) for e in events)
                    + "\n]" + tail + "}", encoding="utf-8")


def _events(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5})
        out.append({"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "pid": 0, "tid": 7, "ts": 10 * i + 2, "dur": 3,
                    "args": {"correlation": i, "stream": 7, "device": 0}})
    return out


def test_a_cut_inside_an_element_falls_back_to_one_pass(tmp_path: Path, splits: list[bool]) -> None:
    events = _events(200)
    # The middle of the file falls in a long list of objects inside one event's args: "}, {" there is
    # no boundary of traceEvents.
    events[201]["args"]["inputs"] = [{"shape": [i, i]} for i in range(3000)]
    path = tmp_path / "nested.json"
    _write(path, events, ', "deviceProperties": [{"name": "GPU"}]')
    size = path.stat().st_size
    at = split.element_start(str(path), size // 2)
    assert at is not None and path.read_bytes()[at:at + 10].startswith(b'{"shape"')  # inside the element
    two = render(analyze(path, jobs=2), "json")
    assert splits == [False]
    assert two == render(analyze(path, jobs=1), "json")
    assert json.loads(two)["summary"]["devices"] == ["GPU"]  # a key after traceEvents, read by the one pass


def test_keys_after_the_events_are_read_from_the_tail(tmp_path: Path, splits: list[bool]) -> None:
    path = tmp_path / "keys.json"
    _write(path, _events(300), ', "deviceProperties": [{"name": "H100"}], "baseTimeNanoseconds": 1700000000000000000')
    report = analyze(path, jobs=2)
    assert splits == [True]
    assert report.summary.devices == ["H100"] and report.summary.base_time_ns == 1700000000000000000


def test_a_malformed_tail_is_reported_as_one_pass_reports_it(tmp_path: Path, splits: list[bool]) -> None:
    path = tmp_path / "bad.json"
    _write(path, _events(300))
    data = path.read_bytes()
    bad = data.rindex(b'"dur"', 0, len(data) - 200)
    path.write_bytes(data[:bad] + b'"dur" 5' + data[bad + len(b'"dur": 5'):])  # a missing colon in the tail
    with pytest.raises(ReportInputError) as one:
        analyze(path, jobs=1)
    with pytest.raises(ReportInputError) as two:
        analyze(path, jobs=2)
    assert splits == [False] and str(two.value) == str(one.value)


def test_malformed_events_in_both_parts_are_counted_as_one_pass_counts_them(tmp_path: Path, splits: list[bool]) -> None:
    events = _events(300)
    for i in (5, 550):  # one in the head, one in the tail
        events[i]["ts"] = "soon"
    events[560]["dur"] = -4  # a negative duration, read as 0 ns
    path = tmp_path / "odd.json"
    _write(path, events)
    two = analyze(path, jobs=2)
    assert splits == [True]
    one = analyze(path, jobs=1)
    assert render(two, "json") == render(one, "json")
    assert one.summary.skipped_events == 2


def _random_events(rng: random.Random, n: int) -> list[Event]:
    out = []
    for i in range(n):
        kind = rng.choice([KERNEL, MEMCPY, RUNTIME, CPU_OP, RANGE])
        name = {KERNEL: f"k{rng.randrange(9)}", MEMCPY: "Memcpy HtoD (Pageable -> Device)",
                RUNTIME: rng.choice(["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaGraphLaunch"]),
                CPU_OP: f"aten::op{rng.randrange(12)}", RANGE: f"r{rng.randrange(4)}"}[kind]
        dur = rng.choice([1_000, 2_000, 3_000, 50_000])  # few values: ties everywhere, among the longest too
        tid = rng.randrange(3)
        flops = rng.choice([-1, -1, 1000]) if kind == CPU_OP else -1
        out.append(Event(kind, name, 10_000 * i + rng.randrange(5000), dur, rng.randrange(2), tid,
                         rng.randrange(50), nbytes=4096 if kind == MEMCPY else -1, stream=rng.choice([7, 13]),
                         device=rng.randrange(2), flops=flops))
    return out


def _tables(scan: TraceScan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in vars(scan).items():
        if name == "_seq":
            continue
        if hasattr(value, "__slots__") and name not in ("longest_cpu",):
            for field in value.__slots__:
                column = getattr(value, field)
                out[f"{name}.{field}"] = (list(column.items()) if hasattr(column, "items") else list(column))
        elif isinstance(value, dict):
            out[name] = [(k, (v.count, v.total_ns, v.max_ns, v.id) if hasattr(v, "count") else v) for k, v in value.items()]
        elif name == "longest_cpu":
            out[name] = [e[:1] + e[2:] for e in sorted(value, reverse=True)]  # the arrival number is internal
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_merged_scan_holds_what_one_scan_of_both_parts_holds(seed: int) -> None:
    rng = random.Random(seed)
    events = _random_events(rng, 400)
    cut = rng.randrange(1, len(events))
    keep = rng.choice([1, 5, 20])
    whole, head, tail = (TraceScan(keep_longest=keep) for _ in range(3))
    whole.consume(events)
    head.consume(events[:cut])
    tail.consume(events[cut:])
    head.merge(tail)
    assert _tables(head) == _tables(whole)


def test_scans_made_with_different_settings_are_not_merged() -> None:
    with pytest.raises(ValueError, match="different settings"):
        TraceScan(keep_longest=5).merge(TraceScan(keep_longest=6))
