"""OTLP/HTTP push to a local receiver that decodes the protobuf; exporter faults never reach the user."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import warnings
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

import gpuprobe
from gpuprobe import probe
from gpuprobe.runtime import runtime
from gpuprobe.exporters.otlp import MeterProviderBridge, OtlpExporter

from helpers import expected_device_label


class Receiver:
    """A minimal OTLP/HTTP metrics receiver on 127.0.0.1; ``mode`` is ok, error or slow."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[ExportMetricsServiceRequest] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.mode == "slow":
                    time.sleep(3)
                if outer.mode == "error":
                    self.send_response(500)
                    self.end_headers()
                    return
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                outer.requests.append(req)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics(self) -> dict[str, object]:
        out = {}
        for req in self.requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out[m.name] = (m, rm.resource)
        return out


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


def attrs(kvs) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {kv.key: kv.value.string_value for kv in kvs}


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


def test_users_meter_provider_receives_gpuprobe_metrics_with_our_buckets() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    bridge = MeterProviderBridge(MeterProvider(metric_readers=[reader])).attach()
    for _ in range(3):
        with probe("bridged"):
            pass
    runtime().drain()
    bridge.tick()
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    hist = metrics["gpuprobe.probe.duration"]
    (point,) = [p for p in hist.data.data_points
                if p.attributes["probe"] == "bridged" and p.attributes["clock"] == "host"]
    assert point.count == 3 and hist.unit == "s"
    assert list(point.explicit_bounds)[:2] == [1e-06, 2.5e-06]
    assert point.attributes["gpuprobe.rank"] == "0"
    bridge.close()
