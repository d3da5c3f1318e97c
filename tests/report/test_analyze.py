"""Report sections checked against sums and counts computed here from the raw JSON."""

from __future__ import annotations

import json
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import analyze, categorize_kernel

LAUNCH_APIS = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"}


def xs(doc: dict[str, Any], *cats: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


# ------------------------------------------------------------------------------------ kineto_min


@pytest.fixture(scope="module")
def min_report(kineto_min: Path) -> Any:
    return analyze(kineto_min)


def test_kernel_count_and_total_match_the_raw_events(min_report: Any, kineto_min: Path, raw: Any, ns: Any) -> None:
    kernels = xs(raw(kineto_min), "kernel")
    assert min_report.summary.kernel_count == len(kernels) == 2
    assert min_report.summary.kernel_ns == sum(ns(k["dur"]) for k in kernels) == 18_304 + 9_120


def test_category_sums_match_the_raw_events(min_report: Any, kineto_min: Path, raw: Any, ns: Any) -> None:
    doc = raw(kineto_min)
    expected: dict[str, int] = defaultdict(int)
    for e in xs(doc, "kernel"):
        expected["gemm" if e["name"].startswith("nvjet") else "softmax"] += ns(e["dur"])
    for e in xs(doc, "gpu_memcpy"):
        expected["memcpy"] += ns(e["dur"])
    for e in xs(doc, "gpu_memset"):
        expected["memset"] += ns(e["dur"])
    got = {r.category: r.total_ns for r in min_report.categories.rows}
    assert got == dict(expected)
    assert min_report.categories.other_share == 0.0


def test_memcpy_bytes_and_bandwidth_by_direction(min_report: Any, kineto_min: Path, raw: Any, ns: Any) -> None:
    copy = xs(raw(kineto_min), "gpu_memcpy")[0]
    row = next(r for r in min_report.memory.rows if r.kind == "memcpy")
    assert (row.direction, row.bytes, row.total_ns) == ("DtoH", copy["args"]["bytes"], ns(copy["dur"]))
    assert row.bandwidth_gbps == pytest.approx(8 / 1376)


def test_gpu_time_inside_forward_is_its_two_correlated_kernels(min_report: Any) -> None:
    forward = next(r for r in min_report.ranges.rows if r.path == "decode_step/forward")
    assert forward.gpu_busy_ns == 18_304 + 9_120
    assert (forward.launches, forward.gpu_ops, forward.depth) == (2, 2, 1)


def test_nested_ranges_are_explicit_paths(min_report: Any) -> None:
    assert [r.path for r in min_report.ranges.rows] == ["decode_step", "decode_step/forward", "decode_step/sampling"]
    sampling = min_report.ranges.rows[2]
    assert sampling.gpu_busy_ns == 1_376 + 960
    assert sampling.kernel_ns == 0


def test_launch_to_start_delay_follows_correlation(min_report: Any, kineto_min: Path, raw: Any, ns: Any) -> None:
    doc = raw(kineto_min)
    launches = {e["args"]["correlation"]: ns(e["ts"]) for e in xs(doc, "cuda_runtime") if e["name"] in LAUNCH_APIS}
    delays = [ns(e["ts"]) - launches[e["args"]["correlation"]] for e in xs(doc, "kernel", "gpu_memcpy", "gpu_memset")]
    la = min_report.launches
    assert la.launch_count == len(launches) == 4
    assert la.delay_median_ns == statistics.median(delays)
    assert la.delay_max_ns == max(delays)
    assert la.sync_ns == 22_000


def test_the_decode_step_is_one_step_with_its_gpu_work(min_report: Any) -> None:
    steps = min_report.steps
    assert steps.count == 1
    step = steps.rows[0]
    assert (step.name, step.phase, step.cpu_ns, step.launches, step.kernels) == ("decode_step", "decode", 100_000, 4, 2)
    assert step.gpu_busy_ns == 18_304 + 9_120 + 1_376 + 960
    assert step.categories == {"gemm": 18_304, "softmax": 9_120, "memcpy": 1_376, "memset": 960}


def test_event_order_in_the_file_does_not_matter(tmp_path: Path, kineto_min: Path, min_report: Any) -> None:
    doc = json.loads(kineto_min.read_text())
    random.Random(7).shuffle(doc["traceEvents"])
    path = tmp_path / "shuffled.json"
    path.write_text(json.dumps(doc))
    assert analyze(path).to_dict()["ranges"] == min_report.to_dict()["ranges"]
    assert analyze(path).to_dict()["steps"] == min_report.to_dict()["steps"]


def test_a_capture_with_launches_but_no_kernels_is_reported_broken(tmp_path: Path, kineto_min: Path) -> None:
    doc = json.loads(kineto_min.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    path = tmp_path / "no_gpu_side.json"
    path.write_text(json.dumps(doc))
    report = analyze(path)
    assert report.summary.launch_count == 4
    assert report.summary.gpu_busy_ns is None and report.summary.gpu_busy_share is None
    assert any(w.startswith("broken capture") for w in report.summary.warnings)
    assert report.steps.rows[0].gpu_busy_ns is None


def test_sections_not_asked_for_are_left_out(kineto_min: Path) -> None:
    report = analyze(kineto_min, sections=["kernels"])
    assert report.kernels is not None and report.steps is None and report.categories is None
    assert set(report.to_dict()) == {"schema", "summary", "kernels"}


def test_an_unknown_section_is_refused(kineto_min: Path) -> None:
    with pytest.raises(ValueError, match="unknown section"):
        analyze(kineto_min, sections=["kernelz"])


def test_the_step_pattern_is_a_parameter(kineto_min: Path) -> None:
    report = analyze(kineto_min, step_pattern="^(forward|sampling)$")
    assert [r.name for r in report.steps.rows] == ["forward", "sampling"]
    assert [r.gpu_busy_ns for r in report.steps.rows] == [27_424, 2_336]


# ------------------------------------------------------------------------------ real GPU traces


@pytest.fixture(scope="module")
def sampled(data_dir: Path) -> Path:
    return data_dir / "kineto" / "hta_sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def sampled_report(sampled: Path) -> Any:
    return analyze(sampled, top=1000)


def test_real_trace_kernel_totals(sampled_report: Any, sampled: Path, raw: Any, ns: Any) -> None:
    kernels = xs(raw(sampled), "kernel")
    assert sampled_report.summary.kernel_count == len(kernels) == 1154
    assert sampled_report.summary.kernel_ns == sum(ns(k["dur"]) for k in kernels)
    assert sampled_report.kernels.distinct == len({k["name"] for k in kernels})


def test_real_trace_per_kernel_statistics(sampled_report: Any, sampled: Path, raw: Any, ns: Any) -> None:
    by_name: dict[str, list[int]] = defaultdict(list)
    for k in xs(raw(sampled), "kernel"):
        by_name[k["name"]].append(ns(k["dur"]))
    for row in sampled_report.kernels.rows:
        durs = sorted(by_name[row.name])
        assert (row.count, row.total_ns, row.min_ns, row.max_ns) == (len(durs), sum(durs), durs[0], durs[-1])
        assert row.median_ns == (statistics.median_low(durs) + statistics.median_high(durs)) // 2


def test_real_trace_category_sums(sampled_report: Any, sampled: Path, raw: Any, ns: Any) -> None:
    doc = raw(sampled)
    expected: dict[str, int] = defaultdict(int)
    for e in xs(doc, "kernel"):
        expected[categorize_kernel(e["name"])] += ns(e["dur"])
    for cat, kind in (("gpu_memcpy", "memcpy"), ("gpu_memset", "memset")):
        for e in xs(doc, cat):
            expected[kind] += ns(e["dur"])
    assert {r.category: r.total_ns for r in sampled_report.categories.rows} == dict(expected)
    other = expected.get("other", 0) / sum(expected.values())
    assert sampled_report.categories.other_share == pytest.approx(other)


def test_real_trace_memcpy_bytes_by_direction(sampled_report: Any, sampled: Path, raw: Any) -> None:
    expected: dict[str, int] = defaultdict(int)
    for e in xs(raw(sampled), "gpu_memcpy"):
        expected[e["name"].split()[1]] += e["args"]["bytes"]
    got = {r.direction: r.bytes for r in sampled_report.memory.rows if r.kind == "memcpy"}
    assert got == dict(expected)


def test_real_trace_gpu_busy_is_the_union_of_gpu_intervals(
    sampled_report: Any, sampled: Path, raw: Any, ns: Any
) -> None:
    ops = xs(raw(sampled), "kernel", "gpu_memcpy", "gpu_memset")
    assert sampled_report.summary.gpu_busy_ns == union([(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ops])


def test_real_trace_steps_are_the_profiler_steps(sampled_report: Any, sampled: Path, raw: Any, ns: Any) -> None:
    expected = sorted(
        (ns(e["ts"]), e["name"], ns(e["dur"]))
        for e in xs(raw(sampled), "user_annotation")
        if e["name"].startswith("ProfilerStep#")
    )
    assert [(r.name, r.cpu_ns) for r in sampled_report.steps.rows] == [(n, d) for _, n, d in expected]
    assert sampled_report.steps.pattern == r"^ProfilerStep#\d+$"


def test_real_trace_launch_count(sampled_report: Any, sampled: Path, raw: Any) -> None:
    launches = [e for e in xs(raw(sampled), "cuda_runtime") if e["name"] in LAUNCH_APIS]
    assert sampled_report.launches.launch_count == len(launches) == 1204
    assert sampled_report.launches.gpu_ops_without_launch == 0


def test_a_triton_kernel_launched_by_the_driver_api(data_dir: Path, raw: Any, ns: Any) -> None:
    path = data_dir / "kineto" / "hta_triton_example.json.gz"
    report = analyze(path)
    doc = raw(path)
    kernel = xs(doc, "kernel")[0]
    launch = next(e for e in xs(doc, "cuda_driver") if e["name"] == "cuLaunchKernel")
    assert report.categories.rows[0].category == "triton"
    # epoch-sized µs timestamps, exact to the nanosecond: 2413669097444.592 - 2413669097399.166
    assert report.launches.delay_median_ns == ns(kernel["ts"]) - ns(launch["ts"]) == 45_426
    assert report.small_ops.rows[0].name == "triton_poi_fused_add_cos_sin_0"


# ---------------------------------------------------------------------------- CPU traces (Llama)


@pytest.fixture(scope="module")
def cpu_report(cpu_traces: dict[str, Path]) -> Any:
    return analyze(cpu_traces["plain"], top=1000)


def test_cpu_trace_steps_are_the_generation_steps(
    cpu_report: Any, cpu_traces: dict[str, Path], raw: Any, ns: Any
) -> None:
    expected = sorted(
        (ns(e["ts"]), e["name"], ns(e["dur"]))
        for e in xs(raw(cpu_traces["plain"]), "user_annotation")
        if e["name"] in ("prefill", "decode")
    )
    rows = cpu_report.steps.rows
    assert [(r.name, r.cpu_ns) for r in rows] == [(n, d) for _, n, d in expected]
    assert [r.phase for r in rows] == ["prefill"] + ["decode"] * 5
    assert cpu_report.summary.step_count == 6


def test_cpu_trace_forward_ranges_nest_inside_steps(
    cpu_report: Any, cpu_traces: dict[str, Path], raw: Any, ns: Any
) -> None:
    ranges = xs(raw(cpu_traces["plain"]), "user_annotation")
    decodes = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ranges if e["name"] == "decode"]
    inside = [
        ns(e["dur"])
        for e in ranges
        if e["name"] == "forward" and any(s <= ns(e["ts"]) and ns(e["ts"]) + ns(e["dur"]) <= t for s, t in decodes)
    ]
    row = next(r for r in cpu_report.ranges.rows if r.path == "decode/forward")
    assert (row.count, row.cpu_ns, row.depth) == (len(inside), sum(inside), 1) == (5, sum(inside), 1)


def test_cpu_trace_operators_match_raw_sums(cpu_report: Any, cpu_traces: dict[str, Path], raw: Any, ns: Any) -> None:
    totals: dict[str, list[int]] = defaultdict(list)
    for e in xs(raw(cpu_traces["plain"]), "cpu_op"):
        totals[e["name"]].append(ns(e["dur"]))
    for row in cpu_report.cpu_ops.rows:
        assert (row.count, row.total_ns, row.max_ns) == (
            len(totals[row.name]),
            sum(totals[row.name]),
            max(totals[row.name]),
        )
    assert cpu_report.cpu_ops.count == sum(len(v) for v in totals.values())


def test_cpu_trace_says_gpu_figures_are_unknown_not_zero(cpu_report: Any) -> None:
    s = cpu_report.summary
    assert (s.gpu_busy_ns, s.kernel_ns, s.gpu_busy_share) == (None, None, None)
    assert any("CPU-only" in w for w in s.warnings)
    assert all(r.gpu_busy_ns is None for r in cpu_report.steps.rows)


def test_cpu_trace_span_covers_every_used_event(
    cpu_report: Any, cpu_traces: dict[str, Path], raw: Any, ns: Any
) -> None:
    used = xs(raw(cpu_traces["plain"]), "cpu_op", "user_annotation", "python_function")
    start = min(ns(e["ts"]) for e in used)
    end = max(ns(e["ts"]) + ns(e["dur"]) for e in used)
    assert cpu_report.summary.span_ns == end - start


# ------------------------------------------------------------------------------------------ nsys


def test_nsys_export_gives_the_same_answers_as_the_kineto_trace(nsys_db: Path, min_report: Any) -> None:
    report = analyze(nsys_db)
    same = ("categories", "ranges", "steps", "memory")
    for section in same:
        assert report.to_dict()[section] == min_report.to_dict()[section], section
    assert report.summary.kernel_ns == 27_424
    assert report.launches.delay_median_ns == min_report.launches.delay_median_ns


def test_nsys_export_without_kernel_records_is_reported_broken(tmp_path: Path, make_nsys: Any, data_dir: Path) -> None:
    script = (data_dir / "nsys_min.sql").read_text() + (
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL; DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY;"
        "DELETE FROM CUPTI_ACTIVITY_KIND_MEMSET;"
    )
    report = analyze(make_nsys(tmp_path / "broken.sqlite", script))
    assert report.summary.gpu_busy_ns is None
    assert any(w.startswith("broken capture") for w in report.summary.warnings)


def test_nsys_correlation_ids_are_matched_within_a_process(tmp_path: Path, make_nsys: Any, data_dir: Path) -> None:
    # a second process reuses correlation id 101 for a launch; the kernel of pid 4242 keeps its own launch
    other = (1 << 48) | (777 << 24) | 777
    script = (data_dir / "nsys_min.sql").read_text() + (
        f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1000500,1000600,0,{other},101,2,0,NULL);"
    )
    report = analyze(make_nsys(tmp_path / "two.sqlite", script))
    forward = next(r for r in report.ranges.rows if r.path == "decode_step/forward")
    assert forward.gpu_busy_ns == 27_424
    assert report.launches.delay_max_ns == 9_000
