"""Small helpers shared by tests."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from typing import Any, Callable


def scrape(url: str) -> dict[str, list]:
    """GET a /metrics URL and parse it with prometheus_client's own parser: name → samples."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_present() -> bool:
    """Whether torch in this process sees a CUDA device: a real one, or the simulated machine of
    ``pytest --simulate-gpu`` (docs/gpu.md). Tests whose subject is a process without CUDA check it."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return False
    return torch.cuda.device_count() > 0


def cpu_continuous_batching_cannot_pin() -> str | None:
    """Why continuous batching of a CPU model cannot run in this process, or None when it can.

    transformers pins the host buffers of a CPU model's continuous batching when torch sees an
    accelerator (``continuous_batching/input_outputs.py``: ``pin_memory`` when ``get_available_devices()``
    lists more than the CPU). A CPU build of torch cannot pin memory, so under ``pytest --simulate-gpu``
    (CUDA simulated over a CPU build) those buffers fail to allocate; on a machine with CUDA they pin.
    """
    import torch

    if not torch.cuda.is_available():
        return None  # nothing is pinned
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError as exc:
        return f"transformers pins continuous batching's host buffers when it sees CUDA, and this torch cannot: {exc}"
    return None


def use_cuda_if_present() -> str:
    """On a machine with CUDA, initialize it as a program that uses the GPU does (gpuprobe reads the CUDA
    allocator and takes device spans only after that); returns where memory readings of probes on the
    calling thread are taken: ``cpu`` (the process's RSS) without CUDA, else ``cuda:N``."""
    if not cuda_present():
        return "cpu"
    torch = sys.modules["torch"]
    return f"cuda:{torch.cuda.current_device()}"


def expected_device_label() -> str:
    """The ``gpuprobe.device`` label of series recorded since the last ``reset()`` by probes that ran on no
    tensor, from torch's state alone: ``cpu`` without a CUDA device; ``cuda`` until the program has
    initialized CUDA (no device span was taken); then the device the probes ran on, the current one."""
    if not cuda_present():
        return "cpu"
    torch = sys.modules["torch"]
    if not torch.cuda.is_initialized():
        return "cuda"
    return f"cuda:{torch.cuda.current_device()}"


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for import-time behaviour); returns the finished process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    full_env["PYTHONPATH"] = ROOT
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def patch_host_clock(monkeypatch: Any, package: str, clock: Callable[[], int]) -> None:
    """Make ``clock`` the host clock (``perf_counter_ns``) of every module of ``package`` that reads it,
    e.g. ``"gpuprobe.integrations._transformers.generate"``."""
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        module = importlib.import_module(info.name)
        if hasattr(module, "perf_counter_ns"):
            monkeypatch.setattr(module, "perf_counter_ns", clock)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until it returns something true (returned), or fail naming ``what``."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def child_pids() -> set[int]:
    """The process ids of this process's children (read from Linux's /proc; none elsewhere)."""
    out: set[int] = set()
    if not os.path.isdir("/proc/self/task"):
        return out
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                out.update(int(pid) for pid in f.read().split())
        except FileNotFoundError:  # a thread that ended while the tasks were listed
            continue
    return out
