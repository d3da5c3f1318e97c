"""The examples in gpuprobe's docstrings run as shown (doctest): one test per module that has any.

What the docs' pages show is tests/test_docs.py's; this is the ``>>>`` lines of the code's own docstrings,
run as ``python -m doctest`` would (with ``...`` matching anything, as pytest's doctests do).
"""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpuprobe"


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


@pytest.fixture(autouse=True)
def _a_plain_machine(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--simulate-gpu", False) or getattr(sys.modules.get("conftest"), "_machine_sim", None):
        pytest.skip("the examples show what a machine without CUDA prints (torch.cuda.is_available() is False): "
                    "the plain run covers them")


def test_the_modules_are_found() -> None:
    assert "gpuprobe._requests" in MODULES and len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_as_shown(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional dependency this environment lacks
        pytest.skip(f"{name} needs {exc.name or exc}")
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name) if t.examples]
    failures = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        out: list[str] = []
        result = runner.run(test, out=out.append, clear_globs=True)
        if result.failed:
            failures.append("".join(out))
    assert not failures, "\n".join(failures)
