"""The service-level-goal panels and burn-rate rules, and ``gpuprobe dashboard --verify`` on a process that
only runs continuous batching: the burn-rate alerts fire as promtool's unit tests expect; on a real
Prometheus (Debian's package) scraping a continuous-batching workload with goals set, ``--verify`` exits 0,
naming the generate()-only panels' reason, and the goodput panel reads what the workload's /metrics says."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuprobe import dashboards as dash
from gpuprobe.dashboards.model import GENERATE_ONLY, NO_GENERATE_CALL, NO_SERVICE_LEVEL_GOALS
from gpuprobe.errors import ConfigError

from .promstack import (
    DASHBOARD_DIR,
    HERE,
    PROMETHEUS_DIR,
    PROMTOOL,
    Proc,
    ensure_prometheus,
    free_port,
    http_ok,
    shipped_dashboards,
    start_prometheus,
    temp_dir,
    wait_until,
)

WORKLOAD = os.path.join(HERE, "continuous_workload.py")


# -- the rules and panels, without a server ------------------------------------------------------------------

def test_burn_rate_alerts_fire_as_their_unit_tests_expect() -> None:
    ensure_prometheus()
    done = subprocess.run([PROMTOOL, "test", "rules", os.path.join(HERE, "slo_alerts_test.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_burn_rate_alert_reads_two_recorded_windows_at_its_rate_times_the_budget() -> None:
    alerts = {r["alert"]: r for r in dash.alert_rules()["groups"][0]["rules"]}
    recorded = {r["record"] for g in dash.recording_rules()["groups"] for r in g["rules"]}
    for burn in dash.BURN_RATES:
        threshold = burn.rate * (1 - dash.SLO_OBJECTIVE)
        long, short = dash.miss_ratio_name(burn.long), dash.miss_ratio_name(burn.short)
        assert {long, short} <= recorded
        expr = alerts[burn.alert]["expr"]
        assert re.fullmatch(rf"{re.escape(long)} > ([\d.]+) and {re.escape(short)} > ([\d.]+)", expr), expr
        assert [float(x) for x in re.findall(r"> ([\d.]+)", expr)] == [pytest.approx(threshold)] * 2


def test_another_objective_moves_every_threshold() -> None:
    rules = {r["alert"]: r["expr"] for r in dash.alert_rules(slo_objective=0.999)["groups"][0]["rules"]}
    assert rules["GpuprobeErrorBudgetBurnFast"].endswith("rate5m > 0.0144")
    assert rules["GpuprobeErrorBudgetBurnSlow"].endswith("rate6h > 0.001")


@pytest.mark.parametrize("objective", [0, 1, 1.5, -0.1])
def test_an_objective_that_is_not_a_share_is_refused(objective: float) -> None:
    with pytest.raises(ConfigError, match="between 0 and 1"):
        dash.alert_rules(slo_objective=objective)


def test_the_goal_panels_wait_for_goals_and_read_the_goal_counter() -> None:
    row = next(r for r in dash.overview().rows if r.title == "Service-level goals")
    assert [p.title for p in row.panels] == ["Goodput", "Requests missing their goals", "Error-budget burn rate"]
    for panel in row.panels:
        assert panel.no_data is NO_SERVICE_LEVEL_GOALS
        assert all("gpuprobe_requests_slo_total" in t.expr for t in panel.targets)


def test_generate_only_panels_say_so_and_no_other_does() -> None:
    only = {p.title for d in dash.dashboards() for p in d.panels if p.generate_only}
    assert only == {"Requests in flight", "Batch size", "KV cache size", "KV cache sequence length",
                    "Logits processors: share of step time", "Requests in flight by rank"}
    for board in shipped_dashboards():
        for panel in dash.json_panels(board):
            assert dash.is_generate_only(panel) == (panel["title"] in only), panel["title"]
            # a conditional excuse: never read back as a reason the panel always has
            assert dash.no_data_reason(panel) is not NO_GENERATE_CALL


def test_the_conditional_reason_is_not_a_panels_own() -> None:
    with pytest.raises(ValueError, match="generate_only=True"):
        dash.Panel("p", "d", (), no_data=NO_GENERATE_CALL)
    assert NO_GENERATE_CALL.sentence == GENERATE_ONLY


def test_docs_name_the_conditional_reason_and_the_burn_rate_alerts() -> None:
    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "grafana.md"), encoding="utf-8") as f:
        doc = f.read()
    assert NO_GENERATE_CALL.reason in doc
    for burn in dash.BURN_RATES:
        assert f"`{burn.alert}`" in doc


# -- a continuous-batching workload scraped by a real Prometheus ---------------------------------------------------

def _query(url: str, expr: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return [s for s in body["data"]["result"] if math.isfinite(float(s["value"][1]))]


def _all(expr: str) -> str:
    out = expr.replace("$__rate_interval", "1m")
    for name in ("model", "rank", "instance"):
        out = out.replace(f"${name}", ".*")
    return out


@pytest.fixture(scope="module")
def continuous() -> Iterator[tuple[str, int]]:
    """A Prometheus (1 s scrapes, the shipped rules) over the continuous-batching workload, whose goals
    every request meets (an hour for the first token and for the whole request); its URL and the
    workload's port."""
    ensure_prometheus()
    with temp_dir() as work, contextlib.ExitStack() as cleanup:
        port, prom_port = free_port(), free_port()
        workload = Proc("continuous", [sys.executable, WORKLOAD, "--port", str(port)],
                        os.path.join(work, "continuous.log"), env={"GPUPROBE_SLO_TTFT": "1h", "GPUPROBE_SLO_E2E": "1h"})
        cleanup.callback(workload.stop)
        rules = [os.path.join(PROMETHEUS_DIR, dash.RULES_FILE), os.path.join(PROMETHEUS_DIR, dash.ALERTS_FILE)]
        prom = start_prometheus(dash.scrape_config(base_port=port, interval="1s", rule_files=rules), work, prom_port)
        cleanup.callback(prom.stop)
        url = f"http://127.0.0.1:{prom_port}"
        wait_until("Prometheus to be ready", lambda: http_ok(f"{url}/-/ready"), 60, (workload, prom))
        wait_until("the workload's /metrics", lambda: http_ok(f"http://127.0.0.1:{port}/metrics"), 180,
                   (workload, prom))
        yield url, port


@pytest.mark.prometheus_server
@pytest.mark.slow
def test_verify_passes_on_continuous_batching_naming_the_generate_only_panels(
        continuous: tuple[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = continuous
    only = {f"{d.uid} / {p.title}" for d in dash.dashboards() for p in d.panels if p.generate_only}
    deadline = time.monotonic() + 240
    while True:  # until the workload's series fill the 1 minute windows
        code = dash.main(["--verify", url, "--out", DASHBOARD_DIR])
        out = capsys.readouterr().out
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert code == 0, out
    assert "with no documented reason" not in out
    head = f"  {NO_GENERATE_CALL.reason} ("
    assert head in out, out
    listed = set()
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        listed.add(re.sub(r" \(\d+ of its \d+ queries\)$", "", line.strip()))
    # Exactly the generate()-only panels whose queries Prometheus, asked here, finds empty.
    empty = {f"{b['uid']} / {p['title']}" for b in shipped_dashboards() for p in dash.json_panels(b)
             if p["title"] in {t.split(" / ")[1] for t in only}
             and any(not _query(url, _all(t["expr"])) for t in p["targets"])}
    assert listed == empty and listed <= only and listed
    # The memory gauges are read under continuous batching: the memory panels have data.
    memory = next(p for b in shipped_dashboards() for p in dash.json_panels(b) if p["title"] == "Memory allocated and peak")
    assert all(_query(url, _all(t["expr"])) for t in memory["targets"])


@pytest.mark.prometheus_server
@pytest.mark.slow
def test_goodput_reads_what_the_workload_counted(continuous: tuple[str, int]) -> None:
    url, port = continuous
    wait_until("requests counted against their goals",
               lambda: bool(_query(url, 'sum(rate(gpuprobe_requests_slo_total{result="met"}[1m])) > 0')), 180)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    counted = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^gpuprobe_requests_slo_total\{[^}]*result="(\w+)"[^}]*\} (\S+)$', text, re.M)}
    assert counted["met"] > 0 and sum(v for k, v in counted.items() if k != "met") == 0  # an hour: all met
    goodput = next(p for b in shipped_dashboards() for p in dash.json_panels(b) if p["title"] == "Goodput")
    (sample,) = _query(url, _all(goodput["targets"][0]["expr"]))
    assert float(sample["value"][1]) == 1.0
    assert sample["metric"]["model"] == "tiny-cb"
