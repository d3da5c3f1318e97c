"""The package's shape: no import cycles (imports inside functions count), the root package imports
no optional dependency, and the live SDK never imports the offline report."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import run_python

PACKAGE = Path(__file__).resolve().parents[1] / "gpuprobe"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the gpuprobe modules it imports, anywhere in its code (functions and TYPE_CHECKING too).

    ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg`` itself.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_package else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in modules else source)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            graph[mod].update(t for t in targets if t in modules and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # gpuprobe/__init__.py imports the Prometheus exporter only inside serve().
    assert "gpuprobe.exporters.prometheus" in graph["gpuprobe"]


def test_the_package_has_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_live_sdk_never_imports_the_report() -> None:
    graph = import_graph()
    offenders = {m: sorted(t for t in targets if t.startswith("gpuprobe.report"))
                 for m, targets in graph.items() if not m.startswith("gpuprobe.report")}
    assert {m: t for m, t in offenders.items() if t} == {}


@pytest.mark.parametrize("extra", ["prometheus_client", "opentelemetry", "nvtx", "transformers", "torch", "numpy",
                                   "ijson", "yaml", "promql_parser", "matplotlib", "pynvml"])
def test_importing_gpuprobe_imports_no_optional_dependency(extra: str) -> None:
    proc = run_python(f"import sys, gpuprobe; print({extra!r} in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_no_two_test_modules_share_a_file_name() -> None:
    # The test folders are not packages: pytest imports each test module by its file name, so two of one
    # name in different folders cannot both be collected in one process ("import file mismatch").
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if "__pycache__" not in path.parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
