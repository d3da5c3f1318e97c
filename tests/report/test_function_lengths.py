"""No function of the report is longer than a screenful or two: 120 lines from its ``def`` to its last
line (its docstring and comments included), read from the source with ``ast``, methods and nested
functions alike."""

from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "gpuprobe" / "report"
MOST_LINES = 120


def long_functions(source: str, most: int = MOST_LINES) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function of ``source`` longer than ``most`` lines."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > most:
                        found.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_no_report_function_is_longer_than_120_lines() -> None:
    offenders = {}
    for path in sorted(REPORT.rglob("*.py")):
        for name, lines in long_functions(path.read_text(encoding="utf-8")):
            offenders[f"{path.relative_to(REPORT)}:{name}"] = lines
    assert offenders == {}


def test_the_length_reader_finds_a_long_method_and_a_long_nested_function() -> None:
    six = ["x = 1"] * 6
    lines = ["class A:", "    def m(self):", *("        " + x for x in six),  # 7 lines
             "def outer():", "    def inner():", *("        " + x for x in six), "    return inner",  # 9 and 7
             "def short():", "    return 1"]
    found = dict(long_functions("\n".join(lines) + "\n", most=5))
    assert found == {"A.m": 7, "outer": 9, "outer.inner": 7}
