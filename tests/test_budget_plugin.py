"""The pytest plugin's budgets, run as a user runs them: test files in a fresh folder, pytest in a process of
its own (pytester), real tiny Llamas built from configs.

Each run holds a test that must fail and its twin that must pass, so one process start checks both sides.
Expected values come from the tests' own code: the line of the ``.item()`` is found in the source written,
the number of concatenations is layers × steps, the shapes are those fed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _budget_kit import TIMEOUT, line_of, run, section  # noqa: E402

pytest_plugins = ["pytester"]
# What these tests check runs in the pytest processes they start, which a simulated CUDA does not reach.
pytestmark = pytest.mark.subprocess_only


SYNCS = '''
import pytest
import transformers


class ItemProcessor(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        if scores[0, 0].item() > 1e9:  # the sync
            scores = scores * 1
        return scores


class QuietProcessor(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores - 0.0


TOKENS = 8


def generate(model, ids, processors, tokens=TOKENS):
    return model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                          logits_processor=transformers.LogitsProcessorList(processors))


@pytest.mark.parametrize("processors", [[ItemProcessor()], []], ids=["item_processor", "no_processor"])
def test_decode_has_no_syncs(gpuprobe_budget, model, ids, processors):
    with gpuprobe_budget(host_syncs_per_step=0):
        generate(model, ids, processors)


def test_a_quiet_processor_has_no_syncs(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_syncs_per_step={"logits_processor": 0}, host_syncs=0) as block:
        generate(model, ids, [QuietProcessor()])
    assert block["host_syncs_per_step"].components() == {}
    # transformers' stop check, left out as expected: one a step, one for each new token in the block
    assert block["host_syncs_per_step"].expected.components() == {"other": 1}
    assert block["host_syncs"].expected.components()["other"] == TOKENS


def test_the_processor_s_syncs_alone_count(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_syncs=TOKENS) as block:
        generate(model, ids, [ItemProcessor()])
    # one .item() a token; transformers' syncs before the first step stay expected, of the same kind though they are
    assert block["host_syncs"].components() == {"logits_processor/ItemProcessor": TOKENS}


def test_every_sync_counts_the_stop_check(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_syncs_per_step_all=1):
        generate(model, ids, [ItemProcessor()])


def test_the_stop_check_holds_one_sync_a_step(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_syncs_per_step_all=1, host_syncs_all=10**6, host_syncs=0) as block:
        generate(model, ids, [])
    assert block["host_syncs_per_step_all"].components() == {"other": 1}
    every, theirs = block["host_syncs_all"], block["host_syncs"].expected
    assert every.components()["other"] == TOKENS and every.components() == theirs.components()


def test_a_sync_of_the_block_between_calls(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_syncs={"outside_steps": 0}):
        generate(model, ids, [], tokens=24)  # more syncs of the same kind than the audit looks at again
        ids[0, 0].item()  # the block's own sync
        generate(model, ids, [])
'''


def test_a_processor_that_calls_item_fails_no_syncs_and_the_report_names_its_class_and_line(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, {"test_syncs.py": SYNCS})
    out = result.stdout.str()
    failed = sorted(re.findall(r"FAILED test_syncs.py::(\S+)", out))
    assert failed == ["test_a_sync_of_the_block_between_calls", "test_decode_has_no_syncs[item_processor]",
                      "test_every_sync_counts_the_stop_check"], out
    result.assert_outcomes(failed=3, passed=4)
    line = line_of(SYNCS, ".item() > 1e9")
    # The failure table: the count, its budget, the measured value, the class and the line of the sync.
    report = section(out, "test_decode_has_no_syncs[item_processor]")
    row = re.search(r"host_syncs_per_step\s+0\s+1\s+over\s+(.*)", report)
    assert row is not None, report
    assert row.group(1).startswith("call 1, step 1: logits_processor/ItemProcessor 1 ")
    assert f"aten::_local_scalar_dense at test_syncs.py:{line}" in row.group(1)
    # transformers' stop check, beside it: left out, and where in transformers it runs
    expected = re.search(r"host_syncs_per_step \(expected\)\s+-\s+1\s+expected\s+(.*)", report)
    assert expected is not None, report
    assert re.search(r"other 1 \(aten::_local_scalar_dense in transformers at transformers/generation/\S+:\d+\)",
                     expected.group(1)), expected.group(1)
    # Counting every sync: the processor's and the stop check's
    assert re.search(r"host_syncs_per_step_all\s+1\s+2\s+over", section(out, "test_every_sync_counts_the_stop_check"))
    # The block's own sync between two calls, after more syncs of its kind than the audit looks at again
    between = section(out, "test_a_sync_of_the_block_between_calls")
    row = re.search(r"host_syncs\[outside_steps\]\s+0\s+(\d+)\s+over\s+(.*)", between)
    assert row is not None, between
    assert f"aten::_local_scalar_dense at test_syncs.py:{line_of(SYNCS, 'ids[0, 0].item()')}" in row.group(2)


COMPILED = '''
import torch


def test_growing_shapes(gpuprobe_budget, model):
    compiled = torch.compile(model, backend="eager", dynamic=False)
    with gpuprobe_budget(recompiles=0):
        for n in (6, 7):
            compiled(input_ids=torch.arange(3, 3 + n).unsqueeze(0))


def test_one_shape(gpuprobe_budget, model):
    compiled = torch.compile(model, backend="eager", dynamic=False)
    with gpuprobe_budget(recompiles=0):
        for _ in range(2):
            compiled(input_ids=torch.arange(3, 9).unsqueeze(0))


def shout(x):
    y = x * 2
    print("a graph break")
    return y + 1


def test_a_graph_break(gpuprobe_budget):
    with gpuprobe_budget(graph_breaks=0):
        torch.compile(shout, backend="eager")(torch.ones(3))
'''


def test_a_compiled_model_fed_growing_shapes_fails_no_recompiles_and_names_the_shape(pytester: pytest.Pytester) -> None:
    result = run(pytester, {"test_compiled.py": COMPILED})
    out = result.stdout.str()
    result.assert_outcomes(failed=2, passed=1)
    row = re.search(r"recompiles\s+0\s+1\s+over\s+(.*)", out)
    assert row is not None, out
    # The frame compiled again, and the guard that failed: the sequence dimension of input_ids grew from 6 to 7.
    reason = re.search(r"\(tensor (.*)\)$", row.group(1))
    assert reason is not None and "input_ids" in reason.group(1), row.group(1)
    assert "size mismatch at index 1. expected 6, actual 7" in reason.group(1)
    breaks = re.search(r"graph_breaks\s+0\s+(\d+)\s+over\s+(.*)", out)
    assert breaks is not None and int(breaks.group(1)) >= 1, out
    assert "print" in breaks.group(2)
    assert sorted(re.findall(r"FAILED test_compiled.py::(\w+)", out)) == ["test_a_graph_break", "test_growing_shapes"]


CACHES = '''
from conftest import LAYERS

TOKENS = 8


def test_dynamic_cache(gpuprobe_budget, model, ids):
    with gpuprobe_budget(dynamic_cache_concats=0):
        model.generate(ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None)


def test_static_cache(gpuprobe_budget, model, ids):
    with gpuprobe_budget(dynamic_cache_concats=0):
        model.generate(ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None, cache_implementation="static")


def test_dynamic_cache_counted(gpuprobe_budget, model, ids):
    with gpuprobe_budget(dynamic_cache_concats=LAYERS * TOKENS) as block:
        model.generate(ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None)
    # one update per layer and forward: the prefill and each decode step but the last token's (no forward after it)
    assert block["dynamic_cache_concats"].value() == LAYERS * TOKENS
'''


def test_a_static_cache_passes_no_concatenations_where_a_dynamic_one_fails(pytester: pytest.Pytester) -> None:
    result = run(pytester, {"test_caches.py": CACHES})
    out = result.stdout.str()
    result.assert_outcomes(failed=1, passed=2)
    assert re.search(r"dynamic_cache_concats\s+0\s+16\s+over\s+DynamicLayer 16", out), out
    assert re.findall(r"FAILED test_caches.py::(\w+)", out) == ["test_dynamic_cache"]


UNCOUNTABLE = '''
import sys

import pytest


def test_python_calls_under_another_profiler(gpuprobe_budget, model, ids):
    sys.setprofile(lambda frame, event, arg: None)
    try:
        with gpuprobe_budget(python_calls_per_step=10_000, dynamic_cache_concats=100):
            model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    finally:
        sys.setprofile(None)


def test_peak_memory_without_cuda(gpuprobe_budget, model, ids):
    with gpuprobe_budget(peak_memory_bytes=10**12):
        model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)


def test_over_and_uncountable(gpuprobe_budget, model, ids):
    sys.setprofile(lambda frame, event, arg: None)
    try:
        with gpuprobe_budget(python_calls_per_step=10_000, dynamic_cache_concats=0):
            model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    finally:
        sys.setprofile(None)
'''


def test_a_budget_that_cannot_be_counted_here_is_skipped_with_its_reason(pytester: pytest.Pytester) -> None:
    torch = sys.modules.get("torch") or pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("peak memory is counted on this machine")
    result = run(pytester, {"test_uncountable.py": UNCOUNTABLE})
    out = result.stdout.str()
    result.assert_outcomes(skipped=2, failed=1)
    assert re.search(r"SKIPPED \[1\] test_uncountable.py:\d+: gpuprobe_budget: python_calls_per_step cannot be "
                     r"counted here: another profile function is set on this thread .*\(held: dynamic_cache_concats\)",
                     out), out
    assert re.search(r"SKIPPED \[1\] test_uncountable.py:\d+: gpuprobe_budget: peak_memory_bytes cannot be counted "
                     r"here: no CUDA device", out), out
    # A count over its budget fails even when another cannot be counted: never passed, never skipped away.
    assert re.search(r"dynamic_cache_concats\s+0\s+8\s+over", out), out
    assert re.search(r"python_calls_per_step\s+10000\s+-\s+skipped\s+another profile function", out), out


NO_BUDGET = '''
import json
import os
import sys
import threading


def test_state(request):
    state = {
        "modules": sorted(sys.modules),
        "profile": repr(sys.getprofile()),
        "threads": sorted(t.name for t in threading.enumerate()),
        "env": sorted(k for k in os.environ if k.startswith("GPUPROBE")),
        "plugin": request.config.pluginmanager.has_plugin("gpuprobe"),
    }
    with open(os.environ["STATE_FILE"], "w") as f:
        json.dump(state, f)
'''


def test_a_test_that_asks_for_no_budget_runs_as_without_the_plugin(pytester: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    states = {}
    for mode, args in (("with", ()), ("without", ("-p", "no:gpuprobe"))):
        path = pytester.path / f"{mode}.json"
        monkeypatch.setenv("STATE_FILE", str(path))
        pytester.path.joinpath("test_state.py").write_text(NO_BUDGET, encoding="utf-8")
        pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args,
                                      timeout=TIMEOUT).assert_outcomes(passed=1)
        states[mode] = json.loads(path.read_text(encoding="utf-8"))
    with_plugin, without = states["with"], states["without"]
    assert (with_plugin["plugin"], without["plugin"]) == (True, False)
    assert with_plugin["profile"] == without["profile"] == "None"
    assert with_plugin["threads"] == without["threads"] and with_plugin["env"] == without["env"]
    # Loading the plugin imports the gpuprobe package and a few standard modules, nothing else: no torch,
    # no runtime made, nothing started.
    added = set(with_plugin["modules"]) - set(without["modules"])
    others = {m for m in added if m.split(".")[0] not in sys.stdlib_module_names and not m.startswith("gpuprobe")}
    assert others == set(), others
    assert "torch" not in with_plugin["modules"]
    assert set(without["modules"]) - set(with_plugin["modules"]) == set()


AB = '''
import time

import pytest


def test_slower_variant(gpuprobe_ab):
    gpuprobe_ab(lambda: time.sleep(0.002), lambda: time.sleep(0.030), rounds=9, names=("before", "after"))


def test_same_variant(gpuprobe_ab):
    result = gpuprobe_ab(lambda: time.sleep(0.003), lambda: time.sleep(0.003), rounds=9)
    assert result.verdict in ("no difference", "faster", "slower")
    assert len(result.a_ns) == len(result.b_ns) == 9


def test_faster_variant(gpuprobe_ab):
    result = gpuprobe_ab(lambda: time.sleep(0.030), lambda: time.sleep(0.002), rounds=9)
    assert result.verdict != "slower" and result.comparison.ratio.median > 1


def test_too_few_rounds(gpuprobe_ab):
    gpuprobe_ab(lambda: None, lambda: None, rounds=3)
'''


def test_ab_fails_only_on_a_slower_verdict_beyond_the_noise_with_the_spread(pytester: pytest.Pytester) -> None:
    result = run(pytester, {"test_ab.py": AB})
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("passed")) == (2, 2), out
    assert sorted(re.findall(r"FAILED test_ab.py::(\w+)", out)) == ["test_slower_variant", "test_too_few_rounds"], out
    m = re.search(r"gpuprobe_ab: after is slower than before beyond the noise: after takes ([\d.]+)x before's time "
                  r"\(median of 9 interleaved rounds; per-round before/after ratios [\d.]+-[\d.]+, interquartile "
                  r"[\d.]+-[\d.]+; noise (?:[\d.]+|inf) %\); before [\d.]+ ms \([\d.]+-[\d.]+\), after [\d.]+ ms", out)
    assert m is not None, out
    assert float(m.group(1)) > 2  # 30 ms against 2 ms of sleep, whatever else the machine does
    assert "gpuprobe_ab: rounds must be a whole number >= 7" in section(out, "test_too_few_rounds")
