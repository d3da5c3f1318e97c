"""Models with a generate() of their own (Whisper strips its decoder prompt, MusicGen reshapes its codebooks):
usage counted from the steps gpuprobe saw, and the first call measured where later calls are."""

from __future__ import annotations

from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument, instrument_all, uninstrument, uninstrument_all

pytestmark = pytest.mark.usefixtures("device_backend")

NEW = 8
t = transformers


def counts(metric: str, **labels: str) -> float:
    return sum(p.count if md.spec.instrument == "histogram" else p.value for md in gpuprobe.collect()
               if md.spec.name == metric for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))


def output_tokens(model: str) -> float:
    return sum(p.sum for md in gpuprobe.collect() if md.spec.name == "gen_ai.client.token.usage"
               for p in md.points if p.labels.get("gen_ai.token.type") == "output"
               and p.labels.get("gen_ai.request.model") == model)


def whisper() -> Any:
    cfg = t.WhisperConfig(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                          max_source_positions=32, max_target_positions=64, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None)
    torch.manual_seed(0)
    return t.WhisperForConditionalGeneration(cfg).eval()


def features(batch: int) -> Any:
    return torch.randn(batch, 16, 64, generator=torch.Generator().manual_seed(batch))


def musicgen() -> Any:
    cfg = t.MusicgenDecoderConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                                  num_codebooks=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1)
    torch.manual_seed(0)
    model = t.MusicgenForCausalLM(cfg).eval()
    model.generation_config = t.GenerationConfig(pad_token_id=0, bos_token_id=1, decoder_start_token_id=1)
    return model


def steps(model: str) -> tuple[float, float, float]:
    return (counts("gpuprobe.step.duration", model=model, phase="prefill", clock="host"),
            counts("gpuprobe.step.duration", model=model, phase="decode", clock="host"),
            counts("gpuprobe.inter_token.duration", model=model, clock="host"))


@pytest.mark.parametrize(("batch", "beams"), [(1, 1), (2, 1), (2, 2)], ids=["greedy", "batch-2", "beam-batch-2"])
def test_whisper_counts_the_tokens_it_generated_though_it_strips_its_decoder_prompt(batch: int, beams: int) -> None:
    model = whisper()
    x = features(batch)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, num_beams=beams)
    ref = model.generate(x, **kw)
    assert ref.shape == (batch, NEW)  # Whisper's generate() returns the new tokens only
    instrument(model, model_name="whisper")
    try:
        assert torch.equal(ref, model.generate(x, **kw))
        assert output_tokens("whisper") == batch * NEW
        assert steps("whisper") == (1, NEW - 1, NEW - 1)
        assert counts("gen_ai.server.time_per_output_token", **{"gen_ai.request.model": "whisper"}) == 1
    finally:
        uninstrument(model)


def test_under_instrument_all_whispers_first_and_later_calls_agree() -> None:
    model = whisper()
    x = features(1)
    ref = model.generate(x, max_new_tokens=NEW, min_new_tokens=NEW)
    instrument_all(model_name="whisper")
    per_call = []
    for _ in range(3):
        gpuprobe.testing.reset()
        assert torch.equal(ref, model.generate(x, max_new_tokens=NEW, min_new_tokens=NEW))
        per_call.append((output_tokens("whisper"), *steps("whisper"),
                         counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "whisper"})))
    assert per_call == [(NEW, 1, NEW - 1, NEW - 1, 1)] * 3
    uninstrument_all()
    assert not getattr(t.WhisperForConditionalGeneration.generate, "_gpuprobe_class_wrapper", False)


@pytest.mark.parametrize("class_wide", [False, True], ids=["instrument", "instrument_all"])
def test_musicgen_counts_one_token_per_codebook_and_step_though_it_reshapes_its_output(class_wide: bool) -> None:
    model = musicgen()
    batch, codebooks = 2, 2
    ids = torch.randint(3, 60, (batch * codebooks, 3), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, num_return_sequences=1)
    ref = model.generate(ids, **kw)
    assert ref.shape == (batch, codebooks, 3 + NEW)  # reshaped by MusicGen's own generate()
    if class_wide:  # its generate() calls self._sample directly: GenerationMixin.generate is never reached
        instrument_all(model_name="musicgen")
    else:
        instrument(model, model_name="musicgen")
    try:
        assert torch.equal(ref, model.generate(ids, **kw))
        assert output_tokens("musicgen") == batch * codebooks * NEW
        assert steps("musicgen") == (1, NEW - 1, NEW - 1)
    finally:
        uninstrument_all()
        uninstrument(model)


def test_a_model_class_defined_after_instrument_all_is_measured_at_its_own_generate() -> None:
    instrument_all(model_name="own")
    try:
        class Stripped(t.LlamaForCausalLM):  # strips the prompt and one token from what it returns
            def generate(self, *args: Any, **kwargs: Any) -> Any:
                return super().generate(*args, **kwargs)[:, 7:]

        assert Stripped.config_class is t.LlamaConfig  # transformers' own __init_subclass__ ran
        assert getattr(Stripped.generate, "_gpuprobe_class_wrapper", False)
        cfg = t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(0)
        model = Stripped(cfg).eval()
        for call in range(2):
            out = model.generate(prompt(length=6), max_new_tokens=NEW, min_new_tokens=NEW)
            assert out.shape[1] == 6 + NEW - 7
            assert output_tokens("own") == (call + 1) * NEW
            assert counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "own"}) == call + 1
    finally:
        uninstrument_all()
    assert "generate" in Stripped.__dict__ and not getattr(Stripped.generate, "_gpuprobe_class_wrapper", False)
    assert "__init_subclass__" not in t.GenerationMixin.__dict__


def test_a_generate_that_runs_two_decoding_loops_is_one_request_with_both_loops_steps() -> None:
    class TwoPasses(t.LlamaForCausalLM):  # continues its own output with a second decoding loop
        def generate(self, inputs: Any = None, **kwargs: Any) -> Any:
            first = super().generate(inputs, **kwargs)
            return super().generate(first, **kwargs)

    cfg = t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = TwoPasses(cfg).eval()
    ids = prompt(length=6)
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    ref = model.generate(ids, **kw)
    instrument(model, model_name="two")
    try:
        assert torch.equal(ref, model.generate(ids, **kw))
        assert counts("gen_ai.server.request.duration", **{"gen_ai.request.model": "two"}) == 1
        assert output_tokens("two") == 2 * 4
        assert steps("two") == (2, 2 * 3, 2 * 4 - 1)  # each loop's first step is a prefill
        assert counts("gen_ai.server.time_to_first_token", **{"gen_ai.request.model": "two"}, clock="host") == 1
    finally:
        uninstrument(model)
