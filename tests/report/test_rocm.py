"""ROCm traces (tests/data/kineto, from HolisticTraceAnalysis and TraceLens: see its README): HIP launch
calls join their GPU operations like CUDA's, AMD library kernels get their categories, and every rule
of the categorizer is checked on its own example."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe._kernel_names import CATEGORIES, RULES, categorize_kernel, matching_rule
from gpuprobe.report import analyze

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
ROCM = [
    "hta_mi250_rocm_minitoy.json.gz",
    "tracelens_mi300_bert_small_attn.json.gz",
    "tracelens_mi300_ddp_resnet_rccl.json.gz",
    "tracelens_mi300_sglang_qwen3_decode.json.gz",
    "tracelens_mi300_sglang_qwen3_prefill.json.gz",
    "tracelens_mi300_vllm_decode_fullgraph.json.gz",
    "tracelens_mi300_vllm_piecewise_graphs.json.gz",
]
# HIP calls that enqueue GPU work, written out here independently of gpuprobe's tables
_HIP_LAUNCH = re.compile(
    r"^hip(?:Ext)?(?:Module)?LaunchKernel$|^hipLaunchCooperativeKernel|^hipGraphLaunch$|^hipMemcpy|^hipMemset"
)


def _events(name: str) -> list[dict[str, Any]]:
    return [e for e in read_trace(KINETO / name)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.parametrize("name", ROCM)
def test_hip_launches_join_their_gpu_operations(name: str) -> None:
    ev = _events(name)
    launches = [e for e in ev if e["cat"] == "cuda_runtime" and _HIP_LAUNCH.match(re.sub(r"_v\d+$", "", e["name"]))]
    corr = {e["args"]["correlation"] for e in launches}
    gpu = [e for e in ev if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    joined = sum(1 for e in gpu if e["args"].get("correlation") in corr)
    report = analyze(KINETO / name)
    assert report.summary.launch_count == len(launches) > 0
    assert report.summary.gpu_op_count - report.launches.gpu_ops_without_launch == joined
    assert joined > 0


def test_hip_syncs_are_syncs() -> None:
    ev = _events("hta_mi250_rocm_minitoy.json.gz")
    syncs = [e for e in ev if e["cat"] == "cuda_runtime" and (e["name"].endswith("Synchronize") or e["name"] == "hipMemcpyWithStream")]
    report = analyze(KINETO / "hta_mi250_rocm_minitoy.json.gz")
    assert report.launches.sync_count == len(syncs) == 3
    assert report.launches.sync_ns == sum(to_ns(e["dur"]) for e in syncs)


def test_steps_see_their_hip_launches() -> None:
    report = analyze(KINETO / "tracelens_mi300_sglang_qwen3_prefill.json.gz")
    assert report.steps.rows and all(r.launches > 0 and r.kernels > 0 for r in report.steps.rows)


def test_tensile_gemms_are_gemms_not_other() -> None:
    ev = _events("tracelens_mi300_sglang_qwen3_prefill.json.gz")
    kernels = [e for e in ev if e["cat"] == "kernel"]
    tensile = sum(to_ns(e["dur"]) for e in kernels if e["name"].startswith("Cijk_"))
    total = sum(to_ns(e["dur"]) for e in ev if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert tensile / total > 0.8  # most of this serving trace is Tensile GEMMs
    cats = {r.category: r for r in analyze(KINETO / "tracelens_mi300_sglang_qwen3_prefill.json.gz").categories.rows}
    assert cats["gemm"].total_ns >= tensile
    assert cats.get("other") is None or cats["other"].total_ns / total < 0.01


def test_rccl_and_ck_convolutions() -> None:
    ev = _events("tracelens_mi300_ddp_resnet_rccl.json.gz")
    rccl = {e["name"] for e in ev if e["cat"] == "kernel" and "nccl" in e["name"].lower()}
    conv = {e["name"] for e in ev if e["cat"] == "kernel" and "grouped_conv" in e["name"]}
    assert rccl and conv
    assert {categorize_kernel(n) for n in rccl} == {"communication"}
    assert {categorize_kernel(n) for n in conv} == {"conv"}


@pytest.mark.parametrize("rule", RULES, ids=[f"{r.category}:{r.source}" for r in RULES])
def test_each_categorizer_rule_on_its_example(rule: Any) -> None:
    assert rule.category in CATEGORIES
    assert matching_rule(rule.example) is rule
    assert categorize_kernel(rule.example) == rule.category


@pytest.mark.parametrize(
    ("name", "category"),
    [
        # a type conversion in a template argument is not a convolution
        ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
         "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)", "norm"),
        ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(c10::BFloat16*)",
         "elementwise"),
        ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*)", "other"),
        ("void convert_fp8_kernel<float>(float*)", "other"),
    ],
)
def test_false_matches(name: str, category: str) -> None:
    assert categorize_kernel(name) == category
