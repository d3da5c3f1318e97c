"""The generation methods' seams fail open in their shape too: a keyword the original gains is forwarded,
replacements keep the original's signature and go away cleanly, a method whose shape changed is refused
and the rest still measures (the fault-injection table over every seam is tests/test_fail_open.py)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import transformers

import gpuprobe
from gpuprobe import _seams
from gpuprobe.integrations import transformers as hf
from gpuprobe.integrations._transformers import generate as hf_generate
from gpuprobe.testing import reset

from _hfkit import build
from helpers import cpu_continuous_batching_cannot_pin


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    reset()
    yield
    reset()


def _tiny_llama() -> Any:
    torch.manual_seed(0)
    return build("llama").eval()


def _with_new_keyword(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` with one more keyword-only parameter, ``new_keyword``, before any ``**kwargs``."""
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    rest = [p for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
    new = inspect.Parameter("new_keyword", inspect.Parameter.KEYWORD_ONLY, default="absent")
    return sig.replace(parameters=[*params, new, *rest])


@pytest.mark.parametrize("scenario", ["generate", "generate_batch"])
def test_a_seam_whose_original_gains_a_keyword_forwards_it(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As transformers 5.24 did with _run_generation_loop(use_inference_mode=...): each method seam of a
    model passes a keyword it has never heard of to the original, which gets it, once."""
    model = _tiny_llama()
    calls: list[tuple[str, Any]] = []
    for ms in hf_generate.METHOD_SEAMS:
        original = _seams.unwrapped(type(model), ms.attribute)

        def changed(self: Any, *args: Any, _name: str = ms.attribute, _orig: Any = original,
                    new_keyword: Any = "absent", **kwargs: Any) -> Any:
            calls.append((_name, new_keyword))
            if new_keyword != "absent":
                return "the original's result"
            return _orig(self, *args, **kwargs)

        changed.__signature__ = _with_new_keyword(inspect.signature(original))  # type: ignore[attr-defined]
        monkeypatch.setattr(type(model), ms.attribute, changed)
    hf.instrument(model)
    try:
        for ms in hf_generate.METHOD_SEAMS:
            calls.clear()
            assert getattr(model, ms.attribute)(new_keyword=1) == "the original's result"
            assert calls == [(ms.attribute, 1)]
        # and the workload still runs through the changed methods, measured
        if scenario == "generate":
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
        else:
            reason = cpu_continuous_batching_cannot_pin()
            if reason:
                pytest.skip(reason)
            gen = transformers.GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
            out = model.generate_batch([[5, 6, 7]], generation_config=gen)
            assert [len(o.generated_tokens) for o in out.values()] == [3]
        assert all(s["state"] == "on" for s in gpuprobe.info()["seams"] if s["seam"].startswith("transformers."))
    finally:
        hf.uninstrument(model)
    assert all(ms.attribute not in model.__dict__ for ms in hf_generate.METHOD_SEAMS)


def test_replacements_keep_the_originals_signature_and_uninstall_cleanly() -> None:
    model = _tiny_llama()
    before = {ms.attribute: model.__dict__.get(ms.attribute) for ms in hf_generate.METHOD_SEAMS}
    installs = {ms.attribute: ms.seam.installs for ms in hf_generate.METHOD_SEAMS}  # other models' too
    hf.instrument(model)
    hf.instrument(model)  # installs once
    try:
        for ms in hf_generate.METHOD_SEAMS:
            seamed = getattr(model, ms.attribute)
            assert _seams.is_replacement(seamed)
            original = _seams.unwrapped(type(model), ms.attribute).__get__(model)
            assert inspect.signature(seamed) == inspect.signature(original), ms.attribute
            assert ms.seam.installs == installs[ms.attribute] + 1
    finally:
        hf.uninstrument(model)
    assert {ms.attribute: model.__dict__.get(ms.attribute) for ms in hf_generate.METHOD_SEAMS} == before
    assert {ms.attribute: ms.seam.installs for ms in hf_generate.METHOD_SEAMS} == installs


def test_a_missing_method_is_refused_and_the_rest_still_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape check: a loop method with another signature leaves the loop's seams out (info() says
    why); generate() is still measured per call, and its tokens are those of the plain model."""
    model = _tiny_llama()
    ids = torch.tensor([[5, 6, 7]])
    expected = model.generate(ids, max_new_tokens=3, do_sample=False).tolist()

    original = type(model)._prefill

    def renamed(self: Any, token_ids: Any, generation_config: Any, model_kwargs: Any, *args: Any, **kw: Any) -> Any:
        return original(self, token_ids, generation_config, model_kwargs, *args, **kw)

    monkeypatch.setattr(type(model), "_prefill", renamed)
    with pytest.warns(RuntimeWarning, match=r"seam transformers\.generate\.prefill .* is not installed: .*input_ids"):
        hf.instrument(model)
    try:
        assert model.generate(ids, max_new_tokens=3, do_sample=False).tolist() == expected
    finally:
        hf.uninstrument(model)
    states = {s["seam"]: s for s in gpuprobe.info()["seams"]}
    assert states["transformers.generate.prefill"]["state"] == "refused"
    assert "input_ids" in states["transformers.generate.prefill"]["why"]
    assert states["transformers.generate.stop_check"]["state"] == "refused"
    durations = [p for d in gpuprobe.collect() if d.spec.name == "gen_ai.server.request.duration" for p in d.points]
    assert sum(p.count for p in durations) == 1
    steps = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.duration" for p in d.points]
    assert sum(p.count for p in steps) == 0
