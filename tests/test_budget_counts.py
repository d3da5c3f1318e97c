"""The budgets' arithmetic and files, without pytest in a process of its own: budgets read and refused,
values per step and per component, the table, baselines compared, read, refused and written whole; the
docs' table and excerpts against the code they show."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gpuprobe.testing import budget as b

ROOT = Path(__file__).resolve().parent.parent


# -- budgets as written -----------------------------------------------------------------------------

def test_budgets_take_whole_numbers_and_dicts_of_components() -> None:
    parsed = b.parse_budgets({"host_syncs_per_step": {"logits_processor/Ban": 0, "other": 1}, "recompiles": 0,
                              "launches_per_step": 120.0})
    assert parsed == {"host_syncs_per_step": {"logits_processor/Ban": 0, "other": 1}, "recompiles": 0,
                      "launches_per_step": 120}
    assert type(parsed["launches_per_step"]) is int


@pytest.mark.parametrize(("budgets", "message"), [
    ({"host_sync": 0}, "unknown budget 'host_sync' (did you mean host_syncs?)"),
    ({"no_such_thing": 0}, "unknown budget 'no_such_thing'; the budgets are: host_syncs, host_syncs_per_step"),
    ({"recompiles": -1}, "budget recompiles must be >= 0, got -1"),
    ({"recompiles": 0.5}, "budget recompiles must be a whole number >= 0"),
    ({"recompiles": True}, "budget recompiles must be a whole number >= 0"),
    ({"recompiles": "0"}, "budget recompiles must be a whole number >= 0"),
    ({"recompiles": {"forward": 0}}, "budget recompiles is one number for the whole block"),
    ({"host_syncs_per_step": {}}, "an empty dict budgets nothing"),
    ({"host_syncs_per_step": {"logit_processor": 0}}, "unknown component 'logit_processor'"),
    ({"host_syncs_per_step": {"outside_steps": 0}}, "outside_steps is not in a step"),
    ({"host_syncs_per_step_all": {"outside_steps": 0}}, "outside_steps is not in a step (budget it with host_syncs_all)"),
    ({"host_syncs_all": {"logit_processor": 0}}, "budget host_syncs_all: unknown component 'logit_processor'"),
    ({"launches_per_step": {"gemm": -3}}, "budget launches_per_step[gemm] must be >= 0, got -3"),
    ({}, "needs at least one budget"),
])
def test_a_budget_that_cannot_be_checked_is_refused_naming_the_problem(budgets: dict, message: str) -> None:
    with pytest.raises(b.BudgetError) as caught:
        b.parse_budgets(budgets)
    assert message in str(caught.value)


# -- values ------------------------------------------------------------------------------------------

def stepped(name: str, *steps: dict[str, int]) -> b.Measured:
    return b.Measured(name, [b.Part(f"call 1, step {i}", dict(by), sum(by.values())) for i, by in enumerate(steps, 1)])


def test_a_per_step_value_is_the_most_in_one_step_of_the_component_or_of_all() -> None:
    m = stepped("host_syncs_per_step", {"other": 1, "logits_processor/A": 2}, {"other": 1, "logits_processor/B": 1,
                                                                              "logits_processor/A": 1}, {"other": 3})
    assert m.value() == 3  # step 1: 3, step 2: 3, step 3: 3
    assert m.value("logits_processor") == 2  # A's 2 in step 1; A + B in step 2 is 2 too
    assert m.value("logits_processor/B") == 1
    assert m.value("other") == 3
    assert m.value("forward") == 0
    assert m.components() == {"logits_processor/A": 2, "logits_processor/B": 1, "other": 3}
    assert m.where("logits_processor").startswith("call 1, step 1: logits_processor/A 2")


def test_checked_rows_say_over_ok_or_skipped_and_the_table_puts_failures_first() -> None:
    results = {"host_syncs_per_step": stepped("host_syncs_per_step", {"other": 1, "logits_processor/A": 1}),
               "recompiles": b.Measured("recompiles", [b.Part("block", {}, 0)]),
               "peak_memory_bytes": b.Measured("peak_memory_bytes", skipped="no CUDA device")}
    rows = b.check({"recompiles": 0, "host_syncs_per_step": {"logits_processor": 0, "other": 1},
                    "peak_memory_bytes": 10}, results)
    assert [(r.count, r.limit, r.measured, r.verdict) for r in rows] == [
        ("recompiles", "0", 0, "ok"),
        ("host_syncs_per_step[logits_processor]", "0", 1, "over"),
        ("host_syncs_per_step[other]", "1", 1, "ok"),
        ("peak_memory_bytes", "10", None, "skipped"),
    ]
    table = b.render(rows, "header").splitlines()
    assert table[0] == "header"
    assert re.match(r"count\s+limit\s+measured\s+where$", table[1])
    assert table[2].startswith("host_syncs_per_step[logits_processor]")  # the failing row first
    assert re.search(r"peak_memory_bytes\s+10\s+-\s+skipped\s+no CUDA device$", table[-1])


def test_the_syncs_left_out_as_expected_are_a_row_beside_their_count_that_never_fails() -> None:
    m = stepped("host_syncs_per_step", {"logits_processor/P": 1}, {})
    m.expected = stepped("host_syncs_per_step", {"other": 1}, {"other": 1})
    m.expected.details = {"other": "aten::_local_scalar_dense in transformers at transformers/generation/utils.py:9"}
    quiet = stepped("host_syncs_per_step", {}, {})
    quiet.expected = stepped("host_syncs_per_step", {}, {})
    rows = b.check({"host_syncs_per_step": {"logits_processor": 0}}, {"host_syncs_per_step": m})
    assert [(r.count, r.limit, r.measured, r.verdict, r.failed) for r in rows] == [
        ("host_syncs_per_step[logits_processor]", "0", 1, "over", True),
        ("host_syncs_per_step (expected)", "-", 1, "expected", False),
    ]
    assert rows[1].where == ("left out, transformers' own: call 1, step 1: other 1 (aten::_local_scalar_dense in "
                             "transformers at transformers/generation/utils.py:9)")
    assert [r.verdict for r in b.check({"host_syncs_per_step": 0}, {"host_syncs_per_step": quiet})] == ["ok"]
    kept = record({"host_syncs_per_step": {"all": 0, "components": {}}})
    compared = b.compare_baseline(kept, {"host_syncs_per_step": m})
    assert [(r.count, r.verdict) for r in compared] == [
        ("host_syncs_per_step", "grew"), ("host_syncs_per_step[logits_processor/P]", "grew"),
        ("host_syncs_per_step (expected)", "expected")]
    # what a baseline keeps of a sync count: the user's syncs, not the expected ones
    assert b.baseline_record({"host_syncs_per_step": m})["counts"]["host_syncs_per_step"] == {
        "all": 1, "components": {"logits_processor/P": 1}}


# -- baselines ---------------------------------------------------------------------------------------

def record(counts: dict) -> dict:
    return {"counts": counts, "versions": {}}


def test_a_baseline_comparison_fails_what_grew_and_notes_what_shrank() -> None:
    kept = record({"host_syncs_per_step": {"all": 1, "components": {"other": 1}},
                   "launches_per_step": {"all": 170, "components": {"gemm": 45, "elementwise": 125}},
                   "recompiles": {"all": 0, "components": {}}})
    results = {"host_syncs_per_step": stepped("host_syncs_per_step", {"other": 1, "logits_processor/P": 1}),
               "launches_per_step": stepped("launches_per_step", {"gemm": 45, "elementwise": 120}),
               "recompiles": b.Measured("recompiles", [b.Part("block", {}, 0)]),
               "graph_breaks": b.Measured("graph_breaks", [b.Part("block", {}, 0)])}
    rows = {r.count: (r.limit, r.measured, r.verdict) for r in b.compare_baseline(kept, results)}
    assert rows == {
        "host_syncs_per_step": ("1", 2, "grew"),
        "host_syncs_per_step[logits_processor/P]": ("0", 1, "grew"),
        "launches_per_step": ("170", 165, "shrank"),
        "launches_per_step[elementwise]": ("125", 120, "shrank"),
        "recompiles": ("0", 0, "ok"),
        "graph_breaks": ("not in the baseline", 0, "new"),
    }


def test_a_baseline_record_keeps_values_components_and_what_was_skipped() -> None:
    results = {"launches_per_step": stepped("launches_per_step", {"gemm": 4, "other": 1}, {"gemm": 5}),
               "recompiles": b.Measured("recompiles", [b.Part("block", {"f (/abs/path.py:3)": 2}, 2)]),
               "peak_memory_bytes": b.Measured("peak_memory_bytes", skipped="no CUDA device")}
    rec = b.baseline_record(results)
    assert rec["counts"] == {"launches_per_step": {"all": 5, "components": {"gemm": 5, "other": 1}},
                             # a count without components keeps none: its parts name this machine's files
                             "recompiles": {"all": 2, "components": {}}}
    assert rec["skipped"] == {"peak_memory_bytes": "no CUDA device"}


GOOD = {"format": 1, "name": "n", "test": "t.py::t",
        "machines": {"cpu": {"counts": {"recompiles": {"all": 0, "components": {}}}, "versions": {"torch": "2"}}}}


def edited(**changes: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        target = data
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return data


@pytest.mark.parametrize(("data", "message"), [
    ([], "the file holds list, not an object"),
    (edited(extra=1), "unknown field(s) extra"),
    (edited(format=2), "format is 2, this gpuprobe reads format 1"),
    (edited(test=3), "test must be a string, got 3"),
    (edited(machines={}), "machines must be an object of machine → counts"),
    (edited(machines__cpu__counts__hosts_syncs={"all": 1, "components": {}}), "counts.hosts_syncs: no such count"),
    (edited(machines__cpu__counts__recompiles={"all": 1}), "counts.recompiles must be an object with all and components"),
    (edited(machines__cpu__counts__recompiles={"all": -1, "components": {}}), ".all must be a whole number >= 0, got -1"),
    (edited(machines__cpu__counts__recompiles={"all": 1, "components": {"x": 1.5}}),
     "components['x'] must be a whole number >= 0, got 1.5"),
    (edited(machines__cpu__versions={"torch": 2}), "versions must be an object of strings"),
])
def test_a_hand_edited_baseline_is_refused_naming_the_field(tmp_path: Path, data: object, message: str) -> None:
    path = tmp_path / "n.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(b.BaselineError) as caught:
        b.read_baseline(str(path))
    assert message in str(caught.value) and str(path) in str(caught.value)
    assert "--gpuprobe-update" in str(caught.value)


def test_a_corrupt_baseline_names_its_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "n.json"
    path.write_text('{\n  "format": 1,\n  "name": \n}', encoding="utf-8")
    with pytest.raises(b.BaselineError, match=r"is not JSON \(line 4, column 1: Expecting value\)"):
        b.read_baseline(str(path))
    assert b.read_baseline(str(tmp_path / "missing.json")) is None


def test_a_baseline_is_written_whole_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "n.json"
    b.write_baseline(str(path), GOOD)
    assert b.read_baseline(str(path)) == GOOD
    assert os.listdir(path.parent) == ["n.json"]  # no temporary file left beside it


@pytest.mark.parametrize("name", ["", "../x", "a/b", "x.json", ".hidden", "a" * 101, 3])
def test_a_baseline_name_that_would_name_another_file_is_refused(name: object) -> None:
    with pytest.raises(b.BudgetError, match="a baseline name is 1-100 letters"):
        b.check_name(name)


# -- the docs ------------------------------------------------------------------------------------------

DOC = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")


def test_the_docs_table_of_budgets_is_the_code_s() -> None:
    assert b.budget_table() in DOC


def test_the_docs_excerpts_are_the_example_s_code() -> None:
    example = (ROOT / "examples" / "test_generation_budgets.py").read_text(encoding="utf-8")
    excerpts = re.findall(r"<!-- doc-test: skip \(an excerpt of examples/test_generation_budgets\.py[^>]*-->\n"
                          r"```python\n(.*?)```", DOC, re.S)
    assert len(excerpts) == 2
    for text in excerpts:
        for function in re.split(r"\n(?=def )", text.strip()):
            assert function.strip() in example, function
