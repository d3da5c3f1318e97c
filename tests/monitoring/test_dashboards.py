"""The generator, the checked-in files and their checks; no Prometheus server is started here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuprobe import dashboards as dash
from gpuprobe._metrics import SPECS
from gpuprobe.runtime import runtime
from gpuprobe.errors import ConfigError
from gpuprobe.exporters.prometheus import serve

from .promstack import (
    DASHBOARD_DIR,
    HERE,
    PROMETHEUS_DIR,
    PROMTOOL,
    ROOT,
    ensure_prometheus,
    free_port,
    shipped_dashboards,
)

GRAFANA_DIR = os.path.join(ROOT, "deploy", "grafana")


def _check(*extra: str) -> int:
    return dash.main(["--check", "--out", DASHBOARD_DIR, "--prometheus-out", PROMETHEUS_DIR, *extra])


# -- generated files ------------------------------------------------------------------------------

def test_checked_in_files_are_what_the_generator_makes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check() == 0, capsys.readouterr().err


def test_check_fails_naming_a_file_that_differs(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out, prom = tmp_path / "dash", tmp_path / "prom"
    shutil.copytree(DASHBOARD_DIR, out)
    shutil.copytree(PROMETHEUS_DIR, prom)
    path = out / "gpuprobe-overview.json"
    path.write_text(path.read_text().replace("Time to first token", "Time to 1st token", 1))
    (prom / "gpuprobe-alerts.yml").unlink()
    assert dash.main(["--check", "--out", str(out), "--prometheus-out", str(prom)]) == 1
    err = capsys.readouterr().err
    assert f"{path} differs" in err and "gpuprobe-alerts.yml is missing" in err
    assert "regenerate with: gpuprobe dashboard" in err


def test_writing_then_checking_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["--out", str(tmp_path / "d"), "--prometheus-out", str(tmp_path / "p")]
    assert dash.main(args) == 0
    assert dash.main(["--check", *args]) == 0
    assert sorted(os.listdir(tmp_path / "d")) == ["gpuprobe-overview.json", "gpuprobe-ranks.json"]


def test_generated_yaml_parses_back_to_the_same_data() -> None:
    for data in (dash.recording_rules(), dash.alert_rules(), dash.scrape_config(ranks=3, hosts=["a", "b"]),
                 {"s": 'x{a="b"} > 0', "n": "5s", "t": True, "e": [], "d": {}, "yes": "yes", "num": "0123"}):
        assert yaml.safe_load(dash.to_yaml(data)) == data


@pytest.mark.parametrize("text", [
    "", "null", "~", "True", "off", "0123", "1e3", "0x1F", ".inf", "5m", "a: b", "# no comment", "- item",
    "{{ $labels.instance }}", "[1, 2]", "x\ty\nz", 'quote " and \\ backslash', "÷ · é", "  padded  ",
    "127.0.0.1:9464", "a" * 300,
])
def test_yaml_keeps_every_string_a_string(text: str) -> None:
    data = {"k": text, "list": [text], text or "empty": 1}
    assert yaml.safe_load(dash.to_yaml(data)) == data


def test_yaml_quotes_promql_and_indents_list_items_under_their_key() -> None:
    assert dash.to_yaml({"rules": [{"expr": 'up{job="x"} == 0', "for": "5m"}], "on": (1, 2.5, None, False)}) == (
        'rules:\n'
        '  - expr: "up{job=\\"x\\"} == 0"\n'
        '    for: "5m"\n'
        '"on":\n'
        '  - 1\n'
        '  - 2.5\n'
        '  - null\n'
        '  - false\n'
    )


def test_shipped_prometheus_files_hold_what_the_generator_holds() -> None:
    def load(name: str) -> object:
        with open(os.path.join(PROMETHEUS_DIR, name), encoding="utf-8") as f:
            return yaml.safe_load(f)

    assert load(dash.RULES_FILE) == dash.recording_rules()
    assert load(dash.ALERTS_FILE) == dash.alert_rules()
    assert load("prometheus.yml") == dash.scrape_config()
    assert load("prometheus-ranks.yml") == dash.scrape_config(ranks=8)
    assert load("prometheus-otel-collector.yml") == dash.scrape_config(
        base_port=8889, job="gpuprobe-otel-collector", honor_labels=True)


# -- names ----------------------------------------------------------------------------------------

def test_exported_series_are_exactly_those_on_the_metrics_endpoint() -> None:
    rt = runtime()
    for name, spec in SPECS.items():
        # each series with its declared attributes: a reset keeps prepared series (at 0), so a label a
        # metric does not have would reach later tests' scrapes
        child = rt.family(name).child(**{a.name: (a.values or ("p",))[0] for a in spec.attributes})
        rt.emit(child, 1_000 if spec.instrument == "histogram" else 1)
    server = serve(port=0)
    try:
        import urllib.request

        with urllib.request.urlopen(server.url, timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert names == set(dash.exported_series())


def test_every_shipped_query_names_an_exported_or_recorded_series() -> None:
    boards = shipped_dashboards()
    assert {b["uid"] for b in boards} == {"gpuprobe-overview", "gpuprobe-ranks"}
    for board in boards:
        assert dash.check_queries(board) == []


def test_a_query_naming_a_metric_gpuprobe_does_not_export_is_reported_by_name() -> None:
    board = json.loads(json.dumps(shipped_dashboards()[0]))
    panel = next(p for p in dash.json_panels(board) if p["title"] == "Tokens per second")
    panel["targets"][0]["expr"] = "sum(rate(gen_ai_client_token_usage_total[5m]))"
    problems = dash.check_queries(board)
    assert problems == [
        "dashboard 'gpuprobe-overview', panel 'Tokens per second', query A: gen_ai_client_token_usage_total is "
        "not a series gpuprobe exports or records (did you mean gen_ai_client_token_usage_count?)"
    ]


def test_check_mode_fails_on_a_hand_edited_query_with_an_unknown_metric(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "dash"
    shutil.copytree(DASHBOARD_DIR, out)
    path = out / "gpuprobe-ranks.json"
    path.write_text(path.read_text().replace("gpuprobe_memory_allocated_bytes", "gpuprobe_memory_used_bytes"))
    assert dash.main(["--check", "--out", str(out), "--prometheus-out", PROMETHEUS_DIR]) == 1
    assert "panel 'Memory allocated by rank', query A: gpuprobe_memory_used_bytes is not a series" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("expr", "names"), [
    ('histogram_quantile(0.95, sum by (le, job) (rate(a_bucket{x="y"}[5m])))', ["a_bucket"]),
    ("sum by (component) (rate(b[$__rate_interval])) / ignoring(component) group_left sum(c)", ["b", "c"]),
    ('max(gpuprobe:x:p95_rate1m{m=~"$model"}) / min(d offset 5m) * 1e9', ["gpuprobe:x:p95_rate1m", "d"]),
    ('up{job=~"gpuprobe.*"} == 0 and on(instance) e unless f', ["up", "e", "f"]),
    ('rate(g[$window]) > $threshold + {__name__="h", job="j"}', ["g", "h"]),
    ('sum(rate(x[1m])) / sum(rate(x[5m])) or vector(0)', ["x"]),
])
def test_metric_names_skips_functions_labels_keywords_and_durations(expr: str, names: list[str]) -> None:
    assert dash.metric_names(expr) == names


def test_series_names_come_from_the_specs() -> None:
    assert dash.series("gen_ai.server.time_to_first_token", "bucket") == \
        "gen_ai_server_time_to_first_token_seconds_bucket"
    assert dash.series("gpuprobe.kernel.time") == "gpuprobe_kernel_time_seconds_total"
    assert dash.series("gpuprobe.memory.reserved") == "gpuprobe_memory_reserved_bytes"
    with pytest.raises(ConfigError, match="no metric named 'gpuprobe.nope'"):
        dash.series("gpuprobe.nope")
    with pytest.raises(ConfigError, match="part must be bucket, count or sum"):
        dash.series("gpuprobe.step.duration")


# -- dashboard structure ----------------------------------------------------------------------------

def test_dashboards_have_model_rank_and_instance_variables_and_a_datasource() -> None:
    for board in shipped_dashboards():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert set(variables) == {"datasource", "model", "rank", "instance"}
        assert variables["datasource"]["type"] == "datasource"
        for name in ("model", "rank", "instance"):
            assert variables[name]["query"].startswith("label_values(") and variables[name]["allValue"] == ".*"
        for panel in dash.json_panels(board):
            assert panel["datasource"]["uid"] == "${datasource}"
            for target in panel["targets"]:
                for var in ("$rank", "$instance"):
                    assert var in target["expr"], (panel["title"], target["expr"])


def test_panels_fit_the_grid_and_ids_are_unique() -> None:
    for board in shipped_dashboards():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for p in board["panels"]:
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


def test_overview_has_the_panels_a_generation_run_needs() -> None:
    titles = {p.title for p in dash.overview().panels}
    assert {"Time to first token", "Inter-token latency", "Request duration", "Tokens per second",
            "Step time by phase (host clock)", "Step time by component", "Logits processors: share of step time",
            "Decoder layer time", "Memory allocated and peak", "Memory reserved (CUDA caching allocator)",
            "KV cache size", "Requests in flight", "Errors", "Telemetry dropped"} <= titles
    component = next(p for p in dash.overview().panels if p.title == "Step time by component")
    assert component.stack


def test_gpu_only_flags_are_written_into_the_json() -> None:
    for model, board in zip(dash.dashboards(), shipped_dashboards(), strict=True):
        flags = {p["title"]: dash.is_gpu_only(p) for p in dash.json_panels(board)}
        assert flags == {p.title: p.gpu_only for p in model.panels}
    gpu = [p.title for d in dash.dashboards() for p in d.panels if p.gpu_only]
    assert gpu == ["Step time by phase (device clock)", "Memory reserved (CUDA caching allocator)",
                   "GPU utilization", "GPU memory used", "SM clock", "Power draw and limit", "GPU temperature",
                   "SM and tensor-core activity", "Clock throttle reasons", "Decode step time p95 by rank (device clock)"]


def test_quantile_panels_read_the_recording_rules() -> None:
    recorded = {r["record"] for g in dash.recording_rules()["groups"] for r in g["rules"]}
    used = {n for b in shipped_dashboards() for p in dash.json_panels(b) for t in p["targets"]
            for n in dash.metric_names(t["expr"]) if n.startswith("gpuprobe:")}
    assert used and used <= recorded


def test_fill_escapes_values_as_grafana_does() -> None:
    expr = 'x{instance=~"$instance", m=~"${model}"}[$__rate_interval]'
    filled = dash.fill(expr, {"instance": dash.regex_any(["127.0.0.1:9464", "h:1"]), "model": ".*"}, "30s")
    assert filled == r'x{instance=~"(127\\.0\\.0\\.1:9464|h:1)", m=~".*"}[30s]'
    with pytest.raises(ConfigError, match=r"no value for the dashboard variable \$rank"):
        dash.fill('x{r=~"$rank"}', {})


# -- Prometheus configuration -------------------------------------------------------------------------

def test_scrape_config_for_ranks_uses_base_port_plus_local_rank_on_each_host() -> None:
    cfg = dash.scrape_config(ranks=2, base_port=9500, hosts=["n0", "n1"], job="llm")
    groups = cfg["scrape_configs"][0]["static_configs"]
    assert groups == [{"targets": ["n0:9500", "n1:9500"], "labels": {"local_rank": "0"}},
                      {"targets": ["n0:9501", "n1:9501"], "labels": {"local_rank": "1"}}]
    assert cfg["rule_files"] == ["gpuprobe-rules.yml", "gpuprobe-alerts.yml"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ranks": 2, "base_port": 65535}, "--base-port 65535 with --ranks 2 needs ports up to 65536"),
    ({"ranks": 0}, "--ranks must be an integer >= 1, got 0"),
    ({"hosts": ["a", "a"]}, "--host a is given twice"),
    ({"interval": "5"}, "--interval must be a Prometheus duration"),
])
def test_scrape_config_rejects_bad_layouts_naming_the_option(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dash.scrape_config(**kwargs)


def test_cli_prints_the_scrape_config_for_n_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--scrape-config", "--ranks", "4", "--base-port", "9600", "--host", "127.0.0.1"]
    assert dash.main(args) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert [g["targets"] for g in cfg["scrape_configs"][0]["static_configs"]] == [
        [f"127.0.0.1:{9600 + i}"] for i in range(4)]


def test_cli_rejects_a_bad_layout_with_the_option_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert dash.main(["--scrape-config", "--ranks", "3", "--base-port", "65534"]) == 2
    assert "--base-port 65534 with --ranks 3" in capsys.readouterr().err


def test_python_m_gpuprobe_dashboard_dispatches_here() -> None:
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "dashboard", "--scrape-config", "--ranks", "2"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"127.0.0.1:9465"' in done.stdout


def test_promtool_accepts_the_shipped_configs_and_rules() -> None:
    ensure_prometheus()
    configs = sorted(os.path.join(PROMETHEUS_DIR, f) for f in os.listdir(PROMETHEUS_DIR) if f.startswith("prometheus"))
    assert len(configs) == 3
    rules = [os.path.join(PROMETHEUS_DIR, dash.RULES_FILE), os.path.join(PROMETHEUS_DIR, dash.ALERTS_FILE)]
    for cmd in ([PROMTOOL, "check", "config", *configs], [PROMTOOL, "check", "rules", *rules]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    recorded, alerts = len(dash.recorded_series()), len(dash.alert_rules()["groups"][0]["rules"])
    assert f"SUCCESS: {recorded} rules found" in done.stdout and f"SUCCESS: {alerts} rules found" in done.stdout


def test_alert_rules_fire_as_their_unit_tests_expect() -> None:
    ensure_prometheus()
    done = subprocess.run([PROMTOOL, "test", "rules", os.path.join(HERE, "alerts_test.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rejects_a_broken_rule_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ensure_prometheus()
    broken = dash.recording_rules()
    broken["groups"][0]["rules"][0]["expr"] = "histogram_quantile(0.5, sum by (le) (rate(x_bucket[1m]))"
    path = tmp_path / "rules.yml"
    path.write_text(dash.to_yaml(broken))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "gpuprobe:gen_ai_server_time_to_first_token_seconds:p50_rate1m" in done.stdout + done.stderr


# -- other integrations ----------------------------------------------------------------------------------

def test_otel_collector_config_receives_otlp_http_and_exports_to_prometheus() -> None:
    with open(os.path.join(ROOT, "deploy", "otel-collector", "otel-collector.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert cfg["exporters"]["prometheus"]["endpoint"] == "127.0.0.1:8889"
    assert cfg["exporters"]["prometheus"]["add_metric_suffixes"] is True
    pipeline = cfg["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and pipeline["exporters"] == ["prometheus"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(cfg[kind]), f"{kind} used but not defined"
    scrape = dash.scrape_config(base_port=8889, job="gpuprobe-otel-collector", honor_labels=True)
    with open(os.path.join(PROMETHEUS_DIR, "prometheus-otel-collector.yml")) as f:
        assert yaml.safe_load(f)["scrape_configs"] == scrape["scrape_configs"]


def test_grafana_provisioning_loads_the_dashboard_folder_and_a_prometheus_source() -> None:
    with open(os.path.join(GRAFANA_DIR, "provisioning", "dashboards", "gpuprobe.yaml")) as f:
        provider = yaml.safe_load(f)["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards/gpuprobe"
    with open(os.path.join(GRAFANA_DIR, "provisioning", "datasources", "prometheus.yaml")) as f:
        source = yaml.safe_load(f)["datasources"][0]
    assert source["type"] == "prometheus" and source["jsonData"]["timeInterval"] == "5s"
    assert not os.path.exists(os.path.join(ROOT, "deploy", "__init__.py"))


def test_docs_tables_are_the_generated_ones() -> None:
    with open(os.path.join(ROOT, "docs", "grafana.md"), encoding="utf-8") as f:
        doc = f.read()
    assert dash.mapping_table() in doc, "docs/grafana.md: refresh with python -m gpuprobe dashboard --doc-tables"
    assert dash.gpu_panels_table() in doc, "docs/grafana.md: refresh with python -m gpuprobe dashboard --doc-tables"


# -- bad input -------------------------------------------------------------------------------------------

def test_an_unreachable_prometheus_is_named_in_the_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(dash.PrometheusUnreachableError, match=f"Prometheus at {url} is unreachable"):
        dash.verify(url, shipped_dashboards())


def test_cli_verify_against_an_unreachable_prometheus_fails_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert dash.main(["--verify", url, "--out", DASHBOARD_DIR]) == 1
    assert f"Prometheus at {url} is unreachable" in capsys.readouterr().err


def _serve_as_rank(port: int, rank: int, by_local_rank: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(f"""
        import gpuprobe, time
        from gpuprobe.errors import ConfigError
        try:
            server = gpuprobe.serve({port})
        except ConfigError as exc:
            print("ConfigError:", exc)
            raise SystemExit(3)
        print("serving", server.url)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env.update({"PYTHONPATH": ROOT, "RANK": str(rank), "LOCAL_RANK": str(rank),
                "GPUPROBE_PORT_BY_LOCAL_RANK": by_local_rank})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_ranks_sharing_one_port_fail_naming_the_port() -> None:
    port = free_port(2)
    held = serve(port=port)  # this process plays local rank 0
    try:
        clash = _serve_as_rank(port, 1, by_local_rank="0")
        assert clash.returncode == 3, clash.stdout + clash.stderr
        assert f"port {port} on 127.0.0.1 is already in use" in clash.stdout
        apart = _serve_as_rank(port, 1, by_local_rank="1")
        assert apart.returncode == 0 and f"127.0.0.1:{port + 1}/metrics" in apart.stdout, apart.stdout + apart.stderr
    finally:
        held.close()


def test_a_local_rank_port_taken_by_another_process_names_rank_and_port() -> None:
    port = free_port(2)
    held = serve(port=port + 1)  # someone else holds base + 1
    try:
        clash = _serve_as_rank(port, 1, by_local_rank="1")
        assert clash.returncode == 3, clash.stdout + clash.stderr
        assert f"port {port + 1} (base port + LOCAL_RANK=1)" in clash.stdout
    finally:
        held.close()
