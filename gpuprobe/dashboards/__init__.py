"""Grafana dashboards, Prometheus rules and scrape configurations for gpuprobe's metrics.

Everything here is generated from :data:`gpuprobe._metrics.SPECS` and
:func:`gpuprobe._metrics.prometheus_name`, so every query names a series gpuprobe really exports::

    python -m gpuprobe dashboard                  # write deploy/grafana/dashboards/*.json
                                                  # and deploy/prometheus/*.yml
    python -m gpuprobe dashboard --check          # fail if the files on disk differ from the generator
    python -m gpuprobe dashboard --scrape-config --ranks 8 --base-port 9464
    python -m gpuprobe dashboard --verify http://127.0.0.1:9090   # does every panel have data?

Quantile and mean panels read recording rules (``gpuprobe:<series>:p95_rate1m`` ...) from
``gpuprobe-rules.yml``; ``--inline-quantiles`` writes dashboards that compute them in the query
instead, for a Prometheus whose rules you cannot change. Panels whose series only a GPU produces
(device-clock step times, the CUDA caching allocator's reserved memory) say so: their description
starts with :data:`GPU_ONLY`; panels that wait for an event or a setting (errors, continuous batching,
the sync audit, service-level goals, ...) end with the sentence of their :class:`NoData` reason, which
``--verify`` lists; panels only ``generate()`` calls feed say so (:data:`GENERATE_ONLY`), and ``--verify``
excuses them where Prometheus shows continuous batching and no ``generate()`` call.

One module per concern, each importing only those before it in this list:

- :mod:`.series` — Prometheus series and label names of gpuprobe's metrics
- :mod:`.rules` — recording and alert rules
- :mod:`.model` — dashboards, rows, panels, targets
- :mod:`.panels` — what gpuprobe's dashboards contain
- :mod:`.grafana` — the Grafana JSON model: rendering, reading panels, filling variables
- :mod:`.prometheus_config` — scrape configurations
- :mod:`.yaml_emit` — YAML text, with PyYAML
- :mod:`.files` — the generated files: text, atomic writes, differences
- :mod:`.promql` — query checks, with a PromQL parser
- :mod:`.prometheus_api` — an HTTP client of Prometheus
- :mod:`.verify` — every panel query against a live Prometheus
- :mod:`.doc_tables` — the Markdown tables of docs/grafana.md
- :mod:`.cli` — ``python -m gpuprobe dashboard``

PyYAML and promql-parser (the ``dashboard`` extra) are imported only when YAML is written or a
query is checked; without them the Grafana JSON can still be generated, and the rest raises
:class:`~gpuprobe.errors.MissingDependencyError` naming the extra.
"""

from __future__ import annotations

from .cli import main
from .doc_tables import gpu_panels_table, mapping_table
from .files import DASHBOARD_DIR, PROMETHEUS_DIR, dashboard_files, prometheus_files
from .grafana import fill, is_generate_only, is_gpu_only, json_panels, no_data_reason, regex_any, render
from .model import (
    EXEMPLARS_NOTE,
    GENERATE_ONLY,
    GPU_ONLY,
    NO_DATA_REASONS,
    NO_GENERATE_CALL,
    Dashboard,
    NoData,
    Panel,
    Row,
    Target,
)
from .panels import dashboards, overview, ranks
from .prometheus_api import (
    MAX_ANSWER_BYTES,
    Prometheus,
    PrometheusAnswerError,
    PrometheusError,
    PrometheusUnreachableError,
)
from .prometheus_config import DEFAULT_PORT, scrape_config
from .promql import InvalidQueryError, check_queries, check_rules, metric_names
from .rules import (
    ALERTS_FILE,
    BURN_RATES,
    LATENCIES,
    RULES_FILE,
    SLO_OBJECTIVE,
    TTFT_ALERT_SECONDS,
    BurnRate,
    Latency,
    alert_rules,
    miss_ratio_name,
    recorded_name,
    recorded_series,
    recording_rules,
)
from .series import exported_series, label, model_label, series
from .verify import QueryResult, continuous_batching_only, summary, variable_values, verify
from .yaml_emit import to_yaml

__all__ = [
    "Target",
    "Panel",
    "Row",
    "Dashboard",
    "Latency",
    "LATENCIES",
    "GPU_ONLY",
    "GENERATE_ONLY",
    "EXEMPLARS_NOTE",
    "NoData",
    "NO_DATA_REASONS",
    "NO_GENERATE_CALL",
    "RULES_FILE",
    "ALERTS_FILE",
    "DASHBOARD_DIR",
    "PROMETHEUS_DIR",
    "DEFAULT_PORT",
    "TTFT_ALERT_SECONDS",
    "SLO_OBJECTIVE",
    "BurnRate",
    "BURN_RATES",
    "miss_ratio_name",
    "label",
    "model_label",
    "series",
    "exported_series",
    "recorded_name",
    "recorded_series",
    "overview",
    "ranks",
    "dashboards",
    "render",
    "dashboard_files",
    "prometheus_files",
    "recording_rules",
    "alert_rules",
    "scrape_config",
    "to_yaml",
    "metric_names",
    "check_queries",
    "check_rules",
    "InvalidQueryError",
    "is_gpu_only",
    "is_generate_only",
    "no_data_reason",
    "json_panels",
    "fill",
    "regex_any",
    "Prometheus",
    "PrometheusError",
    "PrometheusUnreachableError",
    "PrometheusAnswerError",
    "MAX_ANSWER_BYTES",
    "QueryResult",
    "variable_values",
    "continuous_batching_only",
    "verify",
    "summary",
    "mapping_table",
    "gpu_panels_table",
    "main",
]
