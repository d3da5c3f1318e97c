"""generate() raising inside: the error is counted with its type and nothing stays open."""

from __future__ import annotations

import pytest
from _hfkit import prompt, transformers

import gpuprobe
from gpuprobe.integrations._transformers import generate as hf_generate
from gpuprobe.integrations.transformers import instrument

REQUEST = "gen_ai.server.request.duration"


class Boom(RuntimeError):
    pass


class ExplodeAtStep:
    """A user logits processor that raises on its ``n``-th call."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.n:
            raise Boom("processor failed")
        return scores


def requests_by_error() -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for md in gpuprobe.collect():
        if md.spec.name == REQUEST:
            for p in md.points:
                key = p.labels.get("error.type")
                out[key] = out.get(key, 0) + p.count
    return out


def metric_value(name: str) -> float:
    return sum(p.value for md in gpuprobe.collect() if md.spec.name == name for p in md.points)


def metric_count(name: str) -> int:
    return sum(p.count for md in gpuprobe.collect() if md.spec.name == name for p in md.points)


def test_bad_arguments_count_the_error_type(make_model):
    model = instrument(make_model("llama"), model_name="m")
    with pytest.raises(ValueError):
        model.generate(prompt(), max_new_tokens=2, not_an_argument=1)
    assert requests_by_error() == {"ValueError": 1}
    assert metric_count("gen_ai.server.time_to_first_token") == 0
    assert metric_value("gpuprobe.generate.active") == 0


def test_exception_in_a_user_logits_processor_propagates_unchanged(make_model):
    model = instrument(make_model("llama"), model_name="m", layers=True, layer_every=1)
    bad = ExplodeAtStep(3)
    with pytest.raises(Boom, match="processor failed"):
        model.generate(prompt(), max_new_tokens=6, logits_processor=transformers.LogitsProcessorList([bad]))
    assert requests_by_error() == {"Boom": 1}
    assert metric_value("gpuprobe.generate.active") == 0
    state = model.__dict__[hf_generate.STATE_KEY]
    assert state.current() is None  # the call's context is gone
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_steps_completed_before_a_failure_are_kept_and_the_failed_one_is_not(make_model):
    model = instrument(make_model("llama"), model_name="m")
    with pytest.raises(Boom):
        model.generate(prompt(), max_new_tokens=6, min_new_tokens=6,
                       logits_processor=transformers.LogitsProcessorList([ExplodeAtStep(3)]))
    # Steps 0 and 1 finished; step 2 raised in its logits processor.
    assert metric_count("gpuprobe.step.duration") == 2
    assert metric_count("gpuprobe.inter_token.duration") == 1
    assert metric_count("gen_ai.server.time_to_first_token") == 1
    assert metric_count("gen_ai.server.time_per_output_token") == 0  # per successful request only


def test_a_model_that_failed_generates_and_counts_normally_afterwards(make_model):
    model = instrument(make_model("llama"), model_name="m")
    with pytest.raises(Boom):
        model.generate(prompt(), max_new_tokens=4, logits_processor=transformers.LogitsProcessorList([ExplodeAtStep(1)]))
    model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
    assert requests_by_error() == {"Boom": 1, None: 1}
    assert metric_count("gpuprobe.inter_token.duration") == 3
    assert metric_count("gen_ai.server.time_per_output_token") == 1
