"""The /metrics endpoint, scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import socket
import time

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe

from helpers import expected_device_label, scrape, scrape_text


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    srv = gpuprobe.serve(port=0)
    yield srv
    srv.close()


def test_serves_on_loopback_by_default(server) -> None:  # type: ignore[no-untyped-def]
    assert server.addr == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")


def test_probe_histogram_names_units_labels_and_counts(server) -> None:  # type: ignore[no-untyped-def]
    @probe("tokenize", kind="user", attrs={"stage": "pre"})
    def tokenize() -> None:
        pass

    for _ in range(7):
        tokenize()
    samples = scrape(server.url)
    # The host clock's series (once the program has initialized CUDA, a device clock's series too).
    count = [s for s in samples["gpuprobe_probe_duration_seconds_count"]
             if s.labels["probe"] == "tokenize" and s.labels["clock"] == "host"]
    assert len(count) == 1 and count[0].value == 7
    labels = count[0].labels
    assert labels == {"probe": "tokenize", "kind": "user", "clock": "host", "stage": "pre",
                      "gpuprobe_rank": "0", "gpuprobe_device": expected_device_label()}
    buckets = [s for s in samples["gpuprobe_probe_duration_seconds_bucket"]
               if s.labels["probe"] == "tokenize" and s.labels["clock"] == "host"]
    les = [s.labels["le"] for s in buckets]
    assert les[0] == "1e-06" and les[-1] == "+Inf"
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)  # cumulative
    assert buckets[-1].value == 7


def test_error_counter_is_exposed_with_total_suffix(server) -> None:  # type: ignore[no-untyped-def]
    @probe("boom")
    def boom() -> None:
        raise RuntimeError("x")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            boom()
    samples = scrape(server.url)
    (err,) = samples["gpuprobe_probe_errors_total"]
    assert err.value == 2 and err.labels["error_type"] == "RuntimeError" and err.labels["probe"] == "boom"


def test_a_record_is_visible_within_one_second(server) -> None:  # type: ignore[no-untyped-def]
    with probe("fresh"):
        pass
    t0 = time.monotonic()
    samples = scrape(server.url)
    elapsed = time.monotonic() - t0
    assert any(s.labels["probe"] == "fresh" for s in samples["gpuprobe_probe_duration_seconds_count"])
    assert elapsed < 1.0


def test_help_text_names_the_otel_metric_and_unit(server) -> None:  # type: ignore[no-untyped-def]
    with probe("h"):
        pass
    text = scrape_text(server.url)
    assert "# TYPE gpuprobe_probe_duration_seconds histogram" in text
    assert "(gpuprobe.probe.duration, unit s)" in text


def test_port_in_use_is_a_clear_error_naming_port_and_setting() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as info:
            gpuprobe.serve(port=port)
        msg = str(info.value)
        assert f"port {port}" in msg and "already in use" in msg and "port=" in msg
    finally:
        sock.close()


def test_bad_port_value_is_rejected() -> None:
    with pytest.raises(ConfigError, match="port= must be a TCP port"):
        gpuprobe.serve(port=123456)


def test_port_from_environment_adds_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprobe.testing import reset

    probe_sock = socket.socket()
    probe_sock.bind(("127.0.0.1", 0))
    base = probe_sock.getsockname()[1]
    probe_sock.close()
    reset(prometheus_port=base - 1, local_rank=1)  # server starts from the settings on reset
    samples = scrape(f"http://127.0.0.1:{base}/metrics")
    assert isinstance(samples, dict)


def test_serving_a_port_twice_shares_it_until_the_last_close() -> None:
    first = gpuprobe.serve(port=0)
    second = gpuprobe.serve(port=first.port)
    assert second.port == first.port
    first.close()
    first.close()  # closing one handle twice does not release the other
    assert isinstance(scrape(second.url), dict)  # still served for the second user
    second.close()
    with pytest.raises(OSError):
        scrape(second.url)
