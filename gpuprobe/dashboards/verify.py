"""Run every panel query of Grafana dashboards against a live Prometheus: does each one have data?"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .grafana import fill, is_gpu_only, json_panels, label_values_query, regex_any
from .prometheus_api import Prometheus, PrometheusError, PrometheusUnreachableError

__all__ = ["QueryResult", "variable_values", "verify"]


def variable_values(prom: Prometheus, dashboard: Mapping[str, Any]) -> dict[str, list[str]]:
    """What each ``label_values(...)`` template variable of a dashboard offers, asked of Prometheus.

    Raises:
        ConfigError: a query variable is not a ``label_values(...)`` query.
    """
    out = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = label_values_query(str(var.get("query", "")))
        if query is None:
            raise ConfigError(f"variable {var.get('name')!r}: only label_values(...) queries are supported")
        selector, name = query
        out[var["name"]] = prom.label_values(name, selector or None)
    return out


@dataclasses.dataclass(frozen=True)
class QueryResult:
    """One panel query run against Prometheus.

    Example:
        >>> r = QueryResult("d", "Batch size", "A", "sum(x)", gpu_only=False, series=2)
        >>> r.ok, str(r)
        (True, 'd / Batch size / A: ok (2 series) — sum(x)')
    """

    dashboard: str
    panel: str
    ref: str
    expr: str
    gpu_only: bool
    series: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        """It ran and returned at least one series with a number."""
        return self.error is None and self.series > 0

    def __str__(self) -> str:
        state = "ok" if self.ok else (f"error: {self.error}" if self.error else "no data")
        gpu = " [GPU only]" if self.gpu_only else ""
        return f"{self.dashboard} / {self.panel} / {self.ref}{gpu}: {state} ({self.series} series) — {self.expr}"


def _finite(sample: Mapping[str, Any]) -> bool:
    try:
        return math.isfinite(float(sample["value"][1]))
    except (KeyError, IndexError, TypeError, ValueError):
        return False


def verify(prom: Prometheus | str, dashboards_json: Iterable[Mapping[str, Any]],
           chosen: Mapping[str, Sequence[str]] | None = None, *, rate_interval: str = "1m",
           gpu_only: bool | None = None) -> list[QueryResult]:
    """Run every panel query of the dashboards against Prometheus, variables filled in.

    Each template variable takes the values in ``chosen`` (each must be among those Prometheus
    offers for it, else :class:`ConfigError`), or "All" (``.*``) when not given.

    Args:
        prom: a :class:`Prometheus` client or its URL.
        dashboards_json: Grafana dashboard JSON models.
        chosen: variable name → the values to select.
        rate_interval: what ``$__rate_interval`` becomes.
        gpu_only: None for every panel; True for only GPU-only panels; False for only the others.

    Returns:
        One :class:`QueryResult` per query; ``ok`` tells whether it returned data.

    Raises:
        PrometheusUnreachableError: Prometheus cannot be reached; the message names the URL.
        ConfigError: a chosen value is not offered by the variable's query.

    Example:
        >>> verify("http://127.0.0.1:1", [{"uid": "d", "panels": []}])  # no variables, no panels: no request
        []
    """
    client = prom if isinstance(prom, Prometheus) else Prometheus(prom)
    results = []
    for board in dashboards_json:
        offered = variable_values(client, board)
        values = {}
        for name, offers in offered.items():
            want = list((chosen or {}).get(name, ()))
            missing_values = [v for v in want if v not in offers]
            if missing_values:
                raise ConfigError(f"dashboard {board.get('uid')!r}: variable ${name} does not offer "
                                  f"{missing_values} (Prometheus offers {offers})")
            values[name] = regex_any(want) if want else ".*"
        for panel in json_panels(board):
            flagged = is_gpu_only(panel)
            if gpu_only is not None and flagged != gpu_only:
                continue
            for target in panel.get("targets", []):
                expr = fill(str(target["expr"]), values, rate_interval)
                try:
                    found = sum(1 for s in client.query(expr) if _finite(s))
                    error = None
                except PrometheusUnreachableError:
                    raise
                except PrometheusError as exc:
                    found, error = 0, str(exc)
                results.append(QueryResult(str(board.get("uid")), str(panel.get("title")),
                                           str(target.get("refId")), expr, flagged, found, error))
    return results
