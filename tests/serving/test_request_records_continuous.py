"""One record per continuous-batching request (``generate_batch``, ``init_continuous_batching``) of a tiny
Llama, in process: its tokens against what transformers returned, its phases against each other, and
its share of the steps against gpuprobe's own step series (the shares of all requests add up to the
steps' time)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from _servekit import tiny_llama

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.runtime import runtime

from helpers import cpu_continuous_batching_cannot_pin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL = "tiny-records"


@pytest.fixture
def model() -> Any:
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    m = hf.instrument(tiny_llama(), model_name=MODEL)
    yield m
    hf.uninstrument(m)


def _prompts(lengths: tuple[int, ...]) -> list[list[int]]:
    return [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate(lengths)]


def _generate(model: Any, prompts: list[list[int]], *, new: int = 6, eos: int = -1, **cache: Any) -> dict[str, Any]:
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(**{"num_blocks": 64, "page_size": 16, "max_batch_tokens": 32,
                                                   **cache})
    return model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)


def _step_seconds() -> float:
    return sum(p.sum for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.duration"
               for p in d.points if p.labels.get("clock") == "host" and p.labels.get("model") == MODEL)  # seconds


def test_each_request_has_a_record_with_its_tokens_and_phases(model: Any) -> None:
    prompts = _prompts((5, 9, 12, 20, 7, 3, 15, 11))
    out = _generate(model, prompts)
    gpuprobe.collect()  # the drain splits the steps' time among the requests
    records = {r.request_id: r for r in gpuprobe.requests()}
    assert set(records) == set(out)
    for rid, result in out.items():
        r = records[rid]
        assert r.kind == "continuous_batching" and r.model == MODEL and r.batch_size == 1
        assert r.input_tokens == len(result.prompt_ids)
        assert r.output_tokens == len(result.generated_tokens) == 6
        assert r.finish_reason == "length"
        assert r.queue_s >= 0 and r.prefill_s > 0
        assert r.ttft_s == pytest.approx(r.queue_s + r.prefill_s, abs=1e-6)
        assert r.ttft_s + r.decode_s <= r.duration_s + 1e-6
        assert r.tpot_s == pytest.approx((r.duration_s - r.ttft_s) / 5, rel=1e-6)
        assert 0 < r.itl_p50_s <= r.itl_max_s
        assert r.preemptions == 0
        assert r.step_time_s > 0 and r.kv_block_seconds > 0
        assert r.prefill_steps  # the steps that carried its prompt
        assert 0 <= r.interference_s <= r.duration_s


def test_the_requests_shares_add_up_to_the_steps_time(model: Any) -> None:
    _generate(model, _prompts((10,) * 6), max_batch_tokens=16)  # more than one step takes: they queue
    steps = _step_seconds()
    shares = sum(r.step_time_s for r in gpuprobe.requests())
    assert steps > 0 and shares == pytest.approx(steps, rel=0.01)
    queued = [r.queue_s for r in gpuprobe.requests()]
    assert max(queued) > min(queued)  # some waited for others
    # a request in a step that also prefilled another request's prompt saw interference
    assert any(r.interference_s > 0 for r in gpuprobe.requests())


def test_a_request_holds_its_blocks_for_the_steps_it_runs(model: Any) -> None:
    """kv_block_seconds: the blocks its tokens fill (page of 16) × each step's time, bounded by the blocks of
    its whole length × its steps' time."""
    _generate(model, _prompts((40,)), new=4, max_batch_tokens=64)  # one prefill of 40 tokens: 3 blocks; 43: 3
    gpuprobe.collect()
    (r,) = gpuprobe.requests()
    assert r.kv_block_seconds == pytest.approx(3 * r.step_time_s, rel=0.01)  # alone: its share is every step


def test_a_cancelled_request_says_cancelled(model: Any) -> None:
    gen = transformers.GenerationConfig(max_new_tokens=500, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        rid = manager.add_request([5, 6, 7, 8], max_new_tokens=500)
        deadline = time.monotonic() + 60
        while not [row for row in runtime().requests.in_flight() if row["state"] == "decode"]:
            assert time.monotonic() < deadline, "the request never decoded"
            time.sleep(0.02)
        (row,) = runtime().requests.in_flight()
        assert row["request_id"] == rid and row["kind"] == "continuous_batching" and row["output_tokens"] >= 1
        manager.cancel_request(rid)
        while not gpuprobe.requests():
            assert time.monotonic() < deadline, "no record after cancelling"
            time.sleep(0.02)
    finally:
        manager.stop(block=True, timeout=10)
    (record,) = gpuprobe.requests()
    assert record.request_id == rid and record.finish_reason == "cancelled"
    assert record.ttft_s is not None and record.ttft_s <= record.duration_s
    assert runtime().requests.in_flight() == []


def test_requests_of_a_failed_loop_say_error(model: Any) -> None:
    out = _generate(model, [[5, 6, 7], [500, 6, 7]])  # a token id past the vocabulary: the forward raises
    assert all(o.error is not None for o in out.values())
    assert sorted(r.finish_reason for r in gpuprobe.requests()) == ["error", "error"]


def test_an_end_of_sequence_token_says_eos(model: Any) -> None:
    first = _generate(model, _prompts((6,)), new=2)
    eos = next(iter(first.values())).generated_tokens[1]
    gpuprobe.testing.reset()
    out = _generate(model, _prompts((6,)), new=8, eos=eos)
    (r,) = gpuprobe.requests()
    assert r.output_tokens == len(next(iter(out.values())).generated_tokens) == 2
    assert r.finish_reason == "eos"
