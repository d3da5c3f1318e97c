"""layers=True times the blocks a decoding step runs: the decoder's of an encoder-decoder, the text model's of a
vision-language model; and says so once when a sampled step ran none of the layers it times."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations.transformers import find_layers, instrument, uninstrument

t = transformers


def layer_samples(model: str, layer_type: str | None = None) -> int:
    return sum(p.count for md in gpuprobe.collect() if md.spec.name == "gpuprobe.layer.duration"
               for p in md.points if p.labels.get("model") == model
               and (layer_type is None or p.labels.get("layer.type") == layer_type))


def prophetnet() -> Any:
    cfg = t.ProphetNetConfig(vocab_size=128, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                             num_encoder_layers=3, num_decoder_layers=2, num_encoder_attention_heads=4,
                             num_decoder_attention_heads=4, ngram=2, max_position_embeddings=64, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    torch.manual_seed(0)
    return t.ProphetNetForConditionalGeneration(cfg).eval()


def t5() -> Any:
    cfg = t.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=2, num_heads=4,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return t.T5ForConditionalGeneration(cfg).eval()


def llava() -> Any:
    text = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, image_size=32, patch_size=8, projection_dim=32)
    torch.manual_seed(0)
    return t.LlavaForConditionalGeneration(t.LlavaConfig(text_config=text, vision_config=vision, image_token_id=127)).eval()


@pytest.mark.parametrize(("build", "block", "decoder"), [
    (prophetnet, "ProphetNetDecoderLayer", lambda m: m.prophetnet.decoder.layers),
    (t5, "T5Block", lambda m: m.decoder.block),
    (llava, "LlamaDecoderLayer", lambda m: m.model.language_model.layers),
], ids=["prophetnet", "t5", "llava"])
def test_the_blocks_found_are_the_decoders(build, block: str, decoder) -> None:  # type: ignore[no-untyped-def]
    model = build()
    found = find_layers(model)
    assert [m for m, _ in found] == list(decoder(model))
    assert [i for _, i in found] == [0, 1]
    assert {type(m).__name__ for m, _ in found} == {block}


@pytest.mark.parametrize("build", [prophetnet, t5, llava], ids=["prophetnet", "t5", "llava"])
def test_every_sampled_decode_step_times_each_decoder_block(build) -> None:  # type: ignore[no-untyped-def]
    model = instrument(build(), model_name="m", layers=True, layer_every=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(prompt(length=6), max_new_tokens=5, min_new_tokens=5, do_sample=False)
    finally:
        uninstrument(model)
    assert [str(w.message) for w in caught if "timed layers" in str(w.message)] == []
    assert layer_samples("m") == 4 * 2  # 4 decode steps, 2 decoder blocks


def test_layers_that_never_run_in_a_decode_step_are_named_in_one_warning() -> None:
    model = t5()
    encoder_blocks = list(model.encoder.block)
    instrument(model, model_name="m", layers=encoder_blocks, layer_every=1)
    try:
        with pytest.warns(RuntimeWarning, match=r"none of the 3 timed layers of model 'm' \(T5Block\) ran") as caught:
            model.generate(prompt(length=6), max_new_tokens=4, min_new_tokens=4, do_sample=False)
            model.generate(prompt(length=6), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    finally:
        uninstrument(model)
    assert len([w for w in caught if "timed layers" in str(w.message)]) == 1
    assert layer_samples("m") == 0
