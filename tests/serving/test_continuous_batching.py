"""Continuous batching (``generate_batch``, ``init_continuous_batching``) of a tiny Llama, in process:
what each request, step and the paged cache record."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest
from _servekit import tiny_llama

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.testing import InMemoryExporter, reset

from helpers import cpu_continuous_batching_cannot_pin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL = "tiny-cb"
PROMPT_LENGTHS = (5, 9, 12, 20, 7, 3, 15, 11)


@pytest.fixture
def cpu_batching() -> None:
    """For tests that run a CPU model's continuous batching: skipped where this process cannot."""
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def model(cpu_batching: None) -> Any:
    m = hf.instrument(tiny_llama(), model_name=MODEL)
    yield m
    hf.uninstrument(m)


def _prompts(lengths: tuple[int, ...] = PROMPT_LENGTHS) -> list[list[int]]:
    return [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate(lengths)]


def _generate(model: Any, prompts: list[list[int]], *, new: int = 8, eos: int = -1, **cache: Any) -> dict[str, Any]:
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(**{"num_blocks": 64, "page_size": 16, "max_batch_tokens": 64,
                                                   **cache})
    return model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)


def _points(name: str, **labels: str) -> list[Any]:
    out = []
    for data in gpuprobe.collect():
        if data.spec.name == name:
            out += [p for p in data.points if all(p.labels.get(k) == v for k, v in labels.items())]
    return out


def _count(name: str, **labels: str) -> int:
    return sum(p.count for p in _points(name, **labels))


def _sum(name: str, **labels: str) -> float:
    return sum(p.sum if p.count else p.value for p in _points(name, **labels))


def _gauge(name: str, **labels: str) -> float:
    points = _points(name, **labels)
    assert len(points) == 1, points
    return points[0].value


# -- per request ---------------------------------------------------------------------------------------

def test_each_request_is_counted_once_with_its_tokens(model: Any) -> None:
    prompts = _prompts()
    out = _generate(model, prompts)
    ok = {"gen_ai.request.model": MODEL}
    assert _count("gen_ai.server.request.duration", **ok) == len(prompts)
    assert _count("gen_ai.server.time_to_first_token", **ok) == len(prompts)
    assert _count("gpuprobe.request.queue.duration", model=MODEL) == len(prompts)
    assert _sum("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"}) == sum(map(len, prompts))
    assert _sum("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == \
        sum(len(o.generated_tokens) for o in out.values()) == 8 * len(prompts)
    assert _sum("gpuprobe.requests.finished", model=MODEL, finish_reason="length") == len(prompts)


def test_time_per_output_token_is_one_sample_per_request(model: Any) -> None:
    """(duration − TTFT) ÷ (output tokens − 1), as the OpenTelemetry GenAI convention defines it."""
    with InMemoryExporter() as exp:
        _generate(model, _prompts((6,)), new=9)
    (duration,) = exp.values("gen_ai.server.request.duration")
    (ttft,) = exp.values("gen_ai.server.time_to_first_token")
    (tpot,) = exp.values("gen_ai.server.time_per_output_token")
    assert tpot == pytest.approx((duration - ttft) / 8, abs=1e-9)
    assert 0 < ttft < duration


def test_a_request_finished_by_its_end_of_sequence_token_says_stop(model: Any) -> None:
    # Make the first token greedy decoding picks for this prompt the end-of-sequence token.
    first = _generate(model, _prompts((6,)), new=1)
    eos = next(iter(first.values())).generated_tokens[0]
    reset()
    out = _generate(model, _prompts((6,)), new=8, eos=eos)
    assert len(next(iter(out.values())).generated_tokens) == 1
    assert _sum("gpuprobe.requests.finished", finish_reason="stop") == 1
    assert _count("gen_ai.server.time_per_output_token") == 0  # one token: no time between tokens


def test_requests_that_do_not_fit_wait_and_their_queue_time_is_counted(model: Any) -> None:
    """More requests than one step takes (16 tokens a step, 8 prompts of 10): they wait their turn."""
    with InMemoryExporter() as exp:
        _generate(model, _prompts((10,) * 8), max_batch_tokens=16)
    waiting = exp.values("gpuprobe.requests.waiting", model=MODEL)
    assert max(waiting) >= 4
    queue = exp.values("gpuprobe.request.queue.duration", model=MODEL)
    assert len(queue) == 8 and max(queue) > 0 and sorted(queue)[-1] > sorted(queue)[0]
    assert _gauge("gpuprobe.requests.waiting", model=MODEL) == 0
    assert _gauge("gpuprobe.requests.running", model=MODEL) == 0


def test_a_cache_too_small_for_every_request_preempts_some(model: Any) -> None:
    """8 blocks of 16 tokens for 8 requests of 10 + 40 tokens: the scheduler evicts running requests."""
    with InMemoryExporter() as exp:
        out = _generate(model, _prompts((10,) * 8), new=40, num_blocks=8, max_batch_tokens=16)
    assert all(len(o.generated_tokens) == 40 for o in out.values())
    assert _sum("gpuprobe.requests.preempted", model=MODEL) >= 1
    assert max(exp.values("gpuprobe.kv_cache.usage", model=MODEL)) > 0.8
    # A preempted request is still one request, with one queue time and one first token.
    assert _count("gen_ai.server.request.duration") == _count("gpuprobe.request.queue.duration") == 8
    assert _count("gen_ai.server.time_to_first_token") == 8


def test_a_cancelled_request_ends_with_error_type_cancelled(model: Any) -> None:
    gen = transformers.GenerationConfig(max_new_tokens=500, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        rid = manager.add_request([5, 6, 7, 8], max_new_tokens=500)
        deadline = time.monotonic() + 30
        while _count("gen_ai.server.time_to_first_token") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        manager.cancel_request(rid)
        while _sum("gpuprobe.requests.finished", finish_reason="cancelled") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        manager.stop(block=True, timeout=10)
    assert _count("gen_ai.server.request.duration", **{"error.type": "cancelled"}) == 1
    assert _sum("gpuprobe.requests.finished", finish_reason="cancelled") == 1
    assert _count("gen_ai.server.request.duration") == 1  # no success sample besides it
    assert _gauge("gpuprobe.requests.running", model=MODEL) == 0


def test_requests_of_a_failed_loop_end_with_error_type_failed(model: Any) -> None:
    out = _generate(model, [[5, 6, 7], [500, 6, 7]])  # a token id past the vocabulary: the forward raises
    assert all(o.error is not None for o in out.values())
    assert _count("gen_ai.server.request.duration", **{"error.type": "failed"}) == 2
    assert _sum("gpuprobe.requests.finished", finish_reason="failed") == 2
    assert _count("gen_ai.client.token.usage") == 0  # no usage for requests that failed


def test_every_request_comes_back_with_the_tokens_of_the_uninstrumented_model(cpu_batching: None) -> None:
    """generate_batch and a manager from init_continuous_batching (add_request / get_result), with and
    without gpuprobe: the same tokens for every request, and every request measured."""
    prompts = _prompts()
    plain = tiny_llama()
    expected = sorted((o.prompt_ids, o.generated_tokens) for o in _generate(plain, prompts).values())
    gen = transformers.GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)

    def manager_run(model: Any) -> list[list[int]]:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
        manager.start()
        try:
            ids = [manager.add_request(p, max_new_tokens=5) for p in prompts[:3]]
            return [manager.get_result(request_id=rid, timeout=60).generated_tokens for rid in ids]
        finally:
            manager.stop(block=True, timeout=60)

    expected_manager = manager_run(plain)
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    try:
        got = sorted((o.prompt_ids, o.generated_tokens) for o in _generate(model, prompts).values())
        got_manager = manager_run(model)
    finally:
        hf.uninstrument(model)
    assert got == expected and got_manager == expected_manager
    assert _count("gen_ai.server.request.duration", **{"gen_ai.request.model": MODEL}) == len(prompts) + 3
    assert _count("gen_ai.server.time_to_first_token", clock="host") == len(prompts) + 3
    assert _count("gpuprobe.request.queue.duration", model=MODEL) == len(prompts) + 3


# -- per step ------------------------------------------------------------------------------------------

def test_batch_tokens_split_prompt_tokens_from_generated_ones(model: Any) -> None:
    prompts = _prompts()
    _generate(model, prompts)
    assert _sum("gpuprobe.batch.tokens", model=MODEL, phase="prefill") == sum(map(len, prompts))
    # Each request's first token comes out of its prefill; the 7 others are decoded one a step.
    assert _sum("gpuprobe.batch.tokens", model=MODEL, phase="decode") == 7 * len(prompts)
    steps = _count("gpuprobe.step.duration", model=MODEL, clock="host")
    assert steps == _count("gpuprobe.batch.requests", model=MODEL) > 0
    # Every request takes part in at least 8 steps: its prefill (maybe split) and 7 decodes.
    assert _sum("gpuprobe.batch.requests", model=MODEL) >= 8 * len(prompts)


def test_schedule_forward_and_update_add_up_to_the_step(model: Any) -> None:
    gc.collect()
    gc.disable()  # a collection between two components would be the step's time, in none of them
    try:
        _generate(model, _prompts())
    finally:
        gc.enable()
    step = _sum("gpuprobe.step.duration", model=MODEL, clock="host")
    parts = {c: _sum("gpuprobe.step.component.duration", model=MODEL, component=c)
             for c in ("schedule", "forward", "update")}
    assert all(v > 0 for v in parts.values())
    assert 0.95 * step <= sum(parts.values()) <= step
    steps = _count("gpuprobe.step.duration", model=MODEL, clock="host")
    assert _count("gpuprobe.step.component.duration", component="forward") == steps
    phases = {p.labels["phase"] for p in _points("gpuprobe.step.duration", model=MODEL)}
    assert phases <= {"prefill", "decode", "mixed"} and "decode" in phases


def _check_inter_token(exp: InMemoryExporter, outputs: list[Any]) -> list[float]:
    """One host sample per request and output token after its first, and per request they add up to its
    duration less its TTFT (so over all requests too: the samples carry no request id)."""
    itl = exp.values("gpuprobe.inter_token.duration", model=MODEL, clock="host")
    assert len(itl) == sum(len(o.generated_tokens) - 1 for o in outputs)
    assert all(v > 0 for v in itl)
    durations = exp.values("gen_ai.server.request.duration", **{"gen_ai.request.model": MODEL})
    ttfts = exp.values("gen_ai.server.time_to_first_token", clock="host")
    assert len(durations) == len(ttfts) == len(outputs)
    # the same host clock on both sides: equal up to the rounding of seconds (1 ns a value)
    assert sum(itl) == pytest.approx(sum(durations) - sum(ttfts), abs=1e-9 * (len(itl) + 2 * len(outputs)))
    assert max(itl) <= max(d - t for d, t in zip(sorted(durations), sorted(ttfts))) + max(durations)
    return itl


def test_inter_token_latency_is_one_sample_per_request_and_token_after_its_first(model: Any) -> None:
    with InMemoryExporter() as exp:
        out = _generate(model, _prompts())
        itl = _check_inter_token(exp, list(out.values()))
    steps = _count("gpuprobe.step.duration", model=MODEL, phase="decode") + \
        _count("gpuprobe.step.duration", model=MODEL, phase="mixed")
    assert len(itl) == len(PROMPT_LENGTHS) * (8 - 1) > steps  # many requests decode in one step


def test_inter_token_latency_of_requests_of_different_lengths(model: Any) -> None:
    """A manager's requests, each with its own token limit: a one-token request has no sample."""
    gen = transformers.GenerationConfig(max_new_tokens=9, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    limits = (1, 2, 5, 9)
    with InMemoryExporter() as exp:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
        manager.start()
        try:
            ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(_prompts((4, 7, 5, 6)), limits)]
            outputs = [manager.get_result(request_id=rid, timeout=60) for rid in ids]
        finally:
            manager.stop(block=True, timeout=60)
        assert [len(o.generated_tokens) for o in outputs] == list(limits)
        assert len(_check_inter_token(exp, outputs)) == 0 + 1 + 4 + 8


def test_a_preempted_request_counts_its_wait_in_its_inter_token_latency(model: Any) -> None:
    """Requests evicted and scheduled again: still one sample per token, and the gaps they waited are in
    them (the samples add up to each request's decoding time)."""
    with InMemoryExporter() as exp:
        out = _generate(model, _prompts((10,) * 8), new=40, num_blocks=8, max_batch_tokens=16)
        assert _sum("gpuprobe.requests.preempted", model=MODEL) >= 1
        _check_inter_token(exp, list(out.values()))


def test_steps_advance_the_step_clock(model: Any) -> None:
    from gpuprobe.runtime import runtime

    before = runtime().steps.index
    _generate(model, _prompts())
    assert runtime().steps.index - before == _count("gpuprobe.step.duration", model=MODEL, clock="host")


# -- the paged cache -----------------------------------------------------------------------------------

def test_kv_cache_usage_is_the_fraction_of_blocks_in_use(model: Any) -> None:
    with InMemoryExporter() as exp:
        _generate(model, _prompts(), num_blocks=32)
    usage = exp.values("gpuprobe.kv_cache.usage", model=MODEL)
    used = exp.values("gpuprobe.kv_cache.blocks", model=MODEL, state="used")
    assert all(0 <= u <= 1 for u in usage) and max(usage) > 0
    assert _gauge("gpuprobe.kv_cache.blocks", model=MODEL, state="total") == 32
    assert used and all(0 <= b <= 32 for b in used)
    assert [round(u * 32) for u in usage] == used
    assert _gauge("gpuprobe.kv_cache.usage", model=MODEL) == 0  # everything freed at the end


def test_labels_carry_no_request_id_nor_prompt(model: Any) -> None:
    out = _generate(model, _prompts())
    ids = set(out)
    for data in gpuprobe.collect():
        for point in data.points:
            for key, value in point.labels.items():
                assert "request_id" not in key and "prompt" not in key
                assert value not in ids and not value.startswith("req_"), (data.spec.name, key, value)


# -- switching it on and off ----------------------------------------------------------------------------

_SEAMS = {
    "manager": ("_create_batch_processor", "_run_generation_loop"),
    "router": ("deliver", "deliver_batch"),
    "processor": ("prepare_next_batch", "_generation_step", "update_batch"),
    "scheduler": ("schedule_batch", "set_request_cancellation"),
}


def _objects(manager: Any) -> dict[str, Any]:
    bp = manager.batch_processor
    return {"manager": manager, "router": manager.output_router, "processor": bp, "scheduler": bp.scheduler}


def test_uninstrument_gives_every_object_its_own_methods_back(cpu_batching: None) -> None:
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    gen = transformers.GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=32)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.warmup()  # creates the batch processor
    objects = _objects(manager)
    for kind, names in _SEAMS.items():
        assert all(n in objects[kind].__dict__ for n in names), kind
    hf.uninstrument(model)
    for kind, names in _SEAMS.items():
        assert not any(n in objects[kind].__dict__ for n in names), kind
    assert "init_continuous_batching" not in model.__dict__


def test_instrument_all_covers_a_model_that_only_ever_batches_continuously(cpu_batching: None) -> None:
    mixin = transformers.GenerationMixin
    own = mixin.__dict__.get("init_continuous_batching")
    hf.instrument_all()
    try:
        model = tiny_llama()
        _generate(model, _prompts((4, 6)), new=3)
        assert hf.is_instrumented(model)
        assert _count("gen_ai.server.request.duration") == 2
        assert _count("gpuprobe.batch.tokens", phase="prefill") >= 1
    finally:
        hf.uninstrument_all()
    assert mixin.__dict__.get("init_continuous_batching") is own
    assert not hf.is_instrumented(model)


def test_a_failure_of_gpuprobe_inside_the_loop_is_warned_once_and_generation_goes_on(
        model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprobe.integrations._transformers.continuous.loop import Loop

    def broken(*args: Any) -> None:
        raise ZeroDivisionError("a bug in gpuprobe")

    monkeypatch.setattr(Loop, "open_step", broken)
    monkeypatch.setattr(Loop, "finish", broken)
    with pytest.warns(RuntimeWarning, match=r"seam transformers\.continuous_batching\.\w+ .* failed with "
                                             r"ZeroDivisionError: a bug in gpuprobe.*is off for this process"):
        out = _generate(model, _prompts())
    assert [len(o.generated_tokens) for o in out.values()] == [8] * len(PROMPT_LENGTHS)
    assert all(o.error is None for o in out.values())
    # The whole continuous-batching group switched itself off, once, and says so.
    states = {s["seam"]: s["state"] for s in gpuprobe.info()["seams"]}
    assert {v for k, v in states.items() if k.startswith("transformers.continuous_batching.")} == {"off"}
    assert _sum("gpuprobe.seam.disabled") == 1


def test_gpuprobe_disable_records_nothing(model: Any) -> None:
    gpuprobe.disable()
    try:
        out = _generate(model, _prompts((4, 6)), new=3)
    finally:
        gpuprobe.enable()
    assert len(out) == 2
    assert _count("gen_ai.server.request.duration") == 0 and _count("gpuprobe.step.duration") == 0


# -- on a GPU (the simulated CUDA) --------------------------------------------------------------------

def test_on_a_gpu_the_step_is_timed_on_the_processors_compute_stream(sim: Any) -> None:
    """The forward runs on the batch processor's compute stream; the step's CUDA events go there too.
    Events on the default stream, busy with other work here, would time that instead."""
    from transformers.generation.continuous_batching.requests import FutureRequestState, RequestState, RequestStatus

    from gpuprobe.integrations._transformers.continuous import ServingState
    from gpuprobe.integrations._transformers.series import RequestSeries
    from gpuprobe.runtime import runtime

    compute = torch.cuda.Stream(0)
    state = RequestState(request_id="r0", initial_tokens=[3, 4, 5], max_new_tokens=100)
    state._status, state.generated_tokens, state.position_offset = RequestStatus.DECODING, [6], 3
    batch = [FutureRequestState(state, True, {}, 1)]
    scheduler = _Obj(active_requests={"r0": state}, waiting_requests={},
                     schedule_batch=lambda *a: (batch, True, 1, 0), set_request_cancellation=lambda request_id: None)
    pool = _Obj(free_sectors=[1, 2], count_free_blocks=lambda index: 0)
    cache = _Obj(pool=pool, num_sectors=4, bytes_per_sector=64, num_blocks=4,
                 cache_allocators={"full": _Obj(index=0, bytes_per_block=64, ledger=None)})

    def prepare() -> bool:
        scheduler.schedule_batch(64, 0)
        state.position_offset += 1
        return True

    processor = _Obj(scheduler=scheduler, cache=cache, model_device=torch.device("cuda", 0),
                     inputs_and_outputs=_Obj(compute_stream=compute),
                     prepare_next_batch=prepare, update_batch=lambda: None,
                     _generation_step=lambda model: sim.launch(3_000_000, "forward", stream=compute))
    router = _Obj(deliver=lambda output: None, deliver_batch=lambda outputs: None)
    manager = _Obj(output_router=router, _create_batch_processor=lambda: processor, _run_generation_loop=lambda: None)
    rt = runtime()
    serving = ServingState(rt, MODEL, RequestSeries(rt, MODEL))
    serving.observe(manager)
    bp = manager._create_batch_processor()
    sim.launch(50_000_000, "other work")  # on the default stream
    for _ in range(2):
        bp.prepare_next_batch()
        bp._generation_step(None)
        bp.update_batch()
    sim.finish()
    rt.drain()
    device = _points("gpuprobe.step.duration", model=MODEL, clock="device", phase="decode")
    assert len(device) == 1 and device[0].count == 2
    assert device[0].sum == pytest.approx(0.006, rel=0.01)  # two 3 ms forwards, nothing of the other work
    serving.close()
    assert processor.prepare_next_batch is prepare  # an instance attribute that was there comes back


class _Obj:
    """Attributes given as keywords (stands in for transformers' continuous-batching objects)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def test_generate_and_continuous_batching_record_into_the_same_request_series(model: Any) -> None:
    # One model, both paths: each request-level GenAI series is one series (one point) holding both.
    prompts = _prompts()
    gen = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=0)
    model.generate(torch.tensor([prompts[0]]), generation_config=gen)
    _generate(model, prompts)
    for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.request.duration",
                 "gen_ai.server.time_per_output_token"):
        points = [p for p in _points(name, **{"gen_ai.request.model": MODEL}) if p.labels.get("clock") != "device"]
        assert len(points) == 1, (name, [p.labels for p in points])
        assert points[0].labels["gen_ai.provider.name"] == "transformers"
        assert points[0].count == 1 + len(prompts)
