"""configure() and the exporters: calls add up, a bad exporter argument is a ConfigError that changes
nothing, and the quickstart's exporter block, run as written, delivers to all four exporters."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.runtime import runtime

from helpers import ROOT
from otlp_receiver import attrs, decode

TESTS = Path(__file__).resolve().parent


def _provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def _count(reader: InMemoryMetricReader, name: str) -> int:
    """Calls of probe ``name`` (host clock) the provider has recorded."""
    data = reader.get_metrics_data()
    return sum(p.count for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "gpuprobe.probe.duration" for p in m.data.data_points
               if p.attributes.get("probe") == name and p.attributes.get("clock") == "host")


def _wait_for(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.05)


def _bridges() -> list[str]:
    return [e for e in gpuprobe.info()["exporters"] if "MeterProvider bridge" in e]


def _calls(name: str, n: int) -> None:
    p = probe(name)
    for _ in range(n):
        with p:
            pass


def test_a_meter_provider_stays_fed_through_later_configure_calls(tmp_path: Path) -> None:
    provider, reader = _provider()
    gpuprobe.configure(meter_provider=provider)
    gpuprobe.configure(jsonl=str(tmp_path / "run.jsonl"))  # names another exporter: the provider stays
    gpuprobe.configure(memory=False)
    assert len(_bridges()) == 1
    _calls("kept", 4)
    _wait_for(lambda: _count(reader, "kept") == 4, "4 calls in the provider")


def test_meter_provider_none_records_what_is_queued_then_stops_feeding() -> None:
    provider, reader = _provider()
    gpuprobe.configure(meter_provider=provider)
    _calls("before", 2)
    runtime().drain()  # queued for the provider, not yet recorded
    gpuprobe.configure(meter_provider=None)
    assert _count(reader, "before") == 2 and _bridges() == []
    _calls("after", 3)
    runtime().lifecycle.tick()  # a background round: nothing may reach the provider now
    assert _count(reader, "after") == 0


def test_another_provider_replaces_the_first_and_the_same_one_is_bridged_once() -> None:
    first, first_reader = _provider()
    second, second_reader = _provider()
    gpuprobe.configure(meter_provider=first)
    gpuprobe.configure(meter_provider=first)
    assert len(_bridges()) == 1
    gpuprobe.configure(meter_provider=second)
    assert len(_bridges()) == 1
    _calls("replaced", 3)
    _wait_for(lambda: _count(second_reader, "replaced") == 3, "3 calls in the second provider")
    assert _count(first_reader, "replaced") == 0


class _GetMeterFails:
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no meters today")


class _AttributesFail:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"cannot read {name}")


@pytest.mark.parametrize("bad, message", [
    ("x", r"meter_provider must be an OpenTelemetry MeterProvider \(an object with a get_meter\(\) method\), "
          r"got 'x' \(str\)"),
    (42, r"meter_provider must be .* got 42 \(int\)"),
    (_AttributesFail(), r"meter_provider must be .* \(_AttributesFail\)"),
    (_GetMeterFails(), r"meter_provider: get_meter\(\) of .* failed: RuntimeError\('no meters today'\)"),
], ids=["str", "int", "unreadable_attributes", "get_meter_fails"])
def test_a_bad_meter_provider_is_a_config_error_that_changes_nothing(bad: Any, message: str, tmp_path: Path) -> None:
    before = gpuprobe.configure(jsonl=str(tmp_path / "a.jsonl"))
    with pytest.raises(ConfigError, match=message):
        gpuprobe.configure(meter_provider=bad, jsonl=str(tmp_path / "b.jsonl"))
    assert runtime().settings == before
    assert not (tmp_path / "b.jsonl").exists() and _bridges() == []


@pytest.mark.parametrize("bad", [object(), b"run.jsonl", 3.5, ["run.jsonl"]], ids=["object", "bytes", "float", "list"])
def test_a_jsonl_value_that_is_not_a_path_is_a_config_error_and_creates_no_file(
        bad: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"jsonl must be a path \(str or os.PathLike\[str\]\), got .* "
                                          rf"\({type(bad).__name__}\)"):
        gpuprobe.configure(jsonl=bad)
    assert os.listdir(tmp_path) == []
    assert runtime().settings.jsonl is None


def test_a_jsonl_path_object_is_taken(tmp_path: Path) -> None:
    cfg = gpuprobe.configure(jsonl=tmp_path / "as_path.jsonl")
    assert cfg.jsonl == str(tmp_path / "as_path.jsonl") and (tmp_path / "as_path.jsonl").exists()


# -- the quickstart's exporter block, as written ---------------------------------------------------

def _exporter_block() -> str:
    doc = (Path(ROOT) / "docs" / "quickstart.md").read_text()
    section = doc.split("## Exporters", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/quickstart.md: no python block under '## Exporters'"
    return match.group(1)


# The program around the block: its own OpenTelemetry pipeline (`my_meter_provider`, exporting to the
# same collector as "my-app" once, at exit, as a PeriodicExportingMetricReader does), then probed calls
# and a scrape of its own /metrics.
PROGRAM = """
import json, urllib.request
import gpuprobe
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

my_meter_provider = MeterProvider(
    resource=Resource.create({{"service.name": "my-app"}}),
    metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter(endpoint="http://127.0.0.1:4318/v1/metrics"),
                                                  export_interval_millis=3_600_000)])

{block}

@gpuprobe.probe("documented")
def step():
    pass

for _ in range({calls}):
    step()
with urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=5) as response:
    scraped = response.read().decode()
print(json.dumps({{"scraped": scraped}}))
"""

# Runs the program beside an OTLP receiver on 127.0.0.1:4318, the collector the block names; in a
# network namespace of its own where there is one, so the block's ports are free as written.
DRIVER = """
import json, subprocess, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from otlp_receiver import Receiver

out = Path({out!r})
if {netns!r}:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
receiver = Receiver(port=4318, out_dir=out)
proc = subprocess.run([sys.executable, {program!r}], cwd={cwd!r}, capture_output=True, text=True, timeout=120)
receiver.close()
print(json.dumps({{"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}}))
"""


def _ports_free(*ports: int) -> bool:
    try:
        for port in ports:
            socket.create_server(("127.0.0.1", port)).close()
    except OSError:
        return False
    return True


def _own_network() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    return subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True).returncode == 0


def test_the_quickstart_exporter_block_run_as_written_delivers_to_all_four_exporters(tmp_path: Path) -> None:
    block = _exporter_block()
    assert "serve(port=9464)" in block and "meter_provider=my_meter_provider" in block and "jsonl=" in block
    calls = 9
    program, out = tmp_path / "program.py", tmp_path / "received"
    program.write_text(PROGRAM.format(block=textwrap.dedent(block), calls=calls))
    netns = _own_network()
    if not netns and not _ports_free(9464, 4318):
        pytest.skip("ports 9464 and 4318, which the block names, are taken and no network namespace can be made")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(tests=str(TESTS), out=str(out), netns=netns, program=str(program),
                                    cwd=str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["PYTHONPATH"] = ROOT
    command = (["unshare", "-n"] if netns else []) + [sys.executable, str(driver)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["returncode"] == 0, result["stderr"]
    # No exporter warned (an opentelemetry-api before 1.28 is told once that it takes no bucket advice).
    warned = [line for line in result["stderr"].splitlines()
              if "gpuprobe:" in line and "bucket boundaries as advice" not in line]
    assert warned == []

    # Prometheus: the program's own scrape.
    scraped = {(s.name, s.labels.get("probe"), s.labels.get("clock")): s.value
               for fam in text_string_to_metric_families(json.loads(result["stdout"])["scraped"]) for s in fam.samples}
    assert scraped[("gpuprobe_probe_duration_seconds_count", "documented", "host")] == calls

    # OTLP (gpuprobe's push, at exit) and the MeterProvider (the program's pipeline, at exit): by resource.
    counts: dict[str, int] = {}
    for body in sorted(out.glob("*.pb")):
        for rm in decode(body.read_bytes()).resource_metrics:
            service = attrs(rm.resource.attributes)["service.name"]
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "gpuprobe.probe.duration":
                        for p in m.histogram.data_points:
                            if attrs(p.attributes).get("probe") == "documented" and attrs(p.attributes)["clock"] == "host":
                                counts[service] = p.count  # cumulative: the newest request's count
    assert counts == {"gpuprobe": calls, "my-app": calls}

    # JSONL: one whole line per call, in the file the block names (relative to the program's folder).
    jsonl = re.search(r'jsonl="([^"]+)"', block).group(1)  # type: ignore[union-attr]
    lines = [json.loads(line) for line in (tmp_path / jsonl).read_text().splitlines()]
    assert sum(1 for r in lines if r["attrs"].get("probe") == "documented" and r["attrs"]["clock"] == "host") == calls
