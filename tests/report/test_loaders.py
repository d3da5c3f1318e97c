"""Loaders: exact integer nanoseconds, streaming in any key order, both JSON engines, nsys exports."""

from __future__ import annotations

import gzip
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import Event, ReportInputError, load, us_to_ns
from gpuprobe.report._events import FloatText
from gpuprobe.report._kineto import iter_raw_text

GPU_TRACES = ["kineto/hta_sampled_rank-0.json.gz", "kineto/hta_triton_example.json.gz", "kineto_min.json"]


def events(path: Path | str, engine: str = "stdlib") -> list[Event]:
    return list(load(path, engine=engine).events())


def test_kineto_microseconds_with_three_decimals_become_exact_nanoseconds() -> None:
    assert us_to_ns(FloatText("18.304")) == 18304
    assert us_to_ns(FloatText("1012.000")) == 1_012_000
    assert us_to_ns(Decimal("18.304")) == 18304
    assert us_to_ns(1012) == 1_012_000


def test_epoch_sized_timestamps_keep_every_nanosecond() -> None:
    # as a float, 1727743122000012.345 µs is off by tens of ns once multiplied by 1000
    assert us_to_ns(FloatText("1727743122000012.345")) == 1_727_743_122_000_012_345
    assert float("1727743122000012.345") * 1000 != 1_727_743_122_000_012_345


def test_fractions_beyond_nanoseconds_round_half_to_even() -> None:
    assert us_to_ns(FloatText("0.0005")) == 0
    assert us_to_ns(FloatText("0.0015")) == 2
    assert us_to_ns(FloatText("1.5e3")) == 1_500_000


@pytest.mark.parametrize("bad", ["abc", None, [1], float("nan"), 10**30])
def test_us_to_ns_rejects_what_is_not_a_finite_time(bad: Any) -> None:
    with pytest.raises(ValueError):
        us_to_ns(bad)


def test_the_gemm_of_kineto_min_lasts_18304_ns(kineto_min: Path) -> None:
    kernels = [e for e in events(kineto_min) if e.kind == "kernel"]
    assert kernels[0].name.startswith("nvjet_tst_64x8")
    assert (kernels[0].start_ns, kernels[0].dur_ns) == (1_012_000, 18_304)


@pytest.mark.parametrize("name", GPU_TRACES)
def test_every_raw_kernel_becomes_one_event_with_exact_times(data_dir: Path, raw: Any, ns: Any, name: str) -> None:
    expected = [
        (e["name"], ns(e["ts"]), ns(e["dur"]), e["args"].get("correlation", -1))
        for e in raw(data_dir / name)["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "kernel"
    ]
    got = [(e.name, e.start_ns, e.dur_ns, e.correlation) for e in events(data_dir / name) if e.kind == "kernel"]
    assert got == expected


@pytest.mark.parametrize("engine", ["ijson", "msgspec"])
@pytest.mark.parametrize("name", GPU_TRACES)
def test_every_engine_gives_the_events_of_the_stdlib_one(data_dir: Path, name: str, engine: str) -> None:
    pytest.importorskip(engine)
    assert events(data_dir / name, engine) == events(data_dir / name, "stdlib")


@pytest.mark.parametrize("engine", ["ijson", "msgspec"])
def test_engines_agree_on_a_trace_recorded_here(cpu_traces: dict[str, Path], engine: str) -> None:
    pytest.importorskip(engine)
    assert events(cpu_traces["plain"], engine) == events(cpu_traces["plain"], "stdlib")


def test_auto_takes_msgspec_when_installed(kineto_min: Path) -> None:
    pytest.importorskip("msgspec")
    assert load(kineto_min).engine == "msgspec"


def test_without_msgspec_auto_falls_back_and_msgspec_asks_for_it(monkeypatch: pytest.MonkeyPatch, kineto_min: Path) -> None:
    from gpuprobe.errors import MissingDependencyError
    from gpuprobe.report import _kineto

    monkeypatch.setattr(_kineto, "_TYPED", [None])  # as if msgspec could not be imported
    assert load(kineto_min).engine == "stdlib"
    with pytest.raises(MissingDependencyError, match="msgspec"):
        load(kineto_min, engine="msgspec")


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunk_boundaries_anywhere_give_the_same_elements(kineto_min: Path, chunk: int) -> None:
    text = kineto_min.read_text()
    meta: dict[str, Any] = {}
    items = list(iter_raw_text(io.StringIO(text), meta, chunk=chunk))
    whole = json.loads(text, parse_float=FloatText)
    assert items == whole["traceEvents"]
    assert meta["baseTimeNanoseconds"] == whole["baseTimeNanoseconds"]


@pytest.mark.parametrize("engine", ["stdlib", "ijson"])
def test_metadata_after_trace_events_is_read(tmp_path: Path, kineto_min: Path, engine: str) -> None:
    if engine == "ijson":
        pytest.importorskip("ijson")
    doc = json.loads(kineto_min.read_text())
    reordered = {"traceEvents": doc.pop("traceEvents"), **doc}
    path = tmp_path / "events_first.json"
    path.write_text(json.dumps(reordered))
    trace = load(path, engine=engine)
    got = list(trace.events())
    assert got == events(kineto_min)
    assert trace.info.base_time_ns == 1_727_743_122_000_000_000
    assert trace.info.devices == ["NVIDIA H100 80GB HBM3"]


def test_a_bare_json_array_of_events_is_a_trace(tmp_path: Path, kineto_min: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps(json.loads(kineto_min.read_text())["traceEvents"]))
    assert events(path) == events(kineto_min)


def test_gzip_is_recognised_by_content_not_name(tmp_path: Path, kineto_min: Path) -> None:
    path = tmp_path / "trace.bin"
    path.write_bytes(gzip.compress(kineto_min.read_bytes()))
    trace = load(path)
    assert trace.format == "kineto-gzip"
    assert list(trace.events()) == events(kineto_min)


def test_malformed_events_are_skipped_and_counted(tmp_path: Path, kineto_min: Path) -> None:
    doc = json.loads(kineto_min.read_text())
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "ts": "not a time", "dur": 1})
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "ts": 1, "dur": 1})
    doc["traceEvents"].append("not an event")
    path = tmp_path / "malformed.json"
    path.write_text(json.dumps(doc))
    trace = load(path)
    assert list(trace.events()) == events(kineto_min)
    assert trace.info.skipped_events == 3  # an element that is not an object counts too
    assert trace.info.skipped_reasons == {"with a time that is not a number in range": 1, "without a name": 1,
                                          "not a JSON object": 1}


def test_events_can_be_read_twice(kineto_min: Path) -> None:
    trace = load(kineto_min)
    assert list(trace.events()) == list(trace.events())


def test_progress_reports_bytes_read(tmp_path: Path, kineto_min: Path) -> None:
    seen: list[tuple[int, int]] = []
    list(load(kineto_min).events(progress=lambda done, total: seen.append((done, total))))
    size = kineto_min.stat().st_size
    assert seen and seen[-1] == (size, size)


# ------------------------------------------------------------------------------------------ nsys


def test_nsys_events_strip_api_versions_and_join_names(nsys_db: Path) -> None:
    trace = load(nsys_db)
    assert trace.format == "nsys-sqlite"
    got = list(trace.events())
    apis = [e.name for e in got if e.kind == "runtime"]
    assert apis == [
        "cudaLaunchKernel",
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaStreamSynchronize",
        "cudaMemsetAsync",
    ]
    ranges = [(e.name, e.start_ns, e.dur_ns) for e in got if e.kind == "range"]
    assert ranges == [
        ("decode_step", 1_000_000, 100_000),
        ("forward", 1_001_000, 60_000),
        ("sampling", 1_062_000, 36_000),
    ]
    kernels = [(e.name, e.dur_ns, e.pid, e.correlation) for e in got if e.kind == "kernel"]
    assert kernels[0] == ("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT", 18_304, 4242, 101)
    memcpy = next(e for e in got if e.kind == "memcpy")
    assert (memcpy.direction, memcpy.nbytes) == ("DtoH", 8)
    assert trace.info.base_time_ns == 1_727_743_122_000_000_000
    assert trace.info.devices == ["NVIDIA H100 80GB HBM3"]


def test_nsys_range_text_can_come_from_string_ids(tmp_path: Path, make_nsys: Any, data_dir: Path) -> None:
    script = (data_dir / "nsys_min.sql").read_text() + (
        "INSERT INTO StringIds VALUES (50, 'from_string_ids');"
        "INSERT INTO NVTX_EVENTS (start, end, eventType, textId, globalTid) VALUES (1002000, 1003000, 60, 50, 0);"
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (1004000, NULL, 59, 'open', 0);"
        "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (1005000, 34, 'a mark', 0);"
    )
    trace = load(make_nsys(tmp_path / "t.sqlite", script))
    names = [e.name for e in trace.events() if e.kind == "range"]
    assert "from_string_ids" in names and "open" not in names and "a mark" not in names
    assert any("without a valid end" in note for note in trace.info.notes)


def test_nsys_schema_without_optional_columns_still_loads(tmp_path: Path, make_nsys: Any) -> None:
    # an older layout: kernels named by shortName only, no globalPid, NVTX text only
    script = """
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, correlationId INTEGER, shortName INTEGER);
    CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, correlationId INTEGER, nameId INTEGER);
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT);
    INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'gemm_kernel');
    INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (100, 110, 7, 1);
    INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (120, 150, 7, 2);
    INSERT INTO NVTX_EVENTS VALUES (90, 200, 59, 'step');
    """
    got = list(load(make_nsys(tmp_path / "old.sqlite", script)).events())
    assert [(e.kind, e.name) for e in got] == [
        ("range", "step"),
        ("runtime", "cudaLaunchKernel"),
        ("kernel", "gemm_kernel"),
    ]


def test_missing_file_is_a_report_input_error(tmp_path: Path) -> None:
    with pytest.raises(ReportInputError, match="no such file"):
        load(tmp_path / "nope.json")


# Batches of elements decoded at once (_kineto._array_items): the element-by-element path is their twin.
_TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('}],{["\\ \nab')), max_size=8) if (
    st := pytest.importorskip("hypothesis.strategies")) else None
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), _TRICKY_TEXT,
                  st.decimals(allow_nan=False, allow_infinity=False, places=3).map(float))
_value = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3),
                      max_leaves=8)


def _raw(text: str, chunk: int, batches: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, Any]]:
    from gpuprobe.report import _kineto

    monkeypatch.setattr(_kineto, "_MISSES", _kineto._MISSES if batches else 0)
    meta: dict[str, Any] = {}
    return list(iter_raw_text(io.StringIO(text), meta, chunk=chunk)), meta


@pytest.mark.parametrize("indent", [None, 2])
def test_batches_give_the_elements_one_by_one_decoding_gives(indent: int | None) -> None:
    hypothesis = pytest.importorskip("hypothesis")

    @hypothesis.settings(deadline=None, derandomize=True, database=None, max_examples=300,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(events=st.lists(st.dictionaries(_TRICKY_TEXT, _value, max_size=4) | _value, max_size=12),
                      after=st.dictionaries(_TRICKY_TEXT, _value, max_size=2), chunk=st.sampled_from([3, 64, 1 << 20]))
    def check(events: list[Any], after: dict[str, Any], chunk: int) -> None:
        text = json.dumps({"traceEvents": events, **{k: v for k, v in after.items() if k != "traceEvents"}},
                          indent=indent)
        with pytest.MonkeyPatch.context() as mp:
            batched = _raw(text, chunk, True, mp)
            single = _raw(text, chunk, False, mp)
        whole = json.loads(text, parse_float=FloatText)
        assert batched == single
        assert batched[0] == whole["traceEvents"]

    check()


def test_a_comma_after_a_brace_inside_a_string_fails_its_batch_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each event ends with a string holding "}, {" (what an element boundary looks like): a batch cut
    # there leaves the string open and fails; those elements are read one by one, and the result is the same.
    from gpuprobe.report import _kineto

    events = [{"ph": "X", "args": {"a": {"b": 1}, "c": i}, "name": "k}, {" * (1 + i % 3)} for i in range(5000)]
    text = json.dumps({"traceEvents": events}, separators=(",", ":"))
    failed = []
    decode = _kineto.json.JSONDecoder.raw_decode

    def watched(self: Any, s: str, idx: int = 0) -> Any:
        try:
            return decode(self, s, idx)
        except json.JSONDecodeError:
            failed.append(idx)
            raise

    monkeypatch.setattr(_kineto.json.JSONDecoder, "raw_decode", watched)
    got, _ = _raw(text, 1 << 16, True, monkeypatch)
    assert got == events
    assert failed  # some batches were cut inside a string


def test_batches_decode_many_elements_per_call(monkeypatch: pytest.MonkeyPatch, kineto_min: Path) -> None:
    from gpuprobe.report import _kineto

    events = json.loads(kineto_min.read_text())["traceEvents"] * 200
    text = json.dumps({"traceEvents": events}, indent=2)
    calls = []
    decode = _kineto.json.JSONDecoder.raw_decode
    monkeypatch.setattr(_kineto.json.JSONDecoder, "raw_decode", lambda self, s, idx=0: calls.append(idx) or decode(self, s, idx))
    got, _ = _raw(text, 1 << 20, True, monkeypatch)
    assert got == json.loads(text, parse_float=FloatText)["traceEvents"]
    assert len(calls) < len(events) / 10


# The msgspec engine: typed records for batches msgspec reads, json's values for the rest; both
# turn into the same events as json's values one by one.


def _outcomes(items: list[Any]) -> list[Any]:
    from gpuprobe.report._kineto import DurationReadAsZero, MalformedEventError, to_event

    out: list[Any] = []
    for item in items:
        try:
            out.append(to_event(item))
        except MalformedEventError:
            out.append("malformed")
        except DurationReadAsZero as exc:  # read as 0 ns, and why
            try:
                out.append((str(exc), to_event(item, clamp=True)))
            except MalformedEventError:
                out.append((str(exc), "malformed"))
    return out


def _typed(text: str, chunk: int) -> list[Any]:
    return list(iter_raw_text(io.StringIO(text), {}, chunk=chunk, typed=True))


_time = st.one_of(
    st.integers(-(10**15), 10**15),
    st.decimals(min_value=-(10**12), max_value=10**12, allow_nan=False, allow_infinity=False, places=3).map(float),
    st.sampled_from([1e300, -0.0, 2.5e-7, 10**30]),
    st.none(),
    _TRICKY_TEXT,
)
_ident = st.one_of(st.integers(-5, 5), st.integers(2**62 - 2, 2**64), st.text(max_size=3), st.none(), st.floats(allow_nan=False, allow_infinity=False))
_args = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "correlation": _ident, "stream": _ident, "device": _ident, "bytes": _ident, "flops": _ident,
            "Input Dims": st.recursive(st.integers(0, 64) | st.none(), lambda inner: st.lists(inner, max_size=3), max_leaves=6),
            "other": _value,
        },
    ),
    _value,
)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "s", "f", "M", 1, None])},
    optional={
        "cat": st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "gpu_memcpy", "gpu_memset", "user_annotation", "cuda_sync", "ac2g", 3]),
        "name": st.sampled_from(["aten::mm", "aten::cat", "aten::add", "cudaLaunchKernel", "Memcpy DtoH (Device -> Pinned)", "k},"]) | _ident,
        "ts": _time, "dur": _time, "pid": _ident, "tid": _ident, "args": _args, "id": _value,
    },
)


@pytest.mark.parametrize("indent", [None, 2])
def test_typed_batches_give_the_events_of_json_values_one_by_one(indent: int | None) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    pytest.importorskip("msgspec")

    typed_records = []

    @hypothesis.settings(deadline=None, derandomize=True, database=None, max_examples=400,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(events=st.lists(_event, max_size=12), odd=st.lists(_value, max_size=1),
                      chunk=st.sampled_from([5, 64, 1 << 20]))
    def check(events: list[Any], odd: list[Any], chunk: int) -> None:
        text = json.dumps({"traceEvents": events + odd}, indent=indent)
        with pytest.MonkeyPatch.context() as mp:
            single, _ = _raw(text, chunk, False, mp)
        typed = _typed(text, chunk)
        typed_records.append(sum(type(item) is not dict for item in typed))
        assert _outcomes(typed) == _outcomes(single)

    check()
    assert sum(1 for n in typed_records if n) > len(typed_records) / 4  # msgspec read many batches


def test_typed_batches_hold_records_and_read_what_json_reads(kineto_min: Path) -> None:
    pytest.importorskip("msgspec")
    text = json.dumps({"traceEvents": json.loads(kineto_min.read_text())["traceEvents"] * 200}, indent=2)
    items = _typed(text, 1 << 20)
    assert sum(type(item) is not dict for item in items) > len(items) * 0.9  # msgspec's records
    whole = json.loads(text, parse_float=FloatText)["traceEvents"]
    assert _outcomes(items) == _outcomes(whole)


@pytest.mark.parametrize(
    "element",
    [
        '{"ph": "X", "cat": "kernel", "name": "a", "name": "b", "ts": 1.000, "dur": 2}',  # a repeated key: the last
        '{"ph": "X", "cat": "kernel", "name": "\\ud800", "ts": 1, "dur": 2}',  # a lone surrogate (json reads it)
        '{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 2}',  # json's NaN: not a time
        '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5e3, "dur": 2.500, "args": [1]}',  # args not an object
        '{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 12345678901234.567, "dur": 0.001, "args": {"bytes": 99999999999999999999}}',
    ],
)
def test_text_msgspec_reads_otherwise_or_not_at_all_gives_json_events(element: str) -> None:
    pytest.importorskip("msgspec")
    text = '{"traceEvents": [' + ", ".join([element] * 3000) + "]}"
    one = json.loads("[" + element + "]", parse_float=FloatText, parse_constant=lambda name: name)[0]
    try:
        from gpuprobe.report._kineto import TraceFormatError

        got = _outcomes(_typed(text, 1 << 16))
    except TraceFormatError:
        assert "NaN" in element  # json's own reader refuses it too
        return
    assert got == _outcomes([one] * 3000)


def test_each_format_is_a_reader_of_the_same_events_and_a_new_one_is_a_class_and_a_line(
    tmp_path: Path, kineto_min: Path, nsys_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuprobe.report import _trace, analyze, loaders
    from gpuprobe.report._events import KERNEL, RUNTIME

    for path, name in ((kineto_min, "kineto-json"), (nsys_db, "nsys-sqlite")):
        trace = load(path)
        assert isinstance(trace, _trace.Trace) and trace.format == name
        assert all(type(e) is Event for e in trace.events())

    # A format of its own: a launch and its kernel per line, "name,start_ns,dur_ns,launch_ns".
    class LinesTrace(_trace.Trace):
        source = "kineto"

        def events(self, progress: Any = None) -> Any:
            for corr, line in enumerate(Path(self.path).read_text().split("\n")[1:], start=1):
                name, start, dur, launch = line.split(",")
                yield Event(RUNTIME, "cudaLaunchKernel", int(launch), 2_000, 1, 1, corr)
                yield Event(KERNEL, name, int(start), int(dur), 0, 7, corr, -1, 7, 0)

    magic = b"#gpu-lines"
    line = loaders.Format("gpu-lines", lambda head: head.startswith(magic),
                          lambda path, name, engine, process: LinesTrace(path, name))
    monkeypatch.setattr(loaders, "FORMATS", (line,) + loaders.FORMATS)
    own = tmp_path / "run.lines"
    own.write_text("#gpu-lines\nampere_sgemm_128x64_nn,10000,18304,5000\nvectorized_elementwise_kernel,40000,9120,35000")
    report = analyze(own)
    assert report.summary.kernel_count == 2 and report.summary.kernel_ns == 18_304 + 9_120
    assert {r.category: r.total_ns for r in report.categories.rows} == {"gemm": 18_304, "elementwise": 9_120}
    assert load(kineto_min).format == "kineto-json"  # the formats after it read as before


@pytest.mark.parametrize("chunk", range(1, 13))
def test_a_number_cut_by_the_buffer_at_a_dot_or_an_exponent_is_read_whole(chunk: int) -> None:
    # The decoder reads "0" of "0." and "1" of "1e" when the buffer ends there: more text is read first.
    after = {'[[[[[[""': 0.0, "a": 1e5, "b": -2.5e-3, "c": 12345, "d": 1.5e7, "e": [0.25, 10]}
    text = json.dumps({"traceEvents": [{"ph": "X", "ts": 1.5}, 0.5, 1e3], **after})
    whole = json.loads(text, parse_float=FloatText)
    meta: dict[str, Any] = {}
    events = list(iter_raw_text(io.StringIO(text), meta, chunk=chunk))
    assert events == whole["traceEvents"]
    assert {k: v for k, v in meta.items() if k != "traceEvents"} == {k: v for k, v in whole.items() if k != "traceEvents"}
