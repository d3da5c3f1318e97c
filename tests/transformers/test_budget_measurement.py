"""A budgeted block measured in this process (``gpuprobe.testing.budget.Measurement``, what the
``gpuprobe_budget`` fixture runs) on a tiny real Llama: what it gives back when it ends, however it ends,
and counts that do not depend on what else the block counts."""

from __future__ import annotations

import sys

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.integrations._transformers.cache import ConcatCounter
from gpuprobe.runtime import runtime
from gpuprobe.testing.budget import COUNTS, BudgetError, Measurement


def generate(model, tokens: int = 8, **kwargs):  # type: ignore[no-untyped-def]
    return model.generate(prompt(), max_new_tokens=tokens, do_sample=False, eos_token_id=None, **kwargs)


def state() -> dict:
    rt = runtime()
    dynamo = torch._dynamo.callback.callback_handler
    return {"profile": sys.getprofile(), "hooks": rt.steps.hooks, "done": rt.steps._done_hooks,
            "sync_audit": rt.settings.sync_audit, "sites": rt.sync_sites, "sinks": list(rt.registry.sinks),
            "update": transformers.cache_utils.DynamicLayer.__dict__["update"],
            "compile_callbacks": list(dynamo.start_callbacks), "class_patches": dict(hf._class_patches)}


@pytest.mark.no_cuda
def test_a_block_gives_everything_back_when_its_code_raises(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    before = state()
    with pytest.raises(ZeroDivisionError):
        with Measurement(list(COUNTS)):
            generate(model, 4)
            1 / 0
    assert state() == before
    assert not hf.is_instrumented(model)
    generate(model, 4)  # and the model generates as before, unmeasured
    with Measurement(["dynamic_cache_concats"]) as m:  # a next block starts clean
        generate(model, 4)
    assert m.results["dynamic_cache_concats"].value() == 2 * 4


def test_blocks_do_not_nest() -> None:
    with Measurement(["recompiles"]):
        with pytest.raises(BudgetError, match="a budget block inside another"):
            Measurement(["recompiles"]).__enter__()


def test_a_model_instrumented_by_its_owner_keeps_its_instrumentation(make_model) -> None:  # type: ignore[no-untyped-def]
    model = hf.instrument(make_model("llama"), model_name="mine", memory=False)
    with Measurement(["host_syncs_per_step"]) as m:
        generate(model)
    assert hf.is_instrumented(model) and m.results["host_syncs_per_step"].expected.components() == {"other": 1}
    steps = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.duration" for p in d.points]
    assert {p.labels["model"] for p in steps} == {"mine"}


@pytest.mark.no_cuda
def test_launches_do_not_change_when_the_same_block_audits_its_syncs(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    generate(model, 3)
    counted = []
    for counts in (["launches_per_step"], ["launches_per_step", "host_syncs", "host_syncs_per_step"]):
        with Measurement(counts) as m:
            generate(model)
        launches = m.results["launches_per_step"]
        counted.append(([p.total for p in launches.parts], launches.components()))
    assert counted[0] == counted[1]
    assert len(counted[0][0]) == 8 - 2 and len(set(counted[0][0])) == 1  # every decode step the same


def test_a_sync_outside_the_steps_is_counted_in_the_block_with_its_line(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    with Measurement(["host_syncs"]) as m:
        generate(model, 4)
        torch.arange(10)[torch.arange(10) > 4].tolist()  # x[mask]: a nonzero, outside any step
    syncs = m.results["host_syncs"]
    assert syncs.expected.value("other") == 4  # the stop check, once per step: transformers' own, left out
    assert syncs.value("outside_steps") == 1  # the mask, and only it (transformers' own before its steps are left out)
    assert "aten::index" in syncs.details["outside_steps"]
    assert "test_budget_measurement.py:" in syncs.details["outside_steps"]


def test_the_cache_seam_is_in_place_only_while_a_counter_is_entered(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    original = transformers.cache_utils.DynamicLayer.__dict__["update"]
    with ConcatCounter() as outer:
        assert transformers.cache_utils.DynamicLayer.__dict__["update"] is not original
        with ConcatCounter() as inner:
            generate(model, 5)
        assert transformers.cache_utils.DynamicLayer.__dict__["update"] is not original  # the outer one still counts
        generate(model, 5, cache_implementation="static")
    assert transformers.cache_utils.DynamicLayer.__dict__["update"] is original
    layers = model.config.num_hidden_layers
    assert inner.counts == {"DynamicLayer": layers * 5}  # one update per layer and forward: 5 forwards
    assert outer.counts == {"DynamicLayer": layers * 5}  # the static cache's layers added none
