"""Exemplars end to end: Debian's Prometheus, started with ``--enable-feature=exemplar-storage``, scrapes
gpuprobe's /metrics (it asks for OpenMetrics, the format that carries exemplars) while tiny real models
generate in this process with traces on (the OpenTelemetry SDK's TracerProvider and in-memory exporter);
its ``/api/v1/query_exemplars`` answers with trace and span ids of spans the exporter got, for the shipped
dashboards' own exemplar queries. And the shipped Grafana files that lead from an exemplar to its trace."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml

from gpuprobe import dashboards as dash

from .promstack import PROMETHEUS, ROOT, Proc, ensure_prometheus, free_port, http_ok, shipped_dashboards, temp_dir, \
    wait_until

GRAFANA = os.path.join(ROOT, "deploy", "grafana")


def _exemplar_targets() -> list[tuple[str, str, str]]:
    """(dashboard, panel, query) of every shipped target that asks Grafana for exemplars."""
    return [(board["uid"], panel["title"], target["expr"]) for board in shipped_dashboards()
            for panel in dash.json_panels(board) for target in panel["targets"] if target.get("exemplar")]


# -- the shipped files ------------------------------------------------------------------------------------

def test_the_five_latency_histograms_panels_ask_for_exemplars_from_their_buckets() -> None:
    from gpuprobe._metrics import SPECS, prometheus_name

    targets = _exemplar_targets()
    read = {name for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.request.duration",
                              "gpuprobe.inter_token.duration", "gpuprobe.request.queue.duration",
                              "gpuprobe.step.duration")
            if any(f"{prometheus_name(SPECS[name])}_bucket" in expr for _, _, expr in targets)}
    assert len(read) == 5, read
    for board in shipped_dashboards():
        for panel in dash.json_panels(board):
            asks = any(t.get("exemplar") for t in panel["targets"])
            assert asks == (dash.EXEMPLARS_NOTE in panel["description"]), panel["title"]


def test_the_prometheus_data_source_links_an_exemplar_s_trace_id_to_a_provisioned_traces_source() -> None:
    folder = os.path.join(GRAFANA, "provisioning", "datasources")
    sources = [s for name in sorted(os.listdir(folder)) if name.endswith(".yaml")
               for s in yaml.safe_load(open(os.path.join(folder, name), encoding="utf-8"))["datasources"]]
    by_uid = {s["uid"]: s for s in sources}
    (link,) = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id"  # the exemplar label gpuprobe writes
    assert by_uid[link["datasourceUid"]]["type"] in ("jaeger", "tempo", "zipkin")


def test_the_collector_exposes_openmetrics_so_pushed_exemplars_reach_prometheus() -> None:
    with open(os.path.join(ROOT, "deploy", "otel-collector", "otel-collector.yaml"), encoding="utf-8") as f:
        assert yaml.safe_load(f)["exporters"]["prometheus"]["enable_open_metrics"] is True


# -- a real Prometheus ----------------------------------------------------------------------------------

def _query_exemplars(url: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query_exemplars?{params}", timeout=5) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return [e for series in answer["data"] for e in series["exemplars"]]


def _generate() -> None:
    """generate() calls and a continuous-batching run of tiny models, traced; the spans sent."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "transformers"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "serving"))
    import transformers
    from _hfkit import build, prompt
    from _servekit import tiny_llama

    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.runtime import runtime
    from helpers import cpu_continuous_batching_cannot_pin

    called = instrument(build("llama").eval(), model_name="called")
    for new in (3, 7, 12):
        called.generate(prompt(1, 5), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    uninstrument(called)
    if cpu_continuous_batching_cannot_pin() is None:
        batched = instrument(tiny_llama(), model_name="batched")
        gen = transformers.GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
        cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=16)
        batched.generate_batch([[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate((5, 12, 20, 3))],
                               generation_config=gen, continuous_batching_config=cfg)
        uninstrument(batched)
    gpuprobe.collect()  # the drain splits the continuous-batching steps: their spans are made
    from gpuprobe.exporters.traces import TraceExporter

    for item in runtime().lifecycle.items():
        if isinstance(item, TraceExporter):
            item.flush()


@pytest.mark.prometheus_server
def test_prometheus_stores_exemplars_whose_ids_are_spans_the_exporter_got() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import gpuprobe
    from gpuprobe.testing import reset

    ensure_prometheus()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    reset()
    gpuprobe.configure(tracer_provider=provider)
    with temp_dir() as work:
        server = gpuprobe.serve(port=0)  # answered by its front process, as a served program's is
        prom = None
        try:
            config = dash.scrape_config(base_port=server.port, interval="1s", rule_files=())
            path = os.path.join(work, "prometheus.yml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(dash.to_yaml(config))
            port = free_port()
            prom = Proc("prometheus", [PROMETHEUS, f"--config.file={path}",
                                       f"--storage.tsdb.path={os.path.join(work, 'data')}",
                                       f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                                       "--enable-feature=exemplar-storage"], os.path.join(work, "prometheus.log"))
            url = f"http://127.0.0.1:{port}"
            wait_until("Prometheus to be ready", lambda: http_ok(f"{url}/-/ready"), 60, (prom,))
            start = time.time() - 60
            _generate()
            finished = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}"): s.name
                        for s in memory.get_finished_spans()}
            targets = _exemplar_targets()
            variables = {"model": ".*", "rank": ".*", "instance": ".*"}
            found: dict[str, list[dict[str, Any]]] = {}

            def every_target_has_exemplars() -> bool:
                for board, title, expr in targets:
                    found[f"{board} / {title}"] = _query_exemplars(url, dash.fill(expr, variables), start,
                                                                  time.time() + 5)
                return all(found.values())

            from helpers import cpu_continuous_batching_cannot_pin

            if cpu_continuous_batching_cannot_pin() is not None:  # no queue: its panel waits for serving
                targets = [t for t in targets if "queue" not in t[2]]
            wait_until("exemplars of every exemplar query of the dashboards", every_target_has_exemplars, 60,
                       (prom,))
        finally:
            server.close()
            if prom is not None:
                prom.stop()
            gpuprobe.configure(tracer_provider=None)
            reset()
    assert finished and len(found) == len(targets) and all(found.values())
    for panel, exemplars in found.items():
        for exemplar in exemplars:
            ids = (exemplar["labels"]["trace_id"], exemplar["labels"]["span_id"])
            assert ids in finished, f"{panel}: {ids} is no span the exporter got"
            assert finished[ids] in ("text_completion called", "text_completion batched", "scheduler step")
