"""The GPU check (scripts/gpu-check): its dry run on this machine, the rounds it measures in, and what it
does when a benchmark crashes, hangs or a package is missing.

The dry run is the check itself with the CUDA parts left out (tiny models on the CPU, two rounds each);
the compiled decode is skipped there, as the check says. What only a GPU shows waits for a GPU machine.
The tests that read one dry run (marked ``slow``) share it: ~20 s of CPU time, about a minute of wall
time on a busy 2-core machine; the others take a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu import check, report, runner  # noqa: E402
from benchmarks.gpu._ab import Budget, alternate, figure  # noqa: E402

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu-check")
    committed = ROOT / "benchmarks" / "RESULTS-gpu.md"
    before = committed.stat().st_mtime_ns if committed.exists() else None
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check"), "--dry-run", "--no-tests", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, env=env)
    after = committed.stat().st_mtime_ns if committed.exists() else None
    return {"proc": proc, "json": json.loads((out / "RESULTS-gpu.json").read_text()),
            "md": (out / "RESULTS-gpu.md").read_text(), "committed_untouched": before == after}


@pytest.mark.slow
def test_the_dry_run_succeeds_and_says_it_is_one(dry_run: dict[str, Any]) -> None:
    proc, res = dry_run["proc"], dry_run["json"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dry run (--dry-run)" in proc.stderr
    assert res["dry_run"] is True and res["dry_run_reason"] == "--dry-run"
    assert res["ok"] is True
    assert "**Dry run** (--dry-run)" in dry_run["md"]


@pytest.mark.slow
def test_the_dry_run_leaves_the_committed_results_alone(dry_run: dict[str, Any]) -> None:
    assert dry_run["committed_untouched"]


@pytest.mark.slow
def test_every_benchmark_reports_figures_with_their_spread_but_the_compiled_one_which_says_why(
        dry_run: dict[str, Any]) -> None:
    benches = {b["name"]: b for b in dry_run["json"]["benchmarks"]}
    assert list(benches) == list(runner.PARTS)
    graph = benches.pop("generate.graph")
    assert graph["status"] == "skipped" and "torch.compile" in graph["reason"]
    for name, b in benches.items():
        assert b["status"] == "ok", (name, b.get("error"), b.get("traceback"))
        assert b["figures"], name
        for f in b["figures"]:
            assert f["rounds"] == check.ROUNDS["dry"][1], (name, f)
            if "q1" in f:
                assert f["q1"] <= f["median"] <= f["q3"], (name, f)
            assert f"| {f['name']} | **" in dry_run["md"], (name, f["name"])
        assert f"### {name}: {b['title']}" in dry_run["md"]


@pytest.mark.slow
def test_the_ratio_figures_are_the_ones_each_benchmark_promises(dry_run: dict[str, Any]) -> None:
    names = {b["name"]: [f["name"] for f in b.get("figures", [])] for b in dry_run["json"]["benchmarks"]}
    assert {"tokens/s ratio, steps ÷ plain", "tokens/s ratio, steps+layers/8 ÷ plain"} <= set(names["generate.eager"])
    assert {"@probe ÷ bare", "record_function ÷ bare"} <= set(names["probe_cost"])
    assert "overhead at N=100" in names["kernel_sampling"]
    assert {"tokens/s ratio, N=100 ÷ off", "tokens/s ratio, N=1 ÷ off"} <= set(names["sync_audit"])
    assert "tokens/s ratio, instrumented ÷ plain" in names["continuous_batching"]


@pytest.mark.slow
def test_the_results_name_the_machine_the_software_and_the_doctor(dry_run: dict[str, Any]) -> None:
    import torch
    import transformers

    res = dry_run["json"]
    env = res["environment"]
    assert (env["torch"], env["transformers"]) == (torch.__version__, transformers.__version__)
    assert env["device"].startswith("CPU") or torch.cuda.is_available()
    assert res["gpuprobe"]["commit"] and len(res["gpuprobe"]["sources_sha256"]) == 16
    doctor = res["doctor"]
    assert doctor["available"] in (True, False)
    if doctor["available"] is False:
        assert doctor["status"].startswith("doctor: not available")
    assert res["tests"]["status"] == "not run (--no-tests)"
    for section in ("## Real-GPU tests", "## Benchmarks", "## gpuprobe doctor", "## How to read this"):
        assert section in dry_run["md"]


def test_a_figure_is_the_median_and_quartiles_of_its_rounds() -> None:
    f = figure("x", [5.0, 1.0, 4.0, 2.0, 3.0], "1")
    assert (f["q1"], f["median"], f["q3"], f["rounds"]) == (2.0, 3.0, 4.0, 5)
    with pytest.raises(ValueError, match="no round finished"):
        figure("x", [], "1")


def test_a_spent_budget_still_runs_the_fewest_rounds_within_its_limit() -> None:
    assert list(Budget(0, min_rounds=3, limit=1000).rounds()) == [0, 1, 2]
    assert list(Budget(0, min_rounds=3).rounds()) == [0]  # the limit defaults to twice the budget
    assert list(Budget(1000, min_rounds=1, max_rounds=4).rounds()) == [0, 1, 2, 3]


def test_rounds_far_slower_than_planned_stop_at_the_limit_whatever_the_fewest_rounds() -> None:
    done = []
    for r in Budget(0.01, min_rounds=50).rounds():
        time.sleep(0.03)  # each round outlasts twice the budget
        done.append(r)
    assert done == [0]


def test_variants_alternate_in_an_order_rotated_every_round() -> None:
    calls: list[str] = []
    current = [""]

    def set_variant(v: str) -> None:
        current[0] = v
        calls.append(f"set {v}")

    def run() -> float:
        calls.append(f"run {current[0]}")
        return float(len(calls))

    values = alternate(["a", "b", "c"], set_variant, run, Budget(0, min_rounds=3, max_rounds=3, limit=1000),
                       warmup=1)
    runs = [c[4:] for c in calls if c.startswith("run")]
    assert runs == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert calls[-1] == "set a"  # left on the reference
    assert [len(v) for v in values.values()] == [3, 3, 3]


FAKE_RUNNER = """
import argparse, json, os, sys, time

ap = argparse.ArgumentParser()
for a in ("--parts", "--size", "--deadline", "--min-rounds", "--max-rounds"):
    ap.add_argument(a)
args = ap.parse_args()
def emit(kind, **f):
    print(json.dumps({"kind": kind, **f}), flush=True)
emit("environment", environment={"device": "fake"})
for name in args.parts.split(","):
    emit("start", part=name, budget_s=1.0)
    if name == "crash":
        os._exit(3)
    if name == "hang":
        time.sleep(60)
    emit("result", part=name, elapsed_s=0.0, figures=[{"name": "x", "unit": "1", "median": 1.0, "rounds": 1}],
         setup={})
"""


@pytest.fixture()
def fake_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fake_gpu_runner.py").write_text(textwrap.dedent(FAKE_RUNNER))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "fake_gpu_runner"


def test_a_benchmark_that_takes_its_process_down_fails_alone(fake_runner: str) -> None:
    res = check.run_benchmarks(["a", "crash", "b"], "tiny", time.time() + 60, (1, 1), runner=fake_runner)
    parts = res["parts"]
    assert [parts[p]["status"] for p in ("a", "crash", "b")] == ["ok", "failed", "ok"]
    assert "exit status 3" in parts["crash"]["error"]
    assert res["environment"] == {"device": "fake"}


def test_a_benchmark_past_the_deadline_is_stopped_and_the_rest_reported_not_run(fake_runner: str) -> None:
    t0 = time.time()
    res = check.run_benchmarks(["a", "hang", "b"], "tiny", time.time() + 1, (1, 1), grace_s=1, runner=fake_runner)
    assert time.time() - t0 < 30
    parts = res["parts"]
    assert parts["a"]["status"] == "ok"
    assert parts["hang"]["status"] == "failed" and "out of time" in parts["hang"]["error"]
    assert parts["b"] == {"status": "failed", "error": "not run: the time budget was spent"}


def test_a_benchmark_process_that_cannot_start_fails_every_part_with_its_error() -> None:
    res = check.run_benchmarks(["a", "b"], "tiny", time.time() + 60, (1, 1), runner="gpuprobe_no_such_runner")
    for name in ("a", "b"):
        part = res["parts"][name]
        assert part["error"] == "not run: the benchmark process failed (exit status 1)"
        assert "No module named gpuprobe_no_such_runner" in part["stderr"]


def test_a_failed_benchmark_is_written_with_its_error() -> None:
    results = {"dry_run": False, "dry_run_reason": None, "started": "now", "elapsed_s": 1.0, "ok": False,
               "environment": {}, "gpuprobe": {"commit": "c", "sources_sha256": "s"}, "host": {"python": "3"},
               "packages": {}, "doctor": {"available": False, "status": "doctor: not available"},
               "tests": {"status": "not run (--no-tests)", "passed": None},
               "benchmarks": [{"name": "crash", "title": "t", "status": "failed", "error": "stopped: out of time"}]}
    md = report.markdown(results)
    assert "**Failed**: stopped: out of time" in md and "overall: **NOT ok**" in md
    assert "crash: failed: stopped: out of time" in report.summary(results)


def test_the_doctor_s_checks_are_a_table_with_the_whole_output_kept() -> None:
    doctor = {"available": True, "exit_status": 1, "report": {"schema": 1, "checks": [
        {"check": "cuda", "state": "ok", "reason": "1 device"},
        {"check": "nvml", "state": "failed", "reason": "no libnvidia-ml | here"},
        {"check": "otlp", "state": "off", "reason": "not asked for"}]}}
    results = {"dry_run": False, "dry_run_reason": None, "started": "now", "elapsed_s": 1.0, "ok": True,
               "environment": {}, "gpuprobe": {"commit": "c", "sources_sha256": "s"}, "host": {"python": "3"},
               "packages": {}, "doctor": doctor, "tests": {"status": "not run (--no-tests)", "passed": None},
               "benchmarks": []}
    md = report.markdown(results)
    assert "| cuda | ok | 1 device |" in md
    assert "| nvml | failed | no libnvidia-ml / here |" in md  # a table cell cannot hold a bar
    assert '"schema": 1' in md  # the whole output, below the table
    assert "doctor: exit status 1 (1 ok, 1 failed, 1 off)" in report.summary(results)


def test_a_missing_package_is_named_before_anything_runs(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(check, "REQUIRED", (*check.REQUIRED, ("gpuprobe_absent_pkg", "absent-pkg", "a test")))
    with pytest.raises(SystemExit) as exc:
        check.preflight()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "missing Python package 'absent-pkg'" in err
    assert "pip install --no-index --no-deps --target DIR wheels/*.whl" in err


def test_the_tests_part_reports_pytest_s_counts_and_names_the_failures(tmp_path: Path) -> None:
    (tmp_path / "test_three.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.cuda
        def test_passes():
            pass

        @pytest.mark.cuda
        def test_fails():
            assert False

        @pytest.mark.cuda
        def test_skips():
            pytest.skip("no device")

        def test_not_marked_is_left_out():
            pass
    """))
    res = check.run_tests(120, path=str(tmp_path))
    assert res["passed"] is False and res["exit_status"] == 1
    assert (res["tests"], res["failures"], res["skipped"]) == (3, 1, 1)
    # The class name's prefix is the file's path from pytest's rootdir, which depends on where the
    # checkout and the temporary folder lie (a checkout under /tmp makes /tmp the rootdir).
    (failed,) = res["failed_tests"]
    assert failed == "test_three::test_fails" or failed.endswith(".test_three::test_fails")
    assert "1 failed, 1 passed, 1 skipped, 1 deselected" in res["summary"]


def test_docs_name_a_wheel_for_every_package_the_check_asks_for() -> None:
    text = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    section = text[text.index("## The GPU check"):]
    for _, dist, _ in (*check.REQUIRED, *check.OPTIONAL):
        if dist in ("torch", "transformers"):
            continue  # preinstalled on the GPU machines
        wheel = dist.replace("-", "_")
        assert f"`{wheel}-" in section, dist  # a row of the wheel table
        assert f"{dist}==" in section, dist  # and in the download command
