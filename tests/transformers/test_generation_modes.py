"""Every supported way of calling generate(), on several model families, counted exactly."""

from __future__ import annotations

import threading

import pytest
from _hfkit import FAMILIES, prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument

# Each test on the CPU and on simulated CUDA devices (where the steps and layers also take device spans).
pytestmark = pytest.mark.usefixtures("device_backend")

GenerationConfig = transformers.GenerationConfig


def _key(k: str) -> str:
    return "gen_ai." + k[len("gen_ai_"):].replace("_", ".") if k.startswith("gen_ai_") else k


def counts(metric: str, **labels: str) -> int:
    """Samples in a histogram (or the value of a counter/gauge) whose labels match."""
    total = 0
    for md in gpuprobe.collect():
        if md.spec.name != metric:
            continue
        for p in md.points:
            if all(p.labels.get(_key(k)) == v for k, v in labels.items()):
                total += p.count if md.spec.instrument == "histogram" else p.value
    return total


def sums(metric: str, **labels: str) -> float:
    total = 0.0
    for md in gpuprobe.collect():
        if md.spec.name == metric:
            total += sum(p.sum for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))
    return total


class Recorder(transformers.generation.streamers.BaseStreamer):
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


class StopAfter(transformers.StoppingCriteria):
    """Stop once ``n`` tokens were added to a prompt of ``start`` tokens."""

    def __init__(self, start: int, n: int) -> None:
        self.limit = start + n

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.limit, dtype=torch.bool)


class Halve:
    def __call__(self, input_ids, scores):
        return scores / 2


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_is_unchanged_and_counted_for_each_family(make_model, family, device_backend):
    model = make_model(family)
    ids = prompt(batch=2)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    instrument(model, model_name=family, layers=True, layer_every=2)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert torch.equal(ref, out)
    on_device = device_backend is not None  # on a (simulated) GPU every step also has a device span
    assert counts("gen_ai.server.time_per_output_token", gen_ai_request_model=family) == 1  # one request
    assert counts("gpuprobe.inter_token.duration", model=family, clock="host") == 4  # one per decode step
    assert counts("gpuprobe.inter_token.duration", model=family, clock="device") == 4 * on_device
    assert counts("gen_ai.server.time_to_first_token", gen_ai_request_model=family, clock="host") == 1
    assert counts("gen_ai.server.time_to_first_token", gen_ai_request_model=family, clock="device") == on_device
    assert counts("gpuprobe.step.duration", model=family, phase="prefill", clock="host") == 1
    assert counts("gpuprobe.step.duration", model=family, phase="prefill", clock="device") == int(on_device)
    assert counts("gpuprobe.step.duration", model=family, phase="decode", clock="device") == 4 * on_device
    assert counts("gpuprobe.layer.duration", model=family) == 2 * 2  # decode steps 2 and 4, two layers
    assert counts("gen_ai.client.token.usage", gen_ai_request_model=family) == 2


def test_sampling_runs_the_processors_transformers_builds(make_model):
    model = instrument(make_model("llama"), model_name="m")
    out = model.generate(prompt(), max_new_tokens=6, min_new_tokens=6, do_sample=True, temperature=0.5, top_k=10,
                         top_p=0.8, repetition_penalty=1.2)
    steps = out.shape[1] - prompt().shape[1]
    for cls in ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "RepetitionPenaltyLogitsProcessor"):
        assert counts("gpuprobe.step.component.duration", component="logits_processor", processor=cls) == steps


def test_beam_search_keeps_its_output_and_counts_steps(make_model, device_backend):
    model = make_model("llama")
    ids = prompt(batch=2)
    kw = dict(num_beams=3, num_return_sequences=2, max_new_tokens=5, min_new_tokens=5)
    ref = model.generate(ids, **kw)
    instrument(model, model_name="m")
    out = model.generate(ids, **kw)
    assert torch.equal(ref, out)
    assert counts("gpuprobe.step.duration", model="m", phase="decode", clock="host") == 4
    assert counts("gpuprobe.step.duration", model="m", phase="decode", clock="device") == 4 * (device_backend is not None)
    assert counts("gpuprobe.step.batch_size", model="m") == 1
    assert sums("gpuprobe.step.batch_size", model="m") == 2 * 3  # beams are sequences the model runs
    assert sums("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == 4 * 5


def test_static_cache_matches_dynamic_and_is_counted(make_model):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt()
    dyn = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    sta = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(dyn, sta)
    assert counts("gpuprobe.inter_token.duration", clock="host") == 2 * 5
    assert counts("gen_ai.server.time_per_output_token") == 2


def test_streamer_gets_every_token_and_is_timed_per_step(make_model):
    model = make_model("llama")
    ids = prompt()
    plain = Recorder()
    model.generate(ids, streamer=plain, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    instrument(model, model_name="m")
    timed = Recorder()
    model.generate(ids, streamer=timed, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert timed.chunks == plain.chunks and timed.ended
    assert len(timed.chunks) == 1 + 5  # the prompt, then one put per token
    assert counts("gpuprobe.step.component.duration", component="streamer") == 5


def test_user_logits_processor_and_stopping_criteria(make_model):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt(length=4)
    out = model.generate(ids, max_new_tokens=20, do_sample=False,
                         logits_processor=transformers.LogitsProcessorList([Halve()]),
                         stopping_criteria=transformers.StoppingCriteriaList([StopAfter(4, 3)]))
    assert out.shape[1] == 4 + 3
    assert counts("gpuprobe.step.component.duration", component="logits_processor", processor="Halve") == 3
    assert counts("gpuprobe.step.component.duration", component="stopping_criteria") == 3


def test_generation_config_argument(make_model):
    model = instrument(make_model("llama"), model_name="m")
    cfg = GenerationConfig(do_sample=True, top_k=5, max_new_tokens=4, min_new_tokens=4, pad_token_id=0, eos_token_id=2)
    out = model.generate(prompt(), generation_config=cfg)
    assert out.shape[1] == prompt().shape[1] + 4
    assert counts("gpuprobe.step.component.duration", processor="TopKLogitsWarper") == 4


def test_several_models_in_one_process_keep_their_own_series(make_model):
    a = instrument(make_model("llama"), model_name="a")
    b = instrument(make_model("gpt2"), model_name="b")
    a.generate(prompt(), max_new_tokens=3, min_new_tokens=3)
    b.generate(prompt(), max_new_tokens=5, min_new_tokens=5)
    b.generate(prompt(), max_new_tokens=5, min_new_tokens=5)
    assert counts("gpuprobe.inter_token.duration", model="a", clock="host") == 2
    assert counts("gpuprobe.inter_token.duration", model="b", clock="host") == 8
    assert counts("gen_ai.server.time_per_output_token", gen_ai_request_model="b") == 2
    assert counts("gen_ai.server.time_to_first_token", gen_ai_request_model="b", clock="host") == 2


def test_generate_from_several_threads_at_once(make_model):
    shared = instrument(make_model("llama"), model_name="shared", layers=True, layer_every=1)
    other = instrument(make_model("gpt2"), model_name="other")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(model, n_tokens: int, calls: int) -> None:
        try:
            start.wait()
            for _ in range(calls):
                model.generate(prompt(batch=2), max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(shared, 4, 3)), threading.Thread(target=work, args=(shared, 6, 2)),
               threading.Thread(target=work, args=(other, 5, 2)), threading.Thread(target=work, args=(shared, 2, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert counts("gen_ai.server.time_to_first_token", gen_ai_request_model="shared", clock="host") == 3 + 2 + 2
    assert counts("gpuprobe.inter_token.duration", model="shared", clock="host") == 3 * 3 + 2 * 5 + 2 * 1
    assert counts("gpuprobe.inter_token.duration", model="other", clock="host") == 2 * 4
    assert counts("gen_ai.server.time_per_output_token", gen_ai_request_model="shared") == 3 + 2 + 2
    assert counts("gpuprobe.layer.duration", model="shared") == 2 * (3 * 3 + 2 * 5 + 2 * 1)
    assert counts("gpuprobe.generate.active", model="shared") == 0
    assert all(len(m._forward_hooks) == 0 for m in shared.modules())


def test_inputs_embeds_generation_counts_only_new_tokens(make_model):
    model = instrument(make_model("llama"), model_name="m")
    embeds = model.get_input_embeddings()(prompt())
    out = model.generate(inputs_embeds=embeds, max_new_tokens=3, min_new_tokens=3)
    assert sums("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == out.numel() == 3
    assert sums("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"}) == prompt().numel()

