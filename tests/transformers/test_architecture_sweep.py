"""A sample of the architecture sweep (tests/transformers/_sweep.py): one architecture of each kind, every mode.

The whole sweep (more than 30 architectures) is ``python scripts/generation_sweep.py``. Here: a dense
decoder, a mixture of experts, a state-space model, an encoder-decoder, Whisper (its own generate())
and a vision-language model generating text, each in greedy, sampling, beam search, processors,
streamer, static cache, assisted decoding, prompt lookup, a padded batch of two and instrument_all():
the instrumented output is the plain one, and the counts are exact.
"""

from __future__ import annotations

import pytest
import _sweep

SAMPLE = ("llama", "qwen2_moe", "mamba", "t5", "whisper", "llava")
# Modes these architectures cannot run in transformers itself (it raises, plain and instrumented alike).
UNSUPPORTED = {("mamba", "assisted"), ("mamba", "prompt_lookup")}


def test_the_sweep_covers_every_kind_of_architecture_and_more_than_30() -> None:
    assert len(_sweep.ARCHS) >= 30
    assert {a.category for a in _sweep.ARCHS} == {"dense", "moe", "ssm/hybrid", "encoder-decoder", "speech",
                                                 "vision-language"}
    assert {_sweep.BY_NAME[n].category for n in SAMPLE} == {a.category for a in _sweep.ARCHS}


@pytest.mark.parametrize("name", SAMPLE)
def test_every_mode_keeps_the_output_and_counts_exactly(name: str) -> None:
    results = _sweep.sweep_arch(_sweep.BY_NAME[name])
    assert [r.mode for r in results] == list(_sweep.MODES), results
    failed = [f"{r.mode}: {r.detail}" for r in results if r.status == "FAILED"]
    assert failed == []
    unsupported = {(name, r.mode) for r in results if r.status == "unsupported"}
    assert unsupported == {u for u in UNSUPPORTED if u[0] == name}
