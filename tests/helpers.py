"""Small helpers shared by tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


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


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for import-time behaviour); returns the finished process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    full_env["PYTHONPATH"] = ROOT
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)



class FakeCudaEvent:
    """A stand-in for ``torch.cuda.Event`` (no CUDA device on CPU-only machines).

    It records which calls the timer makes: ``elapsed_time`` on an event that has not completed
    raises, as CUDA does, so a test fails if the timer ever reads an unfinished event, and there is
    no ``synchronize`` method at all, so a blocking call fails loudly.
    """

    clock_ns = 0
    made = 0

    def __init__(self) -> None:
        FakeCudaEvent.made += 1
        self.recorded_at: int | None = None
        self.done = False

    def record(self) -> None:
        self.recorded_at = FakeCudaEvent.clock_ns
        self.done = False

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "FakeCudaEvent") -> float:
        if not (self.done and end.done):
            raise RuntimeError("CUDA error: device not ready")
        assert self.recorded_at is not None and end.recorded_at is not None
        return (end.recorded_at - self.recorded_at) / 1e6  # milliseconds, like CUDA
