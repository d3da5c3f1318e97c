"""Budgets of counts for a model's generation, as a test suite of yours holds them (docs/testing.md).

    python -m pytest -q examples/test_generation_budgets.py --gpuprobe-update   # writes the baseline
    python -m pytest -q examples/test_generation_budgets.py                     # checks every budget

The model is a tiny Llama built from a config (random weights, no download): yours takes its place.
"""

import pytest
import torch
import transformers


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture
def inputs():
    return {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


class NoRepeat(transformers.LogitsProcessor):
    """Bans the last token, without reading anything back to the host."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))


def test_decode_has_no_syncs(gpuprobe_budget, model, inputs):
    # the syncs of your code; transformers' own stop check (one a step) is expected and left out
    with gpuprobe_budget(host_syncs_per_step=0, recompiles=0):
        model.generate(**inputs, max_new_tokens=16, do_sample=False,
                       logits_processor=transformers.LogitsProcessorList([NoRepeat()]))


def test_static_cache_does_not_concatenate(gpuprobe_budget, model, inputs):
    with gpuprobe_budget(dynamic_cache_concats=0):
        model.generate(**inputs, max_new_tokens=16, do_sample=False, cache_implementation="static")


def test_decode_counts_hold_to_their_baseline(gpuprobe_budget, model, inputs):
    with gpuprobe_budget.baseline("tiny-llama-decode"):
        model.generate(**inputs, max_new_tokens=16, do_sample=False)


def test_no_repeat_is_not_slower_than_greedy(gpuprobe_ab, model, inputs):
    gpuprobe_ab(lambda: model.generate(**inputs, max_new_tokens=8, do_sample=False),
                lambda: model.generate(**inputs, max_new_tokens=8, do_sample=False,
                                       logits_processor=transformers.LogitsProcessorList([NoRepeat()])),
                rounds=9, tolerance=0.25, names=("greedy", "no-repeat"))
