"""Helpers shared by the transformers tests: tiny models from configs, prompts, a /metrics parser."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
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


class Watched:
    """What one model's generate() calls did, seen by the test itself: the model's forwards, and for a
    speculative call what transformers handed its candidate generator step by step."""

    def __init__(self) -> None:
        self.forwards = 0
        self.steps: list[tuple[int, int]] = []  # (draft tokens, accepted) per verification step
        self.candidates: list[list[int]] = []  # the candidate ids each draft proposed
        self.processors: list[Any] = []  # the logits processors the candidate generator keeps for its drafts

    @property
    def drafted(self) -> int:
        return sum(d for d, _ in self.steps)

    @property
    def accepted(self) -> int:
        return sum(a for _, a in self.steps)

    @property
    def drafts(self) -> int:
        return sum(1 for d, _ in self.steps if d > 0)

    def accepted_at(self, position: int) -> int:
        return sum(1 for _, a in self.steps if a > position)


@contextlib.contextmanager
def watch(model: Any) -> Iterator[Watched]:
    """Count ``model``'s forwards (a forward pre-hook) and record what its candidate generators see (a
    wrapper of ``GenerationMixin._get_candidate_generator``, put back on leaving)."""
    seen = Watched()
    mixin = transformers.GenerationMixin
    original = mixin.__dict__["_get_candidate_generator"]

    def get_candidate_generator(self: Any, *args: Any, **kwargs: Any) -> Any:
        generator = original(self, *args, **kwargs)
        update, draft = generator.update_candidate_strategy, generator.get_candidates

        def get_candidates(*a: Any, **k: Any) -> Any:
            found = draft(*a, **k)
            seen.candidates.append(found[0].flatten().tolist())
            return found

        def record(input_ids: Any, scores: Any, num_matches: int) -> Any:
            seen.steps.append((scores.shape[1] - 1, int(num_matches)))
            return update(input_ids, scores, num_matches)

        generator.get_candidates = get_candidates
        generator.update_candidate_strategy = record
        seen.processors = list(getattr(generator, "logits_processor", None) or [])
        return generator

    def count(module: Any, args: Any) -> None:
        seen.forwards += 1

    mixin._get_candidate_generator = get_candidate_generator
    handle = model.register_forward_pre_hook(count)
    try:
        yield seen
    finally:
        handle.remove()
        mixin._get_candidate_generator = original
