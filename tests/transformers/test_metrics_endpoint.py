"""What generate() puts on the real /metrics endpoint, read over HTTP and parsed by prometheus_client."""

from __future__ import annotations

import re

import pytest
from _hfkit import prompt, torch

from gpuprobe.integrations.transformers import instrument

TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
ITL = "gpuprobe_inter_token_duration_seconds"
REQ = "gen_ai_server_request_duration_seconds"
USAGE = "gen_ai_client_token_usage"
STEP = "gpuprobe_step_duration_seconds"
COMP = "gpuprobe_step_component_duration_seconds"

SAMPLING = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)


class BanToken:
    """A user logits processor: token 7 is never chosen."""

    def __call__(self, input_ids, scores):
        scores[:, 7] = -float("inf")
        return scores


def new_tokens(out, ids) -> int:
    return out.shape[0] * (out.shape[1] - ids.shape[1])


def test_one_ttft_and_one_request_sample_per_generate_call(make_model, scrape):
    model = instrument(make_model("llama"), model_name="tiny-llama")
    for n in (3, 5, 1):
        model.generate(prompt(), max_new_tokens=n, min_new_tokens=n)
    s = scrape()
    assert s.value(TTFT + "_count", gen_ai_request_model="tiny-llama") == 3
    assert s.value(REQ + "_count", gen_ai_request_model="tiny-llama", gen_ai_provider_name="transformers",
                   gen_ai_operation_name="text_completion") == 3
    assert s.value(STEP + "_count", model="tiny-llama", phase="prefill", clock="host") == 3


def test_output_token_usage_equals_tokens_generated(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt(batch=3, length=7)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding on one row
    outs = [model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n) for n in (4, 6)]
    s = scrape()
    assert s.value(USAGE + "_sum", gen_ai_token_type="output") == sum(new_tokens(o, ids) for o in outs)
    assert s.value(USAGE + "_sum", gen_ai_token_type="input") == 2 * ids.numel()
    assert s.value(USAGE + "_count", gen_ai_token_type="output") == 2


def test_one_decode_step_sample_per_step_run(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt(length=5)
    outs = [model.generate(ids, max_new_tokens=n, min_new_tokens=n) for n in (2, 7)]
    decode_steps = sum(o.shape[1] - ids.shape[1] - 1 for o in outs)  # step 0 is the prefill
    s = scrape()
    assert s.value(ITL + "_count", clock="host") == decode_steps
    assert s.value(TPOT + "_count") == 2  # one per request of two tokens or more
    assert s.value(STEP + "_count", phase="decode", clock="host") == decode_steps
    assert s.value(COMP + "_count", component="forward") == decode_steps + 2


def test_one_series_per_logits_processor_class_with_one_sample_per_step(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    from transformers import LogitsProcessorList

    out = model.generate(prompt(), max_new_tokens=6, min_new_tokens=6, logits_processor=LogitsProcessorList([BanToken()]),
                         **SAMPLING)
    steps = out.shape[1] - prompt().shape[1]
    s = scrape()
    names = s.label_values(COMP + "_count", "processor")
    assert {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "RepetitionPenaltyLogitsProcessor",
            "BanToken"} <= names
    for name in names:
        assert s.value(COMP + "_count", component="logits_processor", processor=name) == steps


def test_components_add_up_to_the_step(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    model.generate(prompt(batch=2), max_new_tokens=8, min_new_tokens=8, **SAMPLING)
    s = scrape()
    steps = s.value(STEP + "_sum", clock="host")
    parts = s.value(COMP + "_sum")
    assert steps > 0
    assert parts == pytest.approx(steps, rel=1e-6)
    assert s.value(COMP + "_count", component="other") == s.value(STEP + "_count", clock="host")
    assert s.value(COMP + "_sum", component="forward") > s.value(COMP + "_sum", component="stopping_criteria")


def test_batch_size_and_requests_in_flight(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    model.generate(prompt(batch=3), max_new_tokens=2)
    s = scrape()
    assert s.value("gpuprobe_step_batch_size_sum", model="m") == 3
    assert s.value("gpuprobe_generate_active", model="m") == 0
    assert s.find("gpuprobe_generate_active", model="m")  # the series exists


def test_exposition_holds_no_prompt_text_or_token_ids(make_model, scrape):
    model = instrument(make_model("llama"), model_name="tiny-exposition")
    ids = torch.tensor([[101, 93, 117, 88, 64, 77]])
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, **SAMPLING)
    s = scrape()
    allowed = {
        "tiny-exposition", "transformers", "text_completion", "input", "output", "prefill", "decode", "host", "device",
        "forward", "logits_processor", "stopping_criteria", "streamer", "other", "cpu", "0",
        "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "RepetitionPenaltyLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor", "MinLengthLogitsProcessor",
    }
    for sample in s.samples:
        owner = sample.labels.get("model", sample.labels.get("gen_ai_request_model"))
        if owner not in (None, "tiny-exposition") or (owner is None and sample.value == 0):
            continue  # another test's model (this one's name is its own), or gpuprobe's own series at 0
        for key, value in sample.labels.items():
            if key == "le" or key.endswith("_version") or key == "device_name":  # gpuprobe_build_info
                continue
            # the device label: cpu; cuda on a machine with CUDA before the program initializes it; then cuda:N
            # an operator's name (the sync audit's op label, when an audit is on): aten::name, from torch
            assert value in allowed or re.fullmatch(r"cuda(:\d+)?|aten::\w+", value), (sample.name, key, value)
    generated = {str(int(t)) for t in out[0]}
    label_text = " ".join(v for smp in s.samples for k, v in smp.labels.items() if k != "le")
    assert not generated & set(label_text.split()) - {"0"}


def test_kv_cache_gauges_with_dynamic_cache(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt(batch=2, length=5)
    out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, return_dict_in_generate=True)
    cache = out.past_key_values
    expected = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    s = scrape()
    assert s.value("gpuprobe_kv_cache_memory_bytes", model="m") == expected
    # The cache holds every position but the last token's: prompt + new - 1.
    assert s.value("gpuprobe_kv_cache_sequence_length", model="m") == ids.shape[1] + 4 - 1


def test_kv_cache_gauges_with_static_cache(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    ids = prompt(batch=1, length=5)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, cache_implementation="static")
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    max_len = ids.shape[1] + 4 - 1  # the static cache is sized for max_length - 1
    per_layer = 2 * 1 * cfg.num_key_value_heads * max_len * head_dim * 4  # keys + values, float32
    s = scrape()
    assert s.value("gpuprobe_kv_cache_memory_bytes", model="m") == cfg.num_hidden_layers * per_layer
    assert s.value("gpuprobe_kv_cache_sequence_length", model="m") == ids.shape[1] + 4 - 1


def test_memory_gauges_are_read(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    model.generate(prompt(), max_new_tokens=2)
    s = scrape()
    assert s.value("gpuprobe_memory_allocated_bytes") > 0
    assert s.value("gpuprobe_memory_peak_bytes") > 0


def test_memory_and_kv_gauges_can_be_turned_off(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m", memory=False, kv_cache=False)
    model.generate(prompt(), max_new_tokens=2)
    s = scrape()
    assert not s.find("gpuprobe_kv_cache_memory_bytes")
    assert not s.find("gpuprobe_memory_allocated_bytes")


def test_layers_sampled_every_n_decode_steps(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m", layers=True, layer_every=3)
    model.generate(prompt(), max_new_tokens=10, min_new_tokens=10)  # 9 decode steps: 3 sampled
    s = scrape()
    assert s.value("gpuprobe_layer_duration_seconds_count", model="m", layer_type="LlamaDecoderLayer") == 3 * 2
    assert not s.label_values("gpuprobe_layer_duration_seconds_count", "layer_index")


def test_layer_index_label_is_opt_in(make_model, scrape):
    model = instrument(make_model("gpt2"), model_name="m", layers=True, layer_every=1, layer_index=True)
    model.generate(prompt(), max_new_tokens=3, min_new_tokens=3)
    s = scrape()
    assert s.label_values("gpuprobe_layer_duration_seconds_count", "layer_index") == {"0", "1"}
    assert s.value("gpuprobe_layer_duration_seconds_count", layer_type="GPT2Block", layer_index="1") == 2


def test_failed_call_shows_its_error_type(make_model, scrape):
    model = instrument(make_model("llama"), model_name="m")
    model.generate(prompt(), max_new_tokens=2)
    with pytest.raises(ValueError):
        model.generate(prompt(), max_new_tokens=2, not_an_argument=True)
    s = scrape()
    assert s.value(REQ + "_count", error_type="ValueError") == 1
    assert s.value(REQ + "_count") == 2
    assert s.value(TTFT + "_count") == 1
