"""instrument() / uninstrument() and the class-wide forms: reversible, idempotent, per instance."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
from _hfkit import FAMILIES, prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations._transformers import generate as hf_generate
from gpuprobe.integrations import transformers as hf

TTFT = "gen_ai.server.time_to_first_token"


def ttft_count(model_name: str | None = None) -> int:
    total = 0
    for md in gpuprobe.collect():
        if md.spec.name == TTFT:
            total += sum(p.count for p in md.points
                         if model_name is None or p.labels["gen_ai.request.model"] == model_name)
    return total


def seams(model) -> dict[str, object]:
    return {ms.attribute: model.__dict__.get(ms.attribute) for ms in hf_generate.METHOD_SEAMS}


def test_uninstrument_restores_outputs_methods_and_hooks(make_model):
    model = make_model("llama")
    ids = prompt(batch=2)
    before = model.generate(ids, max_new_tokens=8, do_sample=False)
    hooks_before = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    hf.instrument(model, layers=True, layer_every=1)
    during = model.generate(ids, max_new_tokens=8, do_sample=False)
    hf.uninstrument(model)
    after = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(before, during) and torch.equal(before, after)
    assert all(v is None for v in seams(model).values())
    assert "_gpuprobe_state" not in model.__dict__
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()] == hooks_before
    assert not hf.is_instrumented(model)


def test_instrument_twice_is_the_same_as_once(make_model):
    model = hf.instrument(make_model("llama"), model_name="m")
    first = seams(model)
    hf.instrument(model, model_name="m")
    assert seams(model) == first
    model.generate(prompt(), max_new_tokens=2)
    assert ttft_count("m") == 1


def test_instrument_again_with_other_options_reconfigures(make_model):
    model = hf.instrument(make_model("llama"), model_name="a")
    hf.instrument(model, model_name="b")
    model.generate(prompt(), max_new_tokens=2)
    assert ttft_count("b") == 1 and ttft_count("a") == 0


def test_uninstrument_twice_and_on_plain_objects_is_harmless(make_model):
    model = make_model("llama")
    hf.uninstrument(model)
    hf.instrument(model)
    hf.uninstrument(model)
    hf.uninstrument(model)
    assert hf.uninstrument(42) == 42


def test_other_instances_of_the_class_are_untouched(make_model):
    a, b = make_model("llama"), make_model("llama")
    hf.instrument(a, model_name="a")
    b.generate(prompt(), max_new_tokens=2)
    assert ttft_count() == 0
    assert all(v is None for v in seams(b).values())


def test_signature_of_generate_is_the_original(make_model):
    model = make_model("llama")
    before = inspect.signature(model.generate)
    hf.instrument(model)
    assert inspect.signature(model.generate) == before


def test_deep_copy_of_an_instrumented_model_is_a_plain_model(make_model):
    model = hf.instrument(make_model("llama"), model_name="orig")
    clone = copy.deepcopy(model)
    assert not hf.is_instrumented(clone)
    with torch.no_grad():
        clone.model.embed_tokens.weight.zero_()  # the copy must run its own weights, not the original's
    out_clone = clone.generate(prompt(), max_new_tokens=3, do_sample=False)
    out_orig = model.generate(prompt(), max_new_tokens=3, do_sample=False)
    assert ttft_count("orig") == 1  # only the original's call was measured
    assert not torch.equal(out_clone, out_orig)
    hf.instrument(clone, model_name="clone")
    clone.generate(prompt(), max_new_tokens=2)
    assert ttft_count("clone") == 1
    hf.uninstrument(clone)


def test_pickled_instrumented_model_loads_uninstrumented(make_model):
    model = hf.instrument(make_model("llama"))
    restored = pickle.loads(pickle.dumps(model))
    assert not hf.is_instrumented(restored)
    out = restored.generate(prompt(), max_new_tokens=2, do_sample=False)
    assert out.shape == (1, prompt().shape[1] + 2)


def test_instrumenting_an_unsupported_object_names_its_type():
    with pytest.raises(hf.UnsupportedModelError, match=r"torch\.nn\.modules\.linear\.Linear"):
        hf.instrument(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="GenerationMixin"):
        hf.instrument("gpt2")
    with pytest.raises(hf.UnsupportedModelError, match="instrument_class"):
        hf.instrument(transformers.LlamaForCausalLM)


def test_instrumenting_a_model_that_cannot_generate_says_so():
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=64, vocab_size=64))
    with pytest.raises(hf.UnsupportedModelError, match="BertModel"):
        hf.instrument(bert)


def test_unsupported_transformers_version_is_named(make_model, monkeypatch):
    model = make_model("llama")
    import sys

    # transformers swaps its module object in sys.modules on first lazy import: patch the live one.
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.46.3")
    with pytest.raises(hf.UnsupportedVersionError, match=r"4\.46\.3.*") as info:
        hf.instrument(model)
    assert hf.SUPPORTED_VERSIONS in str(info.value)
    assert not hf.is_instrumented(model)


def test_bad_options_are_refused(make_model):
    model = make_model("llama")
    with pytest.raises(gpuprobe.ConfigError, match="layer_every"):
        hf.instrument(model, layer_every=0)
    with pytest.raises(gpuprobe.ConfigError, match="model_name"):
        hf.instrument(model, model_name="")
    with pytest.raises(gpuprobe.ConfigError, match="unknown option"):
        hf.instrument_class(transformers.LlamaForCausalLM, layer=True)


def test_instrument_class_instruments_each_instance_at_its_first_generate(make_model):
    hf.instrument_class(transformers.LlamaForCausalLM, layers=True, layer_every=1)
    a, b, g = make_model("llama"), make_model("llama"), make_model("gpt2")
    assert not hf.is_instrumented(a)
    a.generate(prompt(), max_new_tokens=2)
    b.generate(prompt(), max_new_tokens=2)
    g.generate(prompt(), max_new_tokens=2)
    assert hf.is_instrumented(a) and hf.is_instrumented(b) and not hf.is_instrumented(g)
    assert ttft_count("llama") == 2
    hf.uninstrument_class(transformers.LlamaForCausalLM)
    assert "generate" not in transformers.LlamaForCausalLM.__dict__
    assert not hf.is_instrumented(a) and not hf.is_instrumented(b)


def test_instrument_all_covers_every_generating_model_and_is_undone(make_model):
    original = transformers.GenerationMixin.__dict__["generate"]
    hf.instrument_all()
    models = [make_model(f) for f in FAMILIES]
    for m in models:
        m.generate(prompt(), max_new_tokens=2)
    assert ttft_count() == len(FAMILIES)
    hf.uninstrument_all()
    assert transformers.GenerationMixin.__dict__["generate"] is original
    assert not any(hf.is_instrumented(m) for m in models)


def test_uninstrument_keeps_a_model_out_of_class_wide_instrumentation(make_model):
    hf.instrument_all()
    model = make_model("llama")
    model.generate(prompt(), max_new_tokens=2)
    hf.uninstrument(model)
    model.generate(prompt(), max_new_tokens=2)
    assert not hf.is_instrumented(model) and ttft_count() == 1


def test_run_time_switch_turns_measurement_off(make_model):
    model = hf.instrument(make_model("llama"))
    gpuprobe.disable()
    try:
        model.generate(prompt(), max_new_tokens=2)
    finally:
        gpuprobe.enable()
    assert ttft_count() == 0
    model.generate(prompt(), max_new_tokens=2)
    assert ttft_count() == 1


@pytest.mark.parametrize("family, block", [("llama", "LlamaDecoderLayer"), ("gpt2", "GPT2Block"),
                                           ("qwen2", "Qwen2DecoderLayer"), ("qwen3", "Qwen3DecoderLayer"),
                                           ("mistral", "MistralDecoderLayer"), ("gemma", "GemmaDecoderLayer")])
def test_decoder_layers_are_found_for_each_family(make_model, family, block):
    found = hf.find_layers(make_model(family))
    assert [(type(m).__name__, i) for m, i in found] == [(block, 0), (block, 1)]


def test_decoder_layers_are_found_without_no_split_modules(make_model):
    model = make_model("llama")
    model._no_split_modules = None
    assert [type(m).__name__ for m, _ in hf.find_layers(model)] == ["LlamaDecoderLayer"] * 2
