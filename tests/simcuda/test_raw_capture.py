"""Captures begun outside ``torch.cuda.CUDAGraph`` (``cudaStreamBeginCapture`` called on the CUDA runtime
directly) and gpuprobe's reader: the reading thread is in relaxed capture mode while it queries events.

The simulated runtime library (``SimulatedCuda.libcudart``) models what this relies on, from CUDA's
documentation of ``cudaThreadExchangeStreamCaptureMode`` and ``cudaStreamBeginCapture``: each thread's
capture interaction mode (global by default), the exchange call, and the invalidation of a capture
begun in global mode by an unsafe call (``cudaEventQuery``) from another thread unless that thread is
in relaxed (or thread-local) mode. The lookup of the real library is checked in a child interpreter
against a stand-in ``libcudart.so.13`` built here with the C compiler: no CUDA runtime can run on
these machines (the real one answers every call with "CUDA driver version is insufficient" without a
driver). tests/cuda/test_raw_capture_cuda.py makes the same check on a GPU.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import _capture, probe
from gpuprobe.testing import InMemoryExporter
from gpuprobe.testing.simcuda import SimulatedCuda

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DUR = "gpuprobe.probe.duration"
MS = 1_000_000
# cudaStreamCaptureMode and the cudaError_t codes the runtime returns (driver_types.h).
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
SUCCESS, INVALID_VALUE, INVALIDATED, WRONG_THREAD = 0, 1, 901, 908
NOT_PERMITTED = "operation not permitted when stream is capturing"
EXCHANGE = "libcudart.cudaThreadExchangeStreamCaptureMode"


def _in_thread(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a new thread; its result, or the exception it raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def _exchange(sim: SimulatedCuda, mode: int) -> tuple[int, int]:
    """``cudaThreadExchangeStreamCaptureMode`` on the calling thread: (error, previous mode)."""
    cell = ctypes.c_int(mode)
    return sim.libcudart.cudaThreadExchangeStreamCaptureMode(ctypes.pointer(cell)), cell.value


def _end(sim: SimulatedCuda, stream: object) -> tuple[int, int]:
    """``cudaStreamEndCapture``: (error, the graph handle written, 0 for none)."""
    graph = ctypes.c_void_p(0xFFFF)  # a value the call must overwrite
    error = sim.libcudart.cudaStreamEndCapture(stream.cuda_stream, ctypes.pointer(graph))  # type: ignore[attr-defined]
    return error, graph.value or 0


def _recorded_event() -> object:
    """An event recorded on the current stream (not captured): querying it is an unsafe call."""
    event = torch.cuda.Event()
    event.record()
    return event


# -- the simulated runtime: each thread's capture mode -------------------------------------------------

def test_the_exchange_sets_the_threads_mode_and_writes_back_the_previous_one(sim: SimulatedCuda) -> None:
    assert _exchange(sim, RELAXED) == (SUCCESS, GLOBAL)  # every thread starts in global mode
    assert _exchange(sim, THREAD_LOCAL) == (SUCCESS, RELAXED)
    assert _exchange(sim, GLOBAL) == (SUCCESS, THREAD_LOCAL)
    assert sim.calls[EXCHANGE] == 3


def test_the_capture_mode_is_per_thread(sim: SimulatedCuda) -> None:
    _exchange(sim, RELAXED)
    assert _in_thread(lambda: _exchange(sim, GLOBAL)) == (SUCCESS, GLOBAL)  # the other thread's own default
    assert _exchange(sim, GLOBAL) == (SUCCESS, RELAXED)  # this thread's mode was not touched


def test_an_unknown_mode_is_refused_and_changes_nothing(sim: SimulatedCuda) -> None:
    assert _exchange(sim, 3) == (INVALID_VALUE, 3)
    assert sim.libcudart.cudaThreadExchangeStreamCaptureMode(None) == INVALID_VALUE
    assert _exchange(sim, GLOBAL) == (SUCCESS, GLOBAL)


# -- the simulated runtime: captures begun on a stream directly ------------------------------------------

def test_a_stream_capture_keeps_the_work_and_ends_with_a_graph(sim: SimulatedCuda) -> None:
    torch.cuda.current_device()
    s = torch.cuda.Stream()
    assert sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL) == SUCCESS
    with torch.cuda.stream(s):
        assert torch.cuda.is_current_stream_capturing() is True  # the stream captures, whichever API began it
        assert sim.launch(MS, "captured") is None
    assert torch.cuda.is_current_stream_capturing() is False  # the default stream does not
    error, graph = _end(sim, s)
    assert (error, graph != 0) == (SUCCESS, True)
    assert sim.stats.stream_captures == 1 and sim.stats.kernels_launched == 0 and sim.stats.graph_captures == 0


def test_a_capture_cannot_begin_on_the_legacy_stream_twice_or_in_an_unknown_mode(sim: SimulatedCuda) -> None:
    s = torch.cuda.Stream()
    assert sim.libcudart.cudaStreamBeginCapture(0, GLOBAL) == INVALID_VALUE  # cudaStreamLegacy
    assert sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, 7) == INVALID_VALUE
    assert sim.libcudart.cudaStreamBeginCapture(0xDEAD0, GLOBAL) == INVALID_VALUE  # not a stream
    assert sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL) == SUCCESS
    assert sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL) == INVALID_VALUE  # already capturing
    assert _end(sim, s)[0] == SUCCESS
    assert _end(sim, s)[0] == INVALID_VALUE  # no longer capturing


def test_a_capture_not_begun_relaxed_ends_only_on_its_thread(sim: SimulatedCuda) -> None:
    strict, relaxed = torch.cuda.Stream(), torch.cuda.Stream()
    assert sim.libcudart.cudaStreamBeginCapture(strict.cuda_stream, GLOBAL) == SUCCESS
    assert sim.libcudart.cudaStreamBeginCapture(relaxed.cuda_stream, RELAXED) == SUCCESS
    assert _in_thread(lambda: _end(sim, strict)[0]) == WRONG_THREAD
    assert _in_thread(lambda: _end(sim, relaxed)[0]) == SUCCESS
    assert _end(sim, strict)[0] == SUCCESS


def test_is_capturing_tells_none_active_and_invalidated(sim: SimulatedCuda) -> None:
    s = torch.cuda.Stream()
    status = ctypes.c_int(-1)

    def status_of() -> int:
        assert sim.libcudart.cudaStreamIsCapturing(s.cuda_stream, ctypes.pointer(status)) == SUCCESS
        return status.value

    seen = [status_of()]
    sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
    seen.append(status_of())
    event = _recorded_event()
    _in_thread(event.query)  # a global-mode thread's query invalidates it
    seen.append(status_of())
    _end(sim, s)
    seen.append(status_of())
    assert seen == [0, 1, 2, 0]


# -- which threads' unsafe calls invalidate which captures ------------------------------------------------

def test_a_global_mode_thread_invalidates_a_stream_capture_of_another_thread(sim: SimulatedCuda) -> None:
    event = _recorded_event()
    s = torch.cuda.Stream()
    sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
    result = _in_thread(event.query)
    assert isinstance(result, torch.AcceleratorError) and NOT_PERMITTED in str(result)
    assert _end(sim, s) == (INVALIDATED, 0)  # "a NULL graph will be returned"
    assert sim.stats.invalidated_captures == 1 and sim.stats.stream_captures == 0


@pytest.mark.parametrize("mode", [RELAXED, THREAD_LOCAL])
def test_a_relaxed_or_thread_local_thread_queries_during_another_threads_global_capture(
        sim: SimulatedCuda, mode: int) -> None:
    event = _recorded_event()
    s = torch.cuda.Stream()
    sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)

    def query_in_mode() -> object:
        _exchange(sim, mode)
        return event.query()

    assert _in_thread(query_in_mode) is True
    assert _end(sim, s)[0] == SUCCESS
    assert sim.stats.invalidated_captures == 0 and sim.stats.unsafe_calls_during_capture == 0


def test_a_relaxed_thread_leaves_a_cuda_graph_capture_of_another_thread_intact(sim: SimulatedCuda) -> None:
    event = _recorded_event()

    def relaxed_query() -> object:
        _exchange(sim, RELAXED)
        return event.query()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # global mode
        assert _in_thread(relaxed_query) is True
    assert sim.stats.graph_captures == 1 and sim.stats.invalidated_captures == 0


def test_a_thread_local_mode_thread_still_respects_its_own_capture(sim: SimulatedCuda) -> None:
    event = _recorded_event()
    s = torch.cuda.Stream()
    _exchange(sim, THREAD_LOCAL)
    sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
    with pytest.raises(torch.AcceleratorError, match=NOT_PERMITTED):
        event.query()
    assert _end(sim, s)[0] == INVALIDATED


def test_relaxed_mode_still_refuses_what_necessarily_conflicts_with_a_capture(sim: SimulatedCuda) -> None:
    s = torch.cuda.Stream()
    sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
    captured = torch.cuda.Event()
    captured.record(s)
    _exchange(sim, RELAXED)
    with pytest.raises(torch.AcceleratorError, match="operation not permitted on an event last recorded"):
        captured.query()
    with pytest.raises(torch.AcceleratorError, match=NOT_PERMITTED):
        s.query()  # the capturing stream itself
    assert _end(sim, s)[0] == INVALIDATED


# -- gpuprobe's reader ------------------------------------------------------------------------------------

class _RawCapture:
    """A capture begun with ``cudaStreamBeginCapture`` in global mode on ``device``, in a thread of its
    own, held open until :meth:`finish`; as code calling the runtime through ctypes does."""

    def __init__(self, sim: SimulatedCuda, device: int) -> None:
        self._sim = sim
        self._device = device
        self._began = threading.Event()
        self._release = threading.Event()
        self.results: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        torch.cuda.set_device(self._device)
        s = torch.cuda.Stream()
        self.results["begin"] = self._sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
        with torch.cuda.stream(s):
            self._sim.launch(MS, "captured")
        self._began.set()
        self._release.wait(30)
        self.results["end"] = _end(self._sim, s)[0]

    def __enter__(self) -> _RawCapture:
        self._thread.start()
        assert self._began.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(30)


@pytest.fixture
def two_devices(simcuda: Callable[..., SimulatedCuda]) -> Iterator[SimulatedCuda]:
    """Two simulated devices, CUDA initialized by the program, and three device spans of 2 ms on
    device 0 that the device has finished but gpuprobe has not read yet."""
    sim = simcuda(2)
    torch.cuda.current_device()

    @probe("decode")
    def decode() -> None:
        sim.launch(2 * MS, "decode")

    for _ in range(3):
        decode()
    sim.finish()
    yield sim


def _device_values(exp: InMemoryExporter, name: str) -> list[float]:
    return sorted(round(v, 6) for v in exp.values(DUR, probe=name, clock="device"))


def test_the_reader_leaves_a_stream_capture_on_another_device_and_thread_intact(
        two_devices: SimulatedCuda, exporter: InMemoryExporter) -> None:
    sim = two_devices
    with _RawCapture(sim, device=1) as capture:
        gpuprobe.collect()  # the reader queries device 0's events while device 1 captures in global mode
        during = _device_values(exporter, "decode")
    assert capture.results == {"begin": SUCCESS, "end": SUCCESS}
    assert sim.stats.invalidated_captures == 0 and sim.stats.unsafe_calls_during_capture == 0
    assert sim.stats.stream_captures == 1
    assert during == [0.002] * 3  # read during the capture: CaptureGuard did not see it, nothing waited


def test_the_background_reader_leaves_a_stream_capture_intact(two_devices: SimulatedCuda,
                                                              exporter: InMemoryExporter) -> None:
    sim = two_devices
    gpuprobe.collect()  # the spans made before the capture are read now
    gpuprobe.configure(collect_interval=0.005)  # the background thread reads device timings every 5 ms

    @probe("during")
    def step() -> None:
        sim.launch(2 * MS, "step")

    with _RawCapture(sim, device=1) as capture:
        queries = sim.calls["Event.query"]
        for _ in range(3):
            step()
        sim.finish()
        deadline = time.monotonic() + 10
        while sim.calls["Event.query"] < queries + 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # until the background thread has queried the three spans' events
        queried_during = sim.calls["Event.query"] - queries
    assert queried_during >= 3
    assert capture.results == {"begin": SUCCESS, "end": SUCCESS}
    assert sim.stats.invalidated_captures == 0
    assert _device_values(exporter, "during") == [0.002] * 3


def test_a_probe_on_a_stream_captured_outside_cuda_graph_takes_no_device_span(
        two_devices: SimulatedCuda, exporter: InMemoryExporter) -> None:
    sim = two_devices
    s = torch.cuda.Stream()
    assert sim.libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL) == SUCCESS
    with torch.cuda.stream(s):
        with probe("captured_block"):
            sim.launch(MS, "captured")
    assert _end(sim, s)[0] == SUCCESS
    sim.finish()
    assert len(exporter.values(DUR, probe="captured_block", clock="host")) == 1
    assert _device_values(exporter, "captured_block") == []  # an event recorded into a capture is never read
    assert _device_values(exporter, "decode") == [0.002] * 3


def test_without_a_runtime_library_the_query_invalidates_a_stream_capture(
        two_devices: SimulatedCuda, exporter: InMemoryExporter) -> None:
    # What reading did before it set relaxed mode, and does where no CUDA runtime library is found.
    sim = two_devices
    previous = _capture.set_runtime_finder(lambda: None)
    try:
        with warnings.catch_warnings(record=True) as caught, _RawCapture(sim, device=1) as capture:
            warnings.simplefilter("always")
            gpuprobe.collect()  # gpuprobe's own failure does not reach the program
    finally:
        _capture.set_runtime_finder(previous)
    assert capture.results == {"begin": SUCCESS, "end": INVALIDATED}
    assert sim.stats.invalidated_captures == 1
    assert _device_values(exporter, "decode") == []  # the span whose query failed is dropped
    assert any("a device timing could not be read" in str(w.message) for w in caught)


def test_the_reading_thread_gets_its_own_mode_back(two_devices: SimulatedCuda) -> None:
    sim = two_devices
    _exchange(sim, THREAD_LOCAL)  # the program's own choice for this thread
    gpuprobe.collect()
    assert _exchange(sim, GLOBAL) == (SUCCESS, THREAD_LOCAL)


def test_a_reading_with_pending_timings_costs_two_exchanges_and_none_without(two_devices: SimulatedCuda) -> None:
    sim = two_devices
    before = sim.calls[EXCHANGE]
    gpuprobe.collect()  # three pending spans: read in one relaxed block
    assert sim.calls[EXCHANGE] - before == 2
    gpuprobe.collect()  # nothing pending: no query, no exchange
    with probe("hot"):  # the hot path makes no exchange either
        sim.launch(MS)
    assert sim.calls[EXCHANGE] - before == 2


@pytest.mark.parametrize("failure", ["error", "raises"])
def test_an_exchange_that_fails_is_not_tried_again_and_reading_goes_on(
        two_devices: SimulatedCuda, exporter: InMemoryExporter, failure: str) -> None:
    # A stand-in for a runtime that cannot set the mode: libcudart.so.13 returns 35 ("CUDA driver
    # version is insufficient for CUDA runtime version") for every call on a machine without a driver.
    calls: list[int] = []

    def swap(pointer: object) -> int:
        calls.append(1)
        if failure == "raises":
            raise OSError("exception: access violation")
        return 35

    previous = _capture.set_runtime_finder(lambda: _capture.ModeExchange(swap, "a runtime without a driver"))
    try:
        gpuprobe.collect()
        assert _device_values(exporter, "decode") == [0.002] * 3  # read as without the exchange
        with probe("later"):
            two_devices.launch(MS)
        two_devices.finish()
        gpuprobe.collect()
        assert _capture.runtime_exchange() is None
    finally:
        _capture.set_runtime_finder(previous)
    assert calls == [1]
    assert _device_values(exporter, "later") == [0.001]


def test_the_simulation_stands_in_for_the_runtime_library_only_while_installed(
        simcuda: Callable[..., SimulatedCuda]) -> None:
    before = _capture.runtime_exchange()  # the process's own: None on a CPU build of torch
    sim = simcuda(1)
    found = _capture.runtime_exchange()
    assert found is not None and found.swap == sim.libcudart.cudaThreadExchangeStreamCaptureMode
    sim.uninstall()
    try:
        after = _capture.runtime_exchange()
    finally:
        sim.install()
    assert (after and after.source) == (before and before.source)
    assert after is None or after.swap != sim.libcudart.cudaThreadExchangeStreamCaptureMode


# -- finding the real library ------------------------------------------------------------------------------

def _mapped_runtime_libraries() -> list[str]:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return [line.split()[-1] for line in maps if "libcudart" in line]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_cpu_build_of_torch_maps_no_runtime_library() -> None:
    if _mapped_runtime_libraries():
        pytest.skip("this torch loaded a CUDA runtime library")
    assert _capture.find_loaded_runtime() is None


# A stand-in for libcudart.so.13: the one function, with the runtime's thread-local mode and its
# documented return values (cudaSuccess, cudaErrorInvalidValue).
STAND_IN = r"""
static __thread int mode = 0; /* cudaStreamCaptureModeGlobal */
int cudaThreadExchangeStreamCaptureMode(int *m) {
    if (!m || *m < 0 || *m > 2) return 1;
    int previous = mode;
    mode = *m;
    *m = previous;
    return 0;
}
"""


@pytest.fixture(scope="module")
def stand_in_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the stand-in runtime library")
    folder = tmp_path_factory.mktemp("runtime")
    source = folder / "standin.c"
    source.write_text(STAND_IN, encoding="utf-8")
    library = folder / "libcudart.so.13"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", str(library), str(source)],
                   check=True, capture_output=True, timeout=120)
    return library


def _child(program: str, cwd: Path) -> dict[str, object]:
    """Run ``program`` in an isolated interpreter that imports gpuprobe from this checkout; its JSON."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(program)
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_runtime_library_already_loaded_is_found_and_used(stand_in_runtime: Path, tmp_path: Path) -> None:
    result = _child(f"""
        import ctypes, json
        library = ctypes.CDLL({str(stand_in_runtime)!r})  # what import torch does on a CUDA build
        from gpuprobe._capture import RelaxedMode, find_loaded_runtime

        def mode():
            cell = ctypes.c_int(0)
            library.cudaThreadExchangeStreamCaptureMode(ctypes.byref(cell))
            now = cell.value
            library.cudaThreadExchangeStreamCaptureMode(ctypes.byref(cell))  # put back
            return now

        found = find_loaded_runtime()
        relaxed = RelaxedMode()
        with relaxed as was_set:
            inside = mode()
        print(json.dumps({{"source": found.source, "set": was_set, "inside": inside, "after": mode()}}))
    """, tmp_path)
    assert result == {"source": str(stand_in_runtime), "set": True, "inside": RELAXED, "after": GLOBAL}


def test_a_runtime_library_not_loaded_is_not_loaded_by_the_lookup(stand_in_runtime: Path, tmp_path: Path) -> None:
    result = _child(f"""
        import json, os
        os.environ["LD_LIBRARY_PATH"] = {str(stand_in_runtime.parent)!r}
        from gpuprobe._capture import find_loaded_runtime
        found = find_loaded_runtime()
        mapped = [line for line in open("/proc/self/maps") if "libcudart" in line]
        print(json.dumps({{"found": found is not None, "mapped": len(mapped)}}))
    """, tmp_path)
    assert result == {"found": False, "mapped": 0}
