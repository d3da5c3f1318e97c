"""Baselines of the pytest plugin, and its answers to bad input: files written by ``--gpuprobe-update``,
compared on the next run, a diff table when a count grew, a note when one shrank; unknown names, negative
budgets, corrupt and hand-edited files, two tests writing one baseline: one clear line, nothing half-written.

Run as a user runs them (pytester: pytest in a process of its own), on a tiny Llama built from a config.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _budget_kit import run, section  # noqa: E402

pytest_plugins = ["pytester"]
# What these tests check runs in the pytest processes they start, which a simulated CUDA does not reach.
pytestmark = pytest.mark.subprocess_only


BASELINE = '''
import os

import transformers


class Processor(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        change = os.environ.get("CHANGE", "")
        if "launch" in change:
            scores = scores.neg().neg()  # two more operators (two kernels on a GPU) per step
        if "sync" in change:
            scores[0, 0].item()
        return scores


def test_decode(gpuprobe_budget, model, ids):
    with gpuprobe_budget.baseline("decode", counts=["host_syncs_per_step", "host_syncs_per_step_all",
                                                    "launches_per_step", "dynamic_cache_concats"]):
        model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None,
                       logits_processor=transformers.LogitsProcessorList([Processor()]))
'''


def test_a_baseline_is_written_by_update_passes_next_and_fails_with_a_diff_after_a_change(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHANGE", raising=False)
    written = run(pytester, {"test_baseline.py": BASELINE}, "--gpuprobe-update")
    written.assert_outcomes(passed=1)
    path = pytester.path / "gpuprobe-baselines" / "decode.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["test"] == "test_baseline.py::test_decode" and data["name"] == "decode"
    counts = data["machines"]["cpu"]["counts"]
    assert counts["host_syncs_per_step"] == {"all": 0, "components": {}}  # no sync of the test's own
    assert counts["host_syncs_per_step_all"] == {"all": 1, "components": {"other": 1}}  # transformers' stop check
    assert counts["dynamic_cache_concats"]["all"] == 2 * 6  # layers × forwards
    launches = counts["launches_per_step"]["all"]
    assert launches > 20 and sum(counts["launches_per_step"]["components"].values()) == launches
    assert "wrote baseline 'decode' for cpu" in written.stdout.str()

    again = run(pytester, {"test_baseline.py": BASELINE})
    again.assert_outcomes(passed=1)
    assert json.loads(path.read_text(encoding="utf-8")) == data  # compared, not written

    monkeypatch.setenv("CHANGE", "launch sync")
    changed = run(pytester, {"test_baseline.py": BASELINE})
    changed.assert_outcomes(failed=1)
    out = changed.stdout.str()
    assert "gpuprobe baseline 'decode'" in out and "grew" in out
    assert re.search(rf"launches_per_step\s+{launches}\s+{launches + 2}\s+grew", out), out
    elementwise = counts["launches_per_step"]["components"]["elementwise"]
    assert re.search(rf"launches_per_step\[elementwise\]\s+{elementwise}\s+{elementwise + 2}\s+grew", out), out
    assert re.search(r"host_syncs_per_step\s+0\s+1\s+grew", out), out
    assert re.search(r"host_syncs_per_step\[logits_processor/Processor\]\s+0\s+1\s+grew", out), out
    assert re.search(r"host_syncs_per_step_all\s+1\s+2\s+grew", out), out
    assert re.search(r"host_syncs_per_step \(expected\)\s+-\s+1\s+expected", out), out
    assert json.loads(path.read_text(encoding="utf-8")) == data  # a failing comparison writes nothing

    # The change made the baseline; without it, the counts shrink: the test passes and says so.
    run(pytester, {"test_baseline.py": BASELINE}, "--gpuprobe-update").assert_outcomes(passed=1)
    monkeypatch.delenv("CHANGE")
    tighter = run(pytester, {"test_baseline.py": BASELINE})
    tighter.assert_outcomes(passed=1)
    note = tighter.stdout.str()
    assert "baseline 'decode' can be tightened" in note
    assert f"launches_per_step {launches + 2} → {launches}" in note and "host_syncs_per_step 1 → 0" in note


BAD_INPUT = '''
def test_unknown_name(gpuprobe_budget, model, ids):
    with gpuprobe_budget(host_sync=0):
        model.generate(ids, max_new_tokens=3)


def test_negative(gpuprobe_budget):
    with gpuprobe_budget(recompiles=-1):
        pass


def test_unknown_component(gpuprobe_budget):
    with gpuprobe_budget(host_syncs_per_step={"logit_processor": 0}):
        pass


def test_components_of_a_whole_count(gpuprobe_budget):
    with gpuprobe_budget(recompiles={"forward": 0}):
        pass


def test_bad_baseline_name(gpuprobe_budget):
    with gpuprobe_budget.baseline("../elsewhere"):
        pass


def test_corrupt_baseline(gpuprobe_budget):
    with gpuprobe_budget.baseline("corrupt", counts=["dynamic_cache_concats"]):
        pass


def test_edited_baseline(gpuprobe_budget):
    with gpuprobe_budget.baseline("edited", counts=["dynamic_cache_concats"]):
        pass


def test_missing_baseline(gpuprobe_budget):
    with gpuprobe_budget.baseline("missing", counts=["dynamic_cache_concats"]):
        raise AssertionError("the block never runs: the missing file fails the test before it")
'''

EDITED = {"format": 1, "name": "edited", "test": "test_bad_input.py::test_edited_baseline",
          "machines": {"cpu": {"counts": {"dynamic_cache_concats": {"all": "12", "components": {}}}, "versions": {}}}}


def test_bad_input_fails_with_an_error_naming_the_problem(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "gpuprobe-baselines"
    folder.mkdir()
    corrupt = '{"format": 1, "name": "corrupt", "machines": {'
    (folder / "corrupt.json").write_text(corrupt, encoding="utf-8")
    edited = json.dumps(EDITED)
    (folder / "edited.json").write_text(edited, encoding="utf-8")
    result = run(pytester, {"test_bad_input.py": BAD_INPUT})
    result.assert_outcomes(failed=8)
    out = result.stdout.str()
    expected = {
        "test_unknown_name": "unknown budget 'host_sync' (did you mean host_syncs?); the budgets are: host_syncs, ",
        "test_negative": "budget recompiles must be >= 0, got -1",
        "test_unknown_component": "budget host_syncs_per_step: unknown component 'logit_processor'",
        "test_components_of_a_whole_count": "budget recompiles is one number for the whole block, not per component",
        "test_bad_baseline_name": "a baseline name is 1-100 letters, digits",
        "test_corrupt_baseline": "corrupt.json is not JSON (line 1, column",
        "test_edited_baseline": ("edited.json: machines['cpu'].counts.dynamic_cache_concats.all must be a whole "
                                 "number >= 0, got '12'"),
        "test_missing_baseline": "no baseline 'missing' (",
    }
    for test, message in expected.items():
        report = section(out, test)
        assert message in report, (test, report)
        assert len(report.splitlines()) == 1, report  # one clear line, no traceback of the plugin
    assert "write it with pytest --gpuprobe-update" in section(out, "test_missing_baseline")
    # Nothing was rewritten: the files are as they were.
    assert (folder / "corrupt.json").read_text(encoding="utf-8") == corrupt
    assert (folder / "edited.json").read_text(encoding="utf-8") == edited
    assert sorted(p.name for p in folder.iterdir()) == ["corrupt.json", "edited.json"]


TWO_WRITERS = '''
def test_first(gpuprobe_budget):
    with gpuprobe_budget.baseline("shared", counts=["dynamic_cache_concats"]):
        pass


def test_second(gpuprobe_budget):
    with gpuprobe_budget.baseline("shared", counts=["dynamic_cache_concats"]):
        pass
'''


def test_two_tests_writing_one_baseline_is_an_error_and_the_first_file_stays_whole(pytester: pytest.Pytester) -> None:
    result = run(pytester, {"test_two.py": TWO_WRITERS}, "--gpuprobe-update")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "baseline 'shared' is used by test_two.py::test_first already in this run" in section(out, "test_second")
    data = json.loads((pytester.path / "gpuprobe-baselines" / "shared.json").read_text(encoding="utf-8"))
    assert data["test"] == "test_two.py::test_first"
    assert data["machines"]["cpu"]["counts"] == {"dynamic_cache_concats": {"all": 0, "components": {}}}
    assert [p.name for p in (pytester.path / "gpuprobe-baselines").iterdir()] == ["shared.json"]


ONE_WRITER = '''
def test_writes(gpuprobe_budget):
    with gpuprobe_budget.baseline("shared", counts=["dynamic_cache_concats"]):
        pass
'''


def test_two_xdist_workers_writing_one_baseline_is_an_error(pytester: pytest.Pytester) -> None:
    """Each file in a worker of its own (xdist, --dist loadfile): the claim is shared through the run's id."""
    result = run(pytester, {"test_one.py": ONE_WRITER, "test_two.py": ONE_WRITER}, "--gpuprobe-update", "-n", "2",
                 "--dist", "loadfile", "-v")
    result.assert_outcomes(passed=1, failed=1)
    workers = dict(re.findall(r"\[(gw\d)\] \[\s*\d+%\] (?:PASSED|FAILED) (test_\w+)\.py", result.stdout.str()))
    assert len(workers) == 2, result.stdout.str()  # one file in each worker
    data = json.loads((pytester.path / "gpuprobe-baselines" / "shared.json").read_text(encoding="utf-8"))
    writer = data["test"]
    other = ({"test_one.py::test_writes", "test_two.py::test_writes"} - {writer}).pop()
    assert f"baseline 'shared' is used by {writer} already in this run" in result.stdout.str()
    assert f"FAILED {other}" in result.stdout.str()


