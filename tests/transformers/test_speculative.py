"""Assisted decoding and prompt lookup: outputs unchanged, steps, latencies and speculative counts exact.

The expected counts come from the uninstrumented run of the same call (``_hfkit.watch``): the main model's
forwards are counted with a forward hook (one per verification step), and what each step drafted and
accepted is what transformers itself hands its candidate generator (``update_candidate_strategy(input_ids,
scores, num_matches)``), recorded by a wrapper of the test's own around ``_get_candidate_generator``.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hfkit import Watched, prompt, torch, transformers, watch

import gpuprobe
from gpuprobe.integrations.transformers import instrument, instrument_all, uninstrument
from gpuprobe.testing import InMemoryExporter

pytestmark = pytest.mark.usefixtures("device_backend")

NEW = 8


def counts(metric: str, **labels: str) -> float:
    """Samples of a histogram, or the value of a counter, over the series whose labels match."""
    total = 0.0
    for md in gpuprobe.collect():
        if md.spec.name == metric:
            for p in md.points:
                if all(p.labels.get(k) == v for k, v in labels.items()):
                    total += p.count if md.spec.instrument == "histogram" else p.value
    return total


def sums(metric: str, **labels: str) -> float:
    return sum(p.sum for md in gpuprobe.collect() if md.spec.name == metric
               for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))


def assistant_of(model: Any, noise: float = 0.0) -> Any:
    """A draft model: the main model's weights, its head disturbed by ``noise`` (0: every draft accepted)."""
    import copy

    assistant = copy.deepcopy(model)
    # transformers keeps the draft length its heuristic reached in the draft model's generation config, so a
    # second call would not draft as the first did: a constant draft length keeps the calls alike.
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    with torch.no_grad():
        torch.manual_seed(7)
        assistant.lm_head.weight.add_(torch.randn_like(assistant.lm_head.weight) * noise)
    return assistant


def repeating_prompt() -> Any:
    """A prompt whose n-grams repeat, so prompt lookup finds drafts."""
    ids = prompt(length=4, seed=3)
    return torch.cat([ids, ids, ids], dim=1)


def check_call(plain: Watched, model_name: str, method: str, prompt_len: int, on_device: bool) -> None:
    steps = plain.forwards
    assert len(plain.steps) == steps
    assert plain.accepted == NEW - steps  # each step emits its accepted drafts and one token of its own
    gen = {"gen_ai.request.model": model_name}
    assert counts("gen_ai.server.request.duration", **gen) == 1
    assert sums("gen_ai.client.token.usage", **gen, **{"gen_ai.token.type": "input"}) == prompt_len
    assert sums("gen_ai.client.token.usage", **gen, **{"gen_ai.token.type": "output"}) == NEW
    assert counts("gen_ai.server.time_to_first_token", **gen, clock="host") == 1
    assert counts("gen_ai.server.time_to_first_token", **gen, clock="device") == on_device
    assert counts("gen_ai.server.time_per_output_token", **gen) == 1
    assert counts("gpuprobe.step.duration", model=model_name, phase="prefill", clock="host") == 1
    assert counts("gpuprobe.step.duration", model=model_name, phase="decode", clock="host") == steps - 1
    assert counts("gpuprobe.step.duration", model=model_name, phase="decode", clock="device") == (steps - 1) * on_device
    # One inter-token sample per output token after the first, on each clock.
    assert counts("gpuprobe.inter_token.duration", model=model_name, clock="host") == NEW - 1
    assert counts("gpuprobe.inter_token.duration", model=model_name, clock="device") == (NEW - 1) * on_device
    spec = {"model": model_name, "method": method}
    assert counts("gpuprobe.speculative.drafts", **spec) == plain.drafts
    assert counts("gpuprobe.speculative.draft_tokens", **spec) == plain.drafted
    assert counts("gpuprobe.speculative.accepted_tokens", **spec) == plain.accepted
    for position in range(max((d for d, _ in plain.steps), default=0)):
        got = counts("gpuprobe.speculative.accepted_tokens_per_position", **spec, position=str(position))
        assert got == plain.accepted_at(position), position
    assert counts("gpuprobe.speculative.emitted_tokens", **spec) == steps
    assert sums("gpuprobe.speculative.emitted_tokens", **spec) == NEW
    for component in ("draft", "forward", "verify", "stopping_criteria", "other"):
        assert counts("gpuprobe.step.component.duration", model=model_name, component=component) == steps, component


@pytest.mark.parametrize("noise", [0.0, 0.05], ids=["drafts-accepted", "drafts-rejected"])
def test_assisted_decoding_keeps_its_output_and_counts_each_verification_step(
        make_model, device_backend, noise: float) -> None:
    model = make_model("llama")
    assistant = assistant_of(model, noise)
    ids = prompt(length=6)
    with watch(model) as plain:
        ref = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    instrument(model, model_name="main")
    out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    assert torch.equal(ref, out)
    assert ref.shape[1] == 6 + NEW
    if noise == 0.0:
        assert plain.accepted > 0
    check_call(plain, "main", "draft_model", 6, device_backend is not None)


def test_prompt_lookup_counts_its_drafts_without_a_draft_model(make_model, device_backend) -> None:
    model = make_model("llama")
    ids = repeating_prompt()
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, prompt_lookup_num_tokens=3)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    instrument(model, model_name="main")
    assert torch.equal(ref, model.generate(ids, **kw))
    assert plain.drafted > 0
    check_call(plain, "main", "prompt_lookup", ids.shape[1], device_backend is not None)


def test_speculative_sampling_keeps_its_output_for_a_seed(make_model, device_backend) -> None:
    model = make_model("llama")
    assistant = assistant_of(model, 0.02)
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, top_k=20, assistant_model=assistant)
    torch.manual_seed(11)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    instrument(model, model_name="main")
    torch.manual_seed(11)
    assert torch.equal(ref, model.generate(ids, **kw))
    check_call(plain, "main", "draft_model", 6, device_backend is not None)


def test_early_exit_drafts_with_the_model_itself_unmeasured(make_model, device_backend) -> None:
    model = make_model("llama")
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_early_exit=1)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    forwards_with_drafts = plain.forwards  # the draft runs the model's own first layers: forwards of its own
    instrument(model, model_name="main")
    assert torch.equal(ref, model.generate(ids, **kw))
    plain.forwards = len(plain.steps)  # the verification steps alone
    assert forwards_with_drafts > plain.forwards
    check_call(plain, "main", "early_exit", 6, device_backend is not None)


def test_an_instrumented_draft_model_reports_no_requests_of_its_own(make_model, device_backend) -> None:
    model = make_model("llama")
    assistant = instrument(assistant_of(model, 0.05), model_name="draft")
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    gpuprobe.testing.reset()
    instrument(model, model_name="main")
    assert torch.equal(ref, model.generate(ids, **kw))
    check_call(plain, "main", "draft_model", 6, device_backend is not None)
    assert counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "draft"}) == 0
    assert counts("gpuprobe.step.duration", model="draft") == 0
    # Outside a draft, the draft model is measured as any model.
    assistant.generate(ids, max_new_tokens=3, min_new_tokens=3)
    assert counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "draft"}) == 1
    uninstrument(assistant)


@pytest.mark.parametrize("noise", [0.0, 0.01], ids=["drafts-accepted", "drafts-rejected"])
def test_encoder_decoder_assisted_decoding_counts_no_decoder_start_token(device_backend, noise: float) -> None:
    t = transformers
    cfg = t.BartConfig(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                       forced_eos_token_id=None)
    torch.manual_seed(0)
    model = t.BartForConditionalGeneration(cfg).eval()
    assistant = assistant_of(model, noise)
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    instrument(model, model_name="bart")
    try:
        assert torch.equal(ref, model.generate(ids, **kw))
        assert ref.shape[1] == 1 + NEW  # the decoder start token and the new ones
        check_call(plain, "bart", "draft_model", 6, device_backend is not None)
    finally:
        uninstrument(model)


def test_assisted_decoding_under_instrument_all(make_model, device_backend) -> None:
    model = make_model("llama")
    assistant = assistant_of(model, 0.05)
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    instrument_all(model_name="main")
    assert torch.equal(ref, model.generate(ids, **kw))
    check_call(plain, "main", "draft_model", 6, device_backend is not None)


def test_a_speculative_steps_components_add_up_to_it(make_model) -> None:
    model = instrument(make_model("llama"), model_name="main")
    assistant = assistant_of(model, 0.05)
    with InMemoryExporter() as exp:
        model.generate(prompt(length=6), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                       assistant_model=assistant, repetition_penalty=1.2)
    steps = exp.values("gpuprobe.step.duration", clock="host")
    parts = exp.values("gpuprobe.step.component.duration")
    assert len(exp.values("gpuprobe.step.component.duration", component="draft")) == len(steps)
    assert exp.values("gpuprobe.step.component.duration", component="logits_processor")  # once per position
    assert sum(parts) == pytest.approx(sum(steps), rel=1e-9, abs=1e-9)


def test_the_sync_audit_attributes_the_verification(make_model) -> None:
    model = instrument(make_model("llama"), model_name="main")
    assistant = assistant_of(model, 0.05)
    gpuprobe.configure(sync_audit=1)
    model.generate(prompt(length=6), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    audited = counts("gpuprobe.step.audited", model="main")
    assert audited == counts("gpuprobe.step.duration", model="main", clock="host") > 1
    components = {p.labels["component"] for md in gpuprobe.collect() if md.spec.name == "gpuprobe.step.syncs"
                  for p in md.points if p.value}
    assert "verify" in components  # the number of accepted tokens, read on the host to slice the tokens


def test_the_draft_model_drafts_as_it_does_without_gpuprobe(make_model) -> None:
    # The candidate generator hands the call's logits processors to the draft model's generate(), which
    # merges them with its own by type: it must get the processors themselves, not gpuprobe's stand-ins.
    model = make_model("llama")
    assistant = assistant_of(model, 0.05)
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant,
              repetition_penalty=1.5, no_repeat_ngram_size=2)
    with watch(model) as plain:
        ref = model.generate(ids, **kw)
    with watch(model) as measured:
        instrument(model, model_name="main")  # its seam runs the watched method underneath
        out = model.generate(ids, **kw)
    assert torch.equal(ref, out)
    assert measured.candidates == plain.candidates
    assert measured.steps == plain.steps
    handed = [p for p in measured.processors if p is not None]
    assert handed and all(type(p) is p.__class__ for p in handed)  # no stand-in among them
    assert counts("gpuprobe.step.component.duration", component="logits_processor",
                  processor="NoRepeatNGramLogitsProcessor") > 0  # the verification's processors are timed


def test_a_failure_in_the_forward_hook_leaves_the_output_and_turns_the_steps_off(make_model, monkeypatch) -> None:
    from gpuprobe import _seams
    from gpuprobe.integrations._transformers.generate import speculative

    model = make_model("llama")
    assistant = assistant_of(model, 0.05)
    ids = prompt(length=6)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, assistant_model=assistant)
    ref = model.generate(ids, **kw)
    instrument(model, model_name="main")

    def broken(outputs: Any) -> Any:
        raise RuntimeError("a fault injected into gpuprobe")

    monkeypatch.setattr(speculative, "model_output_cache", broken)  # read inside the forward hook
    with pytest.warns(RuntimeWarning, match="transformers.generate.verify"):
        out = model.generate(ids, **kw)
    assert torch.equal(ref, out)
    assert not speculative.SEAM_VERIFY.on
    group = speculative.SEAM_VERIFY.group  # the decoding loop's seams work together: all are off
    assert {s["state"] for s in gpuprobe.info()["seams"] if _seams.seam(s["seam"]).group == group} == {"off"}
    assert model.generate(ids, **kw).tolist() == ref.tolist()  # and the next call runs unmeasured
    assert counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "main"}) == 2  # per call still
