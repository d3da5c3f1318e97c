"""Checks of the PromQL in dashboards and rules, with a real PromQL parser (``promql-parser``, the
``dashboard`` extra): every query must parse, and name only series gpuprobe exports or records.

The only module of gpuprobe that imports ``promql_parser``; it does so on first use. Grafana's
template variables are not PromQL: before parsing, a variable outside a string literal stands in as
``1m`` where a duration goes (``$__rate_interval``, ``[$window]``) and as ``0`` elsewhere; inside a
string literal (``instance=~"$instance"``) it is left as it is.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import GpuprobeError, missing
from .grafana import BUILTIN_VARIABLES, json_panels, label_values_query
from .rules import recorded_series
from .series import exported_series

__all__ = ["InvalidQueryError", "parse", "metric_names", "variable_names", "check_queries", "check_rules"]

TARGET_SERIES = ("up",)
"""Series Prometheus itself writes for every scrape target, which rules may read."""


class InvalidQueryError(GpuprobeError, ValueError):
    """A query is not valid PromQL; the message gives the parser's reason and the query."""


@functools.lru_cache(maxsize=None)
def _promql_parser() -> Any:
    try:
        import promql_parser
    except ImportError:
        raise missing("promql-parser", "dashboard") from None
    return promql_parser


# A string literal (left alone), or a Grafana variable outside one.
_LITERAL_OR_VARIABLE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|\$\{(\w+)(?::\w+)?\}|\$(\w+)')
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def variable_names(expr: str) -> list[str]:
    """The Grafana variables a query uses, in order, each once.

    Example:
        >>> variable_names('rate(x{m=~"$model", r=~"${rank}"}[$__rate_interval]) / on() $model')
        ['model', 'rank', '__rate_interval']
    """
    return list(dict.fromkeys(m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr)))


def _stand_ins(expr: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name is None:
            return m.group()  # a string literal
        before = expr[:m.start()].rstrip()[-1:]
        return "1m" if name in BUILTIN_VARIABLES or before in ("[", ":") else "0"

    return _LITERAL_OR_VARIABLE.sub(sub, expr)


def parse(expr: str) -> Any:
    """Parse a query (Grafana variables allowed) into ``promql_parser``'s syntax tree.

    Raises:
        InvalidQueryError: the query is not valid PromQL; the message says why and quotes it.
        MissingDependencyError: promql-parser is not installed (``pip install 'gpuprobe[dashboard]'``).

    Example:
        >>> type(parse("sum(rate(x[$__rate_interval]))")).__name__
        'AggregateExpr'
        >>> parse("sum(rate(x[1m])")
        Traceback (most recent call last):
        ...
        gpuprobe.dashboards.promql.InvalidQueryError: not valid PromQL (unclosed left parenthesis): sum(rate(x[1m])
    """
    parser = _promql_parser()
    try:
        return parser.parse(_stand_ins(expr))
    except ValueError as exc:
        raise InvalidQueryError(f"not valid PromQL ({exc}): {expr}") from None


def metric_names(expr: str) -> list[str]:
    """The metric names a PromQL expression reads, in order, each once.

    Raises:
        InvalidQueryError: the query is not valid PromQL.

    Example:
        >>> metric_names('sum by (le) (rate(foo_bucket{job="x"}[5m])) / scalar(bar) + {__name__="baz"}')
        ['foo_bucket', 'bar', 'baz']
    """
    parser = _promql_parser()
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, parser.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers
                                      if m.name == "__name__" and m.op == parser.MatchOp.Equal), None)
            if name and name not in names:
                names.append(name)

    parser.walk(parse(expr), visit)
    return names


def _unknown(name: str, allowed: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{name} is not a series gpuprobe exports or records{hint}"


def _problems(where: str, expr: str, allowed: set[str]) -> list[str]:
    try:
        names = metric_names(expr)
    except InvalidQueryError as exc:
        return [f"{where}: {exc}"]
    return [f"{where}: {_unknown(name, allowed)}" for name in names if name not in allowed]


def check_queries(dashboard: Mapping[str, Any], known: Iterable[str] | None = None) -> list[str]:
    """Problems with a dashboard's queries: invalid PromQL, unknown variables, unknown metric names.

    Args:
        dashboard: a Grafana dashboard JSON model.
        known: the series names allowed; default :func:`~.series.exported_series` plus
            :func:`~.rules.recorded_series`.

    Returns:
        One message per problem, naming the dashboard, panel (or variable) and query; empty when all is well.

    Example:
        >>> check_queries({"uid": "d", "panels": [{"title": "p", "targets": [{"refId": "A", "expr": "nope"}]}]})[0]
        "dashboard 'd', panel 'p', query A: nope is not a series gpuprobe exports or records"
    """
    allowed = set(exported_series()) | recorded_series() if known is None else set(known)
    variables = dashboard.get("templating", {}).get("list", [])
    defined = {*BUILTIN_VARIABLES, *(str(v.get("name")) for v in variables)}
    problems = []
    for panel in json_panels(dashboard):
        for target in panel.get("targets", []):
            where = f"dashboard {dashboard.get('uid')!r}, panel {panel.get('title')!r}, query {target.get('refId')}"
            expr = str(target.get("expr", ""))
            problems += [f"{where}: ${name} is not a variable of the dashboard"
                         for name in variable_names(expr) if name not in defined]
            problems += _problems(where, expr, allowed)
    for var in variables:
        query = label_values_query(str(var.get("query", ""))) if var.get("type") == "query" else None
        if query and query[0]:
            problems += _problems(f"dashboard {dashboard.get('uid')!r}, variable {var.get('name')!r}", query[0],
                                  allowed)
    return problems


def check_rules(rules: Mapping[str, Any], known: Iterable[str] | None = None) -> list[str]:
    """Problems with the expressions of a Prometheus rule file: invalid PromQL, unknown metric names.

    Args:
        rules: a rule file's content (``{"groups": [{"name": ..., "rules": [...]}]}``).
        known: the series names allowed; default what gpuprobe exports or records, and ``up``.

    Example:
        >>> check_rules({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0 and"}]}]})
        ["rule group 'g', alert 'A': not valid PromQL (invalid promql query): up == 0 and"]
    """
    allowed = set(exported_series()) | recorded_series() | set(TARGET_SERIES) if known is None else set(known)
    problems = []
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            kind = "alert" if "alert" in rule else "record"
            where = f"rule group {group.get('name')!r}, {kind} {rule.get(kind)!r}"
            problems += _problems(where, str(rule.get("expr", "")), allowed)
    return problems
