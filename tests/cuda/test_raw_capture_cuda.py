"""A capture begun with ``cudaStreamBeginCapture`` outside ``torch.cuda.CUDAGraph``, on a real GPU, while
gpuprobe's reader queries events: the checks of tests/simcuda/test_raw_capture.py against the real
CUDA runtime torch loaded (skipped without CUDA, and where torch maps no ``libcudart``).
"""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

import gpuprobe
from gpuprobe import _capture, probe
from gpuprobe.testing import InMemoryExporter, reset

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda
GLOBAL, RELAXED = 0, 2
DUR = "gpuprobe.probe.duration"


@pytest.fixture(autouse=True)
def _fresh() -> None:  # type: ignore[misc]
    reset()
    yield
    reset()


@pytest.fixture
def libcudart() -> ctypes.CDLL:
    """The CUDA runtime library torch loaded, with the capture calls' C signatures."""
    torch.cuda.init()
    found = _capture.find_loaded_runtime()
    if found is None:
        pytest.skip("this torch maps no libcudart (a static CUDA runtime?)")
    lib = ctypes.CDLL(found.source, mode=os.RTLD_NOLOAD)
    lib.cudaStreamBeginCapture.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.cudaStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.cudaGraphDestroy.argtypes = [ctypes.c_void_p]
    lib.cudaThreadExchangeStreamCaptureMode.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def _mode(lib: ctypes.CDLL) -> int:
    """The calling thread's capture mode, left as it was."""
    cell = ctypes.c_int(GLOBAL)
    assert lib.cudaThreadExchangeStreamCaptureMode(ctypes.byref(cell)) == 0
    now = cell.value
    assert lib.cudaThreadExchangeStreamCaptureMode(ctypes.byref(cell)) == 0
    return now


def test_the_reading_thread_is_relaxed_while_it_reads_and_gets_its_mode_back(libcudart: ctypes.CDLL) -> None:
    seen: list[int] = []
    relaxed = _capture.RelaxedMode()
    with relaxed as was_set:
        seen.append(_mode(libcudart))
    seen.append(_mode(libcudart))
    assert (was_set, seen) == (True, [RELAXED, GLOBAL])


def test_a_stream_capture_on_another_thread_survives_the_reader(libcudart: ctypes.CDLL) -> None:
    x = torch.zeros(1024, device="cuda")
    with InMemoryExporter() as exp:
        with probe("pending_during_capture"):
            torch.cuda._sleep(int(20 * 1.4e6))  # ~20 ms on the device
        torch.cuda.synchronize()  # done before the capture begins; not read yet (nothing has drained)
        began, read = threading.Event(), threading.Event()
        errors: dict[str, int] = {}

        def capture() -> None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                x.add_(1)  # warm-up outside the capture
                errors["begin"] = libcudart.cudaStreamBeginCapture(s.cuda_stream, GLOBAL)
                for _ in range(100):
                    x.add_(1)
                began.set()
                read.wait(30)
                graph = ctypes.c_void_p()
                errors["end"] = libcudart.cudaStreamEndCapture(s.cuda_stream, ctypes.byref(graph))
            if graph.value:
                libcudart.cudaGraphDestroy(graph)

        t = threading.Thread(target=capture)
        t.start()
        assert began.wait(30)
        gpuprobe.collect()  # queries the span's events while the other thread captures in global mode
        during = exp.values(DUR, probe="pending_during_capture", clock="device")
        read.set()
        t.join(30)
    assert errors == {"begin": 0, "end": 0}
    assert len(during) == 1 and during[0] > 0.01
