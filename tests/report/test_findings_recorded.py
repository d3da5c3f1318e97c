"""Findings on CPU traces recorded here: a real tiny Llama (built from a config) generating under an
instrumented profile window, whose trace carries the integration's component ranges. Expected
figures are computed from the raw events of each trace."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class ItemProcessor(transformers.LogitsProcessor):
    """Reads two scalars and the positive positions every step: three syncs on a GPU."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if scores.max().item() > 1e9:
            scores = scores * 1.0
        if scores.min().item() < -1e9:
            scores = scores * 1.0
        _ = (scores > 0).nonzero()
        return scores


class SlowProcessor(transformers.LogitsProcessor):
    """A Python loop over the vocabulary, three times: a thousand tiny operations per step."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        for _ in range(3):
            for i in range(scores.shape[-1]):
                scores[:, i] = scores[:, i] * 1.0
        return scores


def _record(path: Path, *, hidden: int, layers: int, heads: int, attn: str, prompt: int, new: int,
            processors: list[Any], steps: str, shapes: bool = False, flops: bool = False,
            **generate_kwargs: Any) -> Path:
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.testing import reset

    reset()  # step indexes from 0: the window's steps are this generate()'s
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=128,
        max_position_embeddings=1024,
    )
    config._attn_implementation = attn
    model = transformers.LlamaForCausalLM(config).eval()
    instrument(model)
    ids = torch.arange(1, prompt + 1).remainder(120).unsqueeze(0) + 1
    window = gpuprobe.profile(steps, output=str(path), record_shapes=shapes, with_flops=flops)
    try:
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                logits_processor=transformers.LogitsProcessorList(processors),
                **generate_kwargs,
            )
    finally:
        window.stop()
        uninstrument(model)
    assert path.exists(), window
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    from gpuprobe.testing import reset

    folder = tmp_path_factory.mktemp("recorded")
    reset()
    out = {
        "eager": _record(folder / "eager.json", hidden=64, layers=2, heads=4, attn="eager", prompt=5, new=12,
                         processors=[ItemProcessor(), SlowProcessor()], steps="2-10"),
        # one layer, a KV cache of 256 values per token, shapes recorded: the elements concatenated per step
        "dynamic": _record(folder / "dynamic.json.gz", hidden=256, layers=1, heads=4, attn="sdpa", prompt=8,
                           new=120, processors=[], steps="1-119", shapes=True),
        "static": _record(folder / "static.json.gz", hidden=256, layers=1, heads=4, attn="sdpa", prompt=8,
                          new=120, processors=[], steps="1-119", shapes=True, cache_implementation="static"),
    }
    yield out
    reset()


@pytest.fixture(scope="module")
def cache_experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The static- vs dynamic-cache experiment on CPU: a 4-layer Llama, a 32-token prompt, 8 decode
    steps in the window; one run with the dynamic cache, one with cache_implementation='static'."""
    from gpuprobe.testing import reset

    folder = tmp_path_factory.mktemp("cache")
    common = dict(hidden=64, layers=4, heads=4, attn="sdpa", prompt=32, new=10, processors=[], steps="1-8")
    out = {
        "dynamic": _record(folder / "dynamic.json", **common),
        "static": _record(folder / "static.json", **common, cache_implementation="static"),
    }
    yield out
    reset()


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]


def _inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
    return e["tid"] == outer["tid"] and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]


def test_item_and_nonzero_in_a_processor_would_sync(traces: dict[str, Path]) -> None:
    ev = _events(traces["eager"])
    ranges = [e for e in ev if e["cat"] == "user_annotation" and e["name"] == "ItemProcessor"]
    steps = [e for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("gpuprobe.step")]
    items = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::item" and any(_inside(e, r) for r in ranges)]
    nonzero = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::nonzero" and any(_inside(e, r) for r in ranges)]
    assert len(ranges) == len(steps) == 9 and len(items) == 18 and len(nonzero) == 9
    f = {f.id: f for f in analyze(traces["eager"]).findings}["host_sync"]
    rows = {(r["operator"], r["range"]): r for r in f.evidence["would_sync_on_gpu"]["top_offenders"]}
    assert rows["aten::item", "ItemProcessor"]["calls"] == len(items)
    assert rows["aten::item", "ItemProcessor"]["per_step"] == 2
    assert rows["aten::nonzero", "ItemProcessor"]["calls"] == len(nonzero)


def test_slow_processor_share_of_step_time(traces: dict[str, Path]) -> None:
    ev = _events(traces["eager"])
    slow = sum(to_ns(e["dur"]) for e in ev if e["cat"] == "user_annotation" and e["name"] == "SlowProcessor")
    steps = sum(to_ns(e["dur"]) for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("gpuprobe.step"))
    f = {f.id: f for f in analyze(traces["eager"]).findings}["logits_processor_share"]
    rows = {r["processor"]: r for r in f.evidence["by_class"]}
    assert rows["SlowProcessor"]["share_of_step"] == pytest.approx(slow / steps)
    assert slow / steps > 0.1
    assert "ItemProcessor" not in rows  # a few operators: below the threshold


def test_eager_attention_on_a_recorded_trace(traces: dict[str, Path]) -> None:
    ev = _events(traces["eager"])
    softmax = sum(1 for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::softmax")
    f = {f.id: f for f in analyze(traces["eager"]).findings}["attention_impl"]
    assert f.evidence["softmax_ops"] == softmax and softmax >= 2 * 9  # two layers, nine steps
    assert "attention_impl" not in {f.id for f in analyze(traces["dynamic"]).findings}  # sdpa


def _steps(ev: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("gpuprobe.step")),
                  key=lambda e: e["ts"])


def _in_forward(ev: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The operators of a name inside the model's ``forward`` ranges (not generate's loop)."""
    forwards = [e for e in ev if e["cat"] == "user_annotation" and e["name"] == "forward"]
    return [e for e in ev if e["cat"] == "cpu_op" and e["name"] == name and any(_inside(e, f) for f in forwards)]


def _cat_elements_per_step(path: Path) -> list[int]:
    """Elements the model concatenates per step, from the recorded input shapes of aten::cat."""
    ev = _events(path)
    steps = _steps(ev)
    cats = _in_forward(ev, "aten::cat")

    def elements(e: dict[str, Any]) -> int:
        total = 0
        for shape in e["args"]["Input Dims"][0]:  # the tensor list
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    return [sum(elements(c) for c in cats if _inside(c, s)) for s in steps]


def test_dynamic_cache_concatenation_grows_and_static_does_not(traces: dict[str, Path]) -> None:
    import statistics

    per_step = _cat_elements_per_step(traces["dynamic"])[1:]  # the window's first step counts as the prefill
    q = len(per_step) // 4
    first, last = statistics.median(per_step[:q]), statistics.median(per_step[-q:])
    # the share of step time is timing; the growth itself is shapes: the test checks growth, so a
    # share threshold low enough for any machine
    lenient = {"kv_cache_concat.share": 0.0001}
    f = {f.id: f for f in analyze(traces["dynamic"], thresholds=lenient).findings}["kv_cache_concat"]
    assert (f.evidence["source"], f.evidence["basis"]) == ("cpu_ops", "elements")
    assert f.evidence["growth"] == pytest.approx(last / first)
    assert last / first >= 1.5
    static = _cat_elements_per_step(traces["static"])[1:]
    assert statistics.median(static[-q:]) / statistics.median(static[:q]) < 1.5
    assert "kv_cache_concat" not in {f.id for f in analyze(traces["static"], thresholds=lenient).findings}


def test_flops_achieved_on_a_cpu_trace(traces: dict[str, Path]) -> None:
    """FLOPs from the recorded shapes, against torch.profiler's own counts of the same run."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=128)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    path = traces["eager"].with_name("flops.json")
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        model(torch.tensor([[1, 5, 9, 3, 7]]))
    prof.export_chrome_trace(str(path))
    expected: dict[str, int] = defaultdict(int)
    for e in prof.events():  # torch's FLOP formulas
        if e.flops:
            expected[e.name] += e.flops
    cpu_ns: dict[str, int] = defaultdict(int)
    for e in _events(path):
        if e["cat"] == "cpu_op" and e["name"] in expected:
            cpu_ns[e["name"]] += to_ns(e["dur"])
    section = analyze(path).flops
    rows = {r.operator: r for r in section.rows}
    assert {"aten::mm", "aten::bmm"} <= set(expected) and set(rows) == set(expected)
    for name, count in expected.items():
        assert (rows[name].flops, rows[name].time_ns) == (count, cpu_ns[name])
        assert rows[name].flops_per_s == pytest.approx(count * 1e9 / cpu_ns[name])
    assert section.clock == "cpu" and section.total_flops == sum(expected.values())
    gemm = sum(count for name, count in expected.items() if name in ("aten::mm", "aten::addmm", "aten::bmm"))
    assert next(c for c in section.categories if c.category == "gemm").flops == gemm


def test_cache_experiment_dynamic_cache_concatenates_per_layer_and_step(cache_experiment: dict[str, Path]) -> None:
    ev = _events(cache_experiment["dynamic"])
    decode = _steps(ev)[1:]  # the window's first step counts as the prefill
    cats = _in_forward(ev, "aten::cat")
    sdpa = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::scaled_dot_product_attention"]
    per_step = [sum(_inside(c, s) for c in cats) for s in decode]
    layers = [sum(_inside(a, s) for a in sdpa) for s in decode]
    cat_ns = sum(to_ns(c["dur"]) for c in cats if any(_inside(c, s) for s in decode))
    step_ns = sum(to_ns(s["dur"]) for s in decode)
    # the share is timing (CPU time of the operators); the counts are not: a share threshold of 0
    lenient = {"kv_cache_concat.step_share": 0}
    f = {f.id: f for f in analyze(cache_experiment["dynamic"], thresholds=lenient).findings}["kv_cache_concat"]
    assert (f.evidence["source"], f.evidence["basis"], f.evidence["in_forward"]) == ("cpu_ops", "per_step", True)
    assert f.evidence["per_step"] == statistics.median(per_step)
    assert f.evidence["layers"] == statistics.median(layers) == 4
    # per layer: keys and values (the cache) and q and k (rotate_half), plus the rotary embedding once
    assert statistics.median(per_step) == 4 * 4 + 1
    assert f.evidence["share"] == pytest.approx(cat_ns / step_ns)
    # at the default share threshold: a warning from 2 % of step time, below it an info (a CPU trace
    # shows the pattern, not what it costs on a GPU)
    default = {f.id: f for f in analyze(cache_experiment["dynamic"]).findings}["kv_cache_concat"]
    assert default.severity == ("warning" if cat_ns / step_ns >= 0.02 else "info")


def test_cache_experiment_static_cache_writes_in_place(cache_experiment: dict[str, Path]) -> None:
    ev = _events(cache_experiment["static"])
    decode = _steps(ev)[1:]
    writes = _in_forward(ev, "aten::index_copy_")
    assert [sum(_inside(w, s) for w in writes) for s in decode] == [2 * 4] * len(decode)  # keys, values per layer
    lenient = {"kv_cache_concat.step_share": 0}
    assert "kv_cache_concat" not in {f.id for f in analyze(cache_experiment["static"], thresholds=lenient).findings}


def test_cache_experiment_stopping_check_is_expected(cache_experiment: dict[str, Path]) -> None:
    ev = _events(cache_experiment["dynamic"])
    steps = _steps(ev)
    ranges = [e for e in ev if e["cat"] == "user_annotation" and not e["name"].startswith("gpuprobe.step")]
    checks = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::is_nonzero"
              and any(_inside(e, s) for s in steps) and not any(_inside(e, r) for r in ranges)]
    assert len(checks) == len(steps)  # bool(unfinished_sequences.max() == 0), between the components
    f = {f.id: f for f in analyze(cache_experiment["dynamic"]).findings}["host_sync"]
    assert f.severity == "info" and f.evidence["stop_check"]["calls"] == len(checks)
    assert f.evidence["stop_check"]["where"] == "the generate loop"


def test_cache_experiment_diff_verdict_from_the_steps(cache_experiment: dict[str, Path]) -> None:
    from gpuprobe.report import diff

    medians = {}
    for name in ("dynamic", "static"):
        durations = sorted(to_ns(s["dur"]) for s in _steps(_events(cache_experiment[name])))
        half = len(durations) // 2  # an even count: the mean of the middle two, rounded down
        medians[name] = (durations[half - 1] + durations[half]) // 2 if len(durations) % 2 == 0 else durations[half]
    d = diff(cache_experiment["dynamic"], cache_experiment["static"])
    row = next(r for r in d.verdict_rows if r.figure == "CPU time per step")
    # within 1 ns: the mean of two durations, each read from µs with three decimals
    assert row.a == pytest.approx(medians["dynamic"], abs=1) and row.b == pytest.approx(medians["static"], abs=1)
    assert d.findings[0].id == "verdict" and d.verdict in ("better", "worse", "mixed", "unchanged")
    assert d.verdict == {"better": "better", "worse": "worse", "same": "unchanged"}[row.judgement]
