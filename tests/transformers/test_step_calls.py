"""The Python calls gpuprobe itself makes per decode step of an instrumented generate(), as a budget.

Counted with ``sys.setprofile`` (a count, not a timing: deterministic on any machine), only the calls
whose code is gpuprobe's (its files and the wrappers it generates), so transformers' own calls — which
change between its releases — are not counted. A decode step of greedy decoding passes: the stop check's
seam (its replacement and one hook, which turns the step: closing and opening it), the seam at the end of
the forward (replacement, hook, forward end), and one stand-in per stopping criterion (max length, EOS).
The memory and KV-cache gauges are read every 8 steps (6 calls on the CPU). ``benchmarks/step_calls.py``
compares the count with another revision's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _hfkit import prompt

import gpuprobe
from gpuprobe.integrations.transformers import instrument

GPUPROBE = str(Path(gpuprobe.__file__).parent)


def gpuprobe_calls(fn: Any) -> int:
    n = 0

    def profiler(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event == "call":
            f = frame.f_code.co_filename
            if f.startswith(GPUPROBE) or f.startswith("<gpuprobe"):
                n += 1

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def per_decode_step(model: Any, tokens: int) -> float:
    ids = prompt()

    def one(n: int) -> int:
        gpuprobe.collect()  # an empty buffer: no drain inside the counted call

        def run() -> None:
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None)
            assert out.shape[1] - ids.shape[1] == n

        return gpuprobe_calls(run)

    one(tokens)  # warm-up: caches filled, stand-in classes made
    return (one(2 * tokens) - one(tokens)) / tokens


@pytest.mark.no_cuda  # on a GPU the device clock's own calls (one event record per step) come on top
def test_a_greedy_decode_step_costs_at_most_ten_python_calls_of_gpuprobe(make_model) -> None:  # type: ignore[no-untyped-def]
    model = instrument(make_model("llama"), model_name="m", memory=False, kv_cache=False)
    # eos_token_id=None: the max-length criterion only (one stand-in). Per step: 2 seam replacements, the
    # stop check's hook, close_step, open_step, the forward end's hook and end_forward, 1 stand-in.
    calls = per_decode_step(model, 16)
    assert calls == 8
    assert calls <= 10  # the budget (benchmarks/step_calls.py: 15.75 before boundaries were shared)


@pytest.mark.no_cuda
def test_the_gauges_add_six_calls_every_eighth_step(make_model) -> None:  # type: ignore[no-untyped-def]
    model = instrument(make_model("llama"), model_name="m")
    # read_gauges, memory_children, process_reading (RSS and peak RSS: 2 more), cache_bytes: 6, every 8 steps.
    assert per_decode_step(model, 16) == 8 + 6 / 8
