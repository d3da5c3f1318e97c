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
