"""Inside a profile window, each component of a generation step is a range of the kineto trace.

A real tiny Llama generates inside ``gpuprobe.profile(...)``; the trace file is read back with plain
``json`` (not with gpuprobe's report) and the ranges are checked against the operators they hold.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations import _hf_marks
from gpuprobe.integrations.transformers import instrument

BUILT_IN = "RepetitionPenaltyLogitsProcessor"
CRITERIA = ("stopping_criteria/MaxLengthCriteria", "stopping_criteria/EosTokenCriteria")


class BanTokens:
    """A user logits processor whose one operator (``aten::index_fill``) nothing else in a step runs."""

    def __init__(self) -> None:
        self.ids = torch.tensor([7, 8])

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores.index_fill(1, self.ids, float("-inf"))


class Quiet(transformers.generation.streamers.BaseStreamer):
    """A streamer that keeps nothing."""

    def put(self, value: Any) -> None:
        pass

    def end(self) -> None:
        pass


def events(path: str | Path) -> list[dict[str, Any]]:
    """The complete ("X") events of a kineto trace, times as exact Decimals (microseconds)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        trace = json.load(f, parse_float=Decimal)
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            e["ts"], e["dur"] = Decimal(e["ts"]), Decimal(e["dur"])
            out.append(e)
    return out


def ranges(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("cat") == "user_annotation"]


def inside(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return (inner["tid"] == outer["tid"] and inner["ts"] >= outer["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])


def generate(model: Any, **kwargs: Any) -> Any:
    processors = transformers.LogitsProcessorList([transformers.RepetitionPenaltyLogitsProcessor(1.3), BanTokens()])
    return model.generate(prompt(), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                          logits_processor=processors, streamer=Quiet(), **kwargs)


def test_each_step_of_a_window_holds_one_range_per_component(make_model, tmp_path):
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-3", output=str(tmp_path / "steps.json"))
    generate(model)
    assert window.path is not None
    found = ranges(events(window.path))
    steps = [r for r in found if r["name"].startswith("gpuprobe.step#")]
    assert [s["name"] for s in steps] == ["gpuprobe.step#1", "gpuprobe.step#2", "gpuprobe.step#3"]
    # transformers adds two length processors (min_new_tokens) in front of the user's list.
    expected = sorted(["forward", "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", BUILT_IN,
                       "BanTokens", *CRITERIA, "streamer"])
    for step in steps:
        children = [r for r in found if r is not step and inside(r, step)]
        assert sorted(r["name"] for r in children) == expected, step["name"]
    components = [r for r in found if not r["name"].startswith("gpuprobe.step#")]
    # Every component range lies in a step range: none straddles a step boundary.
    assert all(any(inside(r, s) for s in steps) for r in components)


def test_the_operators_of_a_processor_lie_inside_its_range(make_model, tmp_path):
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-3", output=str(tmp_path / "steps.json"))
    generate(model)
    evs = events(window.path)
    found = ranges(evs)
    ops = [e for e in evs if e.get("cat") == "cpu_op"]

    def ops_named(name: str) -> list[dict[str, Any]]:
        picked = [e for e in ops if e["name"] == name]
        assert picked, name
        return picked

    user = [r for r in found if r["name"] == "BanTokens"]
    built_in = [r for r in found if r["name"] == BUILT_IN]
    forward = [r for r in found if r["name"] == "forward"]
    assert len(user) == len(built_in) == len(forward) == 3
    # aten::index_fill runs only in the user's processor, aten::gather only in the repetition penalty,
    # aten::embedding only in the forward: each inside its own range, once per step.
    for op_name, own in (("aten::index_fill", user), ("aten::gather", built_in), ("aten::embedding", forward)):
        hits = ops_named(op_name)
        assert len(hits) == 3, op_name
        assert all(sum(inside(op, r) for r in own) == 1 for op in hits), op_name
    # ... and a processor's range holds no operator of the forward.
    assert not any(inside(op, r) for op in ops_named("aten::embedding") for r in user + built_in)


def test_the_prefill_step_has_a_forward_range_too(make_model, tmp_path):
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("0-0", output=str(tmp_path / "prefill.json.gz"))
    generate(model)
    found = ranges(events(window.path))
    step = [r for r in found if r["name"] == "gpuprobe.step#0"]
    assert len(step) == 1
    assert [r["name"] for r in found if r["name"] == "forward" and inside(r, step[0])] == ["forward"]


def test_a_profiler_of_your_own_sees_no_component_ranges(make_model):
    model = instrument(make_model("llama"), model_name="m")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model)
    names = {e.name for e in prof.events()}
    assert "aten::index_fill" in names  # the profile did record the generation
    assert not names & {"forward", "BanTokens", BUILT_IN, "streamer", *CRITERIA}


def test_without_a_window_no_range_is_entered(make_model, monkeypatch):
    model = instrument(make_model("llama"), model_name="m")
    generate(model)  # binds what the ranges need, if anything would
    entered: list[str] = []
    monkeypatch.setattr(_hf_marks, "_enter", lambda name, args: entered.append(name))
    generate(model)
    assert entered == []


def test_steps_after_the_window_get_no_ranges(make_model, tmp_path, monkeypatch):
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-2", output=str(tmp_path / "steps.json"))
    generate(model)
    assert window.state == "done"
    entered: list[str] = []
    monkeypatch.setattr(_hf_marks, "_enter", lambda name, args: entered.append(name))
    generate(model)  # steps 6-11: after the window
    assert entered == []
