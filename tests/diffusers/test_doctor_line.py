"""``gpuprobe doctor`` through the integration registry: a line for diffusers with the installed version and the
supported range, its seams shape-checked on diffusers' classes; a version outside the range fails the line."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import diffusers
import pytest

from gpuprobe.integrations import diffusers as gd

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> str:
    """The range pyproject.toml's diffusers extra installs (read here, not from gpuprobe)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    (found,) = [r.replace(" ", "")[len("diffusers"):] for r in extras["diffusers"] if r.startswith("diffusers")]
    return found


def test_doctor_lists_diffusers_with_its_version_and_range_and_checks_its_seams(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-I", "-m", "gpuprobe", "doctor", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    found = json.loads(done.stdout)
    lines = {line["check"]: line for line in found["checks"]}
    line = lines["diffusers"]
    installed = importlib.metadata.version("diffusers")
    assert line["state"] == "ok", line
    assert line["details"]["version"] == installed and line["details"]["supported"] == _declared()
    assert line["reason"].startswith(f"{installed}, inside the supported range {_declared()}")
    rows = {r["seam"]: r for r in lines["seams"]["details"]["seams"]}
    checked = {name for name, r in rows.items() if name.startswith("diffusers.") and r["checked"]}
    assert {"diffusers.call", "diffusers.class.subclass", "diffusers.denoiser.forward", "diffusers.scheduler.step",
            "diffusers.vae.decode"} <= checked
    assert f"diffusers {installed}" in lines["seams"]["reason"]


def test_a_version_outside_the_range_fails_the_line_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffusers, "__version__", "0.34.0")
    found = gd.describe()
    assert found["state"] == "fail"
    assert found["reason"].startswith(f"0.34.0 is outside the supported range {_declared()}")
    assert found["details"]["inside_tested_range"] is False
