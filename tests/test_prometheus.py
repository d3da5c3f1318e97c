"""The /metrics endpoint, scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe

from helpers import cuda_present, expected_device_label, scrape, scrape_text, wait_for


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
    (err,) = [s for s in samples["gpuprobe_probe_errors_total"] if s.labels["probe"] == "boom"]
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


# -- series there from the start ------------------------------------------------------------------------

def test_build_info_names_the_versions_and_the_device_from_the_first_scrape(server) -> None:  # type: ignore[no-untyped-def]
    from importlib import metadata

    (info,) = scrape(server.url)["gpuprobe_build_info"]
    assert info.value == 1
    v = sys.version_info
    # Nothing has run on a device since the reset: the label says which kind of device only, whether or
    # not an earlier test initialized CUDA (a device span since the reset would make it cuda:N).
    device = "cuda" if cuda_present() else "cpu"
    assert info.labels == {
        "gpuprobe_version": gpuprobe.__version__, "torch_version": metadata.version("torch"),
        "transformers_version": metadata.version("transformers"), "python_version": f"{v.major}.{v.minor}.{v.micro}",
        "device_name": device, "gpuprobe_rank": "0", "gpuprobe_device": device}


def test_counters_of_known_labels_read_0_before_anything_is_counted(server) -> None:  # type: ignore[no-untyped-def]
    from gpuprobe import _seams
    from gpuprobe._metrics import DROP_REASONS

    samples = scrape(server.url)
    dropped = {s.labels["reason"]: s.value for s in samples["gpuprobe_telemetry_dropped_total"]}
    assert set(DROP_REASONS) <= set(dropped) and set(dropped.values()) == {0.0}  # (and reasons earlier tests used)
    seams = {s.labels["seam"]: s.value for s in samples["gpuprobe_seam_disabled_total"]}
    declared = {seam.name for seam in _seams.registry()}
    assert declared and declared <= set(seams) and set(seams.values()) == {0.0}  # (and seams earlier tests named)


def test_a_counted_drop_shows_beside_the_zeros_of_the_other_reasons() -> None:
    from gpuprobe.runtime import runtime

    runtime().drop("jsonl_queue_full", 3)
    srv = gpuprobe.serve(port=0)
    try:
        dropped = {s.labels["reason"]: s.value for s in scrape(srv.url)["gpuprobe_telemetry_dropped_total"]}
    finally:
        srv.close()
    assert dropped["jsonl_queue_full"] == 3 and dropped["otlp_export_failed"] == 0


def test_every_reason_the_code_drops_for_is_declared() -> None:
    """The drop reasons in gpuprobe's source (literal, or a queued sink's ``<name>_queue_full`` and
    ``<name>_write_failed``) are those exposed at 0: a new reason needs declaring in DROP_REASONS."""
    import ast
    import importlib

    from gpuprobe._metrics import DROP_REASONS

    package = Path(gpuprobe.__file__).parent
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("drop", "_on_problem", "_device_problem") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    for module in ("gpuprobe.exporters.jsonl", "gpuprobe.exporters.otlp"):
        importlib.import_module(module)
    from gpuprobe.exporters._queued import QueuedSink

    sinks = [cls.name for cls in QueuedSink.__subclasses__()]
    found |= {f"{name}_{what}" for name in sinks for what in ("queue_full", "write_failed")}
    assert {"jsonl", "meter_provider"} <= set(sinks) and "kernel_sampling_busy" in found
    assert found <= set(DROP_REASONS), sorted(found - set(DROP_REASONS))


def test_serving_imports_no_optional_package_the_program_did_not() -> None:
    from helpers import run_python

    done = run_python("""
        import sys, urllib.request
        import gpuprobe
        server = gpuprobe.serve(port=0)
        text = urllib.request.urlopen(server.url, timeout=30).read().decode()
        assert "gpuprobe_build_info{" in text, text
        line = next(l for l in text.splitlines() if l.startswith("gpuprobe_build_info{"))
        print(line)
        print(sorted(m for m in ("torch", "transformers", "numpy", "nvtx", "opentelemetry") if m in sys.modules))
        server.close()
    """)
    assert done.returncode == 0, done.stderr
    line, imported = done.stdout.splitlines()
    assert imported == "[]"
    from importlib import metadata

    assert f'torch_version="{metadata.version("torch")}"' in line


def test_build_info_takes_the_gpu_name_once_the_program_runs_work_on_it(simcuda) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    sim = simcuda(2)
    srv = gpuprobe.serve(port=0)
    try:
        (before,) = scrape(srv.url)["gpuprobe_build_info"]
        assert before.labels["device_name"] == "cuda"  # CUDA not initialized by the program yet

        @probe("on_gpu")
        def work() -> None:
            sim.launch(1_000_000)

        torch.cuda.set_device(1)
        work()
        sim.finish()
        name = torch.cuda.get_device_properties(1).name

        def renamed() -> list:
            found = scrape(srv.url)["gpuprobe_build_info"]
            return found if found[0].labels["device_name"] == name else []

        after = wait_for(renamed, "the GPU's name in gpuprobe_build_info")
        assert len(after) == 1 and after[0].labels["gpuprobe_device"] == "cuda:1"  # one series, not two
    finally:
        srv.close()


# -- the exposition's own renderer, against prometheus_client's -----------------------------------------

@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-0.0.4", "openmetrics-1.0"])
def test_the_renderer_writes_what_prometheus_client_writes(openmetrics: bool) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    from gpuprobe.exporters.prometheus import GpuprobeCollector, render
    from gpuprobe.runtime import runtime

    @probe("odd", attrs={"aaa": 'quote " back \\ line \n end', "zzz": "after le"})  # labels around "le"
    def odd() -> None:
        pass

    for _ in range(3):
        odd()
    rt = runtime()
    rt.drop("otlp_export_failed", 12_345_678)  # past a million: Go's exponent form
    rt.emit(rt.family("gpuprobe.generate.active").child(model="m"), -2)
    rt.emit(rt.family("gpuprobe.memory.allocated").child(device="cpu"), 0.5)
    collector = GpuprobeCollector(rt)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    ours = render(collector.data(), openmetrics=openmetrics).decode()
    theirs = (generate_openmetrics if openmetrics else generate_latest)(registry).decode()
    parse = parse_openmetrics if openmetrics else parse_text

    def families(text: str) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
        return [(f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
                for f in parse(text)]

    assert families(ours) == families(theirs)
    assert 'aaa="quote \\" back \\\\ line \\n end"' in ours and "12345678" not in ours  # 1.2345678e+07
    assert ("# EOF" in ours) == openmetrics
