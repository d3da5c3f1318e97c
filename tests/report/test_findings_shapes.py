"""The static- vs dynamic-cache experiment as kineto traces built in the shape of real ones
(tests/kineto_shapes.py): A, a dynamic cache run eagerly; B, a static cache compiled into one CUDA graph
replay per step with generate's loop still eager; C, a static cache run eagerly. Every expected figure
is computed here from the raw events written."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns
from kineto_shapes import KinetoTrace

from gpuprobe.report import analyze, diff, render

LAYERS = 4
STEPS = 8
GEMM = "nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, "
         "cutlass::bfloat16_t>, false, false, false, false, true, true, false>(Flash_fwd_params)")
CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::"
       "OpaqueType<2u>, unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, "
       "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::"
       "OpaqueType<2u>, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, "
       "4u>, int, unsigned int)")
MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, "
       "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
       "at::detail::Array<char*, 3>)")
COPY = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
        "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::"
        "Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
        "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int)")
MEAN = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<float, "
        "float, float, float>, unsigned int, c10::BFloat16, 4> >(at::native::ReduceOp<c10::BFloat16, "
        "at::native::MeanOps<float, float, float, float>, unsigned int, c10::BFloat16, 4>)")
ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
          "unsigned int, long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)")
INDEX_COPY = ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
              "at::native::index_copy_kernel_impl<c10::BFloat16>>(int)")
TRITON_NORM = "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"
TRITON_ROPE = "triton_poi_fused_add_cat_index_copy_mul_1"
TRITON_ACT = "triton_poi_fused_mul_silu_2"
LAUNCH_APIS = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch")
LOOP = "the generate loop"
LOOP_OP_US = 60.0  # host time per operator in generate's loop: Python between the calls, under the profiler


def _norm(t: KinetoTrace) -> None:
    t.kernel("aten::pow", MUL, 1.5)
    t.kernel("aten::mean", MEAN, 2.0)
    t.kernel("aten::mul", MUL, 1.5)


def _eager_forward(t: KinetoTrace, cache: str, step: int) -> None:
    """One decode step's forward, eager: per layer a dynamic cache concatenates keys and values
    (``cache="dynamic"``), a static one writes them in place (``"static"``)."""
    t.kernel("aten::cat", CAT, 1.2)  # the rotary embedding's cat((freqs, freqs))
    for _ in range(LAYERS):
        _norm(t)
        for _ in range(3):
            t.kernel("aten::linear", GEMM, 6.0)
        for _ in range(2):  # rotate_half for q and k: a small cat each
            t.kernel("aten::mul", MUL, 1.5)
            t.kernel("aten::cat", CAT, 1.5)
        for _ in range(2):  # keys, values
            if cache == "dynamic":
                t.kernel("aten::cat", CAT, 4.0 + step * 0.01)
            else:
                t.kernel("aten::index_copy_", INDEX_COPY, 1.5)
        t.kernel("aten::scaled_dot_product_attention", FLASH, 9.0)
        t.kernel("aten::linear", GEMM, 6.0)
        t.kernel("aten::add", MUL, 1.5)
        _norm(t)
        for _ in range(2):
            t.kernel("aten::linear", GEMM, 12.0)
        t.kernel("aten::silu", MUL, 2.0)
        t.kernel("aten::mul", MUL, 2.0)
        t.kernel("aten::linear", GEMM, 12.0)
        t.kernel("aten::add", MUL, 1.5)
        t.kernel("aten::to", COPY, 1.5)
    _norm(t)
    t.kernel("aten::linear", GEMM, 20.0)


def _graph_forward(t: KinetoTrace) -> None:
    """The compiled step: input copies into the graph's static buffers, then one replay."""
    for _ in range(2):
        ext = t.op("aten::copy_", t.clock, 6)
        corr = t.runtime("cudaMemcpyAsync", t.clock + 1, 3, ext)
        start = max(t.clock + 6, t.gpu_free)
        t.gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", start, 1.0, corr, ext, bytes=8)
        t.gpu_free = start + 1.0
        t.clock += 7
    nodes: list[tuple[str, float]] = []
    for _ in range(LAYERS):
        nodes += [(TRITON_NORM, 2.5)] + [(GEMM, 6.0)] * 3 + [(TRITON_ROPE, 3.0), (FLASH, 9.0), (GEMM, 6.0)]
        nodes += [(TRITON_NORM, 2.5), (GEMM, 12.0), (GEMM, 12.0), (TRITON_ACT, 2.0), (GEMM, 12.0)]
    nodes += [(TRITON_NORM, 2.5), (GEMM, 20.0)]
    t.graph(nodes)


def _loop(t: KinetoTrace, criterion_syncs: bool = False) -> None:
    """generate's loop after the forward: processors, token selection, the token append, stopping
    criteria and the stopping check, all eager."""
    t.kernel("aten::to", COPY, 1.5, op_us=LOOP_OP_US)  # next_token_logits to float
    start = t.clock
    for _ in range(2):
        t.kernel("aten::where", MUL, 1.5, op_us=LOOP_OP_US)
    t.range("MinLengthLogitsProcessor", start, t.clock - start)
    t.clock += 6
    t.kernel("aten::argmax", ARGMAX, 3.0, op_us=LOOP_OP_US)
    t.kernel("aten::cat", CAT, 1.2, op_us=LOOP_OP_US)  # input_ids = torch.cat([input_ids, next_tokens[:, None]])
    t.kernel("aten::cat", CAT, 1.2, op_us=LOOP_OP_US)  # the attention mask grows by one
    start = t.clock
    t.kernel("aten::ge", MUL, 1.2, op_us=LOOP_OP_US)
    t.range("stopping_criteria/MaxLengthCriteria", start, t.clock - start)
    start = t.clock
    t.kernel("aten::isin", MUL, 1.2, op_us=LOOP_OP_US)
    if criterion_syncs:
        t.item(outer="aten::item")
    t.range("stopping_criteria/MyEosCriterion", start, t.clock - start)
    t.kernel("aten::bitwise_and", MUL, 1.2, op_us=LOOP_OP_US)
    t.kernel("aten::max", MUL, 1.2, op_us=LOOP_OP_US)
    t.kernel("aten::eq", MUL, 1.2, op_us=LOOP_OP_US)
    t.item()  # StopCheck: bool(unfinished_sequences.max() == 0)


def experiment(variant: str, criterion_syncs: bool = False) -> KinetoTrace:
    """``dynamic`` (A), ``graph`` (B) or ``static`` (C): decode steps inside gpuprobe step ranges."""
    t = KinetoTrace()
    t.clock = 1000.0
    for step in range(1, STEPS + 1):
        t.clock = max(t.clock, t.gpu_free) + 20
        start = t.clock
        forward_start = t.clock
        if variant == "graph":
            _graph_forward(t)
        else:
            _eager_forward(t, variant, step)
        t.range("forward", forward_start, t.clock - forward_start)
        t.clock += 2
        _loop(t, criterion_syncs)
        t.range(f"gpuprobe.step#{step}", start - 1, t.clock - start + 2)
    return t


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("shapes")
    return {
        "A": experiment("dynamic").write(folder / "a_dynamic.json"),
        "B": experiment("graph").write(folder / "b_graph.json"),
        "C": experiment("static").write(folder / "c_static.json"),
        "criterion": experiment("dynamic", criterion_syncs=True).write(folder / "a_criterion.json"),
    }


# ------------------------------------------------------------------------ raw readings of a trace


class Raw:
    """A trace read back with plain json: steps, ranges, launches and GPU operations in ns."""

    def __init__(self, path: Path) -> None:
        ev = [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]
        self.ranges = [e for e in ev if e["cat"] == "user_annotation"]
        self.steps = sorted((e for e in self.ranges if e["name"].startswith("gpuprobe.step")), key=lambda e: e["ts"])
        self.ops = [e for e in ev if e["cat"] == "cpu_op"]
        self.runtime = [e for e in ev if e["cat"] == "cuda_runtime"]
        self.gpu = [e for e in ev if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
        self.launch_of = {e["args"]["correlation"]: e for e in self.runtime}

    @staticmethod
    def span(e: dict[str, Any]) -> tuple[int, int]:
        return to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])

    def in_step(self, e: dict[str, Any], step: dict[str, Any]) -> bool:
        a, b = self.span(step)
        return a <= to_ns(e["ts"]) <= b

    def launches(self, step: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in self.runtime if e["name"] in LAUNCH_APIS and self.in_step(e, step)]

    def step_gpu(self, step: dict[str, Any]) -> list[dict[str, Any]]:
        return [g for g in self.gpu if self.in_step(self.launch_of[g["args"]["correlation"]], step)]

    def busy(self, step: dict[str, Any]) -> int:
        """The union of the step's GPU operations, one ns at a time over a set (independent of the code)."""
        covered: set[int] = set()
        for g in self.step_gpu(step):
            a, b = self.span(g)
            covered.update(range(a, b))
        return len(covered)

    def innermost(self, e: dict[str, Any]) -> dict[str, Any]:
        around = [r for r in self.ranges if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]]
        return min(around, key=lambda r: r["dur"])

    def inside(self, e: dict[str, Any], name: str) -> bool:
        return any(r["name"] == name and r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in self.ranges)


def findings(path: Path, **kwargs: Any) -> dict[str, Any]:
    return {f.id: f for f in analyze(path, **kwargs).findings}


# ---------------------------------------------------------------- CUDA graphs and launch_bound agree


def test_graph_run_is_launch_bound_by_the_launches_outside_its_graphs(paths: dict[str, Path]) -> None:
    raw = Raw(paths["B"])
    decode = raw.steps
    outside = [[e for e in raw.launches(s) if e["name"] != "cudaGraphLaunch"] for s in decode]
    graph_launches = [sum(e["name"] == "cudaGraphLaunch" for e in raw.launches(s)) for s in decode]
    places: Counter[str] = Counter()
    for launches in outside:
        for e in launches:
            inner = raw.innermost(e)
            places[LOOP if inner["name"].startswith("gpuprobe.step") else inner["name"]] += 1
    node_ns = sum(to_ns(g["dur"]) for g in raw.gpu
                  if g["cat"] == "kernel" and raw.launch_of[g["args"]["correlation"]]["name"] == "cudaGraphLaunch")
    kernel_ns = sum(to_ns(g["dur"]) for g in raw.gpu if g["cat"] == "kernel")

    f = findings(paths["B"])
    lb, graphs = f["launch_bound"], f["cuda_graphs"]
    assert lb.evidence["launches_outside_graphs_per_step"] == statistics.median(len(x) for x in outside)
    assert lb.evidence["graph_replays_per_step"] == statistics.median(graph_launches) == 1
    assert lb.evidence["outside_graphs_by_place_per_step"] == {p: round(n / STEPS, 2) for p, n in places.items()}
    assert lb.evidence["graph_kernel_share"] == pytest.approx(node_ns / kernel_ns)
    assert node_ns / kernel_ns > 0.5  # the graph holds most kernel time: a warning, not "use CUDA graphs"
    assert lb.severity == "warning"
    assert lb.title.startswith("Launch-bound outside the CUDA graphs")
    assert "CUDA graphs (torch.compile" not in lb.remedy and "already replays CUDA graphs" in lb.remedy
    assert "generate's own loop" in lb.remedy and "logits processors" in lb.remedy
    assert "torch.profiler" in lb.remedy and lb.evidence["profiler"]["recorded_with"] == "torch.profiler"
    ops_per_step = [sum(raw.in_step(o, s) for o in raw.ops) for s in decode]
    assert lb.evidence["profiler"]["cpu_ops_per_step"] == statistics.median(ops_per_step)
    # cuda_graphs says the same number, and no longer tells a graph run to use graphs
    assert graphs.severity == "info"
    assert graphs.evidence["launches_outside_graphs_per_step"] == lb.evidence["launches_outside_graphs_per_step"]
    assert f"{statistics.median(len(x) for x in outside):g} launches per step run outside them" in graphs.title


def test_eager_run_is_still_told_to_use_cuda_graphs(paths: dict[str, Path]) -> None:
    f = findings(paths["A"])
    assert f["launch_bound"].title.startswith("Launch-bound: ")
    assert "CUDA graphs (torch.compile" in f["launch_bound"].remedy
    assert f["cuda_graphs"].severity == "warning" and f["cuda_graphs"].evidence["graph_launches"] == 0


# ----------------------------------------------------------------------------- dynamic-cache concat


def test_dynamic_cache_concatenation_per_step_and_layer(paths: dict[str, Path]) -> None:
    raw = Raw(paths["A"])
    decode = raw.steps[1:]  # no phase named: the first step counts as the prefill
    cats, cat_ns, kernel_ns, layers = [], 0, 0, []
    for s in decode:
        mine = [g for g in raw.step_gpu(s) if g["cat"] == "kernel"]
        in_forward = [g for g in mine if "CatArrayBatchedCopy" in g["name"]
                      and raw.inside(raw.launch_of[g["args"]["correlation"]], "forward")]
        cats.append(len(in_forward))
        cat_ns += sum(to_ns(g["dur"]) for g in in_forward)
        kernel_ns += sum(to_ns(g["dur"]) for g in mine)
        layers.append(sum(o["name"] == "aten::scaled_dot_product_attention" and raw.in_step(o, s) for o in raw.ops))
    f = findings(paths["A"])["kv_cache_concat"]
    assert f.evidence["basis"] == "per_step" and f.evidence["source"] == "kernels"
    assert f.evidence["per_step"] == statistics.median(cats) == 2 * LAYERS + 2 * LAYERS + 1  # cache, rotary, emb
    assert f.evidence["layers"] == statistics.median(layers) == LAYERS
    assert f.evidence["per_layer"] == pytest.approx(statistics.median(cats) / LAYERS)
    assert f.evidence["share"] == pytest.approx(cat_ns / kernel_ns)
    assert f.evidence["in_place_writes_per_step"] == 0
    assert "cache_implementation='static'" in f.remedy
    # the loop's own two concatenations per step (token append, attention mask) are not the model's
    all_cats = sum(1 for g in raw.step_gpu(decode[0]) if "CatArrayBatchedCopy" in g["name"])
    assert all_cats == cats[0] + 2


def test_no_concat_finding_for_a_static_cache_eager_or_in_a_graph(paths: dict[str, Path]) -> None:
    raw = Raw(paths["C"])
    writes = sum(1 for o in raw.ops if o["name"] == "aten::index_copy_" and raw.in_step(o, raw.steps[1]))
    assert writes == 2 * LAYERS  # the static cache writes keys and values in place
    assert "kv_cache_concat" not in findings(paths["C"])
    assert "kv_cache_concat" not in findings(paths["B"])  # the fused ..._cat_... kernels run inside the graph


# ------------------------------------------------------------------------------ syncs in the loop


def test_the_stopping_check_is_placed_in_the_generate_loop(paths: dict[str, Path]) -> None:
    raw = Raw(paths["A"])
    syncs = [e for e in raw.runtime if e["name"] == "cudaStreamSynchronize"]
    for e in syncs:  # each sync sits directly in the step, under bool() of a tensor
        assert raw.innermost(e)["name"].startswith("gpuprobe.step")
        around = [o for o in raw.ops if o["ts"] <= e["ts"] <= o["ts"] + o["dur"]]
        assert max(around, key=lambda o: o["dur"])["name"] == "aten::is_nonzero"
    f = findings(paths["A"])["host_sync"]
    assert f.severity == "info" and f.title.startswith("Only generate's stopping check")
    check = f.evidence["stop_check"]
    assert (check["calls"], check["per_step"], check["where"]) == (len(syncs), len(syncs) / STEPS, LOOP)
    assert check["time_ns"] == sum(to_ns(e["dur"]) for e in syncs)
    assert "StopCheck" in check["function"] and f.remedy.startswith("Nothing to do")


def test_a_stopping_criterion_that_syncs_is_named(paths: dict[str, Path]) -> None:
    raw = Raw(paths["criterion"])
    syncs = [e for e in raw.runtime if e["name"] == "cudaStreamSynchronize"]
    in_criterion = [e for e in syncs if raw.innermost(e)["name"] == "stopping_criteria/MyEosCriterion"]
    assert len(in_criterion) == STEPS and len(syncs) == 2 * STEPS
    f = findings(paths["criterion"])["host_sync"]
    assert f.severity == "warning" and f.evidence["per_step"] == 2
    assert f.evidence["per_step_besides_stop_check"] == 1 and f.evidence["stop_check_calls"] == STEPS
    rows = {(r["operator"], r["range"]): r for r in f.evidence["top_offenders"]}
    crit = rows["aten::_local_scalar_dense", "stopping_criteria/MyEosCriterion"]
    assert (crit["calls"], crit["role"]) == (STEPS, "stopping_criterion")
    loop = rows["aten::_local_scalar_dense", LOOP]
    assert (loop["calls"], loop["role"]) == (STEPS, "stop_check")
    assert "MyEosCriterion" in f.remedy and "Nothing to do for generate's stopping check" in f.remedy


# ------------------------------------------------------------------------------------------- diff


def _step_medians(raw: Raw) -> dict[str, float]:
    steps = raw.steps
    return {
        "GPU busy per step": statistics.median(raw.busy(s) for s in steps),
        "CPU time per step": statistics.median(to_ns(s["dur"]) for s in steps),
        "launches per step": statistics.median(len(raw.launches(s)) for s in steps),
    }


def _per_step_ns(raw: Raw, keep: Any) -> float:
    return sum(to_ns(g["dur"]) for g in raw.gpu if g["cat"] == "kernel" and keep(g["name"])) / len(raw.steps)


def test_diff_of_the_experiment_opens_with_a_better_verdict_and_finds_the_fusion(paths: dict[str, Path]) -> None:
    a, b = Raw(paths["A"]), Raw(paths["B"])
    d = diff(paths["A"], paths["B"])
    assert d.findings[0].id == "verdict" and d.verdict == "better" and d.findings[0].severity == "info"
    rows = {r.figure: r for r in d.verdict_rows}
    for figure, value in _step_medians(a).items():
        assert rows[figure].a == value, figure
    for figure, value in _step_medians(b).items():
        assert rows[figure].b == value, figure
        assert rows[figure].judgement == "better"
    # the new Triton families are a fusion paid for by the elementwise, copy and reduction kernels removed
    fusion = next(f for f in d.findings if f.id == "fusion")
    triton = _per_step_ns(b, lambda n: n.startswith("triton_"))
    fusable = ("vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "CatArrayBatchedCopy", "reduce_kernel")
    removed = _per_step_ns(a, lambda n: any(k in n for k in fusable)) - _per_step_ns(
        b, lambda n: any(k in n for k in fusable))
    assert fusion.evidence["new_ns"] == pytest.approx(triton)
    assert fusion.evidence["removed_ns"] == pytest.approx(removed)
    assert {r["family"] for r in fusion.evidence["new_families"]} == {
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt", "triton_poi_fused_add_cat_index_copy_mul",
        "triton_poi_fused_mul_silu"}
    # no regression for what is new (triton) nor for the unchanged GEMMs and attention
    assert not [f for f in d.findings if f.id in ("regression", "new_work")]
    text = render(d, "text")
    assert text.startswith("Verdict: better\n") and text.index("Verdict") < text.index("Findings")


def test_diff_regression_only_like_for_like_beyond_the_spread(tmp_path: Path) -> None:
    def trace(gemm_us: list[float]) -> Path:
        t = KinetoTrace()
        t.clock = 1000.0
        for i, us in enumerate(gemm_us):
            t.clock = max(t.clock, t.gpu_free) + 20
            start = t.clock
            for _ in range(4):
                t.kernel("aten::linear", GEMM, us)
            t.range(f"gpuprobe.step#{i + 1}", start - 1, t.clock - start + 2)
        return t.write(tmp_path / f"g{len(list(tmp_path.iterdir()))}.json")

    base = trace([10.0] * 8)
    noisy = trace([10.0, 30.0, 10.0, 30.0, 10.0, 30.0, 10.0, 30.0])  # p10-p90 of 80 µs per step
    slower = trace([20.0] * 8)
    regressions = [f for f in diff(base, slower).findings if f.id == "regression" and f.evidence["key"] == "gemm"]
    assert regressions and regressions[0].evidence["ratio"] == pytest.approx(2.0)
    assert regressions[0].evidence["b_median_ns"] - regressions[0].evidence["a_median_ns"] == 4 * 10_000
    noisy_b = trace([15.0, 15.0, 15.0, 15.0, 15.0, 15.0, 15.0, 15.0])  # +20 µs: within noisy A's spread
    assert not [f for f in diff(noisy, noisy_b).findings if f.id == "regression" and f.evidence["key"] == "gemm"]


def test_without_cpu_operators_a_sync_in_the_loop_is_taken_for_the_stopping_check(tmp_path: Path) -> None:
    """As in an nsys export or a trace recorded without operators: only ranges, launches and syncs."""
    t = experiment("dynamic")
    t.events = [e for e in t.events if e.get("cat") != "cpu_op"]
    path = t.write(tmp_path / "no_ops.json")
    syncs = [e for e in Raw(path).runtime if e["name"] == "cudaStreamSynchronize"]
    f = findings(path)["host_sync"]
    assert f.severity == "info" and f.evidence["stop_check"]["calls"] == len(syncs) == STEPS


def test_a_new_family_is_a_fusion_only_if_it_is_a_fused_kernel(tmp_path: Path) -> None:
    def trace(name: str, kernels: list[tuple[str, float]]) -> Path:
        t = KinetoTrace()
        t.clock = 1000.0
        for i in range(STEPS):
            t.clock = max(t.clock, t.gpu_free) + 20
            start = t.clock
            for kernel, us in kernels:
                t.kernel("aten::op", kernel, us)
            t.range(f"gpuprobe.step#{i + 1}", start - 1, t.clock - start + 2)
        return t.write(tmp_path / name)

    eager = trace("eager.json", [(GEMM, 20.0)] + [(MUL, 10.0)] * 4)  # 40 µs of elementwise per step
    fused_name = "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, int)"
    fused = trace("fused.json", [(GEMM, 20.0), (fused_name, 15.0)])
    other = trace("other.json", [(GEMM, 20.0), (INDEX_COPY, 15.0)])  # a new family, but not a fused kernel
    d = diff(eager, fused)
    fusion = next(f for f in d.findings if f.id == "fusion")
    assert (fusion.evidence["new_ns"], fusion.evidence["removed_ns"]) == (15_000, 40_000)
    assert not [f for f in d.findings if f.id in ("new_work", "regression")]
    d = diff(eager, other)
    assert "fusion" not in {f.id for f in d.findings}
    new = next(f for f in d.findings if f.id == "new_work")
    assert [r["b_ns"] for r in new.evidence["families"]] == [15_000]
