"""Helpers shared by the transformers tests: tiny models from configs, prompts, a /metrics parser."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("prometheus_client")


_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
# Token ids 0..2 are pad/bos/eos in every tiny config; prompts use ids >= 3.
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def build(family: str) -> Any:
    t = transformers
    if family == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**_SMALL, **_IDS))
    if family == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, **_IDS))
    if family == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**_SMALL, **_IDS))
    if family == "qwen3":
        return t.Qwen3ForCausalLM(t.Qwen3Config(**_SMALL, head_dim=16, **_IDS))
    if family == "mistral":
        return t.MistralForCausalLM(t.MistralConfig(**_SMALL, sliding_window=64, **_IDS))
    if family == "gemma":
        return t.GemmaForCausalLM(t.GemmaConfig(**_SMALL, head_dim=16, **_IDS))
    raise ValueError(family)


FAMILIES = ("llama", "gpt2", "qwen2", "qwen3", "mistral", "gemma")


def prompt(batch: int = 1, length: int = 6, *, seed: int = 0) -> Any:
    """Token ids >= 3 (never pad/bos/eos), reproducible."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (batch, length), generator=g)


class Scrape:
    """One scrape of the real /metrics endpoint, parsed with prometheus_client's parser."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.text = text
        self.samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    def find(self, name: str, **labels: str) -> list[Any]:
        want = {k: str(v) for k, v in labels.items()}
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the matching samples' values (0 when none)."""
        return sum(s.value for s in self.find(name, **labels))

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}
