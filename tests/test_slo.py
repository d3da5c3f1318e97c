"""Service-level goals (settings slo_ttft, slo_tpot, slo_e2e): every finished request of a real tiny Llama
counted in ``gpuprobe.requests.slo`` as met, or by the first goal it missed, or as an error; cancelled
requests left out; the goals following ``configure()``. What each request should count as is worked out
here from its own record's figures and the goals, apart from gpuprobe's judgement."""

from __future__ import annotations

import time
import timeit
from typing import Any

import pytest

import gpuprobe
from gpuprobe._requests import RequestRecord
from gpuprobe._slo import RESULTS, Goals, SloCounter
from gpuprobe.integrations import transformers as hf
from gpuprobe.runtime import runtime

from helpers import cpu_continuous_batching_cannot_pin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL = "tiny-slo"
HOUR = 3600.0


@pytest.fixture
def model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = hf.instrument(transformers.LlamaForCausalLM(config).eval(), model_name=MODEL)
    yield m
    hf.uninstrument(m)


def _generate(model: Any, new: int = 4, ids: list[int] | None = None) -> RequestRecord:
    prompt = torch.tensor([ids or [5, 6, 7, 8]])
    with gpuprobe.catch_requests() as caught:
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    return caught.record


def _counts() -> dict[str, float]:
    """``gpuprobe.requests.slo`` of the model, by result: what /metrics shows (its zeros included)."""
    out: dict[str, float] = {}
    rt = runtime()
    with rt.lock:
        rt.drain()
        snapshot = rt.registry.snapshot(["gpuprobe.requests.slo"], zeros=True)
    for data in snapshot:
        if data.spec.name == "gpuprobe.requests.slo":
            for p in data.points:
                if p.labels["model"] == MODEL:
                    out[p.labels["result"]] = out.get(p.labels["result"], 0) + p.value
    return out


def _counted() -> dict[str, float]:
    """The results counted at least once."""
    return {k: v for k, v in _counts().items() if v}


def _expected(record: RequestRecord, ttft: float | None, tpot: float | None, e2e: float | None) -> str:
    """The result a request's own figures give against the goals: the first missed, in the documented order."""
    if record.finish_reason == "error":
        return "error"
    for goal, figure, name in ((ttft, record.ttft_s, "ttft"), (tpot, record.tpot_s, "tpot"),
                               (e2e, record.duration_s, "e2e")):
        if goal is not None and figure is not None and figure > goal:
            return name
    return "met"


def test_without_goals_nothing_is_counted(model: Any) -> None:
    _generate(model)
    assert _counted() == {}


def test_a_request_within_every_goal_is_met_and_the_misses_read_zero(model: Any) -> None:
    gpuprobe.configure(slo_ttft=HOUR, slo_tpot=HOUR, slo_e2e=HOUR)
    record = _generate(model)
    assert _expected(record, HOUR, HOUR, HOUR) == "met"
    assert _counts() == {"met": 1, "ttft": 0, "tpot": 0, "e2e": 0, "error": 0}


def test_the_first_goal_missed_is_the_result(model: Any) -> None:
    # Goals no request can meet, one at a time, then two at once: the earlier in ttft, tpot, e2e is counted.
    tiny = 1e-9
    cases = [(tiny, None, None), (HOUR, tiny, None), (HOUR, HOUR, tiny), (None, tiny, tiny), (tiny, None, tiny)]
    for ttft, tpot, e2e in cases:
        gpuprobe.testing.reset()
        gpuprobe.configure(slo_ttft=ttft, slo_tpot=tpot, slo_e2e=e2e)
        record = _generate(model, new=4)
        assert record.tpot_s is not None and record.ttft_s is not None
        want = _expected(record, ttft, tpot, e2e)
        assert _counted() == {want: 1}, (ttft, tpot, e2e)
    assert want == "ttft"


def test_a_one_token_answer_has_no_time_per_output_token_to_miss(model: Any) -> None:
    gpuprobe.configure(slo_tpot=1e-9)
    record = _generate(model, new=1)
    assert record.output_tokens == 1 and record.tpot_s is None
    assert _counts()["met"] == 1


def test_a_failed_request_counts_as_an_error(model: Any) -> None:
    gpuprobe.configure(slo_ttft=HOUR)
    with pytest.raises(IndexError):
        _generate(model, ids=[5, 500, 7])  # a token id past the vocabulary: the embedding raises
    (record,) = gpuprobe.requests()
    assert record.finish_reason == "error"
    assert _counted() == {"error": 1}


def test_configure_changes_the_goals_and_never_doubles_the_count(model: Any) -> None:
    gpuprobe.configure(slo_e2e=HOUR)
    gpuprobe.configure(slo_e2e=HOUR)  # the same goals again: still one listener
    _generate(model)
    assert _counts()["met"] == 1
    gpuprobe.configure(slo_e2e=1e-9)
    _generate(model)
    assert _counts()["met"] == 1 and _counts()["e2e"] == 1
    gpuprobe.configure(slo_e2e=None)  # no goal: counting stops, what was counted stays
    _generate(model)
    assert sum(_counts().values()) == 2


def test_goals_from_the_environment_are_read(monkeypatch: pytest.MonkeyPatch, model: Any) -> None:
    monkeypatch.setenv("GPUPROBE_SLO_TTFT", "1h")
    gpuprobe.testing.reset()  # the settings from the environment, as at start-up
    assert runtime().settings.slo_ttft == HOUR
    _generate(model)
    assert _counts()["met"] == 1


def test_a_cancelled_request_is_not_counted(model: Any) -> None:
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    gpuprobe.configure(slo_ttft=HOUR, slo_e2e=HOUR)
    gen = transformers.GenerationConfig(max_new_tokens=500, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        done = manager.add_request([5, 6, 7], max_new_tokens=3)
        rid = manager.add_request([5, 6, 7, 8], max_new_tokens=500)
        deadline = time.monotonic() + 60
        while not any(row["request_id"] == rid and row["state"] == "decode" for row in runtime().requests.in_flight()):
            assert time.monotonic() < deadline, "the request never decoded"
            time.sleep(0.02)
        manager.cancel_request(rid)
        while len(gpuprobe.requests()) < 2:
            assert time.monotonic() < deadline, "no record after cancelling"
            time.sleep(0.02)
    finally:
        manager.stop(block=True, timeout=10)
    reasons = {r.request_id: r.finish_reason for r in gpuprobe.requests()}
    assert reasons == {done: "length", rid: "cancelled"}
    assert _counted() == {"met": 1}


def test_a_record_the_counter_cannot_judge_never_reaches_the_request(recwarn: pytest.WarningsRecorder) -> None:
    gpuprobe.configure(slo_e2e=1.0)
    broken = RequestRecord(request_id="r", model=MODEL, duration_s=None)  # type: ignore[arg-type]
    runtime().requests.add(broken)  # what an integration does as a request ends
    assert _counted() == {}
    assert any("could not be counted against its goals" in str(w.message) for w in recwarn)


def test_results_are_the_declared_attribute_values() -> None:
    declared = next(a for a in gpuprobe._metrics.SPECS["gpuprobe.requests.slo"].attributes if a.name == "result")
    assert declared.values == RESULTS


def test_counting_a_request_costs_a_few_microseconds() -> None:
    counter = SloCounter(runtime(), Goals(ttft=0.25, tpot=0.05, e2e=10.0))
    record = RequestRecord(request_id="r", model=MODEL, duration_s=1.0, ttft_s=0.1, tpot_s=0.01, finish_reason="length")
    counter(record)  # the model's series made once
    records = runtime().thread_records()
    n = 20_000
    best = min(timeit.repeat(lambda: counter(record), number=n, repeat=5)) / n
    records.clear()
    # The goal is 20 us for everything a finished request costs; the count is a small part of it.
    assert best < 5e-6, f"{best * 1e6:.2f} us per request"
