"""Inside a profile window, or the program's own torch.profiler, each component of a generation step
is a range of the kineto trace.

A real tiny Llama generates inside ``gpuprobe.profile(...)`` or ``torch.profiler.profile()``; the trace
file is read back with plain ``json`` (not with gpuprobe's report) and the ranges are checked against
the operators they hold.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations._transformers.generate import marks as hf_marks, steps as hf_steps
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


def own_profile(model: Any, tmp_path: Path, **kwargs: Any) -> tuple[Any, list[dict[str, Any]]]:
    """generate() inside the program's own CPU profiler; its output and the trace it exported itself."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = generate(model, **kwargs)
    prof.export_chrome_trace(str(tmp_path / "mine.json"))
    return out, events(tmp_path / "mine.json")


def test_your_own_profiler_gets_a_range_per_step_holding_its_components(make_model, tmp_path):
    model = instrument(make_model("llama"), model_name="m")
    out, evs = own_profile(model, tmp_path)
    found = ranges(evs)
    steps = sorted((r for r in found if r["name"].startswith("gpuprobe.step#")), key=lambda r: r["ts"])
    new_tokens = out.shape[1] - prompt().shape[1]  # a prefill, then one decode step per further token
    assert [s["name"] for s in steps] == [f"gpuprobe.step#{i}" for i in range(new_tokens)]
    expected = sorted(["forward", "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", BUILT_IN,
                       "BanTokens", *CRITERIA])
    for step in steps[1:]:  # step 0 (the prefill) has no streamer: transformers puts the prompt before it
        children = [r for r in found if r is not step and inside(r, step)]
        assert sorted(r["name"] for r in children if r["name"] != "streamer") == expected, step["name"]
        assert [r["name"] for r in children].count("streamer") == 1
    # every index_fill (the user's processor only) lies in a BanTokens range inside a step
    fills = [e for e in evs if e.get("cat") == "cpu_op" and e["name"] == "aten::index_fill"]
    user = [r for r in found if r["name"] == "BanTokens"]
    assert len(fills) == len(user) == new_tokens
    assert all(any(inside(op, r) for r in user) for op in fills)


def test_a_window_inside_your_own_profiler_starts_no_second_session(make_model, tmp_path):
    """kineto holds one session per process: the window stands aside (it would end the program's
    session, whose export then crashes) and the program's trace holds each range once."""
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-3", output=str(tmp_path / "window.json"))
    with pytest.warns(RuntimeWarning, match="already records"):
        out, evs = own_profile(model, tmp_path)
    assert window.state == "failed" and "already records" in (window.error or "")
    assert not (tmp_path / "window.json").exists()
    names = [r["name"] for r in ranges(evs)]
    new_tokens = out.shape[1] - prompt().shape[1]
    assert sorted(n for n in names if n.startswith("gpuprobe.step#")) == sorted(
        f"gpuprobe.step#{i}" for i in range(new_tokens))
    assert names.count("forward") == names.count("BanTokens") == new_tokens


def test_a_window_records_each_range_once(make_model, tmp_path):
    """A window's profiler is a profiler too: its steps get the window's step range, not a second one."""
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-3", output=str(tmp_path / "steps.json"))
    generate(model)
    names = [r["name"] for r in ranges(events(window.path))]
    assert sorted(n for n in names if n.startswith("gpuprobe.step#")) == [f"gpuprobe.step#{i}" for i in (1, 2, 3)]
    assert names.count("forward") == names.count("BanTokens") == 3


def test_without_a_profiler_no_range_is_entered(make_model, monkeypatch):
    model = instrument(make_model("llama"), model_name="m")
    generate(model)  # binds what the ranges need, if anything would
    entered: list[str] = []
    monkeypatch.setattr(hf_marks, "_enter", lambda name, args: entered.append(name))
    generate(model)
    assert entered == []
    # the check each step makes is torch's own C function: no Python frame on the step
    assert hf_steps.profiling is torch._C._autograd._profiler_enabled


def test_the_kernel_samplers_sessions_get_no_ranges(make_model, monkeypatch):
    """The sampler's short sessions are read for kernels (CPU operators here) only: no ranges go into
    them; your own profiler's steps, which the sampler then leaves alone, get them."""
    from torch.profiler import ProfilerActivity, profile

    from gpuprobe.profiling import KernelSampler

    model = instrument(make_model("llama"), model_name="m")
    generate(model)
    sampler = KernelSampler(1).attach()
    try:
        entered: list[str] = []
        hf_marks._bind_ranges()  # else bound at the first marked step, after the stand-in below
        real = hf_marks._enter
        monkeypatch.setattr(hf_marks, "_enter", lambda name, args: entered.append(name) or real(name, args))
        generate(model)
        # It sampled steps (each after the first, less those whose predecessor was still being read:
        # on a loaded machine some are skipped, counted as kernel_sampling_busy).
        assert sampler.wait(30) and sampler.samples >= 1
        assert entered == []
        with profile(activities=[ProfilerActivity.CPU]):
            generate(model)
        assert entered.count("forward") == 6
        assert sum(n.startswith("gpuprobe.step#") for n in entered) == 6
    finally:
        sampler.detach()


def test_steps_after_the_window_get_no_ranges(make_model, tmp_path, monkeypatch):
    model = instrument(make_model("llama"), model_name="m")
    window = gpuprobe.profile("1-2", output=str(tmp_path / "steps.json"))
    generate(model)
    assert window.state == "done"
    entered: list[str] = []
    monkeypatch.setattr(hf_marks, "_enter", lambda name, args: entered.append(name))
    generate(model)  # steps 6-11: after the window
    assert entered == []
