"""Fixtures of the monitoring tests: one Prometheus scraping a workload, a GPU fixture and two torchrun ranks.

The stack is started once per session, and only by tests that ask for it (those marked
``prometheus_server``). Every process is stopped by PID (process group) at the end, also on failure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from gpuprobe import dashboards as dash

from .promstack import (
    PROMETHEUS_DIR,
    SIM_INSTANCE,
    Proc,
    Stack,
    ensure_prometheus,
    free_port,
    http_ok,
    start_prometheus,
    start_torchrun,
    start_workload,
    temp_dir,
    wait_until,
)


def _config(single: int, fixture: int, rank_base: int) -> dict:
    rules = [os.path.join(PROMETHEUS_DIR, dash.RULES_FILE), os.path.join(PROMETHEUS_DIR, dash.ALERTS_FILE)]
    cfg = dash.scrape_config(base_port=single, interval="1s", rule_files=rules)
    cfg["scrape_configs"] += dash.scrape_config(ranks=2, base_port=rank_base, job="gpuprobe-ranks")["scrape_configs"]
    cfg["scrape_configs"] += dash.scrape_config(base_port=fixture, job="gpuprobe-gpu-fixture")["scrape_configs"]
    # The same process once more, with the labels an OpenTelemetry Collector's prometheus exporter adds.
    cfg["scrape_configs"].append({
        "job_name": "gpuprobe-otel-sim",
        "static_configs": [{"targets": [f"127.0.0.1:{single}"]}],
        "relabel_configs": [{"target_label": "instance", "replacement": SIM_INSTANCE}],
        "metric_relabel_configs": [{"target_label": "otel_scope_name", "replacement": "gpuprobe"},
                                   {"target_label": "otel_scope_version", "replacement": "0.1.0"}],
    })
    return cfg


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """Prometheus (1 s scrapes, the shipped rules) over the workload, the GPU fixture and two ranks."""
    ensure_prometheus()
    procs: list[Proc] = []
    with temp_dir() as work, contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: [p.stop() for p in reversed(procs)])
        single, fixture, rank_base, prom_port = free_port(), free_port(), free_port(2), free_port()
        procs.append(start_workload("workload", work, "--port", str(single)))
        procs.append(start_workload("gpu-fixture", work, "--port", str(fixture), "--gpu-fixture"))
        procs.append(start_torchrun(work, 2, "--port", str(rank_base), "--pause", "0.3"))
        procs.append(start_prometheus(_config(single, fixture, rank_base), work, prom_port))
        url = f"http://127.0.0.1:{prom_port}"
        wait_until("Prometheus to be ready", lambda: http_ok(f"{url}/-/ready"), 60, tuple(procs))
        ranks = [f"127.0.0.1:{rank_base}", f"127.0.0.1:{rank_base + 1}"]
        for target in [f"127.0.0.1:{single}", f"127.0.0.1:{fixture}", *ranks]:
            wait_until(f"gpuprobe /metrics at {target}", lambda t=target: http_ok(f"http://{t}/metrics"), 120,
                       tuple(procs))
        yield Stack(dash.Prometheus(url), f"127.0.0.1:{single}", f"127.0.0.1:{fixture}", ranks, SIM_INSTANCE,
                    procs, single)
