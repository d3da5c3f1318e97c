"""The user's own code under instrumentation runs as written: a model class's own generate() (as Whisper,
MusicGen and Bark have) runs once per call with the caller's arguments, and a logits-processor list
subclass's own __call__ still runs."""

from __future__ import annotations

from typing import Any

import pytest

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.testing import reset

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class WhisperLikeLM(transformers.LlamaForCausalLM):
    """A model whose own generate() takes arguments of its own, translates them, and calls
    super().generate() — the shape of Whisper's generate (input_features, task, language, ...)."""

    calls: list[dict[str, Any]] = []

    def generate(self, input_features: Any = None, task: str | None = None, prompt_ids: Any = None,
                 **kwargs: Any) -> Any:
        WhisperLikeLM.calls.append({"input_features": input_features.tolist(), "task": task, "kwargs": sorted(kwargs)})
        ids = input_features if prompt_ids is None else torch.cat([prompt_ids, input_features], dim=-1)
        if task == "translate":
            kwargs.setdefault("repetition_penalty", 1.5)
        return super().generate(ids, **kwargs)


def _model(cls: type = transformers.LlamaForCausalLM) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      pad_token_id=0, eos_token_id=1)
    return cls(config).eval()


def _request_count() -> int:
    return sum(p.count for d in gpuprobe.collect() if d.spec.name == "gen_ai.server.request.duration"
               for p in d.points)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    reset()
    WhisperLikeLM.calls = []
    yield
    hf.uninstrument_all()
    reset()


def _calls(model: Any, n: int) -> list[Any]:
    ids = torch.tensor([[5, 6, 7, 8]])
    prompt = torch.tensor([[9, 10]])
    return [model.generate(ids, task="translate", prompt_ids=prompt, max_new_tokens=4, do_sample=False).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("how", ["instrument_class", "instrument_all", "instrument"])
def test_a_models_own_generate_runs_once_per_call_with_the_callers_arguments(how: str) -> None:
    expected = _calls(_model(WhisperLikeLM), 3)
    plain_calls = list(WhisperLikeLM.calls)
    assert len(plain_calls) == 3
    WhisperLikeLM.calls = []

    model = _model(WhisperLikeLM)
    if how == "instrument_class":
        hf.instrument_class(WhisperLikeLM)
    elif how == "instrument_all":
        hf.instrument_all()
    else:
        hf.instrument(model)
    try:
        assert _calls(model, 3) == expected  # tokens identical
        assert WhisperLikeLM.calls == plain_calls  # its body ran once per call, with the caller's arguments
        assert _request_count() == 3  # each call measured once
        assert hf.is_instrumented(model)
    finally:
        hf.uninstrument(model)


def test_a_logits_processor_list_subclass_keeps_its_own_call() -> None:
    """A list class with its own __call__ (here: it counts its calls and caps the scores) runs as written,
    and the processors inside it are still timed by class."""

    class CappedList(transformers.LogitsProcessorList):
        calls = 0

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            CappedList.calls += 1
            return super().__call__(input_ids, scores, **kwargs).clamp(max=0.5)

    class CappedLM(transformers.LlamaForCausalLM):
        def _get_logits_processor(self, *args: Any, **kwargs: Any) -> Any:
            return CappedList(super()._get_logits_processor(*args, **kwargs))

    ids = torch.tensor([[5, 6, 7, 8]])
    expected = _model(CappedLM).generate(ids, max_new_tokens=5, do_sample=False, repetition_penalty=1.2).tolist()
    plain_calls, CappedList.calls = CappedList.calls, 0
    assert plain_calls == 5

    model = hf.instrument(_model(CappedLM))
    try:
        assert model.generate(ids, max_new_tokens=5, do_sample=False, repetition_penalty=1.2).tolist() == expected
    finally:
        hf.uninstrument(model)
    assert CappedList.calls == plain_calls
    timed = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.component.duration" for p in d.points
             if p.labels.get("processor") == "RepetitionPenaltyLogitsProcessor"]
    assert sum(p.count for p in timed) == 5


def test_processors_are_back_in_the_list_after_the_call() -> None:
    """The list a model's own _get_logits_processor returns may be the user's: its elements are the
    user's objects again once generate() returns."""
    mine = transformers.LogitsProcessorList([transformers.TemperatureLogitsWarper(0.7)])
    element = mine[0]

    class OwnListLM(transformers.LlamaForCausalLM):
        def _get_logits_processor(self, *args: Any, **kwargs: Any) -> Any:
            return mine

    model = hf.instrument(_model(OwnListLM))
    try:
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    finally:
        hf.uninstrument(model)
    assert len(mine) == 1 and mine[0] is element
    timed = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.component.duration" for p in d.points
             if p.labels.get("processor") == "TemperatureLogitsWarper"]
    assert sum(p.count for p in timed) == 3
