"""``gpuprobe doctor``: every line, its state and reason, the exit status, the JSON layout.

Expected values come from sources doctor does not read the same way: ``platform``, ``torch.__version__``,
``importlib.metadata``, pyproject.toml's declared range (scripts/versions.py, read with ``packaging``),
the sockets and servers the tests bind themselves, the NVTX calls an injection library recorded, and
the simulated device's own clock. No GPU runs here: the CUDA lines run on the simulated CUDA
(gpuprobe.testing.simcuda); NVML's module belongs to gpuprobe's NVML support, and where this gpuprobe
has none a stand-in module (a test double) plays its ``describe()``.
"""

from __future__ import annotations

import dataclasses
import http.server
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from gpuprobe import _seams, config, doctor
from gpuprobe.integrations import registry
from gpuprobe.testing.nvtx_capture import capture_env, parse_capture

from kineto_shapes import use_shape

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import versions  # noqa: E402 - scripts/versions.py reads pyproject.toml

CHECKS = ["python", "settings", "torch", "threads", *registry.names(), "cuda", "device timing", "nvtx", "kernel sampling",
          "nvml", "prometheus", "otlp", "files", "seams"]


@pytest.fixture(autouse=True)
def _no_gpuprobe_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no GPUPROBE_* variable and no NVTX tool; it sets what it is about."""
    for name in list(os.environ):
        if name.startswith("GPUPROBE_") or name.startswith("NVTX_"):
            monkeypatch.delenv(name)


def run(settings: Any = None) -> tuple[dict[str, doctor.Line], int]:
    lines = doctor.diagnose(settings)
    by_check = {line.check: line for line in lines}
    assert len(by_check) == len(lines), [line.check for line in lines]
    return by_check, doctor.exit_status(lines)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m gpuprobe doctor ARGS`` in a fresh interpreter with only the GPUPROBE_* variables of ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_"))}
    full["PYTHONPATH"] = str(ROOT)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpuprobe", "doctor", *args], env=full, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test holds (bound and listening) until it ends."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver's answer to a push: 200 on /v1/metrics, 404 elsewhere; requests kept."""

    seen: list[tuple[str, str, str | None, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(("POST", self.path, self.headers.get("Content-Type"), body))
        self.send_response(200 if self.path == "/v1/metrics" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list]]:
    """A local HTTP server standing where an OpenTelemetry Collector would: its base URL and what it received."""
    seen: list = []
    handler = type("Handler", (_Collector,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


# -- this machine: CPU only ----------------------------------------------------------------------------------

@pytest.mark.no_cuda
def test_every_line_on_a_cpu_machine_with_default_settings() -> None:
    import torch

    lines, status = run()
    assert list(lines) == CHECKS
    assert status == 0, {c: (l.state, l.reason) for c, l in lines.items() if l.state == "fail"}

    assert lines["python"].state == "ok"
    assert lines["python"].details["version"] == platform.python_version()
    assert platform.python_version() in lines["python"].reason and sys.executable in lines["python"].reason

    assert lines["settings"].state == "ok" and "defaults" in lines["settings"].reason

    assert lines["torch"].state == "ok"
    assert lines["torch"].details["version"] == torch.__version__
    assert torch.__version__ in lines["torch"].reason
    floor = versions.floor("torch")
    assert lines["torch"].details["tested_floor"] == floor
    assert f">={floor}" in lines["torch"].reason

    installed = importlib.metadata.version("transformers")
    spec = versions.spec("transformers")
    assert lines["transformers"].details["version"] == installed
    assert lines["transformers"].details["inside_tested_range"] == (installed in SpecifierSet(spec))
    assert lines["transformers"].state == ("ok" if installed in SpecifierSet(spec) else "fail")
    assert installed in lines["transformers"].reason and spec in lines["transformers"].reason.replace(" ", "")

    assert (lines["cuda"].state, lines["cuda"].details["devices"]) == ("off", 0)
    assert "no CUDA device" in lines["cuda"].reason
    assert not [c for c in lines if c.startswith("cuda:")]
    assert lines["device timing"].state == "off" and "no CUDA device" in lines["device timing"].reason

    assert lines["nvtx"].state == "off" and "NVTX_INJECTION64_PATH is unset" in lines["nvtx"].reason
    assert lines["nvtx"].details["backend"] == "off"

    assert lines["kernel sampling"].state == "off"
    assert "not asked for (GPUPROBE_KERNEL_SAMPLING=0)" in lines["kernel sampling"].reason
    assert "CPU operators" in lines["kernel sampling"].reason  # no CUDA device: what sampling would record

    assert lines["nvml"].state == "off" and "not asked for (GPUPROBE_NVML unset)" in lines["nvml"].reason

    assert lines["prometheus"].state == "off" and "GPUPROBE_PROMETHEUS_PORT is unset" in lines["prometheus"].reason
    assert lines["otlp"].state == "off" and "GPUPROBE_OTLP_ENDPOINT is unset" in lines["otlp"].reason
    assert lines["files"].state == "off"

    assert lines["seams"].state == "ok", lines["seams"].notes
    rows = lines["seams"].details["seams"]
    assert {r["seam"] for r in rows} == {s.name for s in _seams.registry()}
    assert all(r["state"] == "on" for r in rows)
    checked = {r["seam"] for r in rows if r["checked"]}
    # The seams whose owners exist before any model does: the generation methods, the class-wide ones,
    # continuous batching's classes and the CUDA graph capture guard.
    assert {"transformers.generate.prefill", "transformers.generate", "transformers.class.generate",
            "transformers.continuous_batching.schedule_batch", "torch.cuda_graph.capture_begin"} <= checked
    assert "transformers.generate.streamer" not in checked  # a caller's streamer: checked when installed


@pytest.mark.parametrize(("threads", "usable", "load", "machine", "expected"), [
    (2, 2.0, 2.6, 2.0, (0.0, 1)),    # a busy 2-core machine: every core taken, two threads wait for each other
    (2, 2.0, 0.3, 2.0, (1.7, None)),  # a quiet one: they fit
    (1, 2.0, 9.0, 2.0, (0.0, None)),  # one thread is the fewest: nothing to advise
    (8, 4.0, 8.0, 16.0, (2.0, 2)),   # held to 4 of 16 cores: a quarter of the machine's load is on them
    (4, 1.5, 0.0, 1.5, (1.5, 2)),    # a container's quota of 1.5 cores: 2 threads fit it
])
def test_thread_advice_compares_torchs_threads_with_the_free_cores(threads: int, usable: float, load: float,
                                                                   machine: float, expected: tuple) -> None:
    assert doctor.thread_advice(threads, usable, load, machine) == expected


def _threads_line(env: dict[str, str], cores: set[int]) -> dict[str, Any]:
    """The threads line of ``gpuprobe doctor --json`` in a child held to ``cores``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "NVTX_", "OMP_"))}
    full["PYTHONPATH"] = str(ROOT)
    full.update(env)
    proc = subprocess.run([sys.executable, "-m", "gpuprobe", "doctor", "--json"], env=full, capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, cores))
    checks = {c["check"]: c for c in json.loads(proc.stdout)["checks"]}
    return checks["threads"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity (Linux) and two cores")
@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_more_torch_threads_than_usable_cores_names_omp_num_threads() -> None:
    pytest.importorskip("torch")
    core = {min(os.sched_getaffinity(0))}
    # held to one core, two threads asked for: what torch runs there, asked of torch itself
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OMP_")}, "OMP_NUM_THREADS": "2"}
    asked = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                           capture_output=True, text=True, timeout=60, check=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, core))
    if int(asked.stdout) != 2:
        pytest.skip(f"torch runs {asked.stdout.strip()} threads when asked for 2 on one core here")
    line = _threads_line({"OMP_NUM_THREADS": "2"}, core)
    assert line["state"] == "ok"
    assert line["details"]["intra_op_threads"] == 2 and line["details"]["usable_cores"] == 1.0
    assert line["details"]["suggested_threads"] == 1
    assert "torch runs 2 intra-op threads (OMP_NUM_THREADS=2), more than the cores free" in line["reason"]
    assert "set OMP_NUM_THREADS=1" in line["reason"] and "torch.set_num_threads(1)" in line["reason"]

    fits = _threads_line({"OMP_NUM_THREADS": "1"}, core)
    assert fits["details"]["suggested_threads"] is None
    assert fits["reason"].startswith("torch runs 1 intra-op thread (OMP_NUM_THREADS=1); ")
    assert "OMP_NUM_THREADS=1 in" not in fits["reason"]


def test_a_bad_setting_fails_the_settings_line_and_the_rest_runs_on_defaults(monkeypatch: pytest.MonkeyPatch,
                                                                             taken_port: int) -> None:
    monkeypatch.setenv("GPUPROBE_MEMORY", "maybe")
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", str(taken_port))  # ignored with the rest: defaults
    lines, status = run()
    assert status == 1
    assert lines["settings"].state == "fail"
    assert "GPUPROBE_MEMORY" in lines["settings"].reason and "'maybe'" in lines["settings"].reason
    assert lines["prometheus"].state == "off"  # the defaults: no port asked for
    assert list(lines) == CHECKS or set(CHECKS) <= set(lines)  # every check still ran


def test_a_variable_one_typo_from_a_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PROT", "9464")
    monkeypatch.setenv("GPUPROBE_JSONL", "/tmp/x.jsonl")
    lines, _ = run()
    assert lines["settings"].state == "ok"
    assert "GPUPROBE_PROMETHEUS_PROT is not a setting (did you mean GPUPROBE_PROMETHEUS_PORT?)" in \
        lines["settings"].reason
    assert lines["settings"].details["variables"] == ["GPUPROBE_JSONL"]


# -- the Prometheus port -----------------------------------------------------------------------------------

def test_a_free_prometheus_port_is_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", str(port))
    lines, _ = run()
    assert lines["prometheus"].state == "ok"
    assert f"port {port} on 127.0.0.1 is free" in lines["prometheus"].reason
    with socket.socket() as sock:  # doctor let it go again
        sock.bind(("127.0.0.1", port))


def test_a_taken_prometheus_port_fails_naming_the_port(monkeypatch: pytest.MonkeyPatch, taken_port: int) -> None:
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", str(taken_port))
    lines, status = run()
    assert status == 1
    assert lines["prometheus"].state == "fail"
    assert f"port {taken_port} on 127.0.0.1 is already in use" in lines["prometheus"].reason


def test_the_port_checked_is_the_base_port_plus_local_rank(monkeypatch: pytest.MonkeyPatch, taken_port: int) -> None:
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", str(taken_port - 1))
    monkeypatch.setenv("LOCAL_RANK", "1")
    lines, status = run()
    assert status == 1 and lines["prometheus"].details["port"] == taken_port
    assert (f"port {taken_port} (GPUPROBE_PROMETHEUS_PORT {taken_port - 1} + LOCAL_RANK 1) on 127.0.0.1 is already "
            "in use") in lines["prometheus"].reason


def test_an_address_that_cannot_be_bound_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", "0")
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_ADDR", "192.0.2.1")  # TEST-NET-1: no interface here has it
    lines, status = run()
    assert status == 1 and lines["prometheus"].state == "fail"
    assert "cannot bind 192.0.2.1:0" in lines["prometheus"].reason


# -- the OTLP endpoint ------------------------------------------------------------------------------------

def test_an_answering_otlp_endpoint_is_ok(monkeypatch: pytest.MonkeyPatch, collector: tuple[str, list]) -> None:
    base, seen = collector
    monkeypatch.setenv("GPUPROBE_OTLP_ENDPOINT", base + "/v1/metrics")
    lines, status = run()
    assert lines["otlp"].state == "ok" and status == 0
    assert lines["otlp"].details["status"] == 200
    assert seen == [("POST", "/v1/metrics", "application/x-protobuf", b"")]  # one empty push: nothing stored


def test_an_otlp_endpoint_at_the_wrong_path_fails_with_the_status(monkeypatch: pytest.MonkeyPatch,
                                                                  collector: tuple[str, list]) -> None:
    base, _ = collector
    monkeypatch.setenv("GPUPROBE_OTLP_ENDPOINT", base + "/metrics")
    lines, status = run()
    assert status == 1 and lines["otlp"].state == "fail"
    assert "answered HTTP 404" in lines["otlp"].reason


def test_an_unreachable_otlp_endpoint_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("GPUPROBE_OTLP_ENDPOINT", f"http://127.0.0.1:{port}/v1/metrics")
    t0 = time.monotonic()
    lines, status = run()
    assert status == 1 and lines["otlp"].state == "fail"
    assert "unreachable" in lines["otlp"].reason and str(port) in lines["otlp"].reason
    assert time.monotonic() - t0 < 60  # the whole run; the refusal itself is immediate


def test_an_otlp_endpoint_that_never_answers_fails_after_the_timeout(monkeypatch: pytest.MonkeyPatch,
                                                                     taken_port: int) -> None:
    # taken_port listens and never accepts: the connection is queued, the request is never answered.
    monkeypatch.setenv("GPUPROBE_OTLP_ENDPOINT", f"http://127.0.0.1:{taken_port}/v1/metrics")
    monkeypatch.setenv("GPUPROBE_OTLP_TIMEOUT", "0.3")
    ctx = doctor._Context(config.load())
    t0 = time.monotonic()
    line = doctor._otlp(ctx)
    elapsed = time.monotonic() - t0
    assert line.state == "fail" and "no answer within 0.3 s" in line.reason
    assert 0.25 < elapsed < 3


# -- files the settings ask for --------------------------------------------------------------------------------

def test_files_into_a_missing_or_blocked_folder_fail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPROBE_JSONL", str(tmp_path / "absent" / "run.jsonl"))  # the exporter opens it as it is
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GPUPROBE_SNAPSHOT_ON_OOM", "1")
    monkeypatch.setenv("GPUPROBE_SNAPSHOT_DIR", str(blocker / "snapshots"))
    lines, status = run()
    assert status == 1 and lines["files"].state == "fail"
    assert f"GPUPROBE_JSONL: the folder {tmp_path / 'absent'} does not exist" in lines["files"].reason
    assert f"GPUPROBE_SNAPSHOT_DIR: {blocker} is not a folder" in lines["files"].reason


def test_files_into_folders_that_exist_or_can_be_made_are_ok(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPROBE_JSONL", str(tmp_path / "run.jsonl"))
    monkeypatch.setenv("GPUPROBE_PROFILE_SIGNAL", "SIGUSR2")
    monkeypatch.setenv("GPUPROBE_PROFILE_DIR", str(tmp_path / "traces" / "today"))  # made at the first capture
    lines, status = run()
    assert status == 0 and lines["files"].state == "ok"
    assert lines["files"].details["directories"] == {"GPUPROBE_JSONL": str(tmp_path),
                                                     "GPUPROBE_PROFILE_DIR": str(tmp_path / "traces" / "today")}
    assert not (tmp_path / "traces").exists()  # doctor made nothing


# -- NVTX ----------------------------------------------------------------------------------------------------

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_an_attached_nvtx_tool_is_ok_and_gets_the_gpuprobe_domain(tmp_path: Path) -> None:
    pytest.importorskip("nvtx")
    out = tmp_path / "nvtx.jsonl"
    proc = cli("--json", env=capture_env(out))
    report = json.loads(proc.stdout)
    line = {c["check"]: c for c in report["checks"]}["nvtx"]
    assert line["state"] == "ok", line
    assert line["details"]["backend"] == "nvtx"
    # The tool really attached: the injection library recorded the domain doctor's pick created.
    assert "gpuprobe" in parse_capture(out).domains()


def test_an_injection_path_that_does_not_exist_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "libnothing.so"
    monkeypatch.setenv("NVTX_INJECTION64_PATH", str(missing))
    lines, status = run()
    assert status == 1 and lines["nvtx"].state == "fail"
    assert str(missing) in lines["nvtx"].reason


def test_nvtx_disable_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVTX_DISABLE", "1")
    lines, _ = run()
    assert lines["nvtx"].state == "off" and "NVTX_DISABLE" in lines["nvtx"].reason


# -- kernel sampling ---------------------------------------------------------------------------------------

@pytest.mark.no_cuda
def test_kernel_sampling_asked_for_says_what_it_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_KERNEL_SAMPLING", "5")
    lines, _ = run()
    assert lines["kernel sampling"].state == "ok"
    assert lines["kernel sampling"].reason.startswith("one step in 5: CPU operators")


def test_kernel_sampling_that_this_torch_cannot_do_fails_when_asked_for(monkeypatch: pytest.MonkeyPatch,
                                                                        simcuda: Any) -> None:
    import torch

    simcuda(1)
    use_shape(monkeypatch, "torch-2.2")  # a _KinetoEvent with neither activity_type() nor is_user_annotation()
    lines, _ = run()
    assert lines["kernel sampling"].state == "off"
    assert f"not available on torch {torch.__version__}" in lines["kernel sampling"].reason
    monkeypatch.setenv("GPUPROBE_KERNEL_SAMPLING", "2")
    lines, status = run()
    assert status == 1 and lines["kernel sampling"].state == "fail"
    assert "GPUPROBE_KERNEL_SAMPLING=2" in lines["kernel sampling"].reason
    assert "neither activity_type() nor is_user_annotation()" in lines["kernel sampling"].reason


# -- NVML -----------------------------------------------------------------------------------------------------

def _with_nvml(asked: bool) -> Any:
    """The settings in force plus ``nvml``, as gpuprobe's NVML support declares it."""
    return dataclasses.replace(config.load(), nvml=asked)


@pytest.mark.parametrize(("found", "asked", "state"), [
    ("ok", False, "ok"), ("ok", True, "ok"), ("off", True, "off"), ("fail", False, "off"), ("fail", True, "fail"),
])
def test_the_nvml_line_follows_describe_and_fails_only_when_asked_for(monkeypatch: pytest.MonkeyPatch, found: str,
                                                                      asked: bool, state: str) -> None:
    # What NVML says is stood in (gpuprobe._nvml.describe, tested against a simulated NVML in
    # tests/test_nvml.py): the line's rules are what is tested here.
    from gpuprobe import _nvml

    monkeypatch.setattr(_nvml, "describe", lambda: {"state": found, "detail": f"NVML said {found}"})
    lines, status = run(_with_nvml(asked))
    assert lines["nvml"].state == state
    assert f"NVML said {found}" in lines["nvml"].reason
    assert (status == 1) == (state == "fail")


# -- CUDA devices, peaks and device timing, on the simulated CUDA -----------------------------------------------

def test_simulated_devices_are_named_with_their_peaks_and_timed(simcuda: Any) -> None:
    import torch

    sim = simcuda(2)
    names = [torch.cuda.get_device_name(i) for i in range(2)]
    lines, status = run()
    assert status == 0, {c: l.reason for c, l in lines.items() if l.state == "fail"}
    assert (lines["cuda"].state, lines["cuda"].details["devices"]) == ("ok", 2)
    for i, name in enumerate(names):
        line = lines[f"cuda:{i}"]
        assert line.state == "ok" and line.details["name"] == name and name in line.reason
        # An H100 80GB HBM3 is the SXM part: 3.35 TB/s, 989.5 dense bf16 TFLOP/s (NVIDIA's H100 datasheet).
        assert line.details["memory_bandwidth"] == 3.35e12 and line.details["flops"]["bfloat16"] == 989.5e12
        assert "MBU/MFU peaks known" in line.reason
    timing = lines["device timing"]
    assert timing.state == "ok"
    for i in range(2):
        # Each device ran doctor's kernel and nothing else: its clock stands where the kernel ended.
        assert sim.now_ns(i) > 0
        assert timing.details[f"cuda:{i}"]["elapsed_ms"] == pytest.approx(sim.now_ns(i) / 1e6, rel=1e-6)
    assert sim.stats.kernels_launched == 2


def test_a_device_without_known_peaks_says_which_settings_give_them(simcuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = simcuda(1)
    sim._properties[0] = dataclasses.replace(sim._properties[0], name="NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    lines, status = run()
    assert status == 0 and lines["cuda:0"].state == "ok"
    assert "no peak known for MBU/MFU: set GPUPROBE_PEAK_MEMORY_BANDWIDTH and GPUPROBE_PEAK_FLOPS" in \
        lines["cuda:0"].reason
    monkeypatch.setenv("GPUPROBE_PEAK_MEMORY_BANDWIDTH", "1T")
    lines, _ = run()
    assert "GPUPROBE_PEAK_MEMORY_BANDWIDTH set, used on every device" in lines["cuda:0"].reason


def test_events_that_cannot_be_read_on_a_present_device_fail(simcuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    simcuda(1)

    def broken(self: Any, end: Any) -> float:  # a device whose timing events cannot be read back
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", broken)
    lines, status = run()
    assert status == 1 and lines["device timing"].state == "fail"
    assert "cuda:0: RuntimeError: CUDA error: an illegal memory access" in lines["device timing"].reason


def test_device_timing_switched_off_is_not_tried(simcuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = simcuda(1)
    monkeypatch.setenv("GPUPROBE_DEVICE_TIMING", "off")
    lines, status = run()
    assert lines["device timing"].state == "off" and status == 0
    assert sim.stats.kernels_launched == 0


@pytest.mark.no_cuda
def test_device_timing_asked_for_without_a_device_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_DEVICE_TIMING", "cuda")
    lines, status = run()
    assert status == 1 and lines["device timing"].state == "fail"
    assert "GPUPROBE_DEVICE_TIMING=cuda" in lines["device timing"].reason


# -- seams ----------------------------------------------------------------------------------------------------

def test_a_renamed_parameter_shows_the_seam_refused_before_any_model_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    original = transformers.GenerationMixin._prefill

    def renamed(self: Any, token_ids: Any, generation_config: Any, model_kwargs: Any, *args: Any, **kw: Any) -> Any:
        return original(self, token_ids, generation_config, model_kwargs, *args, **kw)

    monkeypatch.setattr(transformers.GenerationMixin, "_prefill", renamed)
    lines, status = run()
    line = lines["seams"]
    assert status == 1 and line.state == "fail"
    rows = {r["seam"]: r for r in line.details["seams"]}
    assert rows["transformers.generate.prefill"]["state"] == "refused"
    assert "no parameter input_ids" in rows["transformers.generate.prefill"]["why"]
    assert rows["transformers.generate.stop_check"]["state"] == "refused"  # the loop's seams go together
    assert rows["transformers.generate"]["state"] == "on"  # per-call metrics still
    assert any(n.startswith("transformers.generate.prefill: refused:") and "input_ids" in n for n in line.notes)
    # doctor asked; it remembered and patched nothing
    assert _seams.seam("transformers.generate.prefill").refused is None
    assert "_prefill" not in transformers.GenerationMixin.__dict__ or \
        transformers.GenerationMixin.__dict__["_prefill"] is renamed


def test_a_seam_switched_off_by_its_own_failure_shows_off() -> None:
    import gpuprobe.integrations.transformers  # noqa: F401 - declares the seams

    _seams.seam("transformers.generate.prefill").fail(RuntimeError("a fault"), report=False)
    lines, status = run()
    rows = {r["seam"]: r for r in lines["seams"].details["seams"]}
    assert rows["transformers.generate.prefill"]["state"] == "off"
    assert "a fault" in rows["transformers.generate.prefill"]["why"]
    assert status == 1


# -- a check that raises, the JSON layout, the command ------------------------------------------------------------

def test_a_check_that_raises_is_a_fail_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Any) -> Any:
        raise KeyError("surprise")

    monkeypatch.setattr(doctor, "_CHECKS", (("python", broken), *doctor._CHECKS[1:]))
    lines, status = run()
    assert status == 1
    assert (lines["python"].state, lines["python"].reason) == ("fail", "the check raised KeyError: 'surprise'")
    assert lines["torch"].state == "ok"  # the others ran


def test_the_json_layout(monkeypatch: pytest.MonkeyPatch, taken_port: int) -> None:
    monkeypatch.setenv("GPUPROBE_PROMETHEUS_PORT", str(taken_port))
    report = json.loads(doctor.render_json(doctor.diagnose()))
    assert set(report) == {"schema", "gpuprobe", "exit_status", "checks"}
    assert report["schema"] == 1
    assert report["gpuprobe"] == importlib.metadata.version("gpuprobe")
    assert report["exit_status"] == 1
    for check in report["checks"]:
        assert set(check) == {"check", "state", "reason", "details", "notes"}
        assert check["state"] in ("ok", "off", "fail")
        assert isinstance(check["reason"], str) and check["reason"]
        assert isinstance(check["details"], dict) and isinstance(check["notes"], list)
    assert [c["check"] for c in report["checks"] if not c["check"].startswith("cuda:")] == CHECKS
    seam_rows = {c["check"]: c for c in report["checks"]}["seams"]["details"]["seams"]
    assert all(set(r) == {"seam", "library", "state", "why", "checked"} for r in seam_rows)


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_the_command_exits_1_fast_naming_a_taken_port_and_an_unreachable_endpoint(taken_port: int) -> None:
    dead = free_port()
    t0 = time.monotonic()
    proc = cli(env={"GPUPROBE_PROMETHEUS_PORT": str(taken_port),
                    "GPUPROBE_OTLP_ENDPOINT": f"http://127.0.0.1:{dead}/v1/metrics"})
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines() if line.split()[:1] in (["ok"], ["off"], ["fail"])}
    assert rows["prometheus"].startswith("fail") and f"port {taken_port}" in rows["prometheus"]
    assert rows["otlp"].startswith("fail") and "unreachable" in rows["otlp"]
    assert proc.stdout.splitlines()[-1] == "2 failed: prometheus, otlp"
    assert elapsed < 90  # interpreter, torch and transformers start-up; the endpoint itself refuses at once


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_the_command_with_the_defaults_exits_0_and_prints_a_line_per_check() -> None:
    proc = cli()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("gpuprobe doctor: gpuprobe ")
    shown = [line[6:].split("  ")[0].strip() for line in out[1:-1] if line[:4].strip() in ("ok", "off", "fail")]
    assert [c for c in shown if not c.startswith("cuda:")] == CHECKS
    assert out[-1] == "nothing failed"


def test_help_says_doctor_initializes_cuda_and_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["--help"]) == 0
    assert "initializes CUDA" in capsys.readouterr().out
    assert doctor.main(["--yaml"]) == 2
    assert "unknown argument(s) --yaml" in capsys.readouterr().err
    from gpuprobe import cli as gpuprobe_cli

    assert gpuprobe_cli.main(["doctor", "--help"]) == 0
    assert "doctor" in gpuprobe_cli._usage()


def test_importing_doctor_imports_no_optional_dependency() -> None:
    code = ("import sys, gpuprobe.doctor\n"
            "print([m for m in ('torch', 'transformers', 'nvtx', 'prometheus_client', 'opentelemetry', 'numpy') "
            "if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
