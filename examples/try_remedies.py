"""Factories for ``gpuprobe try``: a model and its generate() arguments, as your own code would make them.

Runs on a CPU in seconds: a tiny Llama built from a config (random weights, nothing downloaded).

    gpuprobe try examples/try_remedies.py:slow_processor --budget 30s       # experiment 1: a processor
    gpuprobe try examples/try_remedies.py:long_context --variants static-cache --prompt-lens 32,256
    python examples/try_remedies.py                                         # both, through the Python API

``slow_processor`` generates with a logits processor written the slow way (a Python loop over the
vocabulary that reads every score on the host: one device-to-host synchronisation per token of the
vocabulary on a GPU); ``gpuprobe try`` flags it from the baseline's own steps and measures the run
without it. ``long_context`` is plain greedy decoding, for the static-against-dynamic-cache table.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

VOCAB = 256


class BanLowScores(LogitsProcessor):
    """Masks scores below the row's mean: written token by token, as it should not be."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for row in range(scores.shape[0]):
            mean = float(scores[row].mean())             # a host sync
            for token in range(scores.shape[1]):
                if float(scores[row, token]) < mean - 4:  # a host sync per token of the vocabulary
                    scores[row, token] = -float("inf")
        return scores


def tiny_llama(positions: int = 512) -> Any:
    """A 2-layer Llama with random weights (seed 0)."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=positions,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def _prompt(batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def slow_processor() -> tuple[Any, dict[str, Any]]:
    """Experiment 1: greedy decoding through a slow logits processor."""
    return tiny_llama(), {**_prompt(1, 16), "max_new_tokens": 16, "do_sample": False,
                          "logits_processor": LogitsProcessorList([BanLowScores()])}


def long_context() -> tuple[Any, dict[str, Any]]:
    """Experiment 2: plain greedy decoding, to compare a static KV cache with the dynamic one."""
    return tiny_llama(), {**_prompt(1, 32), "max_new_tokens": 32, "do_sample": False}


if __name__ == "__main__":
    from gpuprobe.experiment import render, try_remedies

    torch.set_num_threads(1)
    model, kwargs = slow_processor()
    print(render(try_remedies(model, kwargs, budget="20s", variants=["processors"])))
    model, kwargs = long_context()
    print(render(try_remedies(model, kwargs, budget="30s", variants=["static-cache"], prompt_lens=[32, 256])))
