"""The OpenTelemetry instrumentor: on a real tiny Llama with a real SDK ``MeterProvider``, and found by
``opentelemetry-instrument`` through the package's entry point in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

KIT = Path(__file__).resolve().parent / "transformers"  # the tiny models' kit
sys.path.insert(0, str(KIT))
from _hfkit import ROOT, prompt  # noqa: E402
from _model_fixtures import isolated_models, make_model  # noqa: E402,F401 (fixtures)

import gpuprobe  # noqa: E402
from gpuprobe.integrations.transformers import SUPPORTED_VERSIONS, is_instrumented  # noqa: E402
from gpuprobe.testing import reset  # noqa: E402

pytest.importorskip("opentelemetry.instrumentation")
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor  # noqa: E402

REQUEST = "gen_ai.server.request.duration"


@pytest.fixture
def instrumentor() -> Iterator[GpuprobeInstrumentor]:
    inst = GpuprobeInstrumentor()
    yield inst
    if inst.is_instrumented_by_opentelemetry:
        inst.uninstrument()


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Metric name → data points, as the SDK's reader has them."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def requests_seen(reader: InMemoryMetricReader) -> int:
    return sum(p.count for p in points(reader).get(REQUEST, []))


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_instrumentor_names_the_transformers_it_supports(instrumentor):
    assert f"transformers {SUPPORTED_VERSIONS}" in instrumentor.instrumentation_dependencies()


def test_instrumented_models_feed_the_meter_provider_until_uninstrumented(make_model, instrumentor):
    reset(collect_interval=0.05)  # the bridge writes on the background thread, every collect_interval
    reader = InMemoryMetricReader()
    instrumentor.instrument(meter_provider=MeterProvider(metric_readers=[reader]))
    model = make_model("llama")  # never instrumented by hand
    model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
    assert is_instrumented(model)
    wait_for(lambda: requests_seen(reader) == 1, "the request in the MeterProvider")
    found = points(reader)
    assert {"gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
            "gpuprobe.step.duration"} <= set(found)
    step_points = found["gpuprobe.step.duration"]
    assert sum(p.count for p in step_points) == 4  # one prefill and three decode steps
    assert all(p.attributes["gpuprobe.rank"] == "0" for p in step_points)

    instrumentor.uninstrument()
    assert not is_instrumented(model)
    assert instrumentor.bridge is None
    model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
    time.sleep(0.3)  # six background rounds: what would have been written is written
    assert requests_seen(reader) == 1
    assert not any("MeterProvider bridge" in e for e in gpuprobe.info()["exporters"])



def test_a_problem_is_logged_and_leaves_the_program_running_uninstrumented(make_model, instrumentor, caplog):
    # opentelemetry-instrument stops the program when an instrumentor raises: this one never does.
    with caplog.at_level("WARNING", logger="gpuprobe"):
        instrumentor.instrument(meter_provider=MeterProvider(), layer_every=0)
    assert "transformers is not instrumented" in caplog.text and "layer_every" in caplog.text
    model = make_model("llama")
    model.generate(prompt(), max_new_tokens=2, min_new_tokens=2)
    assert not is_instrumented(model)
    assert instrumentor.bridge is None


APP = """
import json, sys, time
sys.path.insert(0, {kit!r})
from _hfkit import build, prompt
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import gpuprobe
from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor
from gpuprobe.integrations.transformers import is_instrumented

# The program's own OpenTelemetry pipeline, set after the instrumentor ran (it fed the global provider).
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

def seen():
    data = reader.get_metrics_data()
    return {{m.name: sum(getattr(p, "count", 0) for p in m.data.data_points)
            for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics for m in sm.metrics}}

model = build("llama").eval()  # the program never mentions instrumentation
model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
deadline = time.monotonic() + 30
while seen().get("gen_ai.server.request.duration") != 1 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({{
    "instrumented_by_opentelemetry": GpuprobeInstrumentor().is_instrumented_by_opentelemetry,
    "model_instrumented": is_instrumented(model),
    "exporters": gpuprobe.info()["exporters"],
    "meter_provider": seen(),
}}))
"""


@pytest.mark.subprocess_only  # opentelemetry-instrument runs the program in a process of its own
def test_opentelemetry_instrument_finds_gpuprobe_through_its_entry_point(tmp_path: Path):
    command = Path(sys.executable).parent / "opentelemetry-instrument"
    if not command.exists():
        pytest.skip("opentelemetry-instrument is not installed next to this Python")
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(APP.format(kit=str(KIT))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["GPUPROBE_COLLECT_INTERVAL"] = "0.05"  # the bridge writes every background round
    proc = subprocess.run([str(command), "--metrics_exporter", "none", "--traces_exporter", "none",
                           "--logs_exporter", "none", sys.executable, str(script)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["instrumented_by_opentelemetry"], (
        "opentelemetry-instrument did not load gpuprobe: is the package installed (pip install -e .) "
        "with its opentelemetry_instrumentor entry point?")
    assert seen["model_instrumented"] is True
    assert any("MeterProvider bridge" in e for e in seen["exporters"])
    # The global MeterProvider, set by the program after instrumentation, received gpuprobe's metrics.
    assert seen["meter_provider"]["gen_ai.server.request.duration"] == 1
    assert seen["meter_provider"]["gpuprobe.step.duration"] == 4
