"""Findings on real GPU traces (tests/data/kineto, see its README for their origin): each rule that
fires on one is checked against figures computed here from the raw events, and against a trace
without the symptom."""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_SYNC = re.compile(r"^(cuda|cu|hip)\w*Synchronize$|^(cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|hipMemcpy|hipMemcpyWithStream)$")


def events(name: str) -> list[dict[str, Any]]:
    return [e for e in read_trace(KINETO / name)["traceEvents"] if e.get("ph") == "X"]


def findings(name: str) -> dict[str, Any]:
    return {f.id: f for f in analyze(KINETO / name).findings}


def test_host_sync_on_a_real_trace_with_stream_and_device_syncs() -> None:
    ev = events("hta_alexnet_syncs.json.gz")
    syncs = [e for e in ev if e["cat"] == "cuda_runtime" and _SYNC.match(re.sub(r"_v\d+$", "", e["name"]))]
    f = findings("hta_alexnet_syncs.json.gz")["host_sync"]
    assert f.evidence["calls"] == len(syncs) == 21
    assert f.evidence["blocked_ns"] == sum(to_ns(e["dur"]) for e in syncs)
    assert f.evidence["by_api"] == dict(Counter(e["name"] for e in syncs))
    # the GPU-side records of the same syncs are reported, not counted again
    assert f.evidence["gpu_side_records"] == sum(1 for e in ev if e["cat"] == "cuda_sync")


def test_host_sync_operator_attribution_on_a_real_trace() -> None:
    ev = events("tracelens_h100_qwen1_5_0_5b_forward.json.gz")
    f = findings("tracelens_h100_qwen1_5_0_5b_forward.json.gz")["host_sync"]
    syncs = [e for e in ev if e["cat"] == "cuda_runtime" and _SYNC.match(e["name"])]
    ops = [e for e in ev if e["cat"] == "cpu_op"]
    expected: Counter[str] = Counter()
    for s in syncs:  # the innermost operator of the same thread around each sync
        around = [o for o in ops if o["tid"] == s["tid"] and o["ts"] <= s["ts"] <= o["ts"] + o["dur"]]
        expected[min(around, key=lambda o: o["dur"])["name"] if around else "(no operator)"] += 1
    got: Counter[str] = Counter()
    for row in f.evidence["top_offenders"]:
        got[row["operator"]] += row["calls"]
    assert got == expected and expected["aten::_local_scalar_dense"] == 1


def test_no_host_sync_finding_without_syncs() -> None:
    ev = events("hta_sampled_rank-0.json.gz")
    assert not any(e["cat"] == "cuda_runtime" and _SYNC.match(e["name"]) for e in ev)
    assert "host_sync" not in findings("hta_sampled_rank-0.json.gz")


def test_pageable_memcpy_on_a_real_trace() -> None:
    ev = events("hta_sampled_rank-0.json.gz")
    expected: dict[str, dict[str, int]] = {}
    for e in ev:
        if e["cat"] == "gpu_memcpy" and "Pageable" in e["name"]:
            d = expected.setdefault(re.search(r"[HDP]to[HDP]", e["name"]).group(0), {"count": 0, "bytes": 0, "time_ns": 0})
            d["count"] += 1
            d["bytes"] += e["args"]["bytes"]
            d["time_ns"] += to_ns(e["dur"])
    f = findings("hta_sampled_rank-0.json.gz")["pageable_memcpy"]
    assert f.evidence["by_direction"] == expected
    assert "pageable_memcpy" not in findings("tracelens_h100_qwen1_5_0_5b_forward.json.gz")


def test_cuda_graph_replays_on_a_real_trace() -> None:
    ev = events("hta_cudagraph_nccl_rank0.json.gz")
    launches = [e for e in ev if e["cat"] == "cuda_runtime" and e["name"] == "cudaGraphLaunch"]
    corrs = {e["args"]["correlation"] for e in launches}
    nodes = [e for e in ev if e["cat"] in GPU_CATS and e["args"].get("correlation") in corrs]
    f = findings("hta_cudagraph_nccl_rank0.json.gz")["cuda_graphs"]
    assert (f.severity, f.evidence["graph_launches"], f.evidence["node_ops"]) == ("info", len(launches), len(nodes))
    assert len(launches) == 70


def _step_window(ev: list[dict[str, Any]]) -> tuple[int, int, list[tuple[int, int]]]:
    """The only step of the trace: its window and the GPU operations launched in it (raw events)."""
    step = next(e for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep"))
    s0, s1 = to_ns(step["ts"]), to_ns(step["ts"]) + to_ns(step["dur"])
    launch_at = {
        e["args"]["correlation"]: to_ns(e["ts"]) for e in ev if e["cat"] == "cuda_runtime" and "correlation" in e["args"]
    }
    ops = []
    for e in ev:
        if e["cat"] in GPU_CATS and s0 <= launch_at.get(e["args"].get("correlation"), -1) < s1:
            ops.append((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])))
    return min([s0] + [a for a, _ in ops]), max([s1] + [b for _, b in ops]), ops


def test_launch_bound_on_a_real_trace() -> None:
    np = pytest.importorskip("numpy")
    ev = events("param_dlrm_8rank/rank-0.json.gz")
    w0, w1, ops = _step_window(ev)
    busy = np.zeros(w1 - w0, dtype=bool)  # one cell per ns: an independent union
    for a, b in ops:
        busy[a - w0 : b - w0] = True
    f = findings("param_dlrm_8rank/rank-0.json.gz")["launch_bound"]
    assert f.evidence["gpu_busy_share"] == pytest.approx(busy.sum() / (w1 - w0))
    assert f.evidence["kernels_per_step"] == sum(1 for e in ev if e["cat"] == "kernel")  # all in the step
    assert "launch_bound" not in findings("tracelens_h100_qwen1_5_0_5b_forward.json.gz")


def test_small_kernels_on_a_real_trace() -> None:
    ev = events("param_dlrm_8rank/rank-0.json.gz")
    by_name: dict[str, list[int]] = {}
    for e in ev:
        if e["cat"] == "kernel":
            by_name.setdefault(e["name"], []).append(to_ns(e["dur"]))
    small = sum(len(d) for d in by_name.values() if sum(d) < 5_000 * len(d))
    total = sum(len(d) for d in by_name.values())
    f = findings("param_dlrm_8rank/rank-0.json.gz")["small_kernels"]
    assert (f.evidence["count"], f.evidence["count_share"]) == (small, small / total)
    assert "small_kernels" not in findings("tracelens_h100_qwen1_5_0_5b_forward.json.gz")


def test_eager_attention_on_a_real_trace() -> None:
    ev = events("tracelens_h100_timesformer_eager_attn.json.gz")
    softmax = sum(1 for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::softmax")
    f = findings("tracelens_h100_timesformer_eager_attn.json.gz")["attention_impl"]
    assert f.evidence["softmax_ops"] == softmax == 25
    for fused in ("tracelens_h100_qwen1_5_0_5b_forward.json.gz", "tracelens_h100_bert_small_flash.json.gz"):
        assert "attention_impl" not in findings(fused)


def test_other_category_on_a_real_trace() -> None:
    from gpuprobe.report import categorize_kernel

    ev = events("hta_event_sync.json.gz")
    gpu = [e for e in ev if e["cat"] in GPU_CATS]
    other = sum(Decimal(e["dur"]) for e in gpu if e["cat"] == "kernel" and categorize_kernel(e["name"]) == "other")
    f = findings("hta_event_sync.json.gz")["other_category"]
    assert f.evidence["share"] == pytest.approx(float(other / sum(Decimal(e["dur"]) for e in gpu)))
    assert "other_category" not in findings("hta_sampled_rank-0.json.gz")


def test_operators_around_syncs_with_and_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectorized search (large traces) finds the same operators as the plain loop."""
    import sys

    from gpuprobe.report import _evidence
    from gpuprobe.report._scan import TraceScan
    from gpuprobe.report.loaders import load

    trace = load(KINETO / "hta_cudagraph_nccl_rank0.json.gz")
    scan = TraceScan()
    scan.consume(trace.events())
    assert len(scan.cpu_op_rows) > 10_000 and len(scan.syncs)
    vectorized = _evidence._ops_around(scan.cpu_op_rows, scan.syncs)
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy now raises ImportError
    plain = _evidence._ops_around(scan.cpu_op_rows, scan.syncs)
    assert sorted(vectorized) == sorted(plain) and len(plain) == 225


# ------------------------------------------------------------- every rule over every real GPU trace

REAL_TRACES = sorted(
    [p.name for p in KINETO.glob("*.json.gz")]
    + [f"param_dlrm_8rank/{p.name}" for p in (KINETO / "param_dlrm_8rank").glob("*.json.gz")]
)
#: The critical findings on the real traces, each reviewed: (trace, rule) -> why an expert agrees.
REVIEWED_CRITICAL = {
    ("tracelens_b200_vllm_prefill.json.gz", "launch_bound"):
        "eager prefill, GPU busy 14 % of the span, 76 µs of host time per launch over 929 launches and no graphs: "
        "the host's per-operator work sets the pace",
    ("tracelens_h100_bert_small_flash.json.gz", "launch_bound"):
        "a small BERT forward, 60 kernels, GPU busy 7 % of the step at 48 µs of host time per launch: "
        "host-bound eager inference, what CUDA graphs and compilation remove",
    ("tracelens_mi300_bert_small_attn.json.gz", "launch_bound"):
        "the same small BERT on an MI300: GPU busy 10 % of the step, 44 µs of host time per launch",
    ("param_dlrm_8rank/rank-7.json.gz", "launch_bound"):
        "a DLRM training step launching 246 kernels one by one at 36 µs of host time each: the GPU idles 79 % "
        "of the step waiting for them (the other ranks, 33-55 % busy, get a warning)",
}


@pytest.mark.parametrize("name", REAL_TRACES)
def test_every_critical_finding_on_a_real_trace_is_reviewed(name: str) -> None:
    found = {(name, f.id) for f in analyze(KINETO / name).findings if f.severity == "critical"}
    assert found == {key for key in REVIEWED_CRITICAL if key[0] == name}


def test_a_sync_that_waits_on_work_the_trace_does_not_show_is_not_called_a_wait_for_the_gpu() -> None:
    """sglang decode on an MI300: the host blocks 463 ms in one synchronizing copy while no GPU
    operation of the trace runs; the finding says so, and stays a warning (one step, no pattern)."""
    ev = events("tracelens_mi300_sglang_qwen3_decode.json.gz")
    syncs = [e for e in ev if e["cat"] == "cuda_runtime" and _SYNC.match(e["name"])]
    gpu = [(to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in ev if e["cat"] in GPU_CATS]
    idle = 0
    for s in syncs:  # no two syncs overlap here: one thread
        a, b = to_ns(s["ts"]), to_ns(s["ts"]) + to_ns(s["dur"])
        busy = sorted((max(a, x), min(b, y)) for x, y in gpu if min(b, y) > max(a, x))
        covered, end = 0, a
        for x, y in busy:
            covered += max(0, y - max(x, end))
            end = max(end, y)
        idle += (b - a) - covered
    f = findings("tracelens_mi300_sglang_qwen3_decode.json.gz")["host_sync"]
    assert f.evidence["gpu_idle_in_sync_ns"] == idle and idle > 400_000_000
    assert f.severity == "warning" and "while the GPU idles" in f.title


def test_waits_for_a_busy_gpu_are_not_critical() -> None:
    """Qwen forward on an H100: 16 ms in syncs, a third of the step, but the GPU runs its work throughout."""
    f = findings("tracelens_h100_qwen1_5_0_5b_forward.json.gz")["host_sync"]
    assert f.evidence["blocked_share_of_steps"] > 0.25 and f.severity == "warning"
    assert f.evidence["gpu_idle_in_sync_ns"] < f.evidence["blocked_ns"] / 10


def test_launches_outside_graph_replays_on_a_real_trace() -> None:
    ev = events("hta_cudagraph_nccl_rank0.json.gz")
    steps = [e for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep")]
    step_tids = {s["tid"] for s in steps}
    launches = [e for e in ev if e["cat"] == "cuda_runtime"
                and e["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")]
    per_step = []
    for s in steps:  # the step's own thread, and threads without steps, inside its time
        per_step.append(sum(1 for e in launches if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]
                            and (e["tid"] == s["tid"] or e["tid"] not in step_tids)))
    f = findings("hta_cudagraph_nccl_rank0.json.gz")["cuda_graphs"]
    assert f.evidence["launches_outside_graphs_per_step"] == sorted(per_step)[len(per_step) // 2]
    assert f.severity == "info"


@pytest.mark.parametrize("name", sorted(p.name for p in (KINETO.parent / "nsys").glob("*.sqlite.xz")))
def test_no_critical_finding_on_the_real_nsys_exports(name: str, tmp_path: Path) -> None:
    """Reviewed: host syncs around timed regions, pageable copies and MPI codes' kernels; nothing critical."""
    import lzma
    import shutil

    out = tmp_path / name[: -len(".xz")]
    with lzma.open(KINETO.parent / "nsys" / name) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    assert not [f.id for f in analyze(out).findings if f.severity == "critical"]
