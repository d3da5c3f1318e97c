"""The GPU check's ``gpuprobe try`` step (scripts/gpu_check_try.py, run by scripts/gpu-check after the check):
its section in RESULTS-gpu.md and its key in RESULTS-gpu.json, in a dry run with and without ``--try``.

On a GPU the step measures the GPU-sized Llama; that has not run here (no GPU): these tests run the dry
run's tiny Llama on the CPU, and the script's handling of what the check wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

STEP = Path(ROOT) / "scripts" / "gpu_check_try.py"
CHECK = Path(ROOT) / "scripts" / "gpu-check"


def _results(folder: Path, dry_run: bool = True) -> Path:
    """What the check leaves in its --out folder (the parts the step reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "RESULTS-gpu.md").write_text("# gpuprobe on a GPU: results of `scripts/gpu-check`\n\n## Benchmarks\n")
    (folder / "RESULTS-gpu.json").write_text(json.dumps({"schema": 1, "dry_run": dry_run, "ok": True}))
    return folder


def _step(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, str(STEP), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def test_a_dry_run_says_the_step_was_not_run_and_keeps_what_the_check_wrote(tmp_path: Path) -> None:
    out = _results(tmp_path / "out")
    proc = _step("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    md = (out / "RESULTS-gpu.md").read_text()
    assert md.startswith("# gpuprobe on a GPU: results of `scripts/gpu-check`\n\n## Benchmarks\n")
    assert md.rstrip().endswith("## gpuprobe try\n\nNot run in a dry run (`scripts/gpu-check --dry-run --try` runs "
                                "it on the CPU).")
    results = json.loads((out / "RESULTS-gpu.json").read_text())
    assert results["try"] == {"status": "not run (dry run)"} and results["ok"] is True


def test_running_the_step_again_replaces_its_section(tmp_path: Path) -> None:
    out = _results(tmp_path / "out")
    for _ in range(2):
        assert _step("--dry-run", "--out", str(out)).returncode == 0
    assert (out / "RESULTS-gpu.md").read_text().count("## gpuprobe try") == 1


def test_without_the_check_results_the_step_says_so_with_status_2(tmp_path: Path) -> None:
    proc = _step("--out", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "RESULTS-gpu" in proc.stderr


@pytest.mark.slow
def test_asked_for_in_a_dry_run_the_step_adds_the_table_of_the_tiny_llama(tmp_path: Path) -> None:
    out = _results(tmp_path / "out")
    proc = _step("--dry-run", "--try", "--out", str(out), timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "RESULTS-gpu.md").read_text()
    section = md.split("## gpuprobe try\n", 1)[1]
    assert "`python -m gpuprobe try scripts/gpu_check_try.py:model --budget 15s --format markdown` (dry run" in section
    assert "### gpuprobe try: scripts/gpu_check_try.py:model (float32, attention sdpa) on CPU" in section
    assert "#### prompt 16 tokens × batch 1, 8 new tokens (greedy)" in section
    assert "| # | variant | tokens/s |" in section and "| baseline |" in section
    entry = json.loads((out / "RESULTS-gpu.json").read_text())["try"]
    assert entry["status"] == "ok" and entry["dry_run"] is True and entry["exit_status"] == 0


def test_the_check_still_answers_help_and_takes_no_try_step_then() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PYTHON"] = sys.executable
    proc = subprocess.run(["bash", str(CHECK), "--no-try", "--help"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: scripts/gpu-check") and "gpuprobe try" not in proc.stderr
