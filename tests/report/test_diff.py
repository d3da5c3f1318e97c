"""``diff``: deltas per step, per token or in total, checked against raw sums of both traces."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import diff, kernel_family
from gpuprobe.report.cli import main_diff

NEW_GEMM = "nvjet_tst_128x16_64x8_1x2_v_bz_splitK_TNT"  # another tile of the same GEMM
NEW_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int)"
)


@pytest.fixture(scope="module")
def pair(kineto_min: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """kineto_min, and a copy whose GEMM uses another tile (20.000 µs) plus one more element-wise kernel."""
    # plain floats are fine here: shortest repr round-trips these small values digit for digit
    doc = json.loads(kineto_min.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("nvjet"):
            e["name"] = NEW_GEMM
            e["dur"] = 20.0
    launch = next(e for e in doc["traceEvents"] if e.get("name") == "cudaLaunchKernel")
    extra_launch = copy.deepcopy(launch)
    extra_launch.update(ts=1040.0, dur=2.5)
    extra_launch["args"]["correlation"] = 200
    extra_kernel = {
        "ph": "X",
        "cat": "kernel",
        "name": NEW_KERNEL,
        "pid": 0,
        "tid": 7,
        "ts": 1045.0,
        "dur": 3.008,
        "args": {"correlation": 200, "stream": 7, "device": 0},
    }
    doc["traceEvents"] += [extra_launch, extra_kernel]
    b = tmp_path_factory.mktemp("diff") / "b.json"
    b.write_text(json.dumps(doc))
    return kineto_min, b


def categories_from_raw(doc: dict[str, Any], ns: Any) -> dict[str, int]:
    """Per-category GPU ns, by this test's own reading of the four kernel names involved."""
    out: dict[str, int] = defaultdict(int)
    names = {
        "nvjet": "gemm",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward": "softmax",
        "void at::native::vectorized_elementwise_kernel": "elementwise",
    }
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "kernel":
            out[next(c for prefix, c in names.items() if e["name"].startswith(prefix))] += ns(e["dur"])
        elif e.get("cat") in ("gpu_memcpy", "gpu_memset"):
            out[e["cat"][4:]] += ns(e["dur"])
    return out


def test_category_deltas_per_step(pair: tuple[Path, Path], raw: Any, ns: Any) -> None:
    a, b = pair
    d = diff(a, b)
    expected_a, expected_b = categories_from_raw(raw(a), ns), categories_from_raw(raw(b), ns)
    rows = {r.key: r for r in d.categories}
    assert set(rows) == set(expected_a) | set(expected_b)
    for cat, row in rows.items():
        assert (row.a, row.b) == (expected_a.get(cat, 0), expected_b.get(cat, 0))
        assert row.delta == expected_b.get(cat, 0) - expected_a.get(cat, 0)
    assert rows["gemm"].delta == 20_000 - 18_304
    assert rows["elementwise"].delta == 3_008 and rows["elementwise"].ratio is None


def test_tile_variants_compare_as_one_kernel_family(pair: tuple[Path, Path]) -> None:
    a, b = pair
    d = diff(a, b)
    family = kernel_family(NEW_GEMM)
    gemm_rows = [r for r in d.families if r.key.startswith("nvjet")]
    assert [r.key for r in gemm_rows] == [family]
    assert (gemm_rows[0].a, gemm_rows[0].b) == (18_304, 20_000)
    assert gemm_rows[0].ratio == pytest.approx(20_000 / 18_304)


def test_overview_counts_launches_and_kernels(pair: tuple[Path, Path]) -> None:
    d = diff(*pair)
    rows = {r.key: r for r in d.overview}
    assert (rows["kernels"].a, rows["kernels"].b) == (2, 3)
    assert rows["launches"].delta == 1
    assert rows["kernel time"].delta == (20_000 + 9_120 + 3_008) - (18_304 + 9_120)
    assert rows["GPU busy in steps"].a_median == 18_304 + 9_120 + 1_376 + 960


def test_totals_and_per_token_normalisation(pair: tuple[Path, Path]) -> None:
    totals = {r.key: r for r in diff(*pair, normalize="none").categories}
    per_token = {r.key: r for r in diff(*pair, normalize="token", tokens_a=4, tokens_b=2).categories}
    assert per_token["gemm"].a == pytest.approx(totals["gemm"].a / 4)
    assert per_token["gemm"].b == pytest.approx(totals["gemm"].b / 2)


def test_diff_of_cpu_traces_with_and_without_a_logits_processor(cpu_traces: dict[str, Path], raw: Any, ns: Any) -> None:
    d = diff(cpu_traces["plain"], cpu_traces["processor"], top=1000)
    assert (d.a_units, d.b_units) == (6, 6)
    sums = []
    for variant in ("plain", "processor"):
        per_op: dict[str, int] = defaultdict(int)
        for e in raw(cpu_traces[variant])["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op":
                per_op[e["name"]] += ns(e["dur"])
        sums.append(per_op)
    for row in d.cpu_ops:
        assert row.a == pytest.approx(sums[0].get(row.key, 0) / 6)
        assert row.b == pytest.approx(sums[1].get(row.key, 0) / 6)
    processor = [
        ns(e["dur"])
        for e in raw(cpu_traces["processor"])["traceEvents"]
        if e.get("cat") == "user_annotation" and e["name"] == "logits_processor"
    ]
    row = next(r for r in d.ranges if r.key == "logits_processor" and r.metric == "cpu_ns")
    assert len(processor) == 6
    assert (row.a, row.b) == (0, pytest.approx(sum(processor) / 6))


def test_diff_command_renders_every_format(pair: tuple[Path, Path], capsys: Any) -> None:
    a, b = pair
    for fmt in ("text", "md", "csv"):
        assert main_diff([str(a), str(b), "--format", fmt]) == 0
        assert "gemm" in capsys.readouterr().out
    assert main_diff([str(a), str(b), "--format", "json", "--normalize", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuprobe.diff/1" and doc["normalize"] == "none"


def test_a_trace_without_steps_falls_back_to_totals_with_a_warning(tmp_path: Path, kineto_min: Path) -> None:
    d = diff(kineto_min, kineto_min, step_pattern="^no such range$")
    assert (d.a_units, d.b_units) == (1.0, 1.0)
    assert any("no step ranges" in w for w in d.warnings)
