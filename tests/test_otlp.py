"""OTLP/HTTP push to a real receiver that decodes the protobuf; exporter faults never reach the user.

Run on the newest opentelemetry-sdk in .venv and on the lowest pyproject.toml allows by
scripts/test-otel-floor.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.runtime import runtime
from gpuprobe.exporters.otlp import MeterProviderBridge, OtlpExporter

from helpers import expected_device_label, run_python
from otlp_receiver import DripServer, Receiver, attrs


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1/metrics"


def test_push_carries_names_units_attributes_buckets_and_counts(receiver: Receiver) -> None:
    exp = OtlpExporter(receiver.url, interval=60).attach()

    @probe("prefill", kind="step")
    def prefill() -> None:
        pass

    for _ in range(5):
        prefill()
    with pytest.raises(KeyError):
        with probe("lookup"):
            raise KeyError("k")
    assert exp.push() is True
    metrics = receiver.metrics()
    hist, resource = metrics["gpuprobe.probe.duration"]
    assert hist.unit == "s"
    # The host clock's point (once the program has initialized CUDA, a device clock's point too).
    (point,) = [p for p in hist.histogram.data_points
                if attrs(p.attributes)["probe"] == "prefill" and attrs(p.attributes)["clock"] == "host"]
    assert point.count == 5 and sum(point.bucket_counts) == 5
    assert attrs(point.attributes) == {"probe": "prefill", "kind": "step", "clock": "host",
                                      "gpuprobe.rank": "0", "gpuprobe.device": expected_device_label()}
    assert list(point.explicit_bounds)[:3] == [1e-06, 2.5e-06, 5e-06]
    assert hist.histogram.aggregation_temporality == 2  # cumulative
    errors, _ = metrics["gpuprobe.probe.errors"]
    assert errors.unit == "{error}" and errors.sum.is_monotonic
    assert errors.sum.data_points[0].as_double == 1 or errors.sum.data_points[0].as_int == 1
    assert attrs(resource.attributes)["service.name"] == "gpuprobe"
    exp.close()


def test_periodic_push_happens_on_its_own(receiver: Receiver) -> None:
    exp = OtlpExporter(receiver.url, interval=0.2).attach()
    with probe("tick"):
        pass
    deadline = time.monotonic() + 5
    while not receiver.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.requests, "no push arrived within 5 s"
    exp.close()


@pytest.mark.parametrize("mode", ["down", "error"])
def test_failing_endpoint_never_raises_warns_once_and_counts(mode: str) -> None:
    recv = None if mode == "down" else Receiver("error")
    url = _closed_port_url() if recv is None else recv.url
    exp = OtlpExporter(url, interval=60, timeout=1).attach()
    with probe("work"):
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exp.push() is False
        assert exp.push() is False
    ours = [w for w in caught if "OTLP push" in str(w.message)]
    assert len(ours) == 1 and url in str(ours[0].message)
    dropped = {md.spec.name: md for md in gpuprobe.collect()}["gpuprobe.telemetry.dropped"]
    (pt,) = [p for p in dropped.points if p.labels["reason"] == "otlp_export_failed"]
    assert pt.value >= 2
    exp.stop()
    if recv:
        recv.close()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the stuck push times out and says so, once
def test_slow_endpoint_never_blocks_the_hot_path() -> None:
    recv = Receiver("slow")
    exp = OtlpExporter(recv.url, interval=0.05, timeout=1).attach()
    p = probe("hot")
    time.sleep(0.2)  # a push is now stuck in the slow receiver
    worst = 0
    for _ in range(2000):
        t0 = time.perf_counter()
        with p:
            pass
        worst = max(worst, time.perf_counter() - t0)
    # A blocked push would stall a call for ~1 s (the timeout); scheduler noise stays far below that.
    assert worst < 0.2
    exp.stop(timeout=5)  # let the stuck push time out here, not during a later test
    recv.close()


def _takes_bucket_advice() -> bool:
    """Whether the installed opentelemetry-api's create_histogram takes bucket boundaries as advice (1.28+)."""
    from opentelemetry.sdk.metrics import MeterProvider

    meter = MeterProvider().get_meter("probe-the-api")
    return "explicit_bucket_boundaries_advisory" in inspect.signature(meter.create_histogram).parameters


def test_users_meter_provider_receives_gpuprobe_metrics_with_our_buckets() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    bridge = MeterProviderBridge(MeterProvider(metric_readers=[reader])).attach()
    for _ in range(3):
        with probe("bridged"):
            pass
    runtime().drain()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bridge.tick()
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    hist = metrics["gpuprobe.probe.duration"]
    (point,) = [p for p in hist.data.data_points
                if p.attributes["probe"] == "bridged" and p.attributes["clock"] == "host"]
    assert point.count == 3 and hist.unit == "s"
    assert point.attributes["gpuprobe.rank"] == "0"
    advice_warnings = [w for w in caught if "bucket boundaries as advice" in str(w.message)]
    if _takes_bucket_advice():
        assert list(point.explicit_bounds)[:2] == [1e-06, 2.5e-06] and not advice_warnings
    else:  # an older API: the provider's own buckets, said once
        assert list(point.explicit_bounds)[:2] != [1e-06, 2.5e-06] and len(advice_warnings) == 1
    bridge.close()


def test_an_endpoint_that_is_not_an_http_url_is_a_config_error() -> None:
    for bad in ("ftp://127.0.0.1:4318/v1/metrics", "http:///v1/metrics", "http://127.0.0.1:99999/v1/metrics"):
        with pytest.raises(ConfigError, match="OTLP endpoint must be an http"):
            OtlpExporter(bad)
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        OtlpExporter("http://127.0.0.1:4318/v1/metrics", timeout=0)


# -- the last push: nothing measured is lost at exit --------------------------------------------------

SHORT_PROGRAM = """
import json, time
import gpuprobe

@gpuprobe.probe("short_job", kind="step")
def work(seconds):
    time.sleep(seconds)

start = time.perf_counter()
outer = []
for seconds in (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07):
    t0 = time.perf_counter()
    work(seconds)
    outer.append(time.perf_counter() - t0)
for _ in range(3):
    try:
        with gpuprobe.probe("failing"):
            raise ValueError("expected")
    except ValueError:
        pass
time.sleep(max(0.0, 1.0 - (time.perf_counter() - start)))  # a one-second program
print(json.dumps({"outer": sum(outer), "inner": 0.28}))
"""


def _histogram_point(metric, **labels):  # type: ignore[no-untyped-def]
    (point,) = [p for p in metric.histogram.data_points if labels.items() <= attrs(p.attributes).items()]
    return point


def test_a_program_shorter_than_one_push_interval_delivers_its_records(receiver: Receiver) -> None:
    # The default interval is 5 s: nothing is pushed while the program runs, the last push at exit is all.
    proc = run_python(SHORT_PROGRAM, env={"GPUPROBE_OTLP_ENDPOINT": receiver.url})
    assert proc.returncode == 0, proc.stderr
    assert "OTLP push" not in proc.stderr
    times = json.loads(proc.stdout)
    assert len(receiver.requests) == 1
    metrics = receiver.metrics()
    hist, resource = metrics["gpuprobe.probe.duration"]
    point = _histogram_point(hist, probe="short_job", clock="host")
    labels = attrs(point.attributes)
    assert labels["kind"] == "step" and labels["gpuprobe.rank"] == "0"
    assert set(labels) == {"probe", "kind", "clock", "gpuprobe.rank", "gpuprobe.device"}
    assert point.count == 7 and sum(point.bucket_counts) == 7
    # Each call slept its time inside the probe and was timed around it outside: the sum lies between.
    assert times["inner"] <= point.sum <= times["outer"]
    assert 0.01 <= point.min and 0.07 <= point.max <= times["outer"]
    errors, _ = metrics["gpuprobe.probe.errors"]
    (err,) = [p for p in errors.sum.data_points if attrs(p.attributes).get("probe") == "failing"]
    assert attrs(err.attributes)["error.type"] == "ValueError"
    assert (err.as_int or err.as_double) == 3
    assert attrs(resource.attributes)["service.name"] == "gpuprobe"


def test_the_last_interval_of_a_longer_program_arrives(receiver: Receiver) -> None:
    code = """
        import time
        import gpuprobe
        p = gpuprobe.probe("phases")
        for _ in range(4):
            with p:
                pass
        time.sleep(1.0)  # pushes every 0.2 s carry the first 4
        for _ in range(6):
            with p:
                pass
        """  # ...and the program ends at once: only the last push can carry the other 6
    proc = run_python(code, env={"GPUPROBE_OTLP_ENDPOINT": receiver.url, "GPUPROBE_OTLP_INTERVAL": "0.2"})
    assert proc.returncode == 0, proc.stderr
    counts = []
    for req in receiver.requests:
        for rm in req.resource_metrics:
            for m in rm.scope_metrics[0].metrics:
                if m.name == "gpuprobe.probe.duration":
                    counts.append(_histogram_point(m, probe="phases", clock="host").count)
    # Periodic pushes in the pause carried the first 4; only the last push, at exit, the other 6.
    assert counts.count(4) >= 2 and counts[-1] == 10 and counts.count(10) == 1, counts


# -- a slow endpoint: one deadline per push --------------------------------------------------------------

@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer(gap=0.05)
    yield server
    server.close()


def _dropped(reason: str) -> float:
    return sum(p.value for md in gpuprobe.collect() if md.spec.name == "gpuprobe.telemetry.dropped"
               for p in md.points if p.labels["reason"] == reason)


def test_an_endpoint_answering_one_byte_at_a_time_is_cut_at_the_deadline(drip: DripServer) -> None:
    exp = OtlpExporter(drip.url, interval=60, timeout=1.0).attach()
    for name in ("a", "b"):
        with probe(name):
            pass
    points = sum(len(md.points) for md in gpuprobe.collect())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        assert exp.push() is False
        took = time.monotonic() - t0
    # Each read waits 0.05 s at most: per-read timeouts never fire; the push's deadline does.
    assert 1.0 <= took < 1.8, took
    ours = [str(w.message) for w in caught if "OTLP push" in str(w.message)]
    assert len(ours) == 1 and "deadline of 1 s" in ours[0] and "cut" in ours[0]
    assert _dropped("otlp_export_failed") == points
    deadline = time.monotonic() + 2
    while drip.cut_after[0] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert drip.requests == 1 and drip.cut_after[0] is not None and drip.cut_after[0] < 1.5  # the connection closed
    exp.stop()


def test_exit_with_a_dripping_endpoint_waits_no_longer_than_the_deadline(drip: DripServer) -> None:
    code = """
        import time
        import gpuprobe
        with gpuprobe.probe("before_exit"):
            pass
        print(time.monotonic())
        """
    proc = run_python(code, env={"GPUPROBE_OTLP_ENDPOINT": drip.url, "GPUPROBE_OTLP_TIMEOUT": "1"})
    ended = time.monotonic()
    assert proc.returncode == 0, proc.stderr
    assert ended - float(proc.stdout) < 1.0 + 1.5  # the last push's deadline, plus the interpreter's exit
    assert "last OTLP push" in proc.stderr and "deadline of 1 s" in proc.stderr
    assert "next push" not in proc.stderr  # no promise of a retry from a process that is ending


def test_a_retryable_answer_is_retried_within_the_deadline() -> None:
    recv = Receiver(statuses=[503, 429])
    try:
        exp = OtlpExporter(recv.url, interval=60, timeout=3).attach()
        with probe("retried"):
            pass
        assert exp.push() is True
        assert recv.answered == [503, 429, 200] and len(recv.requests) == 1
        exp.stop()
    finally:
        recv.close()


def test_a_retry_that_does_not_fit_the_deadline_is_not_made() -> None:
    recv = Receiver(mode="error", statuses=[503, 503, 503, 503, 503, 503, 503, 503, 503, 503])
    try:
        exp = OtlpExporter(recv.url, interval=60, timeout=0.5).attach()
        with probe("unavailable"):
            pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            assert exp.push() is False
            assert time.monotonic() - t0 < 0.5 + 0.3
        assert any("HTTP 503" in str(w.message) for w in caught)
        exp.stop()
    finally:
        recv.close()


def test_headers_and_compression_follow_the_sdks_environment_variables(receiver: Receiver,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=gpu-team,authorization=Bearer%20abc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip")
    exp = OtlpExporter(receiver.url, interval=60, headers={"x-extra": "1"}).attach()
    with probe("compressed"):
        pass
    assert exp.push() is True
    (headers,) = receiver.headers
    assert headers["content-encoding"] == "gzip" and headers["content-type"] == "application/x-protobuf"
    assert headers["x-tenant"] == "gpu-team" and headers["authorization"] == "Bearer abc"
    assert headers["x-extra"] == "1"
    hist, _ = receiver.metrics()["gpuprobe.probe.duration"]
    assert _histogram_point(hist, probe="compressed", clock="host").count == 1
    exp.stop()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for a TLS receiver")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_https_endpoint_is_verified_with_the_environment_certificate(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    cert, key = _self_signed(tmp_path)
    recv = Receiver()
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        recv.httpd.socket = context.wrap_socket(recv.httpd.socket, server_side=True)
        url = recv.url.replace("http://", "https://")
        with probe("over_tls"):
            pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            untrusted = OtlpExporter(url, interval=60, timeout=2).attach()
            assert untrusted.push() is False  # the receiver's certificate is not trusted by default
        assert any("CERTIFICATE_VERIFY_FAILED" in str(w.message) for w in caught)
        untrusted.stop()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
        trusted = OtlpExporter(url, interval=60, timeout=2).attach()
        assert trusted.push() is True
        hist, _ = recv.metrics()["gpuprobe.probe.duration"]
        assert _histogram_point(hist, probe="over_tls", clock="host").count == 1
        trusted.stop()
    finally:
        recv.close()


def test_otel_variables_it_cannot_use_are_warned_and_left_out(receiver: Receiver, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tmp_path / "missing.pem"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp = OtlpExporter(receiver.url, interval=60).attach()
        https = OtlpExporter(receiver.url.replace("http://", "https://"), interval=60).attach()
    messages = [str(w.message) for w in caught]
    assert any("COMPRESSION must be none, gzip or deflate, got 'brotli'" in m for m in messages)
    assert any("missing.pem" in m and "the system's certificates are used" in m for m in messages)
    with probe("plain"):
        pass
    assert exp.push() is True and "content-encoding" not in receiver.headers[0]
    exp.stop()
    https.stop()
