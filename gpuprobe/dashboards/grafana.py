"""The Grafana JSON model: rendering a :class:`~.model.Dashboard`, and reading panels and variables back.

Rendering needs nothing outside the standard library, so JSON dashboards can be generated without
the ``dashboard`` extra.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError
from .model import GENERATE_ONLY, GPU_ONLY, NEEDS_GPU, NO_DATA_REASONS, Dashboard, NoData, Panel
from .series import RANK, label, series

__all__ = [
    "render",
    "json_panels",
    "is_gpu_only",
    "is_generate_only",
    "no_data_reason",
    "regex_any",
    "fill",
    "BUILTIN_VARIABLES",
    "label_values_query",
]

_DS = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH, _HEIGHT, _PER_ROW = 8, 8, 3


def _variables() -> list[dict[str, Any]]:
    any_series = f'{{{RANK}=~".+"}}'
    model = f"label_values({series('gen_ai.server.request.duration', 'count')}, {label('gen_ai.request.model')})"
    queries = (("model", "Model", model),
               ("rank", "Rank", f"label_values({any_series}, {RANK})"),
               ("instance", "Instance", f"label_values({any_series}, instance)"))
    out: list[dict[str, Any]] = [{
        "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": "",
    }]
    for name, text, query in queries:
        out.append({
            "name": name, "label": text, "type": "query", "datasource": _DS, "query": query,
            "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "hide": 0,
            "sort": 3 if name == "rank" else 1, "regex": "",
        })
    return out


def _description(panel: Panel) -> str:
    """The panel's description, with the sentence of its documented reason to be empty (see :func:`no_data_reason`)
    and, for a panel only generate() calls feed, :data:`~.model.GENERATE_ONLY` (see :func:`is_generate_only`)."""
    text = panel.description
    if panel.generate_only:
        text = f"{text} {GENERATE_ONLY}"
    if panel.no_data is not None:
        text = f"{text} {panel.no_data.sentence}"
    return text


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    refs = "ABCDEFGHIJ"
    return {
        "id": pid, "type": "timeseries", "title": panel.title, "description": _description(panel),
        "datasource": _DS, "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit, "min": 0,
                "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 40 if panel.stack else 10,
                           "showPoints": "never", "spanNulls": False,
                           "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": refs[i], "datasource": _DS, "expr": t.expr, "legendFormat": t.legend,
                     "range": True, "instant": False, "editorMode": "code",
                     **({"exemplar": True} if t.exemplar else {})}
                    for i, t in enumerate(panel.targets)],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The Grafana JSON model of a dashboard (schema version 39; Grafana 10 and later).

    Example:
        >>> from gpuprobe.dashboards.panels import overview
        >>> render(overview())["uid"]
        'gpuprobe-overview'
    """
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in dashboard.rows:
        if len(dashboard.rows) > 1:
            panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
            pid, y = pid + 1, y + 1
        for i, panel in enumerate(row.panels):
            x = (i % _PER_ROW) * _WIDTH
            panels.append(_panel_json(panel, pid, x, y + (i // _PER_ROW) * _HEIGHT))
            pid += 1
        y += math.ceil(len(row.panels) / _PER_ROW) * _HEIGHT
    return {
        "uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
        "tags": ["gpuprobe", "gen-ai"], "timezone": "", "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-15m", "to": "now"},
        "links": [], "annotations": {"list": []}, "templating": {"list": _variables()}, "panels": panels,
    }


def is_gpu_only(panel: Mapping[str, Any]) -> bool:
    """Whether a Grafana panel (JSON) is marked as needing a GPU (its description starts with :data:`GPU_ONLY`).

    Example:
        >>> is_gpu_only({"description": "GPU only. Device clock."}), is_gpu_only({"title": "x"})
        (True, False)
    """
    return str(panel.get("description", "")).startswith(GPU_ONLY)


def is_generate_only(panel: Mapping[str, Any]) -> bool:
    """Whether a Grafana panel (JSON) says only generate() calls feed it (its description holds
    :data:`~.model.GENERATE_ONLY`).

    Example:
        >>> is_generate_only({"description": "Mean sequences per call. " + GENERATE_ONLY})
        True
    """
    return GENERATE_ONLY in str(panel.get("description", ""))


def no_data_reason(panel: Mapping[str, Any]) -> NoData | None:
    """The documented reason a Grafana panel (JSON) may show no data, read from its description: :data:`NEEDS_GPU`
    when it begins with :data:`GPU_ONLY`, else the first of :data:`NO_DATA_REASONS` whose sentence it holds.

    Example:
        >>> no_data_reason({"description": "Sync audit. No data while the sync audit is off "
        ...                                "(GPUPROBE_SYNC_AUDIT=N turns it on)."}).reason
        'sync audit off'
        >>> no_data_reason({"description": "Batch size."}) is None
        True
    """
    text = str(panel.get("description", ""))
    if text.startswith(GPU_ONLY):
        return NEEDS_GPU
    return next((r for r in NO_DATA_REASONS if r is not NEEDS_GPU and r.sentence in text), None)


def json_panels(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The panels of a Grafana dashboard JSON model, rows left out (panels of collapsed rows included).

    Example:
        >>> board = {"panels": [{"type": "row", "panels": [{"title": "inside"}]}, {"title": "top"}]}
        >>> [p["title"] for p in json_panels(board)]
        ['inside', 'top']
    """
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return [p for p in out if p.get("type") != "row"]


def regex_any(values: Iterable[str]) -> str:
    """A PromQL regex matching exactly these values (what Grafana puts for a multi-value variable).

    Example:
        >>> regex_any(["a", "b"])
        '(a|b)'
    """
    escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", v).replace("\\", "\\\\") for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


BUILTIN_VARIABLES = ("__rate_interval", "__interval", "__range")
"""Grafana's own variables that gpuprobe's queries may use; each stands for a duration."""

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def fill(expr: str, values: Mapping[str, str], rate_interval: str = "1m") -> str:
    """Substitute Grafana variables in a query: ``$name`` / ``${name}`` by regexes, ``$__rate_interval``.

    Raises:
        ConfigError: the query uses a variable ``values`` has no value for.

    Example:
        >>> fill('rate(x{m=~"$model"}[$__rate_interval])', {"model": ".*"})
        'rate(x{m=~".*"}[1m])'
    """
    table = {**{name: rate_interval for name in BUILTIN_VARIABLES}, **values}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in table:
            raise ConfigError(f"no value for the dashboard variable ${name} in {expr!r}")
        return table[name]

    return _VARIABLE.sub(sub, expr)


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*?)\s*,\s*)?(\w+)\s*\)\s*$")


def label_values_query(query: str) -> tuple[str, str] | None:
    """The series selector (maybe empty) and label of a ``label_values(...)`` variable query, or None.

    Example:
        >>> label_values_query('label_values(up{job="x"}, instance)')
        ('up{job="x"}', 'instance')
        >>> label_values_query("label_values(instance)"), label_values_query("query_result(up)")
        (('', 'instance'), None)
    """
    m = _LABEL_VALUES.match(query)
    return (m.group(1) or "", m.group(2)) if m else None
