"""How the report's modules import each other: one direction, no cycles, and kernel naming in a
leaf module that the live SDK shares without loading the report. The sections sit between a small
context and the registry: a section imports the context and the table toolkit only, never the
builder nor another section; the builder and the renderers reach sections through the registry.

Imports are read from the source (inside functions and ``TYPE_CHECKING`` blocks too), so an import
cycle is found even where it would not fail at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "gpuprobe" / "report"
SECTIONS = REPORT / "sections"
KERNEL_NAMES = ROOT / "gpuprobe" / "_kernel_names.py"
#: What a section module may import of gpuprobe: the context, the table toolkit, the modules the
#: sections share (``sections/_*.py``) and kernel naming (a leaf).
SECTION_MAY_IMPORT = {"gpuprobe.report._section", "gpuprobe.report._tables", "gpuprobe._kernel_names"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports: ``from X import y`` imports X, and X.y where y is a module."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def report_modules() -> dict[str, Path]:
    return {module_of(p): p for p in REPORT.rglob("*.py")}


def report_graph() -> dict[str, set[str]]:
    modules = report_modules()
    return {name: imported_modules(path) & set(modules) - {name} for name, path in modules.items()}


def gpuprobe_imports(path: Path) -> set[str]:
    """The gpuprobe modules a file imports (``from X import y``: X.y where it is a module, else X)."""
    modules = {module_of(p) for p in (ROOT / "gpuprobe").rglob("*.py")}
    found = imported_modules(path)
    return {m for m in found if m in modules and not any(n in modules and n.startswith(m + ".") for n in found)}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of the graph (as a path that ends where it starts), or [] if there is none."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_the_cycle_finder_finds_a_cycle_of_three_modules() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_report_module_imports_the_report_package_itself() -> None:
    submodules = [p for p in REPORT.rglob("*.py") if p != REPORT / "__init__.py"]
    offenders = sorted(module_of(p) for p in submodules if "gpuprobe.report" in imported_modules(p))
    assert offenders == []


def test_the_report_modules_import_each_other_without_a_cycle() -> None:
    assert find_cycle(report_graph()) == []


def test_kernel_names_import_only_the_standard_library() -> None:
    top_level = {name.split(".")[0] for name in imported_modules(KERNEL_NAMES)}
    assert top_level <= set(sys.stdlib_module_names) | {"__future__"}, top_level


def test_importing_the_kernel_names_loads_no_report_module() -> None:
    code = (
        "import sys, gpuprobe._kernel_names; "
        "print(sorted(m for m in sys.modules if m.startswith('gpuprobe.report')))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def section_modules() -> list[Path]:
    return sorted(p for p in SECTIONS.glob("*.py") if p.name != "__init__.py")


def test_the_import_reader_finds_the_sections_imports() -> None:
    found = gpuprobe_imports(SECTIONS / "kernels.py")
    assert "gpuprobe.report.sections._kernel_rows" in found and "gpuprobe.report._tables" in found
    assert "gpuprobe.report.sections" not in found  # the registry is imported by no section


def test_a_section_imports_the_context_and_the_toolkit_only() -> None:
    shared = {module_of(p) for p in section_modules() if p.name.startswith("_")}
    offenders = {}
    for path in section_modules():
        extra = gpuprobe_imports(path) - SECTION_MAY_IMPORT - shared
        if extra:
            offenders[path.name] = sorted(extra)
    assert offenders == {}


def test_the_context_and_the_toolkit_import_no_section_and_no_builder() -> None:
    above = ("gpuprobe.report.sections", "gpuprobe.report.schema", "gpuprobe.report._analysis",
             "gpuprobe.report._render", "gpuprobe.report._ranks", "gpuprobe.report._diff", "gpuprobe.report.cli")
    for name in ("_section.py", "_tables.py"):
        found = sorted(m for m in imported_modules(REPORT / name) if m.startswith(above))
        assert found == [], name


def test_the_scan_and_the_split_import_no_reader_of_a_trace_format() -> None:
    readers = {"gpuprobe.report._kineto", "gpuprobe.report._nsys", "gpuprobe.report._ncu", "gpuprobe.report.loaders"}
    assert readers <= set(report_modules())
    for name in ("_scan.py", "_split.py"):
        assert sorted(gpuprobe_imports(REPORT / name) & readers) == [], name


def test_the_builder_and_the_renderer_reach_sections_through_the_registry_only() -> None:
    for name in ("_analysis.py", "_render.py"):
        found = sorted(m for m in gpuprobe_imports(REPORT / name) if m.startswith("gpuprobe.report.sections."))
        assert found == [], name
        assert "gpuprobe.report.sections" in imported_modules(REPORT / name), name


def test_the_registry_lists_every_section_module_once_under_its_own_name() -> None:
    from gpuprobe.report import sections

    listed = [s.name for s in sections.REGISTRY]
    modules = sorted(p.stem for p in section_modules() if not p.name.startswith("_"))
    assert sorted(listed) == modules  # a module that is not in the registry, or a name listed twice
    for path in section_modules():
        if not path.name.startswith("_"):
            module = importlib.import_module(f"gpuprobe.report.sections.{path.stem}")
            assert module.SECTION in sections.REGISTRY, path.name


def test_the_report_has_a_field_for_every_section_and_its_json_follows_the_registry() -> None:
    from gpuprobe.report import schema, sections

    fields = {f.name for f in dataclasses.fields(schema.Report)}
    assert fields == set(sections.SECTIONS)
    assert schema.SECTIONS == sections.SECTIONS
