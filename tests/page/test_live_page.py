"""The live page in a real headless Chromium, loaded from running programs: its tables, tiles and charts
hold the numbers computed here from the very /metrics bodies the page received (captured over the
DevTools protocol), for a sliding window and for the whole run.

- the demo (``python -m gpuprobe demo --linger ...``): while it generates, and once it is done and idle;
- the monitoring workload (continuous batching, speculative decoding, failing calls, kernel sampling);
- the workload's GPU fixture (GPU-only series, GPU health from a simulated NVML of two GPUs).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import gpuprobe
from tests.monitoring.promstack import WORKLOAD, Proc, free_port, temp_dir, wait_until

from ._browser import Browser, browser
from ._expected import Pair, charts, histogram_quantile, in_flight, same, samples

pytestmark = pytest.mark.slow

READ_STATE = """(() => {
  if (!window.gpuprobeLive) return {scrape: 0, base: 0, seconds: "", tables: {}, tiles: {}, drawn: {}, status: "",
                                    empty: {}};  // still loading
  const tables = {};
  for (const card of document.querySelectorAll("[data-chart]")) {
    const rows = {};
    for (const tr of card.querySelectorAll("tr[data-line]")) {
      const cols = {};
      for (const td of tr.querySelectorAll("td[data-col]")) cols[td.dataset.col] = td.dataset.value;
      rows[tr.dataset.line] = cols;
    }
    tables[card.dataset.chart] = rows;
  }
  const tiles = {};
  for (const t of document.querySelectorAll("[data-tile]")) tiles[t.dataset.tile] = t.querySelector(".value").dataset.value;
  const drawn = {};
  for (const [id, c] of Object.entries(window.gpuprobeLive.charts())) {
    drawn[id] = {};
    for (const [k, arr] of Object.entries(c.lines)) drawn[id][k] = arr.length ? arr[arr.length - 1] : null;
  }
  const b = document.body.dataset;
  return {scrape: Number(b.scrape || 0), base: Number(b.base || 0), seconds: b.seconds || "", tables, tiles, drawn,
          status: document.querySelector("#status").textContent,
          empty: Object.fromEntries([...document.querySelectorAll("[data-chart]")].map(
            (c) => [c.dataset.chart, c.querySelector(".empty").textContent]))};
})()"""


class Page:
    """The page open in a browser, and what the browser saw: every URL asked for, the /metrics responses in
    order (the page's scrape N is the N-th), script errors."""

    def __init__(self, b: Browser, url: str) -> None:
        self.b = b
        self.url = url
        self.requests: list[str] = []
        self.metrics: list[tuple[str, float]] = []  # (request id, time the response arrived), 200s only
        self.errors: list[str] = []
        b.send("Page.navigate", {"url": url})

    def pump(self) -> None:
        while True:
            try:
                method, params = self.b.events.get_nowait()
            except queue.Empty:
                return
            if method == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif method == "Network.responseReceived":
                if params["response"]["url"].endswith("/metrics") and params["response"]["status"] == 200:
                    self.metrics.append((params["requestId"], params["timestamp"]))
            elif method == "Runtime.exceptionThrown":
                self.errors.append(str(params["exceptionDetails"])[:2000])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                self.errors.append(params["entry"]["text"])
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                self.errors.append(str(params["args"])[:2000])

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.b.evaluate(READ_STATE)
        self.pump()
        return state

    def until(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float,
              procs: tuple[Proc, ...] = ()) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for p in procs:
                p.check_alive()
            state = self.state()
            if check(state):
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"the page: timed out after {timeout:g} s waiting for {what}; last state {state}; "
                            f"errors {self.errors}")
            time.sleep(0.5)

    def body(self, scrape: int) -> str:
        """The /metrics body of the page's scrape number ``scrape`` (1 = its first)."""
        assert 1 <= scrape <= len(self.metrics), (scrape, len(self.metrics))
        return self.b.body(self.metrics[scrape - 1][0])


def check_against_bodies(page: Page, state: dict[str, Any]) -> Pair:
    """Every number the page shows against what the two scrapes it names hold (computed here)."""
    assert state["scrape"] >= 1, state
    newer = page.body(state["scrape"])
    older = page.body(state["base"]) if state["base"] else None
    seconds = float(state["seconds"]) if state["seconds"] else None
    if older is not None:  # the page's clock against the browser's network timestamps
        arrived = page.metrics[state["scrape"] - 1][1] - page.metrics[state["base"] - 1][1]
        assert seconds is not None and abs(seconds - arrived) < 1.0, (seconds, arrived)
    pair = Pair(newer, older, seconds)
    expected = charts(pair)
    assert set(state["tables"]) == set(expected), (sorted(state["tables"]), sorted(expected))
    for chart, lines in expected.items():
        shown = state["tables"][chart]
        assert set(shown) == set(lines), (chart, sorted(shown), sorted(lines))
        for key, cols in lines.items():
            assert set(shown[key]) == set(cols), (chart, key, shown[key], cols)
            for col, value in cols.items():
                assert same(shown[key][col], value), (chart, key, col, shown[key][col], value)
            drawn = state["drawn"][chart].get(key)
            assert same("" if drawn is None else repr(drawn), cols["value"]), (chart, key, drawn, cols["value"])
    check_tiles(pair, state["tiles"])
    return pair


def check_tiles(pair: Pair, tiles: dict[str, str]) -> None:
    out = pair.sums("gen_ai_client_token_usage_sum", lambda lab: lab.get("gen_ai_token_type") == "output", ())
    assert same(tiles["tokens_per_second"], pair.rate(out[()][1]) if () in out else None)
    ttft = pair.histogram("gen_ai_server_time_to_first_token_seconds", lambda lab: lab.get("clock") != "device", ())
    assert same(tiles["ttft_p50"], ttft[()]["q"](0.5) if ttft else None)
    tpot = pair.histogram("gen_ai_server_time_per_output_token_seconds", lambda lab: True, ())
    assert same(tiles["tpot_p50"], tpot[()]["q"](0.5) if tpot else None)
    step = pair.histogram("gpuprobe_step_duration_seconds", lambda lab: lab.get("clock") == "host", ())
    assert same(tiles["step_mean"], step[()]["mean"] if step else None)
    assert same(tiles["in_flight"], in_flight(pair))
    assert same(tiles["memory"], pair.gauge("gpuprobe_memory_allocated_bytes", ()).get(()))


def check_stays_home(page: Page, origin: str) -> None:
    """The page asks its own server only: the page, its files, /metrics, /requests and its history, and nothing
    failed in it."""
    assert page.errors == []
    for url in page.requests:
        assert url.startswith(origin + "/"), url
        path = url[len(origin):]
        assert path in ("/metrics", "/requests", "/gpuprobe/history") or path.startswith("/gpuprobe/page/") or \
            path.split("#")[0] in ("/",), url


def _line(log: Proc, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, log.log_tail(200_000))


@contextlib.contextmanager
def _process(name: str, cmd: list[str], ready: str, timeout: float = 240) -> Iterator[tuple[Proc, str]]:
    """Start ``cmd`` (its log in a temporary folder); yield it with the origin its ``ready`` line names."""
    with temp_dir() as work:
        proc = Proc(name, cmd, os.path.join(work, f"{name}.log"))
        try:
            wait_until(f"{name} to serve", lambda: _line(proc, ready) is not None, timeout, (proc,))
            found = _line(proc, ready)
            assert found is not None
            yield proc, found.group(1)
        finally:
            proc.stop()


@pytest.mark.subprocess_only  # the page watches a process of its own
def test_the_demos_page_shows_what_metrics_holds_while_it_runs_and_after(tmp_path: Any) -> None:
    port = free_port()
    # 100 requests generate for about 20 s on a quiet machine: long enough for a sliding window to pass its
    # first scrape while tokens still flow, even where a busy machine slows the browser more than the demo.
    cmd = [sys.executable, "-m", "gpuprobe", "demo", "--port", str(port), "--requests", "100",
           "--max-new-tokens", "24", "--linger", "600", "--plot", ""]
    with browser() as b, _process("demo", cmd, r"live page at (http://127\.0\.0\.1:\d+)/ ") as (demo, origin):
        assert origin == f"http://127.0.0.1:{port}"
        assert f"serving metrics at {origin}/metrics" in demo.log_tail()
        page = Page(b, f"{origin}/#window=5")
        # While it generates: a window of 5 s slides over the scrapes (its older end is not the first scrape).
        running = page.until("a sliding window with tokens in it",
                             lambda s: s["base"] >= 2 and s["tables"].get("tokens", {}).get("output", {}).get("value"),
                             180, (demo,))
        assert "stays up" not in demo.log_tail(), "the demo finished before the page could watch it generate"
        pair = check_against_bodies(page, running)
        assert float(running["tables"]["tokens"]["output"]["value"]) > 0
        assert float(running["tables"]["components"]["forward/"]["share"]) > 0.3
        assert {k for k in running["tables"]["components"] if k.startswith("logits_processor/")} >= {
            "logits_processor/BanTokens", "logits_processor/RepetitionPenaltyLogitsProcessor"}
        assert pair.old is not None
        # Done and idle: nothing moves in the window any more, the whole run still reads.
        wait_until("the demo's last request", lambda: "stays up" in demo.log_tail(), 600, (demo,))
        finished = page.state()["scrape"]
        idle = page.until("a window past the last request", lambda s: s["scrape"] >= finished + 7, 60, (demo,))
        check_against_bodies(page, idle)
        assert idle["tables"]["ttft"]["p50"]["value"] == "" and idle["tables"]["ttft"]["p50"]["run"] != ""
        assert idle["tables"]["tokens"]["output"]["value"] == "0"  # a rate of nothing, not a gap
        assert idle["empty"]["ttft"] == ""  # the chart still draws what the window had
        with urllib.request.urlopen(f"{origin}/metrics", timeout=30) as resp:  # what /metrics holds, asked here
            assert samples(resp.read().decode()) == samples(page.body(idle["scrape"]))
        assert idle["status"].startswith("live")
        check_stays_home(page, origin)
        polls = len(page.metrics)
        time.sleep(5)
        page.state()
        assert 3 <= len(page.metrics) - polls <= 7  # one scrape a second


@pytest.mark.subprocess_only  # the page watches a process of its own
def test_the_page_follows_continuous_batching_speculative_decoding_and_failures() -> None:
    port = free_port()
    cmd = [sys.executable, WORKLOAD, "--port", str(port), "--seconds", "300", "--pause", "0.05"]
    with _process("workload", cmd, r"serving (http://127\.0\.0\.1:\d+)/metrics") as (work, origin), browser() as b:
        page = Page(b, f"{origin}/#window=30")

        def everything(s: dict[str, Any]) -> bool:
            t = s["tables"]
            return bool(s["base"] and {"serving", "queue", "speculative"} <= set(t)
                        and any(k.startswith("failed ") for k in t.get("requests", {}))
                        and t["speculative"].get("draft_model", {}).get("value")
                        # the drafts of a call are counted before their verification: wait for one verified
                        and float(t["speculative"]["draft_model"].get("run") or 0) > 0)

        state = page.until("continuous batching, speculative decoding and a failed call in the window", everything,
                           240, (work,))
        check_against_bodies(page, state)
        assert {"draft_model", "prompt_lookup"} <= set(state["tables"]["speculative"])
        assert 0 < float(state["tables"]["speculative"]["draft_model"]["run"]) <= 1
        assert state["tables"]["requests"]["failed IndexError"]["run"] not in ("", "0")
        check_stays_home(page, origin)


@pytest.mark.subprocess_only  # the page watches a process of its own
def test_gpu_health_appears_where_nvml_is_on() -> None:
    port = free_port()
    cmd = [sys.executable, WORKLOAD, "--port", str(port), "--seconds", "300", "--gpu-fixture"]
    with _process("gpu-fixture", cmd, r"serving (http://127\.0\.0\.1:\d+)/metrics") as (work, origin), browser() as b:
        page = Page(b, f"{origin}/")
        state = page.until("the GPU health charts",
                           lambda s: s["base"] and {"gpu", "gpu_memory", "gpu_power"} <= set(s["tables"]), 120, (work,))
        check_against_bodies(page, state)
        gpu = state["tables"]["gpu"]
        assert {"utilization 0", "utilization 1", "SM activity 0", "tensor cores 1"} <= set(gpu)
        assert "throttle 1 sw_power_cap" in state["tables"]["gpu_power"]  # the second GPU throttles
        assert {"device p50", "p50"} & set(state["tables"]["ttft"]) == {"device p50"}  # a device clock only
        assert "reserved cuda:0" in state["tables"]["memory"]
        check_stays_home(page, origin)


QUANTILE_CASES = [
    ([(0.1, 0), (1, 0), ("inf", 0)], (0.5,)),  # nothing observed
    ([(0.1, 5), (1, 5), ("inf", 5)], (0.0, 0.5, 1.0)),  # all in the first bucket: from 0 to its bound
    ([(0.1, 0), (1, 0), ("inf", 4)], (0.5, 0.99)),  # all past the last bound: that bound
    ([(0.1, 2), (1, 1), ("inf", 4)], (0.25, 0.5, 0.75)),  # not monotonic (as after a partial scrape)
    ([("inf", 3)], (0.5,)),  # one bucket
    ([(0.1, 2), (0.5, 2), (1, 3)], (0.5,)),  # no +Inf bucket
    ([(0.001, 1), (0.01, 5), (0.1, 9), ("inf", 10)], (0.0, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0)),
    ([(-1, 1), (0, 2), ("inf", 2)], (0.25, 0.75)),  # bounds at and below zero
]


def test_the_pages_quantiles_are_prometheus_histogram_quantile() -> None:
    server = gpuprobe.serve(port=0)
    try:
        with browser() as b:
            page = Page(b, server.page_url)
            page.until("the page's script", lambda s: s["scrape"] >= 1, 60)
            for buckets, qs in QUANTILE_CASES:
                as_js = ", ".join(f"{{le: {'Infinity' if le == 'inf' else le}, count: {c}}}" for le, c in buckets)
                as_py = [(float(le), float(c)) for le, c in buckets]
                for q in qs:
                    shown = b.evaluate(f"String(window.gpuprobeLive.quantile({q}, [{as_js}]))")
                    expected = histogram_quantile(q, as_py)
                    assert same("" if shown == "NaN" else shown, expected), (buckets, q, shown, expected)
    finally:
        server.close()


def test_label_values_with_quotes_backslashes_and_newlines_read_as_written() -> None:
    server = gpuprobe.serve(port=0)
    name = 'load "the" batch \\ part\ntwo'
    try:
        for _ in range(3):
            with gpuprobe.probe(name):
                time.sleep(0.001)
        with browser() as b:
            page = Page(b, server.page_url)
            state = page.until("the probes chart", lambda s: "probes" in s["tables"], 60)
            check_against_bodies(page, state)
            assert f"{name} p95" in state["tables"]["probes"]
            assert float(state["tables"]["probes"][f"{name} mean"]["run"]) >= 0.001
            check_stays_home(page, server.page_url.rstrip("/"))
    finally:
        server.close()


def test_a_restarted_process_starts_the_window_again_and_a_gap_is_said() -> None:
    from gpuprobe.testing import reset

    server = gpuprobe.serve(port=0)
    port = server.port
    for _ in range(5):
        with gpuprobe.probe("work"):
            pass
    with browser() as b:
        page = Page(b, server.page_url)
        before = page.until("a window over the first process", lambda s: s["base"] >= 1 and s["scrape"] >= 3, 60)
        reset()  # as a restart: the server goes away and every count starts again from 0
        down = page.until("the page to say it cannot read /metrics", lambda s: "cannot read /metrics" in s["status"],
                          30)
        assert down["scrape"] >= before["scrape"]
        for _ in range(2):  # before the new server's first scrape: the window never sees them arrive
            with gpuprobe.probe("work"):
                pass
        server = gpuprobe.serve(port=port)
        last = down["scrape"]
        after = page.until("three scrapes of the new process",
                           lambda s: s["scrape"] >= last + 3 and s["base"] > last and "live" in s["status"], 60)
        check_against_bodies(page, after)  # the window's both ends are the new process's
        assert after["tables"]["probes"]["work p95"]["value"] == ""  # nothing new in the window: not a negative
        assert float(after["tables"]["probes"]["work mean"]["run"]) >= 0
        history = b.evaluate("window.gpuprobeLive.charts().probes.x.length")
        assert history <= after["scrape"] - last  # what the old process drew is gone
        server.close()
