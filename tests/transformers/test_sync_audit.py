"""The sync audit on a real tiny Llama: what /metrics shows per component, which steps are audited,
where the first sync of each kind is reported. See docs/sync-audit.md."""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any

import pytest
from _hfkit import Scrape, prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations._transformers import generate as hf_generate
from gpuprobe.integrations.transformers import instrument
from gpuprobe.runtime import runtime

from helpers import cuda_present

SYNCS = "gpuprobe_step_syncs_total"


def counted(scrape: Scrape, name: str) -> list[Any]:
    """The samples of ``name`` that counted something (/metrics also shows prepared series at 0)."""
    return [x for x in scrape.find(name) if x.value]
SCALAR = "aten::_local_scalar_dense"
NONZERO = "aten::nonzero"


class TwoItemsOneNonzero:
    """A user logits processor that reads two scalars and runs one nonzero per call: 3 syncs a step.

    It also notes, per call, whether the dispatcher's PreDispatch key is on for the thread (an audited
    step: the audit's kernels live there) — read from torch, independent of gpuprobe's counts.
    """

    def __init__(self) -> None:
        self.audited: list[bool] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.audited.append(audit_key_on())
        scores[0, 0].item()
        scores[0, 1].item()
        (scores > 1e9).nonzero()
        return scores


def audit_key_on() -> bool:
    return bool(torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PreDispatch))


ITEM_LINE = inspect.getsourcelines(TwoItemsOneNonzero.__call__)[1] + 2  # the first .item()


def generate(model: Any, processor: Any, tokens: int = 6, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the first-seen reports (tested on their own)
        return model.generate(prompt(), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                              logits_processor=transformers.LogitsProcessorList([processor]), **kwargs)


def test_every_audited_step_shows_each_sync_of_the_processor_on_metrics(make_model, scrape):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=6)
    steps = len(proc.audited)
    assert steps == 6 and all(proc.audited)
    s = scrape()
    labels = dict(model="tiny", component="logits_processor", processor="TwoItemsOneNonzero")
    assert s.value(SYNCS, **labels, op=SCALAR) == 2 * steps
    assert s.value(SYNCS, **labels, op=NONZERO) == steps
    assert s.value(SYNCS, **labels) == 3 * steps
    assert s.label_values(SYNCS, "op") >= {SCALAR, NONZERO}
    # The exposition line a dashboard reads; the device label is cpu without CUDA, a CUDA one with it.
    line = re.search(f'^{SYNCS}{{component="logits_processor",gpuprobe_device="(cpu|cuda|cuda:[0-9]+)",'
                     f'gpuprobe_rank="0",model="tiny",op="aten::_local_scalar_dense",'
                     f'processor="TwoItemsOneNonzero"}} {2.0 * steps}$', s.text, re.MULTILINE)
    assert line is not None, s.text
    assert (line.group(1) == "cpu") is not cuda_present()


def test_n_2_audits_every_second_step_across_calls(make_model, scrape):
    gpuprobe.configure(sync_audit=2)
    model = instrument(make_model("llama"), model_name="tiny")
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=6)  # steps 0-5
    generate(model, proc, tokens=5)  # steps 6-10
    assert proc.audited == [i % 2 == 0 for i in range(11)]
    audited = sum(proc.audited)
    s = scrape()
    assert s.value(SYNCS, processor="TwoItemsOneNonzero", op=SCALAR) == 2 * audited
    assert s.value(SYNCS, processor="TwoItemsOneNonzero", op=NONZERO) == audited


def test_n_0_counts_nothing_and_enters_no_audit(make_model, scrape):
    model = instrument(make_model("llama"), model_name="tiny")
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=6)
    assert proc.audited == [False] * 6
    assert counted(scrape(), SYNCS) == []


def test_the_step_after_an_audited_step_runs_without_the_audit(make_model):
    gpuprobe.configure(sync_audit=3)
    model = instrument(make_model("llama"), model_name="tiny")
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=7)
    assert proc.audited == [True, False, False, True, False, False, True]
    assert not audit_key_on()


def test_syncs_are_attributed_to_forward_stopping_criteria_and_streamer(make_model, scrape):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")

    class ScalarCriterion(transformers.StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            input_ids[0, -1].item()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    class ScalarStreamer(transformers.generation.streamers.BaseStreamer):
        def put(self, value: Any) -> None:
            int(value.reshape(-1)[0])

        def end(self) -> None:
            pass

    def in_forward(module: Any, args: Any, output: Any) -> None:
        output[0].nonzero()

    handle = model.model.layers[0].register_forward_hook(in_forward)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = model.generate(prompt(), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                                 stopping_criteria=transformers.StoppingCriteriaList([ScalarCriterion()]),
                                 streamer=ScalarStreamer())
    finally:
        handle.remove()
    steps = out.shape[1] - prompt().shape[1]
    s = scrape()
    assert s.value(SYNCS, component="forward", op=NONZERO) == steps
    assert s.value(SYNCS, component="stopping_criteria", processor="ScalarCriterion", op=SCALAR) == steps
    # The streamer also gets the prompt before the first step: that put is outside every step.
    assert s.value(SYNCS, component="streamer", op=SCALAR) == steps
    assert {x.labels["component"] for x in counted(s, SYNCS)} <= {"forward", "stopping_criteria", "streamer", "other"}


def test_the_first_sync_of_each_kind_is_reported_once_with_its_source_line(make_model):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model.generate(prompt(), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                           logits_processor=transformers.LogitsProcessorList([TwoItemsOneNonzero()]))
    mine = [str(w.message) for w in caught if "TwoItemsOneNonzero" in str(w.message)]
    assert sorted(m.split(": ")[2].split(" ")[0] for m in mine) == [SCALAR, NONZERO]
    assert all(f"{__file__}:" in m for m in mine)
    assert any(f"{__file__}:{ITEM_LINE}" in m for m in mine if SCALAR in m)
    sites = [s for s in gpuprobe.info()["sync_sites"] if s.get("processor") == "TwoItemsOneNonzero"]
    assert [(s["op"], s["source"]) for s in sites][0] == (SCALAR, f"{__file__}:{ITEM_LINE}")


def test_no_audit_while_a_cuda_graph_capture_is_underway(make_model, scrape):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")
    proc = TwoItemsOneNonzero()
    guard = runtime().capture
    guard.underway += 1
    try:
        generate(model, proc, tokens=3)
    finally:
        guard.underway -= 1
    assert proc.audited == [False] * 3
    assert counted(scrape(), SYNCS) == []


def test_no_audit_of_a_call_whose_forward_transformers_compiles(make_model, monkeypatch):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")
    # transformers asks for a compiled forward (static cache on an accelerator) before the prefill;
    # here the "compiled" forward is the plain one, so no compiler runs on the CPU.
    monkeypatch.setattr(type(model), "_valid_auto_compile_criteria", lambda self, *a, **k: True)
    asked: list[bool] = []
    state = model.__dict__[hf_generate.STATE_KEY]
    monkeypatch.setitem(state.originals, "get_compiled_call", lambda *a, **k: asked.append(True) or model.__call__)
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=3)
    assert asked == [True]
    assert proc.audited == [False] * 3


def test_a_failing_audited_step_leaves_no_audit_and_keeps_its_counts(make_model, scrape):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")

    class FailsAtStep2(TwoItemsOneNonzero):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            scores = super().__call__(input_ids, scores)
            if len(self.audited) == 3:
                raise RuntimeError("boom")
            return scores

    with pytest.raises(RuntimeError, match="boom"):
        generate(model, FailsAtStep2(), tokens=6)
    assert not audit_key_on()
    assert scrape().value(SYNCS, processor="FailsAtStep2", op=NONZERO) == 3
    proc = TwoItemsOneNonzero()
    gpuprobe.configure(sync_audit=0)
    generate(model, proc, tokens=2)
    assert proc.audited == [False, False]


def test_audit_and_profile_window_together(make_model, tmp_path, scrape):
    gpuprobe.configure(sync_audit=1)
    model = instrument(make_model("llama"), model_name="tiny")
    window = gpuprobe.profile("1-2", output=str(tmp_path / "w.json"))
    proc = TwoItemsOneNonzero()
    generate(model, proc, tokens=4)
    assert window.state == "done" and all(proc.audited)
    assert scrape().value(SYNCS, processor="TwoItemsOneNonzero") == 3 * 4
