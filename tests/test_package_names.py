"""A package's public name is never one of its submodules' names, or is bound once the package is imported.

Importing a submodule sets the package's attribute of that name to the module: a function exported
lazily under a submodule's name (``gpuprobe.experiment.render`` was ``experiment/render.py``'s
function) became the module once anything imported the module, so ``from gpuprobe.experiment import
render`` returned a module in some test orders. Each package is checked in a fresh interpreter, after
importing every submodule.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import gpuprobe

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib, pkgutil, sys, types
name = sys.argv[1]
package = importlib.import_module(name)
# what each public name is before any submodule is imported: a module exported as such (gpuprobe.memory) is fine
before = {n: isinstance(getattr(package, n, None), types.ModuleType) for n in getattr(package, "__all__", [])
          if n in package.__dict__}
for sub in [s for s in pkgutil.iter_modules(package.__path__) if s.name != "__main__"]:
    try:
        importlib.import_module(f"{name}.{sub.name}")
    except ImportError:  # an optional dependency this machine lacks: not a clash either way
        pass
shadowed = [n for n in getattr(package, "__all__", []) if isinstance(getattr(package, n, None), types.ModuleType)
            and n in {s.name for s in pkgutil.iter_modules(package.__path__)} and not before.get(n)]
print(",".join(shadowed))
"""


def test_no_public_name_is_shadowed_by_its_submodule() -> None:
    packages = ["gpuprobe"] + [m.name for m in pkgutil.walk_packages(gpuprobe.__path__, "gpuprobe.") if m.ispkg]
    assert "gpuprobe.experiment" in packages and "gpuprobe.dashboards" in packages
    shadowed = {}
    for name in packages:
        done = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        assert done.returncode == 0, (name, done.stderr[-1500:])
        if done.stdout.strip():
            shadowed[name] = done.stdout.strip()
    assert not shadowed, f"public names that are modules once their submodule is imported: {shadowed}"
