"""``python -m gpuprobe dashboard --verify`` on the documented five-minute set-up (docs/grafana.md): the
demo on a CPU, scraped by a real Prometheus (Debian's package) with the shipped rules. The counts it
prints are checked against Prometheus asked directly, query by query; the panels empty for a documented
reason are listed by reason and do not fail; a panel empty without one does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuprobe import dashboards as dash

from .promstack import (
    DASHBOARD_DIR,
    PROMETHEUS_DIR,
    Proc,
    ensure_prometheus,
    free_port,
    http_ok,
    shipped_dashboards,
    start_prometheus,
    temp_dir,
    wait_until,
)

pytestmark = [pytest.mark.prometheus_server, pytest.mark.slow]

# What the demo does not run on a CPU: the panels these reasons excuse are empty there.
DEMO_REASONS = {"needs a GPU", "waits for an error", "kernel sampling off", "sync audit off", "no continuous batching",
                "no speculative decoding", "peaks unknown", "no service-level goals", "no diffusers pipeline"}


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    """The URL of a Prometheus scraping ``python -m gpuprobe demo --requests 100000`` every second, with the
    shipped rule files (the shipped prometheus.yml scrapes every 5 s; 1 s fills the windows sooner)."""
    ensure_prometheus()
    with temp_dir() as work, contextlib.ExitStack() as cleanup:
        demo_port, prom_port = free_port(), free_port()
        demo = Proc("demo", [sys.executable, "-m", "gpuprobe", "demo", "--port", str(demo_port), "--requests",
                             "100000", "--plot", "", "--linger", "0"], os.path.join(work, "demo.log"))
        cleanup.callback(demo.stop)
        rules = [os.path.join(PROMETHEUS_DIR, dash.RULES_FILE), os.path.join(PROMETHEUS_DIR, dash.ALERTS_FILE)]
        prom = start_prometheus(dash.scrape_config(base_port=demo_port, interval="1s", rule_files=rules), work,
                                prom_port)
        cleanup.callback(prom.stop)
        url = f"http://127.0.0.1:{prom_port}"
        wait_until("Prometheus to be ready", lambda: http_ok(f"{url}/-/ready"), 60, (demo, prom))
        wait_until("the demo's /metrics", lambda: http_ok(f"http://127.0.0.1:{demo_port}/metrics"), 180, (demo, prom))
        yield url


def _has_data(url: str, expr: str) -> bool:
    """Whether Prometheus answers ``expr`` with at least one finite sample (asked here, not through gpuprobe)."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return any(math.isfinite(float(s["value"][1])) for s in body["data"]["result"])


def _all_values(expr: str) -> str:
    """The query as Grafana sends it with every variable on "All" and a 1 minute rate interval."""
    out = expr.replace("$__rate_interval", "1m")
    for name in ("model", "rank", "instance"):
        out = out.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
    assert "$" not in out, out
    return out


def _truth(url: str) -> tuple[int, int, dict[str, set[str]]]:
    """Queries in the shipped dashboards, those with data, and the panels with an empty query by the reason the
    panel's description gives (read here from the JSON text)."""
    total, with_data = 0, 0
    empty: dict[str, set[str]] = {}
    for board in shipped_dashboards():
        for panel in dash.json_panels(board):
            for target in panel["targets"]:
                total += 1
                if _has_data(url, _all_values(target["expr"])):
                    with_data += 1
                    continue
                text = panel["description"]
                reason = "needs a GPU" if text.startswith("GPU only.") else next(
                    (r.reason for r in dash.NO_DATA_REASONS if r.sentence in text), "none")
                empty.setdefault(reason, set()).add(f"{board['uid']} / {panel['title']}")
    return total, with_data, empty


def _printed(out: str) -> tuple[int, int, dict[str, set[str]]]:
    """The counts and the panels by reason in ``--verify``'s summary."""
    m = re.search(r"^(\d+) of (\d+) queries returned data\.$", out, re.M)
    assert m, out
    by_reason: dict[str, set[str]] = {}
    reason = None
    for line in out[m.end():].splitlines():
        head = re.match(r"^  (\S.*) \(\d+ quer(?:y|ies)\):$", line)
        if head:
            reason = head.group(1)
            by_reason[reason] = set()
        elif line.startswith("    ") and reason:
            by_reason[reason].add(re.sub(r" \(\d+ of its \d+ queries\)$", "", line.strip()))
        else:
            reason = None
    return int(m.group(2)), int(m.group(1)), by_reason


def _verify(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = dash.main(["--verify", url, "--out", DASHBOARD_DIR, *extra])
    return code, capsys.readouterr().out


def test_verify_passes_on_the_demo_and_counts_true(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    deadline = time.monotonic() + 240
    while True:  # until the demo's series are in the 1 minute windows and the two readings agree
        code, out = _verify(prometheus, capsys)
        truth = _truth(prometheus)
        if (code == 0 and _printed(out) == truth) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert code == 0, out
    total, with_data, by_reason = _printed(out)
    assert (total, with_data, by_reason) == truth
    assert total == sum(len(p["targets"]) for b in shipped_dashboards() for p in dash.json_panels(b))
    gpu_queries = sum(len(p["targets"]) for b in shipped_dashboards() for p in dash.json_panels(b)
                      if dash.is_gpu_only(p))
    assert with_data <= total - gpu_queries  # no GPU-only query is counted as data on a CPU
    assert set(by_reason) == DEMO_REASONS
    gpu_panels = {f"{d.uid} / {p.title}" for d in dash.dashboards() for p in d.panels if p.gpu_only}
    assert by_reason["needs a GPU"] == gpu_panels
    assert by_reason["waits for an error"] == {"gpuprobe-overview / Errors"}


def test_a_panel_empty_without_a_reason_fails_and_one_with_a_reason_does_not(
        prometheus: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    def panel(title: str, expr: str, description: str) -> dict[str, Any]:
        return {"type": "timeseries", "title": title, "description": description,
                "targets": [{"refId": "A", "expr": expr}]}

    wait_until("the demo's first scrape", lambda: _has_data(prometheus, "gpuprobe_build_info"), 120)
    absent = "sum(rate(gpuprobe_requests_preempted_total[1m]))"  # the demo runs no continuous batching
    serving = dash.model.NO_CONTINUOUS_BATCHING.sentence
    cases = [
        ([panel("Preemptions", absent, "Evictions per second.")], 1,
         "1 query returned no data in panels with no documented reason to be empty:\n"
         "  gpuprobe-overview / Preemptions / A"),
        ([panel("Preemptions", absent, f"Evictions per second. {serving}")], 0,
         "  no continuous batching (1 query):\n    gpuprobe-overview / Preemptions"),
        ([panel("Preemptions", "sum(rate(gpuprobe_requests_preempted_total[1m]", f"Broken. {serving}")], 1,
         "1 query failed:\n  gpuprobe-overview / Preemptions / A: "),
        ([panel("Build", "max(gpuprobe_build_info)", "Always there.")], 0, "1 of 1 query returned data."),
    ]
    for panels, expected, shown in cases:
        (tmp_path / "gpuprobe-overview.json").write_text(json.dumps({"uid": "gpuprobe-overview", "panels": panels}))
        (tmp_path / "gpuprobe-ranks.json").write_text(json.dumps({"uid": "gpuprobe-ranks", "panels": []}))
        code = dash.main(["--verify", prometheus, "--out", str(tmp_path)])
        out = capsys.readouterr().out
        assert code == expected, out
        assert shown in out
