"""One record per generate() call, on real tiny models, each figure against a reading of its own: the
tokens against the returned ids, the times against a streamer that notes when each token reaches it and
the caller's own clock around the call, the syncs against the sync audit's series, the finish reason
against how the call was told to stop."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument
from gpuprobe.runtime import runtime
from gpuprobe.testing import reset

from helpers import ROOT


class Clock(transformers.generation.streamers.BaseStreamer):
    """Notes the time each put() reaches it: the prompt first, then one put per step's tokens."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class ItemProcessor(transformers.LogitsProcessor):
    """Calls .item() on every step: one host sync a step of its own."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        scores[0, 0].item()
        return scores


class Raises(transformers.LogitsProcessor):
    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            raise ValueError("the processor gave up")
        return scores


class StopAfter(transformers.StoppingCriteria):
    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def generate(model: Any, ids: Any, **kwargs: Any) -> tuple[Any, gpuprobe.RequestRecord, float, Clock]:
    clock = Clock()
    t0 = time.perf_counter()
    with gpuprobe.catch_requests() as caught:
        out = model.generate(ids, streamer=clock, pad_token_id=0, **kwargs)
    wall = time.perf_counter() - t0
    return out, caught.record, wall, clock


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_a_call_s_record_has_its_tokens_and_times(make_model: Any, sampling: bool) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    ids = prompt(1, 6)
    out, record, wall, clock = generate(model, ids, max_new_tokens=7, min_new_tokens=7, do_sample=sampling)
    assert record.kind == "generate" and record.model == "rec" and record.batch_size == 1
    assert record.input_tokens == ids.shape[1] == 6
    assert record.output_tokens == out.shape[1] - ids.shape[1] == 7
    assert record.finish_reason == "length" and record.error is None
    assert record.queue_s is None  # generate() has no queue
    assert 0 < record.ttft_s <= record.duration_s <= wall
    assert record.prefill_s == record.ttft_s
    # decode runs from the first token to the last: what is left of the call is its set-up and return
    assert record.prefill_s + record.decode_s <= record.duration_s
    assert record.duration_s - (record.prefill_s + record.decode_s) < 0.5 * record.duration_s
    # the streamer's clock: the prompt, then one put per token; the first token reaches it right after TTFT
    tokens = clock.times[1:]
    assert len(tokens) == 7
    gaps = [b - a for a, b in zip(tokens, tokens[1:])]
    assert record.decode_s == pytest.approx(tokens[-1] - tokens[0], rel=0.25, abs=0.02)
    assert record.itl_max_s == pytest.approx(max(gaps), rel=0.3, abs=0.02)
    assert min(gaps) - 0.02 <= record.itl_p50_s <= max(gaps) + 0.02
    assert record.tpot_s == pytest.approx((record.duration_s - record.ttft_s) / 6)
    assert record.device_s is None  # a CPU
    assert record.step_time_s is None and record.kv_block_seconds is None  # continuous batching only
    assert gpuprobe.requests()[-1] is record
    json.dumps(record.as_dict())  # plain data


def test_a_batch_of_two_is_one_request_with_its_batch_size(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    ids = prompt(2, 5)
    out, record, _, _ = generate(model, ids, max_new_tokens=4, min_new_tokens=4)
    assert record.batch_size == 2 and record.input_tokens == 2 * 5
    assert record.output_tokens == out.shape[1] - 5 == 4
    assert len(gpuprobe.requests()) == 1


def test_an_end_of_sequence_token_says_eos(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    ids = prompt(1, 6)
    first, _, _, _ = generate(model, ids, max_new_tokens=3, min_new_tokens=3)
    eos = int(first[0, 7])  # greedy decoding's second token: make it the end-of-sequence token
    out, record, _, _ = generate(model, ids, max_new_tokens=10, eos_token_id=eos)
    assert out.shape[1] - 6 == 2 == record.output_tokens
    assert record.finish_reason == "eos"


def test_another_stopping_criterion_says_stop(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    ids = prompt(1, 6)
    criteria = transformers.StoppingCriteriaList([StopAfter(6 + 3)])
    out, record, _, _ = generate(model, ids, max_new_tokens=10, stopping_criteria=criteria)
    assert out.shape[1] - 6 == 3 == record.output_tokens
    assert record.finish_reason == "stop"


def test_a_failing_call_says_error_with_its_exception_type(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    with gpuprobe.catch_requests() as caught, pytest.raises(ValueError, match="gave up"):
        model.generate(prompt(1, 6), max_new_tokens=8, pad_token_id=0,
                       logits_processor=transformers.LogitsProcessorList([Raises(at=3)]))
    record = caught.record
    assert record.finish_reason == "error" and record.error == "ValueError"
    assert record.output_tokens is None and record.duration_s > 0


def test_host_syncs_are_the_audited_steps_syncs(make_model: Any) -> None:
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="rec")
    processors = transformers.LogitsProcessorList([ItemProcessor()])
    _, record, _, _ = generate(model, prompt(1, 6), max_new_tokens=5, min_new_tokens=5, logits_processor=processors)
    counted = sum(p.value for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.syncs" for p in d.points)
    assert record.host_syncs == counted
    processor = sum(p.value for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.syncs" for p in d.points
                    if p.labels.get("processor") == "ItemProcessor")
    assert processor == 5  # one .item() a step, the record counts them with the call's own syncs
    reset()
    model2 = instrument(make_model("llama"), model_name="rec2")
    _, plain, _, _ = generate(model2, prompt(1, 6), max_new_tokens=5, min_new_tokens=5)
    assert plain.host_syncs is None  # the audit is off


def test_the_id_a_block_gives_is_the_record_s_cleaned(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    with gpuprobe.catch_requests(request_id="job-7\r\nX-Evil: 1" + "x" * 1_000_000) as caught:
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
    rid = caught.record.request_id
    assert rid.startswith("job-7??X-Evil: 1") and len(rid) == 128 and rid.isprintable()
    with gpuprobe.catch_requests() as caught:
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
    assert len(caught) == 2 and caught[0].request_id != caught[1].request_id


def test_records_carry_no_prompt_text_or_token_ids(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="rec")
    ids = torch.tensor([[91, 82, 73, 64, 55, 46, 37]])
    out, record, _, _ = generate(model, ids, max_new_tokens=4, min_new_tokens=4)
    values = [v for v in record.as_dict().values() if not isinstance(v, (float, type(None)))]
    generated = out[0].tolist()
    assert not any(isinstance(v, list) and v and set(v) & set(generated) for v in values if v != record.prefill_steps)
    text = json.dumps(record.as_dict())
    assert "91, 82" not in text and str(generated[-4:])[1:-1] not in text


def test_the_kept_records_are_bounded_by_the_setting(make_model: Any) -> None:
    gpuprobe.configure(requests_kept=3)
    model = instrument(make_model("llama"), model_name="rec")
    with gpuprobe.catch_requests() as caught:
        for _ in range(5):
            model.generate(prompt(1, 4), max_new_tokens=1, pad_token_id=0)
    kept = gpuprobe.requests()
    assert len(kept) == 3 and kept == list(caught) and runtime().requests.ended == 5


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_two_thousand_requests_keep_memory_flat() -> None:
    """In a fresh interpreter: RSS after 1,000 and after 2,000 calls differ by little (the log keeps 100)."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {ROOT + '/tests/transformers'!r})
import gc, json, torch, gpuprobe
from _hfkit import build
from gpuprobe.integrations.transformers import instrument
gpuprobe.configure(requests_kept=100)
torch.set_num_threads(1)
model = instrument(build("llama").eval(), model_name="many")
ids = torch.tensor([[5, 6, 7]])
def rss():
    gc.collect()
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
marks = []
for i in range(2000):
    with gpuprobe.catch_requests(request_id="r" * 200 + str(i)):
        model.generate(ids, max_new_tokens=1, pad_token_id=0)
    if i + 1 in (1000, 2000):
        gpuprobe.collect()
        marks.append(rss())
print(json.dumps({{"rss_kb": marks, "kept": len(gpuprobe.requests()), "ended": gpuprobe.runtime.runtime().requests.ended}}))
"""
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kept"] == 100 and got["ended"] == 2000
    first, second = got["rss_kb"]
    assert second - first < 5_000, f"RSS grew by {second - first} kB over the second 1,000 requests"
