"""scripts/install-torch, which scripts/setup-env runs first: the CPU build of the pinned torch where no
NVIDIA GPU is found, the CUDA build where ``nvidia-smi`` lists one, and the default index's build when
PyTorch's CPU index cannot be reached.

``nvidia-smi`` and the interpreter are stand-ins (small shell scripts on ``PATH`` that log how they were
called): no machine here has an NVIDIA GPU, and nothing is installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "install-torch")


def stand_in(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def run(tmp_path: Path, *, gpu: str | None, pip_fails_on: str = "", env: dict[str, str] | None = None,
        print_only: bool = False) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the script with a stand-in nvidia-smi (``gpu``: what ``-L`` prints, exit 0; "fail": exit 9, as
    without a driver; None: no such command) and a stand-in python whose pip fails when its arguments
    contain ``pip_fails_on``. Returns the run and the pip command lines the stand-in saw."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "pip.log"
    if gpu == "fail":
        stand_in(bin_dir, "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate with the "
                                        "NVIDIA driver.'; exit 9\n")
    elif gpu is not None:
        stand_in(bin_dir, "nvidia-smi", f"echo '{gpu}'\n")
    fails = f'case "$*" in *{pip_fails_on}*) exit 1;; esac\n' if pip_fails_on else ""
    python = stand_in(bin_dir, "python-stand-in", f'echo "$*" >> {log}\n{fails}exit 0\n')
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **(env or {})}
    argv = ["bash", SCRIPT, *(["--print"] if print_only else []), str(python), "2.13.0"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=60)
    seen = log.read_text().splitlines() if log.exists() else []
    return proc, seen


@pytest.mark.parametrize("gpu", [None, "fail", "No devices were found"])
def test_without_an_nvidia_gpu_the_cpu_build_comes_from_pytorch_s_cpu_index(tmp_path: Path, gpu: str | None) -> None:
    proc, seen = run(tmp_path, gpu=gpu)
    assert proc.returncode == 0, proc.stderr
    assert seen == ["-m pip install --quiet --retries 1 --timeout 20 --extra-index-url "
                    "https://download.pytorch.org/whl/cpu torch==2.13.0+cpu"]
    assert "the cpu build (GPUPROBE_TORCH_BUILD=auto: no NVIDIA GPU found)" in proc.stderr


def test_with_a_gpu_nvidia_smi_lists_the_cuda_build_comes_from_the_default_index(tmp_path: Path) -> None:
    proc, seen = run(tmp_path, gpu="GPU 0: NVIDIA H200 (UUID: GPU-1234)")
    assert proc.returncode == 0, proc.stderr
    assert seen == ["-m pip install --quiet torch==2.13.0"]
    assert "the cuda build (GPUPROBE_TORCH_BUILD=auto: nvidia-smi lists a GPU)" in proc.stderr


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_and_says_so(tmp_path: Path) -> None:
    proc, seen = run(tmp_path, gpu=None, pip_fails_on="download.pytorch.org")
    assert proc.returncode == 0, proc.stderr
    assert seen[1:] == ["-m pip install --quiet torch==2.13.0"] and "+cpu" in seen[0]
    assert "could not be installed from https://download.pytorch.org/whl/cpu" in proc.stderr


@pytest.mark.parametrize(("build", "expected"), [("cpu", "+cpu"), ("cuda", "torch==2.13.0")])
def test_the_setting_chooses_the_build_whatever_the_machine_has(tmp_path: Path, build: str, expected: str) -> None:
    proc, seen = run(tmp_path, gpu="GPU 0: NVIDIA H200" if build == "cpu" else None,
                     env={"GPUPROBE_TORCH_BUILD": build})
    assert proc.returncode == 0 and len(seen) == 1 and seen[0].endswith(expected), (seen, proc.stderr)


def test_a_bad_build_setting_is_a_clear_error(tmp_path: Path) -> None:
    proc, seen = run(tmp_path, gpu=None, env={"GPUPROBE_TORCH_BUILD": "rocm"})
    assert proc.returncode == 2 and seen == []
    assert "GPUPROBE_TORCH_BUILD must be auto, cpu or cuda, not 'rocm'" in proc.stderr


def test_print_shows_the_commands_without_running_them(tmp_path: Path) -> None:
    proc, seen = run(tmp_path, gpu=None, print_only=True)
    assert proc.returncode == 0 and seen == []
    assert "torch==2.13.0+cpu" in proc.stdout


def test_setup_env_installs_torch_through_it() -> None:
    text = Path(ROOT, "scripts", "setup-env").read_text()
    assert 'bash "$root/scripts/install-torch" "$venv/bin/python" "$torch_version"' in text
    assert "pip install --quiet \"torch==" not in text
