"""The Python calls gpuprobe itself makes per decode step of an instrumented generate(), as a budget.

Counted by the pytest plugin's ``python_calls_per_step`` budget (``sys.setprofile``: a count, not a timing,
deterministic on any machine), step by step, under the component ``gpuprobe``: only the calls whose code is
gpuprobe's (its files and the wrappers it generates), so transformers' own calls — which change between its
releases — are not in the budget. A decode step of greedy decoding passes: the stop check's seam (its
replacement and one hook, which turns the step: closing and opening it), the seam at the end of the
forward (replacement, hook, forward end), and one stand-in per stopping criterion (max length, EOS). The
memory and KV-cache gauges are read every 8 steps (6 calls on the CPU). ``benchmarks/step_calls.py``
compares the count with another revision's.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hfkit import prompt

from gpuprobe.integrations.transformers import instrument

TOKENS = 16


def gpuprobe_calls_by_step(gpuprobe_budget: Any, model: Any, budget: int) -> list[int]:
    """gpuprobe's calls in each decode step of a greedy call of :data:`TOKENS` new tokens, held to ``budget``."""
    ids = prompt()
    model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)  # warm-up: caches, stand-in classes
    with gpuprobe_budget(python_calls_per_step={"gpuprobe": budget}) as block:
        out = model.generate(ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None)
    assert out.shape[1] - ids.shape[1] == TOKENS
    return [part.by.get("gpuprobe", 0) for part in block["python_calls_per_step"].parts]


@pytest.mark.no_cuda  # on a GPU the device clock's own calls (one event record per step) come on top
def test_a_greedy_decode_step_costs_at_most_ten_python_calls_of_gpuprobe(make_model, gpuprobe_budget) -> None:  # type: ignore[no-untyped-def]
    model = instrument(make_model("llama"), model_name="m", memory=False, kv_cache=False)
    # eos_token_id=None: the max-length criterion only (one stand-in). Per step: 2 seam replacements, the
    # stop check's hook, close_step, open_step, the forward end's hook and end_forward, 1 stand-in.
    # The budget: 10 (benchmarks/step_calls.py: 15.75 before boundaries were shared); every decode step
    # between the call's first (the prefill) and its last makes the same 8.
    assert gpuprobe_calls_by_step(gpuprobe_budget, model, 10) == [8] * (TOKENS - 2)


@pytest.mark.no_cuda
def test_the_gauges_add_six_calls_every_eighth_step(make_model, gpuprobe_budget) -> None:  # type: ignore[no-untyped-def]
    model = instrument(make_model("llama"), model_name="m")
    # read_gauges, memory_children, process_reading (RSS and peak RSS: 2 more), cache_bytes: 6, on step 8.
    calls = gpuprobe_calls_by_step(gpuprobe_budget, model, 8 + 6)
    assert calls == [8 + 6 if step % 8 == 0 else 8 for step in range(1, TOKENS - 1)]
