"""NVTX ranges of an instrumented generate(), recorded for real by an NVTX injection library.

One subprocess runs every scenario (interpreter start-up with torch and transformers is the slow
part); each test checks one property of what it recorded.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

nvtx_capture = pytest.importorskip("gpuprobe.testing.nvtx_capture")

SCRIPT = """
import json, threading, torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from gpuprobe.integrations.transformers import instrument

class Quiet(BaseStreamer):
    def put(self, value): pass
    def end(self): pass

class NeverStop(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

class Boom:
    def __init__(self): self.calls = 0
    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom")
        return scores

def tiny(name, **kw):
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=128, pad_token_id=0, eos_token_id=None)).eval()
    return instrument(m, model_name=name, **kw)

ids = torch.randint(3, 128, (1, 5))
report = {}
ok = tiny("ok", layers=True, layer_every=2)
out = ok.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=True, top_k=10, temperature=0.8, streamer=Quiet(),
                  stopping_criteria=StoppingCriteriaList([NeverStop()]))
report["ok_steps"] = out.shape[1] - ids.shape[1]

bad = tiny("badargs")
try:
    bad.generate(ids, max_new_tokens=3, not_an_argument=1)
except ValueError:
    report["badargs_raised"] = True

boom = tiny("boom", layers=True, layer_every=1)
try:
    boom.generate(ids, max_new_tokens=6, min_new_tokens=6, logits_processor=LogitsProcessorList([Boom()]))
except RuntimeError:
    report["boom_raised"] = True

spec = tiny("spec")
draft = tiny("draft")  # the same weights: its drafts are accepted; instrumented, yet measured inside spec's steps
out = spec.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, assistant_model=draft)
report["spec_tokens"] = out.shape[1] - ids.shape[1]
lookup = tiny("lookup")
out = lookup.generate(torch.cat([ids, ids], dim=1), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                      prompt_lookup_num_tokens=2)

shared = tiny("threads")
def work():
    shared.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=True)
threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print("REPORT" + json.dumps(report))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    pytest.importorskip("nvtx")
    if shutil.which(os.environ.get("CC") or "gcc") is None:
        pytest.skip("no C compiler (gcc) to build the NVTX injection library")
    lib = nvtx_capture.build_injection_library(tmp_path_factory.mktemp("nvtx-inject"))
    cap = nvtx_capture.run_captured(SCRIPT, library=lib, timeout=300, cwd=str(Path(__file__).resolve().parents[2]))
    line = next(x for x in cap.stdout.splitlines() if x.startswith("REPORT"))
    return cap, json.loads(line[len("REPORT"):])


def calls(cap: Any, model: str) -> list[Any]:
    return [r for r in cap.ranges("gpuprobe") if r.depth == 0 and r.message == f"generate {model}"]


def children(cap: Any, parent: Any) -> list[Any]:
    return [r for r in cap.ranges("gpuprobe") if r.parent == parent.index]


def test_ranges_are_balanced_in_every_thread(captured):
    cap, _ = captured
    assert cap.attached
    assert cap.is_balanced("gpuprobe"), cap.problems("gpuprobe")
    assert all(r.closed for r in cap.ranges("gpuprobe"))


def test_generate_contains_one_step_per_token_with_the_step_index_as_payload(captured):
    cap, report = captured
    (call,) = calls(cap, "ok")
    assert call.category_name == "generate"
    steps = children(cap, call)
    assert [s.message for s in steps] == ["prefill"] + ["decode"] * (report["ok_steps"] - 1)
    assert [s.payload for s in steps] == list(range(report["ok_steps"]))
    assert {s.category_name for s in steps} == {"step"}


def test_each_step_contains_its_components_with_the_same_payload(captured):
    cap, _ = captured
    (call,) = calls(cap, "ok")
    for step in children(cap, call):
        parts = children(cap, step)
        assert [p.message for p in parts] == ["forward", "TemperatureLogitsWarper", "TopKLogitsWarper",
                                              "stopping_criteria", "stopping_criteria", "streamer"]
        assert {p.payload for p in parts} == {step.payload}
        assert [p.category_name for p in parts] == ["component", "logits_processor", "logits_processor",
                                                    "component", "component", "component"]
        # One stopping_criteria range per criterion, each holding a range of the criterion's class.
        criteria = [children(cap, p) for p in parts if p.message == "stopping_criteria"]
        assert [[c.message for c in inside] for inside in criteria] == [["MaxLengthCriteria"], ["NeverStop"]]
        assert {c.category_name for inside in criteria for c in inside} == {"stopping_criterion"}
        assert {c.payload for inside in criteria for c in inside} == {step.payload}


def test_layers_nest_in_the_forward_of_sampled_steps(captured):
    cap, _ = captured
    (call,) = calls(cap, "ok")
    with_layers = []
    for step in children(cap, call):
        forward = children(cap, step)[0]
        layers = children(cap, forward)
        if layers:
            with_layers.append(step.payload)
            assert [r.message for r in layers] == ["LlamaDecoderLayer 0", "LlamaDecoderLayer 1"]
            assert {r.category_name for r in layers} == {"layer"}
    assert with_layers == [2, 4]  # every second decode step


def test_bad_arguments_leave_only_a_closed_generate_range(captured):
    cap, report = captured
    assert report["badargs_raised"]
    (call,) = calls(cap, "badargs")
    assert call.closed and children(cap, call) == []


def test_an_exception_in_a_step_closes_every_range_it_opened(captured):
    cap, report = captured
    assert report["boom_raised"]
    (call,) = calls(cap, "boom")
    steps = children(cap, call)
    assert [s.payload for s in steps] == [0, 1, 2]  # the processor raised in step 2
    assert all(r.closed for s in steps for r in [s, *children(cap, s)])


def test_concurrent_calls_nest_per_thread(captured):
    cap, _ = captured
    threaded = calls(cap, "threads")
    assert len(threaded) == 2 and threaded[0].thread != threaded[1].thread
    for call in threaded:
        steps = children(cap, call)
        assert [s.payload for s in steps] == [0, 1, 2]
        assert all(s.thread == call.thread for s in steps)


def test_a_speculative_step_shows_its_draft_forward_and_verification(captured):
    cap, report = captured
    (call,) = calls(cap, "spec")
    assert calls(cap, "draft") == []  # the draft model's generate() runs inside the steps, unmeasured
    steps = children(cap, call)
    assert 1 <= len(steps) <= report["spec_tokens"]
    assert [s.message for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    for step in steps:
        parts = [p.message for p in children(cap, step)]
        assert parts[:3] == ["draft", "forward", "verify"], parts
        assert parts[-1] == "stopping_criteria"
        assert {p.payload for p in children(cap, step)} == {step.payload}


def test_prompt_lookup_steps_show_their_draft_too(captured):
    cap, _ = captured
    (call,) = calls(cap, "lookup")
    for step in children(cap, call):
        assert [p.message for p in children(cap, step)][:3] == ["draft", "forward", "verify"]
