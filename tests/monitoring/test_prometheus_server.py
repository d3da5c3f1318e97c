"""The shipped dashboards, rules and alerts against a real Prometheus scraping real generation.

One Prometheus (Debian's package, 1 s scrape and rule evaluation, the shipped recording and alert
rules) scrapes: a tiny Llama generating with gpuprobe's transformers integration; a fixture process
that pushes synthetic GPU-only series through gpuprobe's runtime; two torchrun ranks (gloo); and the
first process once more under the labels an OpenTelemetry Collector adds.
"""

from __future__ import annotations

import importlib.util
import os
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprobe import dashboards as dash
from gpuprobe._metrics import SPECS, prometheus_name
from gpuprobe.errors import ConfigError

from .promstack import DASHBOARD_DIR, ROOT, Stack, shipped_dashboards, wait_until

pytestmark = pytest.mark.prometheus_server

MODEL = "tiny-llama"


def _verify_until_ok(stack: Stack, boards: list[dict], chosen: dict[str, list[str]], gpu_only: bool | None,
                     timeout: float = 90) -> list[dash.QueryResult]:
    """Run :func:`verify` until every query returns data (or the timeout); the last results."""
    deadline = time.monotonic() + timeout
    while True:
        for p in stack.procs:
            p.check_alive()
        try:
            results = dash.verify(stack.prom, boards, chosen, gpu_only=gpu_only)
        except ConfigError:  # a chosen value Prometheus does not offer yet (the workload's first scrapes)
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
            continue
        if all(r.ok for r in results) or time.monotonic() > deadline:
            return results
        time.sleep(1)


def _failures(results: list[dash.QueryResult]) -> str:
    return "\n".join(str(r) for r in results if not r.ok)


def _queries(boards: list[dict], gpu_only: bool) -> int:
    return sum(len(p["targets"]) for b in boards for p in dash.json_panels(b) if dash.is_gpu_only(p) == gpu_only)


def test_every_panel_query_returns_data_for_one_process(stack: Stack) -> None:
    boards = shipped_dashboards()
    chosen = {"instance": [stack.single], "model": [MODEL], "rank": ["0"]}
    results = _verify_until_ok(stack, boards, chosen, gpu_only=False)
    assert len(results) == _queries(boards, gpu_only=False) > 30
    assert all(r.ok for r in results), "panel queries without data:\n" + _failures(results)


def test_gpu_only_panels_return_data_from_the_gpu_fixture(stack: Stack) -> None:
    boards = shipped_dashboards()
    results = _verify_until_ok(stack, boards, {"instance": [stack.gpu_fixture]}, gpu_only=True)
    assert len(results) == _queries(boards, gpu_only=True) >= 3
    assert all(r.ok for r in results), "GPU-only panel queries without data:\n" + _failures(results)


def test_gpu_only_panels_have_no_data_from_a_cpu_process(stack: Stack) -> None:
    boards = shipped_dashboards()
    _verify_until_ok(stack, boards, {"instance": [stack.single]}, gpu_only=False)  # the process is being scraped
    results = dash.verify(stack.prom, boards, {"instance": [stack.single]}, gpu_only=True)
    wrongly_flagged = [str(r) for r in results if r.ok or r.error]
    assert results and not wrongly_flagged, "panels flagged GPU-only that have data on CPU:\n" + "\n".join(
        wrongly_flagged)


def test_panels_ignore_the_labels_an_otel_collector_adds(stack: Stack) -> None:
    boards = shipped_dashboards()
    via_collector = _verify_until_ok(stack, boards, {"instance": [stack.sim]}, gpu_only=False)
    assert all(r.ok for r in via_collector), "no data through collector labels:\n" + _failures(via_collector)
    direct = dash.verify(stack.prom, boards, {"instance": [stack.single]}, gpu_only=False)
    scoped = stack.prom.query(f'count(gpuprobe_step_duration_seconds_count{{instance="{stack.sim}", '
                              'otel_scope_name="gpuprobe"})')
    assert scoped, "the simulated collector labels are missing"
    # A scope label that splits a line shows as more series through the collector. Fewer is no split: the
    # two workloads are processes of their own, and a panel by draft position shows the positions each
    # has reached so far (on a busy machine one may be behind).
    split = [f"{a.panel} / {a.ref}: {a.series} series direct, {b.series} via collector"
             for a, b in zip(direct, via_collector, strict=True) if b.series > a.series]
    assert not split, "scope labels split lines:\n" + "\n".join(split)


def test_inline_quantile_dashboards_work_without_recording_rules(stack: Stack) -> None:
    boards = [dash.render(d) for d in dash.dashboards(inline=True)]
    assert all("gpuprobe:" not in t["expr"] for b in boards for p in dash.json_panels(b) for t in p["targets"])
    results = _verify_until_ok(stack, boards, {"instance": [stack.single]}, gpu_only=False)
    assert all(r.ok for r in results), _failures(results)


def test_recorded_quantile_equals_the_inline_one(stack: Stack) -> None:
    recorded = dash.recorded_name("gen_ai.server.time_per_output_token", "p95")
    sel = f'{{instance="{stack.single}"}}'
    inline = ("histogram_quantile(0.95, sum by (le) (rate("
              f'{dash.series("gen_ai.server.time_per_output_token", "bucket")}{sel}[1m])))')

    def both() -> tuple[float, float]:
        a, b = stack.prom.query(f"{recorded}{sel}"), stack.prom.query(inline)
        return float(a[0]["value"][1]), float(b[0]["value"][1])

    wait_until("the recorded time-per-output-token p95", lambda: all(v == v for v in both()), 60, tuple(stack.procs))
    rec, inl = both()
    # One evaluation interval (1 s) apart at most; within one bucket either way.
    assert rec == pytest.approx(inl, rel=0.5), (rec, inl)


def test_model_labels_in_the_generator_match_the_exposition(stack: Stack) -> None:
    with urllib.request.urlopen(f"http://{stack.single}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    by_family = {prometheus_name(spec): name for name, spec in SPECS.items()}
    seen = set()
    for fam in text_string_to_metric_families(text):
        metric = by_family.get(fam.name)
        if metric is None:
            continue
        want = dash.model_label(metric)
        for sample in fam.samples:
            has = {k for k in sample.labels if "model" in k}
            assert has == ({want} if want else set()), f"{sample.name}: model labels {has}, generator expects {want}"
            assert sample.labels.get("gpuprobe_rank") == "0" and sample.labels.get("gpuprobe_device") == "cpu"
        seen.add(metric)
    assert seen >= {"gen_ai.server.time_to_first_token", "gpuprobe.step.duration", "gpuprobe.kv_cache.memory"}


def test_two_ranks_serve_on_base_port_plus_local_rank_and_are_told_apart(stack: Stack) -> None:
    expr = ('group by (instance, gpuprobe_rank, local_rank) '
            '(gen_ai_server_request_duration_seconds_count{job="gpuprobe-ranks"})')
    wait_until("both ranks' series", lambda: len(stack.prom.query(expr)) == 2, 120, tuple(stack.procs))
    found = {(r["metric"]["instance"], r["metric"]["gpuprobe_rank"], r["metric"]["local_rank"])
             for r in stack.prom.query(expr)}
    assert found == {(stack.ranks[0], "0", "0"), (stack.ranks[1], "1", "1")}


def test_every_panel_returns_data_for_each_rank(stack: Stack) -> None:
    boards = shipped_dashboards()
    for rank in ("0", "1"):
        chosen = {"instance": stack.ranks, "rank": [rank], "model": [MODEL]}
        results = _verify_until_ok(stack, boards, chosen, gpu_only=False)
        assert all(r.ok for r in results), f"rank {rank}:\n" + _failures(results)


def test_rank_dashboard_draws_one_line_per_rank(stack: Stack) -> None:
    board = next(b for b in shipped_dashboards() if b["uid"] == "gpuprobe-ranks")
    values = {"instance": dash.regex_any(stack.ranks), "rank": ".*", "model": ".*"}
    per_rank = [(p["title"], t) for p in dash.json_panels(board) if not dash.is_gpu_only(p)
                for t in p["targets"] if "gpuprobe_rank" in t["legendFormat"]]
    assert len(per_rank) >= 5

    def ranks_of(target: dict) -> set[str]:
        return {r["metric"].get("gpuprobe_rank") for r in stack.prom.query(dash.fill(target["expr"], values))}

    wait_until("every per-rank panel to show both ranks", lambda: all(ranks_of(t) == {"0", "1"} for _, t in per_rank),
               90, tuple(stack.procs))


def test_alerts_fire_for_dropped_telemetry_and_generation_errors(stack: Stack) -> None:
    def firing() -> set[str]:
        return {a["labels"]["alertname"] for a in stack.prom.alerts()
                if a["state"] == "firing" and a["labels"].get("instance") == stack.single}

    wait_until("GpuprobeTelemetryDropped and GpuprobeGenerationErrors to fire",
               lambda: {"GpuprobeTelemetryDropped", "GpuprobeGenerationErrors"} <= firing(), 60, tuple(stack.procs))
    assert "GpuprobeTimeToFirstTokenHigh" not in firing()


def test_device_clock_latencies_stay_apart_from_what_a_client_sees(stack: Stack) -> None:
    """A GPU records time to first token and inter-token latency on both clocks: the latency panels draw
    one line per clock, and the serving and per-rank panels read the host clock only."""
    boards = {b["uid"]: b for b in shipped_dashboards()}

    def target(uid: str, title: str, index: int = 0) -> str:
        panel = next(p for p in dash.json_panels(boards[uid]) if p["title"] == title)
        return str(panel["targets"][index]["expr"])

    def clocks(expr: str, instance: str) -> set[str | None]:
        values = {"instance": dash.regex_any([instance]), "model": ".*", "rank": ".*"}
        return {r["metric"].get("clock") for r in stack.prom.query(dash.fill(expr, values))}

    ttft_p50 = target("gpuprobe-overview", "Time to first token")
    itl_p50 = target("gpuprobe-overview", "Inter-token latency")
    wait_until("device-clock TTFT and inter-token lines from the GPU fixture",
               lambda: clocks(ttft_p50, stack.gpu_fixture) == clocks(itl_p50, stack.gpu_fixture) == {"device"},
               90, tuple(stack.procs))
    wait_until("host-clock lines from the CPU workload",
               lambda: clocks(ttft_p50, stack.single) == clocks(itl_p50, stack.single) == {"host"},
               90, tuple(stack.procs))
    serving_ttft = target("gpuprobe-overview", "Serving latency: TTFT, TPOT, end to end")
    itl_by_rank = target("gpuprobe-ranks", "Inter-token latency p95 by rank")
    assert clocks(serving_ttft, stack.gpu_fixture) == clocks(itl_by_rank, stack.gpu_fixture) == set()
    assert clocks(serving_ttft, stack.single) == clocks(itl_by_rank, stack.single) == {"host"}


def test_plot_script_draws_the_main_series(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "plot_from_prometheus", os.path.join(ROOT, "deploy", "grafana", "plot_from_prometheus.py"))
    assert spec and spec.loader
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    _verify_until_ok(stack, shipped_dashboards(), {"instance": [stack.single]}, gpu_only=False)
    out = tmp_path / "overview.png"
    end = time.time()
    drawn = plot.plot(stack.prom.url, str(out), start=end - 60, end=end, instance=stack.single)
    assert out.stat().st_size > 20_000
    assert len(drawn) >= 9 and all(n > 0 for n in drawn.values()), drawn


def test_cli_verify_reports_every_query_against_a_live_prometheus(stack: Stack, capsys) -> None:  # type: ignore[no-untyped-def]
    boards = shipped_dashboards()
    _verify_until_ok(stack, boards, {"instance": [stack.single]}, gpu_only=False)
    args = ["--verify", stack.prom.url, "--var", f"instance={stack.single}", "--out", DASHBOARD_DIR]
    assert dash.main(args) == 0
    out = capsys.readouterr().out
    total = _queries(boards, gpu_only=False) + _queries(boards, gpu_only=True)
    assert f"of {total} queries returned data" in out and "[needs a GPU]: no data" in out
