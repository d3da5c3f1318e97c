"""On a CUDA device: no synchronisation added per step, and device-clock samples that resolve."""

from __future__ import annotations

import warnings

import pytest
from _hfkit import build, prompt, torch

import gpuprobe
from gpuprobe.integrations.transformers import instrument, uninstrument
from gpuprobe.testing import reset

pytestmark = pytest.mark.cuda

KW = dict(max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=20, temperature=0.8, repetition_penalty=1.1)


def cuda_model(family: str = "llama"):
    return build(family).eval().to("cuda")


def count_syncs(fn) -> int:
    """How many synchronising CUDA calls ``fn`` makes (torch's sync debug mode, in warn mode)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


@pytest.mark.parametrize("options", [{}, {"layers": True, "layer_every": 2}])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_instrumentation_adds_no_device_synchronisation(options, cache):
    reset(device_timing="cuda")
    model = cuda_model()
    ids = prompt(batch=2).to("cuda")
    extra = {"cache_implementation": "static", "disable_compile": True} if cache == "static" else {}

    def run() -> None:
        torch.manual_seed(0)
        model.generate(ids, **KW, **extra)

    run()  # warm-up: allocator, kernels, lazy init
    plain = count_syncs(run)
    instrument(model, model_name="m", memory_every=1, **options)
    run()
    try:
        measured = count_syncs(run)
    finally:
        uninstrument(model)
    assert measured == plain


def test_device_clock_step_samples_resolve_without_blocking():
    reset(device_timing="cuda")
    assert gpuprobe.info()["timing"].endswith("cuda-events")
    model = instrument(cuda_model(), model_name="m", layers=True, layer_every=1)
    ids = prompt().to("cuda")
    out = model.generate(ids, max_new_tokens=6, min_new_tokens=6)
    torch.cuda.synchronize()  # the test waits; the integration never does
    steps = out.shape[1] - ids.shape[1]
    by_clock: dict[str, int] = {}
    layers = 0
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.step.duration":
            for p in md.points:
                by_clock[p.labels["clock"]] = by_clock.get(p.labels["clock"], 0) + p.count
        if md.spec.name == "gpuprobe.layer.duration":
            layers += sum(p.count for p in md.points)
    assert by_clock == {"host": steps, "device": steps}
    assert layers == 2 * (steps - 1)


def test_decode_steps_share_their_boundary_events(monkeypatch):
    """One event record per decode step, and the steps' device spans add up to the call's GPU time."""
    reset(device_timing="cuda")
    model = instrument(cuda_model(), model_name="m")
    ids = prompt().to("cuda")
    model.generate(ids, max_new_tokens=4, min_new_tokens=4)  # warm-up
    torch.cuda.synchronize()
    gpuprobe.collect()
    recorded = [0]
    record = torch.cuda.Event.record

    def counting(self, stream=None):  # type: ignore[no-untyped-def]
        recorded[0] += 1
        return record(self, stream)

    monkeypatch.setattr(torch.cuda.Event, "record", counting)
    counts = {}
    for tokens in (8, 16):
        before = recorded[0]
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens)
        counts[tokens] = recorded[0] - before
    monkeypatch.undo()
    assert counts[16] - counts[8] == 8  # one record per decode step
    def device_steps_s() -> float:
        torch.cuda.synchronize()  # the test waits; the integration never does
        return sum(p.sum for md in gpuprobe.collect() if md.spec.name == "gpuprobe.step.duration"
                   for p in md.points if p.labels["clock"] == "device")

    before_s = device_steps_s()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model.generate(ids, max_new_tokens=8, min_new_tokens=8)
    end.record()
    steps_ns = (device_steps_s() - before_s) * 1e9
    total_ns = start.elapsed_time(end) * 1e6
    # The steps tile the call's device time between its first and last events, inside the outer pair.
    assert 0 < steps_ns <= total_ns


def test_memory_gauges_report_the_cuda_allocator():
    reset()
    model = instrument(cuda_model(), model_name="m")
    model.generate(prompt().to("cuda"), max_new_tokens=3)
    values = {md.spec.name: md.points for md in gpuprobe.collect()}
    allocated = values["gpuprobe.memory.allocated"][0]
    assert allocated.labels["device"].startswith("cuda:") and allocated.value > 0
    assert values["gpuprobe.memory.reserved"][0].value >= allocated.value


def test_continuous_batching_on_the_gpu_returns_every_request_with_device_ttft():
    """generate_batch on a CUDA model: every request back with the tokens of the uninstrumented run, and
    one device-clock TTFT per request, no longer than its host-clock TTFT."""
    import transformers

    reset(device_timing="cuda")
    model = cuda_model()
    prompts = [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate((5, 9, 12, 20, 7, 3))]
    gen = transformers.GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    plain = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    expected = sorted((o.prompt_ids, o.generated_tokens) for o in plain.values())
    instrument(model, model_name="cb")
    try:
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    finally:
        uninstrument(model)
    assert sorted((o.prompt_ids, o.generated_tokens) for o in out.values()) == expected
    torch.cuda.synchronize()  # the test waits; gpuprobe itself never does
    points = {(p.labels["clock"]): p for d in gpuprobe.collect() if d.spec.name == "gen_ai.server.time_to_first_token"
              for p in d.points}
    assert points["device"].count == len(prompts) == points["host"].count
    assert 0 < points["device"].sum <= points["host"].sum


def test_continuous_batching_inter_token_latency_is_per_request_on_both_clocks():
    """One inter-token sample per request and output token after its first, on the host and the device clock."""
    import transformers

    reset(device_timing="cuda")
    model = cuda_model()
    prompts = [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate((5, 9, 12, 20, 7, 3))]
    gen = transformers.GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    instrument(model, model_name="cb")
    try:
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    finally:
        uninstrument(model)
    torch.cuda.synchronize()  # the test waits; gpuprobe itself never does
    expected = sum(len(o.generated_tokens) - 1 for o in out.values())
    points = {p.labels["clock"]: p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.inter_token.duration"
              for p in d.points}
    assert points["host"].count == expected
    # the device count follows the batches transformers scheduled (asynchronous batching may run one more)
    assert expected <= points["device"].count <= expected + len(prompts)


def test_your_own_cuda_profiler_trace_gets_the_step_and_component_ranges(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    from gpuprobe.report import analyze

    reset(device_timing="cuda")
    model = instrument(cuda_model(), model_name="m")
    ids = prompt().to("cuda")
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        prof.export_chrome_trace(str(tmp_path / "mine.json"))
    finally:
        uninstrument(model)
    report = analyze(tmp_path / "mine.json")
    assert report.steps is not None and report.steps.count == out.shape[1] - ids.shape[1]
    assert report.summary.kernel_count > 0
