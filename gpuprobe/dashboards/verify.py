"""Run every panel query of Grafana dashboards against a live Prometheus: does each one have data?"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .grafana import fill, is_generate_only, is_gpu_only, json_panels, label_values_query, no_data_reason, regex_any
from .model import NO_DATA_REASONS, NO_GENERATE_CALL
from .prometheus_api import Prometheus, PrometheusAnswerError, PrometheusError, PrometheusUnreachableError
from .series import RANK, braces, model_label, series

__all__ = ["QueryResult", "variable_values", "continuous_batching_only", "verify", "summary"]


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

    Attributes:
        no_data: the panel's documented reason to show no data (``"needs a GPU"``, ``"waits for an
            error"``, ...; see :data:`~.model.NO_DATA_REASONS`), or None.

    Example:
        >>> r = QueryResult("d", "Batch size", "A", "sum(x)", gpu_only=False, series=2)
        >>> r.ok, str(r)
        (True, 'd / Batch size / A: ok (2 series) — sum(x)')
        >>> r = QueryResult("d", "Errors", "A", "sum(y)", gpu_only=False, series=0, no_data="waits for an error")
        >>> r.excused, str(r)
        (True, 'd / Errors / A [waits for an error]: no data (0 series) — sum(y)')
    """

    dashboard: str
    panel: str
    ref: str
    expr: str
    gpu_only: bool
    series: int
    error: str | None = None
    no_data: str | None = None

    @property
    def ok(self) -> bool:
        """It ran and returned at least one series with a number."""
        return self.error is None and self.series > 0

    @property
    def excused(self) -> bool:
        """It ran and returned nothing, in a panel documented to be empty for a reason (``no_data``)."""
        return self.error is None and self.series == 0 and self.no_data is not None

    def __str__(self) -> str:
        state = "ok" if self.ok else (f"error: {self.error}" if self.error else "no data")
        why = f" [{self.no_data}]" if self.no_data else ""
        return f"{self.dashboard} / {self.panel} / {self.ref}{why}: {state} ({self.series} series) — {self.expr}"


def _finite(sample: Mapping[str, Any]) -> bool:
    try:
        return math.isfinite(float(sample["value"][1]))
    except (KeyError, IndexError, TypeError, ValueError):
        return False


# What only a generate() call records (its batch size, at its first step), and what only continuous batching
# records (the requests of each scheduler step).
_GENERATE_CALLS = "gpuprobe.step.batch_size"
_CONTINUOUS_STEPS = "gpuprobe.batch.requests"


def _recorded(client: Prometheus, metric: str, values: Mapping[str, str]) -> bool:
    """Whether the processes the variables select recorded ``metric`` (a histogram) at least once."""
    model = model_label(metric)
    matchers = (*((f'{model}=~"$model"',) if model and "model" in values else ()),
                *((f'{RANK}=~"$rank"',) if "rank" in values else ()),
                *(('instance=~"$instance"',) if "instance" in values else ()))
    expr = fill(f"count({series(metric, 'count')}{braces(matchers)} > 0)", values)
    return any(_finite(s) for s in client.query(expr))


def continuous_batching_only(client: Prometheus, values: Mapping[str, str]) -> bool:
    """Whether the processes the variables select ran continuous batching and made no ``generate()`` call
    (then a :attr:`~.model.Panel.generate_only` panel has nothing to show: :data:`~.model.NO_GENERATE_CALL`)."""
    return not _recorded(client, _GENERATE_CALLS, values) and _recorded(client, _CONTINUOUS_STEPS, values)


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
        One :class:`QueryResult` per query; ``ok`` tells whether it returned data, ``excused`` whether it
        returned none in a panel documented to be empty for a reason.

    Raises:
        PrometheusUnreachableError: Prometheus cannot be reached; the message names the URL.
        PrometheusAnswerError: what answers at the URL is not a Prometheus API answer (larger than
            :data:`~.prometheus_api.MAX_ANSWER_BYTES`, not JSON, nested too deeply, JSON of another
            shape); the message names the URL and what was wrong.
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
        only_batching: bool | None = None  # asked once per dashboard, when a generate()-only panel comes
        for panel in json_panels(board):
            flagged = is_gpu_only(panel)
            if gpu_only is not None and flagged != gpu_only:
                continue
            reason = no_data_reason(panel)
            if reason is None and is_generate_only(panel):
                if only_batching is None:
                    only_batching = continuous_batching_only(client, values)
                if only_batching:
                    reason = NO_GENERATE_CALL
            for target in panel.get("targets", []):
                expr = fill(str(target["expr"]), values, rate_interval)
                try:
                    found = sum(1 for s in client.query(expr) if _finite(s))
                    error = None
                except (PrometheusUnreachableError, PrometheusAnswerError):
                    raise  # not one query's failure: the server cannot be asked, or is not Prometheus
                except PrometheusError as exc:
                    found, error = 0, str(exc)
                results.append(QueryResult(str(board.get("uid")), str(panel.get("title")),
                                           str(target.get("refId")), expr, flagged, found, error,
                                           reason.reason if reason else None))
    return results


def _panels(results: Sequence[QueryResult], of: Sequence[QueryResult]) -> list[str]:
    """``dashboard / panel`` of each panel among ``results``, with how many of its queries when not all."""
    total: dict[tuple[str, str], int] = {}
    for r in of:
        total[(r.dashboard, r.panel)] = total.get((r.dashboard, r.panel), 0) + 1
    picked: dict[tuple[str, str], int] = {}
    for r in results:
        picked[(r.dashboard, r.panel)] = picked.get((r.dashboard, r.panel), 0) + 1
    return [f"{d} / {p}" + ("" if n == total[(d, p)] else f" ({n} of its {total[(d, p)]} queries)")
            for (d, p), n in picked.items()]


def _queries(n: int) -> str:
    return f"{n} {'query' if n == 1 else 'queries'}"


def summary(results: Sequence[QueryResult]) -> tuple[list[str], bool]:
    """What ``--verify`` prints after the queries: the true count of queries with data, the panels empty
    for a documented reason listed by reason, and the failures (a query Prometheus refused, or no data in
    a panel with no documented reason to be empty).

    Returns:
        The lines, and whether anything failed.

    Example:
        >>> ok = QueryResult("d", "Batch size", "A", "x", gpu_only=False, series=1)
        >>> gpu = QueryResult("d", "SM clock", "A", "y", gpu_only=True, series=0, no_data="needs a GPU")
        >>> lines, failed = summary([ok, gpu])
        >>> print("\\n".join(lines)); failed
        1 of 2 queries returned data.
        1 query returned no data in panels that are empty for a documented reason:
          needs a GPU (1 query):
            d / SM clock
        False
    """
    lines = [f"{sum(r.ok for r in results)} of {_queries(len(results))} returned data."]
    excused = [r for r in results if r.excused]
    if excused:
        lines.append(f"{_queries(len(excused))} returned no data in panels that are empty for a documented reason:")
        known = [r.reason for r in (*NO_DATA_REASONS, NO_GENERATE_CALL)]
        for reason in sorted({r.no_data for r in excused}, key=lambda x: (known.index(x) if x in known else 99, x)):
            these = [r for r in excused if r.no_data == reason]
            lines.append(f"  {reason} ({_queries(len(these))}):")
            lines.extend(f"    {panel}" for panel in _panels(these, results))
    errors = [r for r in results if r.error is not None]
    empty = [r for r in results if r.error is None and not r.ok and r.no_data is None]
    if empty:
        lines.append(f"{_queries(len(empty))} returned no data in panels with no documented reason to be empty:")
        lines.extend(f"  {r.dashboard} / {r.panel} / {r.ref}" for r in empty)
    if errors:
        lines.append(f"{_queries(len(errors))} failed:")
        lines.extend(f"  {r.dashboard} / {r.panel} / {r.ref}: {r.error}" for r in errors)
    return lines, bool(empty or errors)
