"""Findings: each rule on a small synthetic kineto trace that shows its symptom and one that does not,
expected values computed here from the events written; thresholds, --fail-on and diff findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.errors import ConfigError
from gpuprobe.report import analyze, diff, render
from gpuprobe.report._findings import THRESHOLDS
from gpuprobe.report.cli import EXIT_BAD_INPUT, EXIT_FINDINGS, main_diff, main_report

HOST = 1  # host thread
STREAM = 7


class Trace:
    """Builds a kineto trace; times in integer µs."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def x(self, cat: str, name: str, ts: float, dur: float, pid: int = 100, tid: int = HOST, **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args})

    def range(self, name: str, ts: float, dur: float) -> None:
        self.x("user_annotation", name, ts, dur)

    def op(self, name: str, ts: float, dur: float, **args: Any) -> None:
        self.x("cpu_op", name, ts, dur, **args)

    def launch(self, kernel: str, ts: float, dur: float, start: float, kdur: float, api: str = "cudaLaunchKernel") -> None:
        """A launch call at ``ts`` and its kernel at ``start`` on the GPU."""
        self.corr += 1
        self.x("cuda_runtime", api, ts, dur, correlation=self.corr)
        cat = "gpu_memcpy" if kernel.startswith("Memcpy") else "kernel"
        self.x(cat, kernel, start, kdur, pid=0, tid=STREAM, correlation=self.corr, device=0, stream=STREAM, bytes=1000)

    def api(self, name: str, ts: float, dur: float) -> None:
        self.corr += 1
        self.x("cuda_runtime", name, ts, dur, correlation=self.corr)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"traceEvents": self.events}))
        return path


def by_id(report: Any) -> dict[str, Any]:
    return {f.id: f for f in report.findings}


# ------------------------------------------------------------------------------------- host_sync


def sync_trace(syncs_per_step: int, steps: int = 4) -> Trace:
    t = Trace()
    for s in range(steps):
        base = s * 1000
        t.range("decode_step", base, 900)
        t.launch("ampere_sgemm_64x64_nn", base + 10, 5, base + 20, 100)
        t.range("MyProcessor", base + 200, 300)
        for k in range(syncs_per_step):
            at = base + 210 + k * 100
            t.op("aten::item", at, 80)
            t.op("aten::_local_scalar_dense", at + 1, 78)
            t.api("cudaMemcpyAsync", at + 2, 5)
            t.api("cudaStreamSynchronize", at + 10, 60)
        t.api("cudaMemcpy", base + 600, 40)  # synchronous copy: a sync of its own
    return t


def test_host_sync_counts_sync_calls_per_step_with_their_operator_and_range(tmp_path: Path) -> None:
    path = sync_trace(2).write(tmp_path / "sync.json")
    raw = json.loads(path.read_text())["traceEvents"]
    sync_events = [e for e in raw if e["name"] in ("cudaStreamSynchronize", "cudaMemcpy")]
    f = by_id(analyze(path))["host_sync"]
    assert f.evidence["calls"] == len(sync_events) == 12
    assert f.evidence["per_step"] == 3  # two stream syncs and one synchronous cudaMemcpy per step
    assert f.evidence["blocked_ns"] == sum(e["dur"] for e in sync_events) * 1000
    assert f.evidence["by_api"] == {"cudaStreamSynchronize": 8, "cudaMemcpy": 4}
    top = f.evidence["top_offenders"][0]
    assert (top["operator"], top["range"], top["calls"]) == ("aten::_local_scalar_dense", "MyProcessor", 8)
    second = f.evidence["top_offenders"][1]
    assert (second["operator"], second["range"], second["calls"]) == ("(no operator)", "decode_step", 4)
    assert f.severity in ("warning", "critical")


def test_host_sync_is_quiet_without_syncs_and_below_its_threshold(tmp_path: Path) -> None:
    path = sync_trace(0).write(tmp_path / "nosync.json")
    # one synchronous cudaMemcpy per step remains: at the default threshold (1 per step) it fires
    assert "host_sync" in by_id(analyze(path))
    assert "host_sync" not in by_id(analyze(path, thresholds={"host_sync.per_step": 2}))
    t = Trace()
    for s in range(3):
        t.range("decode_step", s * 1000, 900)
        t.launch("ampere_sgemm_64x64_nn", s * 1000 + 10, 5, s * 1000 + 20, 100)
        t.api("cudaMemcpyAsync", s * 1000 + 300, 5)  # asynchronous: not a sync
    assert "host_sync" not in by_id(analyze(t.write(tmp_path / "clean.json")))


def test_cpu_trace_reports_operators_that_would_sync_on_a_gpu(tmp_path: Path) -> None:
    t = Trace()
    for s in range(5):
        base = s * 1000
        t.range("decode_step", base, 900)
        t.range("forward", base + 10, 400)
        t.op("aten::linear", base + 20, 100)
        t.range("StopOnTokenLogitsProcessor", base + 500, 300)
        t.op("aten::item", base + 510, 40)
        t.op("aten::_local_scalar_dense", base + 511, 30)  # inside item(): one sync, not two
        t.op("aten::nonzero", base + 600, 50)
    f = by_id(analyze(t.write(tmp_path / "cpu.json")))["host_sync"]
    w = f.evidence["would_sync_on_gpu"]
    assert w["count"] == 10 and w["per_step"] == 2
    assert w["by_op"] == {"aten::item": 5, "aten::nonzero": 5}
    assert {(r["operator"], r["range"], r["calls"]) for r in w["top_offenders"]} == {
        ("aten::item", "StopOnTokenLogitsProcessor", 5),
        ("aten::nonzero", "StopOnTokenLogitsProcessor", 5),
    }
    assert f.evidence["calls"] == 0  # nothing synchronized in a CPU trace


# ------------------------------------------------------------------------------ pageable_memcpy


def test_pageable_memcpy_by_direction(tmp_path: Path) -> None:
    t = Trace()
    t.launch("Memcpy HtoD (Pageable -> Device)", 0, 5, 10, 20, api="cudaMemcpyAsync")
    t.launch("Memcpy HtoD (Pageable -> Device)", 100, 5, 110, 30, api="cudaMemcpyAsync")
    t.launch("Memcpy DtoH (Device -> Pageable)", 200, 5, 210, 7, api="cudaMemcpyAsync")
    t.launch("Memcpy HtoD (Pinned -> Device)", 300, 5, 310, 9, api="cudaMemcpyAsync")
    f = by_id(analyze(t.write(tmp_path / "copies.json")))["pageable_memcpy"]
    assert f.evidence["count"] == 3
    assert f.evidence["by_direction"] == {
        "DtoH": {"count": 1, "bytes": 1000, "time_ns": 7000},
        "HtoD": {"count": 2, "bytes": 2000, "time_ns": 50000},
    }
    assert f.severity == "info"  # 3 kB: below the warning size
    pinned = Trace()
    pinned.launch("Memcpy HtoD (Pinned -> Device)", 0, 5, 10, 20, api="cudaMemcpyAsync")
    assert "pageable_memcpy" not in by_id(analyze(pinned.write(tmp_path / "pinned.json")))


# --------------------------------------------------------------------- launch_bound, idle, graphs


def launch_trace(kernel_us: float, steps: int = 3, kernels: int = 30) -> Trace:
    """Each step launches ``kernels`` kernels 4 µs apart; each runs ``kernel_us`` right after its launch."""
    t = Trace()
    for s in range(steps):
        base = s * 1000
        t.range("decode_step", base, 30 + kernels * 4)
        for k in range(kernels):
            at = base + 10 + k * 4
            start = max(at + 3, base + 10 + 3 + k * kernel_us)  # queued behind the previous kernel
            t.launch("void at::native::vectorized_elementwise_kernel<4>()", at, 2, start, kernel_us)
    return t


def raster_idle(trace: Trace) -> dict[str, int]:
    """The idle breakdown of one step by marking each ns, independently of the interval code."""
    ev = trace.events
    step = next(e for e in ev if e["name"] == "decode_step")
    kernels = [e for e in ev if e["cat"] == "kernel" and step["ts"] <= _launch_of(ev, e)["ts"] < step["ts"] + step["dur"]]
    w0 = min([step["ts"]] + [k["ts"] for k in kernels]) * 1000
    w1 = max([step["ts"] + step["dur"]] + [k["ts"] + k["dur"] for k in kernels]) * 1000
    n = int(w1 - w0)
    state = ["idle_other"] * n
    by_start = sorted(kernels, key=lambda k: k["ts"])
    for i in range(n):
        t = w0 + i
        if any(k["ts"] * 1000 <= t < (k["ts"] + k["dur"]) * 1000 for k in kernels):
            state[i] = "busy"
            continue
        nxt = next((k for k in by_start if k["ts"] * 1000 > t), None)
        launch = _launch_of(ev, nxt) if nxt else None
        if launch is None or (launch["ts"] + launch["dur"]) * 1000 > t:
            state[i] = "idle_launch"
    return {k: state.count(k) for k in ("busy", "idle_launch", "idle_other")}


def _launch_of(ev: list[dict[str, Any]], op: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in ev if e["cat"] == "cuda_runtime" and e["args"]["correlation"] == op["args"]["correlation"])


def test_launch_bound_fires_when_the_gpu_waits_for_launches(tmp_path: Path) -> None:
    t = launch_trace(kernel_us=1)
    report = analyze(t.write(tmp_path / "bound.json"))
    f = by_id(report)["launch_bound"]
    first = report.idle.rows[0]
    expected = raster_idle(t)
    assert (first.busy_ns, first.idle_launch_ns, first.idle_other_ns) == (
        expected["busy"],
        expected["idle_launch"],
        expected["idle_other"],
    )
    assert first.idle_sync_ns == 0
    assert f.evidence["gpu_busy_share"] == pytest.approx(expected["busy"] / sum(expected.values()))
    assert f.evidence["kernels_per_step"] == 30
    # no graphs in a launch-bound run: the cuda_graphs rule says so
    assert by_id(report)["cuda_graphs"].severity == "warning"
    # and the tiny kernels are a storm only past the minimum count (90 < 100 by default)
    assert "small_kernels" not in by_id(report)
    assert "small_kernels" in by_id(analyze(tmp_path / "bound.json", thresholds=["small_kernels.min_count=50"]))


def test_a_host_that_works_between_launches_is_host_bound(tmp_path: Path) -> None:
    t = Trace()
    for s in range(3):  # 30 kernels of 1 µs, one every 150 µs: the host does something else in between
        base = s * 10_000
        t.range("decode_step", base, 30 * 150 + 20)
        for k in range(30):
            at = base + 10 + k * 150
            t.launch("void at::native::vectorized_elementwise_kernel<4>()", at, 2, at + 3, 1)
    report = analyze(t.write(tmp_path / "host.json"))
    f = by_id(report)["launch_bound"]
    # by hand, per step (all alike): the GPU waits for the first launch to return (12 µs), then 148 µs
    # between a kernel's end (14 + 150k) and the next launch's return (12 + 150(k + 1)), 29 times, then
    # 156 µs from the last kernel's end (4,364) to the step's end (4,520): 4,460 µs over 30 launches
    assert f.evidence["host_gap_per_launch_ns"] == round((12 + 29 * 148 + 156) * 1000 / 30)
    assert f.title.startswith("Host-bound") and f.severity == "warning"
    assert "cuda_graphs" not in by_id(report)  # graphs do not remove the host's own work


def test_busy_gpu_is_not_launch_bound(tmp_path: Path) -> None:
    t = launch_trace(kernel_us=20)  # kernels longer than the launch interval: the queue never drains
    report = analyze(t.write(tmp_path / "busy.json"))
    assert "launch_bound" not in by_id(report)
    assert "cuda_graphs" not in by_id(report)
    expected = raster_idle(t)
    assert report.idle.rows[0].busy_ns == expected["busy"]


def test_idle_while_the_host_waits_in_a_sync(tmp_path: Path) -> None:
    t = Trace()
    t.range("decode_step", 0, 200)
    t.launch("ampere_sgemm_64x64_nn", 10, 5, 20, 50)  # busy 20-70
    t.api("cudaStreamSynchronize", 15, 75)  # returns at 90: GPU idle 70-90 while the host waits
    t.launch("ampere_sgemm_64x64_nn", 120, 5, 130, 20)  # launched after the sync; busy 130-150
    row = analyze(t.write(tmp_path / "sync_idle.json")).idle.rows[0]
    # window 0-200, busy 70; idle: 0-15 launch (the first launch returns at 15), 15-20 and 70-90 sync
    # (the host is in the sync call, which takes precedence), 90-125 launch (the next launch returns at
    # 125), 125-130 other (launched, not started), 150-200 launch (nothing launched until the step ends)
    assert (row.window_ns, row.busy_ns) == (200_000, 70_000)
    assert row.idle_sync_ns == 5_000 + 20_000
    assert row.idle_launch_ns == 15_000 + 35_000 + 50_000
    assert row.idle_other_ns == 5_000


def test_cuda_graph_replays_with_and_without_node_kernels(tmp_path: Path) -> None:
    t = Trace()
    for s in range(3):
        t.range("decode_step", s * 1000, 900)
        t.launch("void some_graph_node_kernel<1>()", s * 1000 + 10, 5, s * 1000 + 20, 300, api="cudaGraphLaunch")
    f = by_id(analyze(t.write(tmp_path / "graphs.json")))["cuda_graphs"]
    assert (f.severity, f.evidence["graph_launches"], f.evidence["per_step"], f.evidence["node_ops"]) == ("info", 3, 1, 3)
    bare = Trace()
    for s in range(3):
        bare.range("decode_step", s * 1000, 900)
        bare.api("cudaGraphLaunch", s * 1000 + 10, 5)
    f = by_id(analyze(bare.write(tmp_path / "bare.json")))["cuda_graphs"]
    assert (f.severity, f.evidence["graph_launches"], f.evidence["node_ops"]) == ("warning", 3, 0)


# ------------------------------------------------------------------ small kernels, other, attention


def kernels_trace(names_durations: list[tuple[str, float]]) -> Trace:
    t = Trace()
    at = 0.0
    for name, dur in names_durations:
        t.launch(name, at, 2, at + 3, dur)
        at += dur + 10
    return t


def test_small_kernels_storm(tmp_path: Path) -> None:
    small = kernels_trace([("void at::native::vectorized_elementwise_kernel<4>()", 1)] * 150 + [("ampere_sgemm_64x64_nn", 50)] * 10)
    f = by_id(analyze(small.write(tmp_path / "small.json")))["small_kernels"]
    assert (f.evidence["count"], f.evidence["count_share"]) == (150, 150 / 160)
    assert f.evidence["time_share"] == pytest.approx(150 / (150 + 500))
    big = kernels_trace([("void at::native::vectorized_elementwise_kernel<4>()", 10)] * 150)
    assert "small_kernels" not in by_id(analyze(big.write(tmp_path / "big.json")))


def test_other_category_share_and_its_threshold(tmp_path: Path) -> None:
    path = kernels_trace([("mystery_kernel_a", 30), ("ampere_sgemm_64x64_nn", 70)]).write(tmp_path / "other.json")
    f = by_id(analyze(path))["other_category"]
    assert f.evidence["share"] == pytest.approx(0.3) and f.evidence["time_ns"] == 30_000
    assert "other_category" not in by_id(analyze(path, thresholds={"other_category.share": 0.31}))


def test_eager_attention_by_kernels(tmp_path: Path) -> None:
    eager = [("ampere_sgemm_64x64_nn", 10), ("void at::native::softmax_warp_forward<float>()", 5)] * 4
    f = by_id(analyze(kernels_trace(eager).write(tmp_path / "eager.json")))["attention_impl"]
    assert (f.evidence["softmax_kernels"], f.evidence["softmax_ns"]) == (4, 20_000)
    fused = [("ampere_sgemm_64x64_nn", 10), ("void pytorch_flash::flash_fwd_kernel<Flash_fwd>()", 5)] * 4
    assert "attention_impl" not in by_id(analyze(kernels_trace(fused).write(tmp_path / "fused.json")))


# --------------------------------------------------------------------- processors, KV-cache concat


def test_logits_processor_share_by_class(tmp_path: Path) -> None:
    t = Trace()
    for s in range(4):
        base = s * 1000
        t.range("decode_step", base, 1000)
        t.range("forward", base, 500)
        t.range("SlowLogitsProcessor", base + 500, 350)
        t.launch("void at::native::vectorized_elementwise_kernel<4>()", base + 510, 2, base + 520, 1)
        t.range("TemperatureLogitsWarper", base + 860, 20)
    f = by_id(analyze(t.write(tmp_path / "proc.json")))["logits_processor_share"]
    rows = {r["processor"]: r for r in f.evidence["by_class"]}
    assert set(rows) == {"SlowLogitsProcessor"}  # 2 % is below the threshold
    assert rows["SlowLogitsProcessor"]["share_of_step"] == pytest.approx(0.35)
    assert rows["SlowLogitsProcessor"]["gpu_ops_per_call"] == 1
    assert f.severity == "critical"
    lenient = analyze(tmp_path / "proc.json", thresholds={"logits_processor_share.critical_share": 0.5})
    assert by_id(lenient)["logits_processor_share"].severity == "warning"


def concat_trace(growing: bool, steps: int = 16) -> Trace:
    t = Trace()
    for s in range(steps):
        base = s * 1000
        t.range("prefill" if s == 0 else "decode_step", base, 900)
        t.launch("ampere_sgemm_64x64_nn", base + 10, 5, base + 20, 100)
        dur = 2 + (s * 3 if growing else 0)
        t.launch("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>()", base + 200, 5, base + 210, dur)
    return t


def test_kv_cache_concat_growth(tmp_path: Path) -> None:
    f = by_id(analyze(concat_trace(True).write(tmp_path / "dynamic.json")))["kv_cache_concat"]
    decode = list(range(1, 16))  # step 0 is the prefill
    durations = [2 + s * 3 for s in decode]
    q = len(decode) // 4
    first, last = sorted(durations[:q])[q // 2], sorted(durations[-q:])[q // 2]  # q is odd: the middle one
    assert f.evidence["decode_steps"] == 15
    assert f.evidence["first_quarter_ns"] == round(first * 1000)
    assert f.evidence["last_quarter_ns"] == round(last * 1000)
    assert f.evidence["growth"] == pytest.approx(last / first)
    assert f.evidence["basis"] == "time"  # no shapes recorded
    assert "kv_cache_concat" not in by_id(analyze(concat_trace(False).write(tmp_path / "static.json")))


# ---------------------------------------------------------------------------------------- FLOPs


def test_flops_per_category_on_gpu_time(tmp_path: Path) -> None:
    t = Trace()
    t.op("aten::addmm", 0, 50, flops=2_000_000_000)
    t.launch("ampere_sgemm_128x64_nn", 10, 5, 20, 1000)
    t.op("aten::mul", 100, 20, flops=1_000_000)
    t.launch("void at::native::vectorized_elementwise_kernel<4>()", 105, 5, 1100, 10)
    fl = analyze(t.write(tmp_path / "flops.json")).flops
    cats = {c.category: c for c in fl.categories}
    assert fl.clock == "gpu" and fl.total_flops == 2_001_000_000
    assert cats["gemm"].flops_per_s == pytest.approx(2e9 / 1e-3)
    assert cats["elementwise"].flops_per_s == pytest.approx(1e6 / 10e-6)


# ----------------------------------------------------------------------- order, gates, thresholds


def test_findings_are_ordered_by_time_at_stake_and_rendered_first(tmp_path: Path) -> None:
    report = analyze(sync_trace(2).write(tmp_path / "s.json"))
    stakes = [f.evidence["at_stake_ns"] for f in report.findings]
    assert stakes == sorted(stakes, reverse=True)
    data = json.loads(render(report, "json"))
    assert list(data)[:2] == ["schema", "findings"]
    assert set(data["findings"][0]) == {"id", "severity", "title", "evidence", "remedy"}
    assert render(report, "text").startswith("Findings\n")
    assert render(report, "md").startswith("## Findings\n")
    assert render(report, "csv").startswith("section,id,severity,title,at_stake_ns,remedy,evidence\n")


def test_fail_on_and_threshold_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(sync_trace(2).write(tmp_path / "s.json"))
    assert main_report([path, "--fail-on", "warning", "--sections", "summary"]) == EXIT_FINDINGS
    assert "host_sync" in capsys.readouterr().err
    quiet = ["--threshold", "host_sync.per_step=4", "--threshold", "logits_processor_share.share=0.5"]
    assert main_report([path, "--fail-on", "warning", *quiet]) == 0  # MyProcessor holds a third of the step
    assert main_report([path, "--threshold", "host_sync.per_stp=4"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "unknown threshold 'host_sync.per_stp'" in err
    assert main_report([path, "--threshold", "host_sync.per_step=many"]) == EXIT_BAD_INPUT
    with pytest.raises(ConfigError, match="not a number"):
        analyze(path, thresholds={"host_sync.per_step": "x"})  # type: ignore[dict-item]


def test_every_threshold_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md").read_text()
    for name, t in THRESHOLDS.items():  # the table row, default and meaning as in the code
        assert f"| `{name}` | {t.default:g} | {t.doc} |" in doc, name


def test_diff_findings_regressions_and_new_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = kernels_trace([("ampere_sgemm_64x64_nn", 100)] * 3)
    a.range("decode_step", -5, 400)
    b = Trace()
    b.range("decode_step", -5, 900)
    at = 0
    for _ in range(3):
        b.launch("ampere_sgemm_64x64_nn", at, 2, at + 3, 200)
        b.api("cudaStreamSynchronize", at + 5, 200)
        at += 250
    pa, pb = a.write(tmp_path / "a.json"), b.write(tmp_path / "b.json")
    d = diff(pa, pb)
    found = {(f.id, f.evidence.get("key")) for f in d.findings}
    assert ("regression", "gemm") in found
    gemm = next(f for f in d.findings if f.evidence.get("key") == "gemm")
    assert gemm.evidence["ratio"] == pytest.approx(2.0) and gemm.severity == "critical"
    new = next(f for f in d.findings if f.id == "host_sync")
    assert new.evidence["new_in"] == "B" and new.title.startswith("New in B:")
    # the verdict comes first: one step each, CPU time 400 -> 900 µs and GPU busy 300 -> 600 µs per step
    assert d.findings[0].id == "verdict" and d.verdict == "worse"
    assert d.findings[0].severity == "critical"  # 900 / 400 = 2.25 >= regression.critical_ratio
    figures = {r.figure: r for r in d.verdict_rows}
    assert (figures["CPU time per step"].a, figures["CPU time per step"].b) == (400_000, 900_000)
    assert (figures["GPU busy per step"].a, figures["GPU busy per step"].b) == (300_000, 600_000)
    # sync time appeared in B: new work, not a like-for-like regression (the new host_sync says it)
    assert ("regression", "sync time") not in found
    assert main_diff([str(pa), str(pb), "--fail-on", "critical", "--format", "json"]) == EXIT_FINDINGS
    assert json.loads(capsys.readouterr().out)["findings"][0]["id"] == "verdict"
    lenient = ["--threshold", "regression.critical_ratio=3", "--threshold", "host_sync.per_step=9"]
    assert main_diff([str(pa), str(pb), *lenient, "--fail-on", "critical"]) == 0


def test_pageable_copies_in_an_nsys_export(tmp_path: Path, make_nsys: Any, data_dir: Path) -> None:
    script = (data_dir / "nsys_min.sql").read_text()
    row = "(1070000,1071376,0,1,NULL,7,103,281546145660928,8,2,NULL,2,1,"  # DtoH, Device -> Pinned
    assert row in script
    pinned = analyze(make_nsys(tmp_path / "pinned.sqlite", script))
    assert "pageable_memcpy" not in by_id(pinned)
    assert any(r.name == "Memcpy DtoH (Device -> Pinned)" for r in pinned.timeline.rows)  # named as kineto does
    pageable = make_nsys(tmp_path / "pageable.sqlite", script.replace(row, row[: -len("2,1,")] + "2,0,"))
    f = by_id(analyze(pageable))["pageable_memcpy"]
    assert f.evidence["by_direction"] == {"DtoH": {"count": 1, "bytes": 8, "time_ns": 1376}}
