"""Nsight Compute input of ``gpuprobe report`` / ``diff``: real exports (tests/data/ncu), a raw
export with gpuprobe's NVTX stack built here, the join with a timeline, ``gpuprobe ncu-args``.

Expected figures are computed here from the CSV rows with the csv module, not by the reader.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprobe import cli as gpuprobe_cli
from gpuprobe._ncu_args import main as ncu_args_main, ncu_args
from gpuprobe.report import ReportInputError, load
from gpuprobe.report._ncu import parse_nvtx_stack, read_ncu
from gpuprobe.report._ncu_analysis import NCU_THRESHOLDS, analyze_ncu, diff_ncu
from gpuprobe.report._ncu_render import render_ncu
from gpuprobe.report.cli import main_diff, main_report

DATA = Path(__file__).resolve().parents[1] / "data"
NCU = DATA / "ncu"
RAW_2019 = NCU / "microgpusim_vectoradd_gtx1080_raw.csv"
RAW_2019_STDOUT = NCU / "microgpusim_vectoradd_gtx1080_raw_stdout.txt"
ESMM = NCU / "esmm_sgemm_a10g_details.csv"
LLMPERF = NCU / "llmperfopt_kernel0001_rtx5090_details.csv"
SUPERBENCH = NCU / "superbench_cublaslt_b200_details.log"
ERROR_ONLY = NCU / "llmperfopt_error_only_raw.csv"
JOIN_TRACE = DATA / "kineto_ncu_esmm.json"
NVTX_COLUMN = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"


# ---------------------------------------------------------------------------- an oracle: the rows


def _table(path: Path) -> list[dict[str, str]]:
    """The rows of an ncu CSV table as dicts (the text before the header skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID",'))
    rows = list(csv.reader(lines[start:]))
    return [dict(zip(rows[0], r)) for r in rows[1:]]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _details(path: Path, metric: str, section: str | None = None) -> dict[int, tuple[str, str]]:
    """ID -> (value, unit) of one metric of a details page."""
    return {
        int(r["ID"]): (r["Metric Value"], r["Metric Unit"])
        for r in _table(path)
        if r.get("Metric Name") == metric and (section is None or r["Section Name"] == section)
    }


# ---------------------------------------------------------------------------- real exports


def test_raw_2019_legacy_names_give_duration_sol_and_occupancy() -> None:
    rows = [r for r in _table(RAW_2019) if r["ID"]]  # the units row has no ID
    units = next(r for r in _table(RAW_2019) if not r["ID"])
    assert units["gpu__time_duration"] == "nsecond"
    report = analyze_ncu(RAW_2019)
    durations = [_num(r["gpu__time_duration"]) for r in rows]
    assert report.launches == len(rows) == 3
    assert report.duration_ns == round(sum(durations))
    family = report.families[0]
    assert (family.name, family.launches) == ("vecAdd", 3)

    def weighted(column: str) -> float:
        return sum(_num(r[column]) * d for r, d in zip(rows, durations)) / sum(durations)

    assert family.sm_sol_pct == pytest.approx(weighted("sm__sol_pct"))
    assert family.memory_sol_pct == pytest.approx(weighted("gpu__compute_memory_sol_pct"))
    assert family.dram_pct == pytest.approx(weighted("fbpa__sol_pct"))
    assert family.achieved_occupancy_pct == pytest.approx(weighted("sm__active_warps_avg_per_active_cycle_pct"))
    assert family.theoretical_occupancy_pct == pytest.approx(weighted("sm__maximum_warps_per_active_cycle_pct"))
    assert family.registers_per_thread == _num(rows[0]["launch__registers_per_thread"])
    assert family.block_size == _num(rows[0]["launch__block_size"])
    assert family.grid_size == _num(rows[0]["launch__grid_size"])
    assert family.waves_per_sm == _num(rows[0]["launch__waves_per_multiprocessor"])
    limits = {
        "registers": _num(rows[0]["launch__occupancy_limit_registers"]),
        "shared memory": _num(rows[0]["launch__occupancy_limit_shared_mem"]),
        "warps": _num(rows[0]["launch__occupancy_limit_warps"]),
        "blocks": _num(rows[0]["launch__occupancy_limit_blocks"]),
    }
    assert family.limiter == min(limits, key=limits.__getitem__)
    assert family.tensor_pct is None and "tensor_pct" in report.metrics_absent  # absent, not 0
    # both speeds of light far below 60 %: latency-bound; a grid of 1 block: under one wave
    assert max(weighted("sm__sol_pct"), weighted("gpu__compute_memory_sol_pct")) < 60
    assert family.classes == ["latency-bound", "under-occupied"]
    assert "one wave" in family.evidence["under-occupied"]


def test_program_output_and_prof_lines_before_the_table_are_skipped() -> None:
    text = RAW_2019_STDOUT.read_text(encoding="utf-8")
    assert text.splitlines()[0].startswith("grid:") and "==PROF==" in text
    a, b = analyze_ncu(RAW_2019), analyze_ncu(RAW_2019_STDOUT)
    assert [vars(r) for r in a.kernels] == [vars(r) for r in b.kernels]
    assert a.findings == b.findings == []  # a raw page has no rule results


def test_crlf_line_ends_and_a_byte_order_mark_read_alike(tmp_path: Path) -> None:
    path = tmp_path / "windows.csv"
    path.write_bytes(b"\xef\xbb\xbf" + SUPERBENCH.read_bytes().replace(b"\n", b"\r\n"))
    a, b = analyze_ncu(SUPERBENCH), analyze_ncu(path)
    assert [vars(r) for r in a.kernels] == [vars(r) for r in b.kernels] and a.findings == b.findings
    path.write_bytes(b"\xef\xbb\xbf" + ESMM.read_bytes())  # the mark right before the header
    assert main_report([str(path), "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["launches"] == analyze_ncu(ESMM).launches


def test_details_with_thousands_separators_and_absent_figures() -> None:
    durations = _details(ESMM, "gpu__time_duration.sum")
    assert durations[0] == ("10,776,576", "nsecond")
    report = analyze_ncu(ESMM)
    assert report.page == "details"
    assert report.launches == len(durations) == 9
    assert report.duration_ns == round(sum(_num(v) for v, _ in durations.values()))
    by_name: dict[str, float] = {}
    names = {int(r["ID"]): r["Kernel Name"] for r in _table(ESMM)}
    for kid, (value, _) in durations.items():
        by_name[names[kid]] = by_name.get(names[kid], 0.0) + _num(value)
    assert {r.name: r.duration_ns for r in report.kernels} == {n: round(v) for n, v in by_name.items()}
    sgemm = next(r for r in report.kernels if r.name == "ampere_sgemm_128x64_nn")
    assert sgemm.launches == 2 and sgemm.family == "ampere_sgemm_nn" and sgemm.category == "gemm"
    # --metrics only: no speed of light, no occupancy -> absent (None), no class, never 0
    for row in report.kernels:
        assert row.sm_sol_pct is None and row.achieved_occupancy_pct is None and row.classes == []
    assert {"sm_sol_pct", "memory_sol_pct", "achieved_occupancy_pct"} <= set(report.metrics_absent)
    # the Block Size / Grid Size columns: "(32, 32, 1)" -> 1024
    first = next(r for r in _table(ESMM) if r["ID"] == "0")
    assert first["Block Size"] == "(32, 32, 1)"
    assert next(r for r in report.kernels if r.name.startswith("basic(")).block_size == 32 * 32


def test_details_2025_units_na_and_the_speed_of_light_section() -> None:
    report = analyze_ncu(LLMPERF)
    kernel = report.kernels[0]
    value, unit = _details(LLMPERF, "Duration", "GPU Speed Of Light Throughput")[0]
    assert unit == "us"
    assert kernel.duration_ns == round(_num(value) * 1000)
    # "Memory Throughput" is % in the SOL section and Gbyte/s in Memory Workload Analysis
    sol_mem, sol_unit = _details(LLMPERF, "Memory Throughput", "GPU Speed Of Light Throughput")[0]
    _, mwa_unit = _details(LLMPERF, "Memory Throughput", "Memory Workload Analysis")[0]
    assert (sol_unit, mwa_unit) == ("%", "Gbyte/s")
    assert kernel.memory_sol_pct == pytest.approx(_num(sol_mem))
    sm = _num(_details(LLMPERF, "Compute (SM) Throughput")[0][0])
    assert kernel.sm_sol_pct == pytest.approx(sm)
    theo = _num(_details(LLMPERF, "Theoretical Occupancy")[0][0])
    assert kernel.theoretical_occupancy_pct == pytest.approx(theo)
    limits = {w: _num(_details(LLMPERF, f"Block Limit {n}")[0][0])
              for w, n in (("registers", "Registers"), ("shared memory", "Shared Mem"), ("warps", "Warps"),
                           ("blocks", "SM"))}
    assert kernel.limiter == min(limits, key=limits.__getitem__)
    assert kernel.registers_per_thread is None  # no Launch Statistics section in this export
    assert max(sm, _num(sol_mem)) < 60 and theo < 50
    assert kernel.classes == ["latency-bound", "under-occupied"]
    # "n/a" cells (flop_count_hp.sum) are absent, and the export's rows are ragged (16 of 20 fields)
    raw_rows = list(csv.reader(LLMPERF.read_text().splitlines()))
    assert len(raw_rows[0]) == 20 and len(raw_rows[1]) == 16
    assert any(r.get("Metric Value") == "n/a" for r in _table(LLMPERF))


def test_rule_results_become_findings_ordered_by_time_saved() -> None:
    rules = [r for r in _table(SUPERBENCH) if r.get("Rule Name")]
    duration = _num(_details(SUPERBENCH, "Duration", "GPU Speed Of Light Throughput")[0][0])
    expected = sorted(
        (round(duration * _num(r["Estimated Speedup"]) / 100) if r["Estimated Speedup"] else 0 for r in rules),
        reverse=True,
    )
    findings = analyze_ncu(SUPERBENCH).findings
    assert len(findings) == len(rules) == 8  # every rule message of the one launch is a finding
    assert [f.evidence["at_stake_ns"] for f in findings] == expected
    top = findings[0]
    best = max(rules, key=lambda r: _num(r["Estimated Speedup"] or "0"))
    assert top.id == f"ncu.{best['Rule Name']}" == "ncu.TheoreticalOccupancy"
    assert top.evidence["estimated_speedup_pct"] == _num(best["Estimated Speedup"])
    assert top.evidence["speedup_type"] == best["Estimated Speedup Type"]
    assert top.evidence["kernel"] == best["Kernel Name"]
    assert top.severity == "warning"  # OPT
    assert top.title.endswith(best["Rule Description"].split(". ")[0] + ".")


def test_info_rules_are_info_findings() -> None:
    findings = analyze_ncu(LLMPERF).findings
    roofline = next(f for f in findings if f.id == "ncu.SOLFPRoofline")
    assert roofline.severity == "info" and roofline.evidence["rule_type"] == "INF"


# ---------------------------------------------------------------------------- NVTX stack (built here)


def _entry(name: str, payload: int | None, color: str) -> str:
    pl = ("Int64", str(payload)) if payload is not None else ("none", "none")
    return f'"gpuprobe:{name}:{pl[0]}:{pl[1]}:RGB:{color}:REGISTERED:{name}"'


def _stack(*ranges: tuple[str, int | None, str]) -> str:
    return "1  " + "  ".join(_entry(*r) for r in ranges) + " " if ranges else ""


GEN = ("generate LlamaForCausalLM", None, "0x4e79a7")


def _step(kind: str, n: int) -> tuple[str, int, str]:
    return (kind, n, "0xf28e2b")


def _comp(name: str, n: int) -> tuple[str, int, str]:
    return (name, n, "0x59a14f")


def _proc(name: str, n: int) -> tuple[str, int, str]:
    return (name, n, "0xe15759")


#: kernel name, stack, duration (ns), SM SOL %, memory SOL %, theoretical/achieved occupancy, waves,
#: block limits (registers, shared memory, warps, blocks)
SYNTHETIC: list[tuple[str, str, int, float, float, float, float, float, tuple[int, int, int, int]]] = [
    ("nvjet_tst_128x64_64x4_1x2_h_bz_TNN", _stack(GEN, _step("prefill", 0), _comp("forward", 0),
                                                  ("LlamaDecoderLayer 0", 0, "0x76b7b2")),
     1_250_000, 78.5, 40.2, 25.0, 24.1, 1.25, (2, 3, 8, 32)),
    ("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT", _stack(GEN, _step("decode", 1), _comp("forward", 1)),
     12_345, 22.0, 86.4, 50.0, 47.0, 4.0, (4, 4, 4, 32)),
    ("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT", _stack(GEN, _step("decode", 2), _comp("forward", 2)),
     12_655, 21.0, 88.0, 50.0, 46.0, 4.0, (4, 4, 4, 32)),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
     _stack(GEN, _step("decode", 1), _proc("TopKLogitsWarper", 1)), 3_100, 3.5, 9.0, 100.0, 30.0, 0.02,
     (32, 32, 2, 32)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     _stack(GEN, _step("decode", 2), _proc("RepetitionPenaltyLogitsProcessor", 2)), 2_048, 1.0, 4.0, 100.0, 12.0,
     0.01, (16, 32, 2, 32)),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<bool, at::native::func_wrapper_t<bool> > >"
     "(at::native::ReduceOp<bool>)", _stack(GEN, _step("decode", 2), _comp("stopping_criteria", 2)), 1_999,
     2.0, 5.0, 100.0, 40.0, 0.01, (16, 32, 2, 32)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", _stack(), 1_024, 1.0, 2.0, 100.0, 10.0,
     0.01, (16, 32, 2, 32)),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, "
     "unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int)",
     _stack(GEN, _step("decode", 1)), 4_321, 4.0, 12.5, 100.0, 35.0, 0.01, (16, 32, 2, 32)),
]


def _write_synthetic(path: Path, rows: list[Any] = SYNTHETIC) -> None:
    """A raw page as ncu --nvtx --csv --page raw writes it: ==PROF== lines, header, units row,
    numbers with thousands separators, the push/pop NVTX column."""
    metrics = [
        ("gpu__time_duration.sum", "nsecond"),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%"),
        ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
        ("sm__maximum_warps_per_active_cycle_pct", "%"),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "%"),
        ("launch__waves_per_multiprocessor", ""),
        ("launch__occupancy_limit_registers", "block"),
        ("launch__occupancy_limit_shared_mem", "block"),
        ("launch__occupancy_limit_warps", "block"),
        ("launch__occupancy_limit_blocks", "block"),
    ]
    ident = ["ID", "Process ID", "Process Name", "Host Name", NVTX_COLUMN, "Kernel Name", "Context", "Stream",
             "Block Size", "Grid Size", "Device", "CC"]
    buf = io.StringIO()
    buf.write("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n")
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(ident + [m for m, _ in metrics])
    writer.writerow([""] * len(ident) + [u for _, u in metrics])
    for i, (name, stack, dur, sm, mem, theo, ach, waves, limits) in enumerate(rows):
        writer.writerow([str(i), "4242", "python3.12", "127.0.0.1", stack, name, "1", "7", "(128, 1, 1)",
                         "(132, 1, 1)", "0", "9.0", f"{dur:,}", f"{sm:,.2f}", f"{mem:,.2f}", f"{theo:.2f}",
                         f"{ach:.2f}", f"{waves:.2f}", *(str(x) for x in limits)])
    buf.write("==PROF== Disconnected from process 4242\n")
    path.write_text(buf.getvalue(), encoding="utf-8")


def test_the_nvtx_stack_of_the_h200_format_is_parsed() -> None:
    stack = parse_nvtx_stack(_stack(GEN, _step("decode", 1), _comp("forward", 1)))
    assert [(r.domain, r.name, r.payload) for r in stack] == [
        ("gpuprobe", "generate LlamaForCausalLM", None), ("gpuprobe", "decode", "1"), ("gpuprobe", "forward", "1")]
    # a message with colons is found by its repetition in the Msg field
    odd = parse_nvtx_stack('7  "<default domain>:a:b:none:none:none:none:none:a:b"')
    assert [(r.domain, r.name) for r in odd] == [("<default domain>", "a:b")]
    assert parse_nvtx_stack("") == []


def test_kernels_group_by_gpuprobe_step_component_and_processor(tmp_path: Path) -> None:
    path = tmp_path / "decode.csv"
    _write_synthetic(path)
    report = analyze_ncu(path)
    assert report.has_nvtx

    def total(pred: Any) -> int:
        return sum(r[2] for r in SYNTHETIC if pred(r[1]))

    steps = {r.name: r for r in report.steps}
    assert set(steps) == {"prefill", "decode"}
    assert steps["decode"].duration_ns == total(lambda s: '"gpuprobe:decode:' in s)
    assert steps["decode"].launches == sum('"gpuprobe:decode:' in r[1] for r in SYNTHETIC) == 6
    assert steps["prefill"].duration_ns == SYNTHETIC[0][2]
    assert steps["decode"].evidence["steps"] == "1, 2"  # the payloads: the step indices
    components = {r.name: r.duration_ns for r in report.components}
    assert components == {
        "forward": total(lambda s: ":forward:" in s),
        "TopKLogitsWarper": SYNTHETIC[3][2],
        "RepetitionPenaltyLogitsProcessor": SYNTHETIC[4][2],
        "stopping_criteria": SYNTHETIC[5][2],
        "other": SYNTHETIC[7][2],  # in the step, in no range inside it (token selection)
    }
    assert {r.name for r in report.processors} == {"TopKLogitsWarper", "RepetitionPenaltyLogitsProcessor"}
    # the kernel outside every gpuprobe range counts in the kernels, in no step
    assert report.launches == len(SYNTHETIC)
    assert sum(r.launches for r in report.steps) == len(SYNTHETIC) - 1


def test_step_ranges_outside_the_gpuprobe_domain_are_named_in_a_warning(tmp_path: Path) -> None:
    # torch.cuda.nvtx writes to the default domain: the stack holds the same messages there
    rows = [(name, stack.replace('"gpuprobe:', '"<default domain>:'), *rest) for name, stack, *rest in SYNTHETIC]
    path = tmp_path / "default_domain.csv"
    _write_synthetic(path, rows)
    report = analyze_ncu(path)
    assert report.steps == [] and report.launches == len(SYNTHETIC)
    assert any("'<default domain>'" in w and "nvtx package" in w for w in report.warnings)


def test_classes_follow_the_documented_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "decode.csv"
    _write_synthetic(path)
    kernels = {r.name: r for r in analyze_ncu(path).kernels}
    prefill = kernels[SYNTHETIC[0][0]]
    # SM 78.5 % >= 60 and above memory: compute-bound; theoretical 25 % < 50 % limited by registers (2
    # blocks, the lowest limit); 1.25 waves: the partial wave leaves (2 - 1.25) / 2 = 37.5 % idle >= 20 %
    assert prefill.classes == ["compute-bound", "under-occupied", "tail-effect"]
    assert prefill.limiter == "registers"
    assert "38 %" in prefill.evidence["tail-effect"]
    gemv = kernels[SYNTHETIC[1][0]]
    assert gemv.launches == 2
    weights = (SYNTHETIC[1][2], SYNTHETIC[2][2])
    mem = (SYNTHETIC[1][4] * weights[0] + SYNTHETIC[2][4] * weights[1]) / sum(weights)
    assert gemv.memory_sol_pct == pytest.approx(mem)
    # memory >= 60 and above SM: memory-bound; 4.0 waves: no tail; a three-way tie of block limits
    assert gemv.classes == ["memory-bound"]
    assert gemv.limiter == "registers, shared memory, warps"
    softmax = kernels[SYNTHETIC[3][0]]
    # 3.5 % and 9 %: latency-bound; achieved 30 % < 0.8 x 100 %; 0.02 waves: under one wave
    assert softmax.classes == ["latency-bound", "under-occupied"]
    # a stricter threshold moves the GEMV out of memory-bound
    strict = {r.name: r for r in analyze_ncu(path, thresholds=["ncu.sol_high_pct=90"]).kernels}
    assert strict[SYNTHETIC[1][0]].classes == ["latency-bound"]


def test_json_text_md_and_csv_of_an_ncu_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "decode.csv"
    _write_synthetic(path)
    out = tmp_path / "r.json"
    assert main_report([str(path), "--format", "json", "-o", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["schema"] == "gpuprobe.ncu/1"
    assert {r["name"] for r in body["processors"]} == {"TopKLogitsWarper", "RepetitionPenaltyLogitsProcessor"}
    assert body["kernels"][0]["duration_ns"] == SYNTHETIC[0][2]
    assert main_report([str(path), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## Logits processors (NVTX)" in md and "| TopKLogitsWarper |" in md
    assert main_report([str(path), "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    sections = {r[0] for r in rows if r}
    assert {"ncu_kernels", "ncu_families", "ncu_steps", "ncu_components", "ncu_processors"} <= sections
    assert main_report([str(path)]) == 0
    text = capsys.readouterr().out
    assert "gpuprobe steps (NVTX)" in text and "compute-bound, under-occupied, tail-effect" in text


# ---------------------------------------------------------------------------- timeline join and diff


#: the families of the kernels in kineto_ncu_esmm.json, by hand: template arguments, parameters
#: and tile shapes dropped
FAMILY = {
    "basic(int, int, int, const float *, const float *, float *)": "basic",
    "void gmem_coalesce<(int)32>(int, int, int, const float *, const float *, float *)": "gmem_coalesce",
    "ampere_sgemm_128x64_nn": "ampere_sgemm_nn",
    "void warptiling<(int)128, (int)128, (int)16, (int)64, (int)64, (int)4, (int)8, (int)4, (int)128>"
    "(int, int, int, float *, float *, float *)": "warptiling",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)":
        "at::native::cunn_SoftMaxForward",
}


def test_a_timeline_with_ncu_puts_share_beside_efficiency(tmp_path: Path) -> None:
    events = [e for e in json.loads(JOIN_TRACE.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    times: dict[str, float] = {}
    counts: dict[str, int] = {}
    for e in events:
        times[FAMILY[e["name"]]] = times.get(FAMILY[e["name"]], 0.0) + e["dur"] * 1000
        counts[FAMILY[e["name"]]] = counts.get(FAMILY[e["name"]], 0) + 1
    whole = sum(times.values())
    ncu_launches: dict[str, int] = {}
    for r in _table(ESMM):
        if r["Metric Name"] == "gpu__time_duration.sum":
            fam = FAMILY.get(r["Kernel Name"])
            if fam:
                ncu_launches[fam] = ncu_launches.get(fam, 0) + 1
    out = tmp_path / "joined.json"
    assert main_report([str(JOIN_TRACE), "--ncu", str(ESMM), "--format", "json", "-o", str(out), "--top", "3"]) == 0
    body = json.loads(out.read_text())
    assert body["schema"] == "gpuprobe.report/1" and body["ncu"]["schema"] == "gpuprobe.ncu/1"
    rows = {r["family"]: r for r in body["ncu"]["timeline"]}
    for fam, ns in times.items():
        assert rows[fam]["timeline_ns"] == round(ns)
        assert rows[fam]["timeline_share"] == pytest.approx(ns / whole)
        assert rows[fam]["timeline_count"] == counts[fam]
        assert rows[fam]["ncu_launches"] == ncu_launches.get(fam, 0)
    timeline_categories = {r["family"]: r["category"] for r in body["families"]["rows"]}
    for row in body["ncu"]["families"]:  # the same family names and categories as the timeline report
        if row["name"] in timeline_categories:
            assert row["category"] == timeline_categories[row["name"]]
    assert rows["at::native::cunn_SoftMaxForward"]["ncu_launches"] == 0  # not profiled by ncu
    assert rows["smem_blocking"]["timeline_ns"] is None  # profiled by ncu, not in the timeline
    assert len(body["families"]["rows"]) == 3  # the timeline's own table keeps --top


def test_text_report_with_ncu_has_both_parts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_report([str(JOIN_TRACE), "--ncu", str(SUPERBENCH), "--sections", "kernels"]) == 0
    text = capsys.readouterr().out
    assert "Top kernels" in text or "kernels" in text.lower()
    assert "share of GPU time (timeline) and efficiency (ncu)" in text
    assert "no kernel family of" in text  # a B200 GEMM beside an A10G trace: nothing in common


def _scaled(src: Path, dst: Path, factor: dict[str, float]) -> None:
    """A copy of a details export whose durations of some kernels are scaled (same quoting)."""
    lines = src.read_text().splitlines()
    rows = list(csv.reader(lines))
    header = rows[0]
    name, metric, value = header.index("Kernel Name"), header.index("Metric Name"), header.index("Metric Value")
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    for r in rows[1:]:
        if r[metric] == "gpu__time_duration.sum" and r[name] in factor:
            r[value] = f"{round(_num(r[value]) * factor[r[name]]):,}"
        writer.writerow(r)
    dst.write_text(buf.getvalue())


def test_diff_of_two_ncu_exports_per_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warp = next(n for n in FAMILY if n.startswith("void warptiling"))
    after = tmp_path / "after.csv"
    _scaled(ESMM, after, {warp: 0.5})
    a = {int(k): _num(v) for k, (v, _) in _details(ESMM, "gpu__time_duration.sum").items()}
    b = {int(k): _num(v) for k, (v, _) in _details(after, "gpu__time_duration.sum").items()}
    names = {int(r["ID"]): r["Kernel Name"] for r in _table(ESMM)}
    warp_a = sum(v for k, v in a.items() if names[k] == warp)
    warp_b = sum(v for k, v in b.items() if names[k] == warp)
    assert warp_b < warp_a
    d = diff_ncu(ESMM, after)
    rows = {r.family: r for r in d.families}
    assert rows["warptiling"].delta_ns == round(warp_b) - round(warp_a)
    assert rows["warptiling"].ratio == pytest.approx(round(warp_b) / round(warp_a))
    assert rows["basic"].delta_ns == 0
    assert d.families[0].family == "warptiling"  # ordered by the size of the change
    out = tmp_path / "d.json"
    assert main_diff([str(ESMM), str(after), "--format", "json", "-o", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["schema"] == "gpuprobe.ncu-diff/1"
    # findings as in every other JSON output: asks_nothing only where it is true
    assert body["findings"] == (None if d.findings is None else [f.to_dict() for f in d.findings])
    assert main_diff([str(ESMM), str(after)]) == 0
    assert "Nsight Compute diff" in capsys.readouterr().out


def test_a_timeline_from_nsys_with_ncu(tmp_path: Path, nsys_db: Path) -> None:
    import sqlite3

    export = tmp_path / "decode.csv"
    _write_synthetic(export)
    con = sqlite3.connect(nsys_db)
    kernels = con.execute(
        "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    ).fetchall()
    con.close()
    whole = sum(d for _, d in kernels)
    gemv = dict(kernels)["nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT"]
    out = tmp_path / "joined.json"
    assert main_report([str(nsys_db), "--ncu", str(export), "--format", "json", "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["ncu"]["timeline"]
    row = next(r for r in rows if r["timeline_ns"] == gemv)
    weights = (SYNTHETIC[1][2], SYNTHETIC[2][2])
    assert row["timeline_share"] == pytest.approx(gemv / whole)
    assert row["ncu_launches"] == 2
    assert row["memory_sol_pct"] == pytest.approx(
        (SYNTHETIC[1][4] * weights[0] + SYNTHETIC[2][4] * weights[1]) / sum(weights))
    assert row["classes"] == ["memory-bound"]


def test_several_ncu_exports_are_one_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "both.json"
    assert main_report([str(LLMPERF), str(SUPERBENCH), "--format", "json", "-o", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["launches"] == 2
    rules = [r for p in (LLMPERF, SUPERBENCH) for r in _table(p) if r.get("Rule Name")]
    assert len(body["findings"]) == len(rules)
    assert main_report([str(LLMPERF), str(JOIN_TRACE)]) == 2
    assert "join them with --ncu" in capsys.readouterr().err


def test_diff_of_an_ncu_export_and_a_timeline_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_diff([str(ESMM), str(JOIN_TRACE)]) == 2
    assert "one Nsight Compute export and one timeline trace" in capsys.readouterr().err


# ---------------------------------------------------------------------------- bad input, exit codes


def test_an_export_with_only_errors_names_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    first_error = ERROR_ONLY.read_text().splitlines()[0]
    assert first_error.startswith("==ERROR==")
    assert main_report([str(ERROR_ONLY)]) == 2
    err = capsys.readouterr().err
    assert "Nsight Compute reported errors" in err and first_error[len("==ERROR=="):].strip() in err
    assert err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('==PROF== Connected to process 1\n"ID","Process ID","Kernel Name","gpu__time_duration.sum"\n',
         "no kernel rows"),
        ('"ID","Process ID","Kernel Name","gpu__time_duration.sum"\n"x","1","k","5"\n', "not a number"),
        ("==PROF== Connected to process 1\nhello\n", "no table header"),
        ("==PROF== Connected to process 1\n==PROF== Disconnected from process 1\n"
         "==WARNING== No kernels were profiled.\n", "profiled no kernels"),
    ],
    ids=["header-only", "bad-id", "no-table", "no-kernels-profiled"],
)
def test_bad_csv_exports(tmp_path: Path, content: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    assert main_report([str(path)]) == 2
    assert words in capsys.readouterr().err


def test_an_ncu_rep_without_a_reader_says_what_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = tmp_path / "profile.bin"  # detected by content, not by extension
    rep.write_bytes(b"NVR\x00\x07\x00\x00\x00" + bytes(64))
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu here
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # and no ncu_report module
    assert main_report([str(rep)]) == 2
    err = capsys.readouterr().err
    assert "ncu_report" in err and "ncu command on PATH" in err


def test_an_ncu_rep_is_read_through_ncu_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the ncu command (Nsight Compute cannot run here): it prints a real export of
    # the page asked for, as `ncu --import FILE --csv --page PAGE` would.
    rep = tmp_path / "profile.ncu-rep"
    rep.write_bytes(b"NVR\x00" + bytes(32))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ncu"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"--page details"*) cat "{SUPERBENCH}";; *) cat "{RAW_2019}";; esac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "ncu_report", None)
    export = read_ncu(rep)
    assert [k.name for k in export.kernels] == [r["Kernel Name"] for r in _table(RAW_2019) if r["ID"]]
    # the rules come from the details page, by launch ID (ID 0 in both)
    assert [r.name for r in export.kernels[0].rules] == [r["Rule Name"] for r in _table(SUPERBENCH) if r["Rule Name"]]
    assert export.kernels[1].rules == []


def test_fail_on_gates_on_ncu_findings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_report([str(SUPERBENCH), "--fail-on", "warning"]) == 3
    assert "ncu.TheoreticalOccupancy" in capsys.readouterr().err
    assert main_report([str(SUPERBENCH), "--fail-on", "critical"]) == 0


def test_options_of_timelines_are_refused_for_an_ncu_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_report([str(ESMM), "--sections", "kernels"]) == 2
    assert "apply to timeline traces" in capsys.readouterr().err
    assert main_report([str(ESMM), "--threshold", "ncu.nope=1"]) == 2
    assert "unknown threshold 'ncu.nope'" in capsys.readouterr().err


def test_the_timeline_loader_points_an_ncu_export_elsewhere() -> None:
    with pytest.raises(ReportInputError, match="an Nsight Compute export, not a timeline"):
        load(SUPERBENCH)


def test_render_rejects_an_unknown_format() -> None:
    from gpuprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="format must be one of"):
        render_ncu(analyze_ncu(ESMM), "xml")


def test_every_ncu_threshold_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    for name, t in NCU_THRESHOLDS.items():  # the table row, default and meaning as in the code
        assert f"| `{name}` | {t.default:g} | {t.meaning} |" in doc, name


# ---------------------------------------------------------------------------- gpuprobe ncu-args


def test_ncu_args_select_steps_and_components(capsys: pytest.CaptureFixture[str]) -> None:
    assert ncu_args(step="decode") == ["--nvtx", "--nvtx-include", "gpuprobe@decode/"]
    assert ncu_args(step="prefill", count=10)[-2:] == ["--launch-count", "10"]
    assert gpuprobe_cli.main(["ncu-args", "--component", "RepetitionPenaltyLogitsProcessor"]) == 0
    assert capsys.readouterr().out == "--nvtx --nvtx-include gpuprobe@RepetitionPenaltyLogitsProcessor/\n"
    assert ncu_args_main(["--component", "LlamaDecoderLayer 3", "--steps", "5-7"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "--nvtx --nvtx-include 'gpuprobe@LlamaDecoderLayer 3/' --profile-from-start off\n"
    assert "GPUPROBE_PROFILE_STEPS=5-7" in captured.err and "GPUPROBE_PROFILE_NSYS=1" in captured.err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "say what to select"),
        (["--step", "decode", "--component", "forward"], "choose --step or --component"),
        (["--step", "step"], "invalid choice"),
        (["--steps", "9-3"], "A <= B"),
        (["--component", "a/b"], "without '/'"),
        (["--step", "decode", "--count", "0"], "must be positive"),
    ],
)
def test_ncu_args_bad_arguments(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ncu_args_main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


class _Metric:
    def __init__(self, value: str, unit: str) -> None:
        self.value, self._unit = value, unit

    def as_double(self) -> float:
        return _num(self.value)

    def unit(self) -> str:
        return self._unit


class _Domain:
    def __init__(self, name: str, ranges: list[str]) -> None:
        self._name, self._ranges = name, ranges

    def name(self) -> str:
        return self._name

    def push_pop_ranges(self) -> list[str]:
        return self._ranges


class _Nvtx:
    def __init__(self, domains: list[_Domain]) -> None:
        self._domains = domains

    def domains(self) -> list[int]:
        return list(range(len(self._domains)))

    def domain_by_id(self, i: int) -> _Domain:
        return self._domains[i]


class _Action:
    def __init__(self, row: dict[str, str], units: dict[str, str], nvtx: _Nvtx) -> None:
        self.row, self.units, self.nvtx = row, units, nvtx

    def name(self) -> str:
        return self.row["Kernel Name"]

    def metric_names(self) -> list[str]:
        return [k for k, u in self.units.items() if "__" in k]

    def metric_by_name(self, name: str) -> _Metric:
        return _Metric(self.row[name], self.units[name])

    def nvtx_state(self) -> _Nvtx:
        return self.nvtx


def test_an_ncu_rep_is_read_through_ncu_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for NVIDIA's ncu_report module (it ships with Nsight Compute, absent here), with
    # the calls of its documented interface, serving the rows of a real raw export.
    rows = _table(RAW_2019)
    units, kernels = rows[0], rows[1:]
    nvtx = _Nvtx([_Domain("gpuprobe", ["generate m", "decode"])])
    actions = [_Action(r, units, nvtx) for r in kernels]

    class _Range:
        def num_actions(self) -> int:
            return len(actions)

        def action_by_idx(self, i: int) -> _Action:
            return actions[i]

    class _Context:
        def num_ranges(self) -> int:
            return 1

        def range_by_idx(self, i: int) -> _Range:
            return _Range()

    module = type(sys)("ncu_report")
    module.load_report = lambda path: _Context()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ncu_report", module)
    rep = tmp_path / "decode.ncu-rep"
    rep.write_bytes(b"NVR\x00" + bytes(32))
    report = analyze_ncu(rep)
    assert report.duration_ns == round(sum(_num(r["gpu__time_duration"]) for r in kernels))
    assert report.steps[0].name == "decode" and report.steps[0].launches == len(kernels)
    assert any("no rule results" in w for w in report.warnings)
    module.load_report = lambda path: 1 / 0  # type: ignore[attr-defined]
    with pytest.raises(ReportInputError, match="ncu_report cannot read it: ZeroDivisionError"):
        read_ncu(rep)


@pytest.mark.parametrize("source", [RAW_2019_STDOUT, ESMM, LLMPERF, SUPERBENCH], ids=lambda p: p.name)
def test_damaged_exports_give_a_report_or_an_input_error(source: Path, tmp_path: Path) -> None:
    data = source.read_bytes()
    path = tmp_path / "damaged.csv"
    outcomes = set()
    for cut in range(1, len(data), max(1, len(data) // 60)):  # cut anywhere, or a slice taken out
        for variant in (data[:cut], data[:cut] + data[cut + 7:]):
            path.write_bytes(variant)
            try:
                report = analyze_ncu(path)
            except ReportInputError:
                outcomes.add("error")
                continue
            for fmt in ("text", "md", "json", "csv"):
                assert render_ncu(report, fmt)
            outcomes.add("report")
    assert outcomes == {"report", "error"}


def test_findings_in_json_as_in_every_other_output_asks_nothing_only_where_true() -> None:
    report = analyze_ncu(SUPERBENCH)
    assert report.findings  # the export has rule results
    body = report.to_dict()
    assert body["findings"] == [f.to_dict() for f in report.findings]
    for finding, shown in zip(report.findings, body["findings"]):
        assert ("asks_nothing" in shown) == finding.asks_nothing
