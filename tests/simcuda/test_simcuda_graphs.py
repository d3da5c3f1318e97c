"""CUDA graph capture: modes, invalidation, captured events, replay (torch/cuda/graphs.py, CUDA docs)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from gpuprobe.testing.simcuda import SimulatedCuda

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


def _in_thread(fn: Callable[[], object]) -> object:
    """Run ``fn`` in another thread; its result, or the exception it raised."""
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


def test_global_mode_query_from_another_thread_invalidates_and_capture_end_raises(sim: SimulatedCuda) -> None:
    """cudaStreamCaptureModeGlobal: an unsafe call from any thread fails and invalidates the capture
    (PyTorch issues #104487, #148594)."""
    done = torch.cuda.Event()
    done.record()
    g = torch.cuda.CUDAGraph()
    ctx = torch.cuda.graph(g)
    ctx.__enter__()
    result = _in_thread(done.query)
    assert isinstance(result, torch.AcceleratorError) and str(result).startswith(NOT_PERMITTED)
    assert sim.stats.invalidated_captures == 1
    with pytest.raises(torch.AcceleratorError, match="operation failed due to a previous error during capture"):
        ctx.__exit__(None, None, None)
    assert sim.stats.graph_captures == 0
    assert torch.cuda.is_current_stream_capturing() is False


def test_thread_local_mode_allows_other_threads(sim: SimulatedCuda) -> None:
    """cudaStreamCaptureModeThreadLocal: "Concurrent capture sequences in other threads are ignored"."""
    ev = torch.cuda.Event()
    ev.record()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        assert _in_thread(ev.query) is True
        assert _in_thread(torch.cuda.synchronize) is None
    assert sim.stats.graph_captures == 1 and sim.stats.invalidated_captures == 0


def test_thread_local_mode_forbids_the_capturing_thread(sim: SimulatedCuda) -> None:
    """cudaStreamCaptureModeThreadLocal: the capturing thread may not make unsafe calls."""
    g = torch.cuda.CUDAGraph()
    with pytest.raises(torch.AcceleratorError, match="operation failed due to a previous error"):
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            with pytest.raises(torch.AcceleratorError, match="not permitted when stream is capturing"):
                torch.cuda.synchronize()
    assert sim.stats.unsafe_calls_during_capture == 1


def test_relaxed_mode_forbids_nothing_but_the_capturing_stream_itself(sim: SimulatedCuda) -> None:
    """cudaStreamCaptureModeRelaxed: unsafe calls are allowed, operations on the capturing stream are not."""
    ev = torch.cuda.Event()
    ev.record()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(torch.AcceleratorError, match="operation failed due to a previous error"):
        with torch.cuda.graph(g, capture_error_mode="relaxed"):
            assert ev.query() is True
            torch.cuda.synchronize()
            assert sim.stats.invalidated_captures == 0
            with pytest.raises(torch.AcceleratorError, match="not permitted when stream is capturing"):
                torch.cuda.current_stream().query()
    assert sim.stats.invalidated_captures == 1


def test_captured_event_cannot_be_queried_after_capture(sim: SimulatedCuda) -> None:
    """cudaErrorCapturedEvent: "operation not permitted on an event last recorded in a capturing stream"."""
    ev = torch.cuda.Event(enable_timing=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ev.record()
    with pytest.raises(torch.AcceleratorError,
                       match="operation not permitted on an event last recorded in a capturing stream"):
        ev.query()
    with pytest.raises(torch.AcceleratorError, match="last recorded in a capturing stream"):
        ev.synchronize()
    ev.record()  # recorded again outside capture: an ordinary event
    assert ev.query() is True


def test_work_launched_during_capture_runs_only_on_replay(sim: SimulatedCuda) -> None:
    """CUDAGraph::replay: cudaGraphLaunch on the current stream; captured work is not run at capture."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        assert torch.cuda.is_current_stream_capturing() is True
        assert sim.launch(1_000, "a") is None
        assert sim.launch(2_000, "b") is None
    assert sim.stats.kernels_launched == 0
    ev = torch.cuda.Event()
    g.replay()  # on the current stream: the default stream here
    ev.record()
    assert sim.stats.kernels_launched == 2 and sim.stats.graph_replays == 1
    sim.advance(2_999)
    assert ev.query() is False
    sim.advance(1)
    assert ev.query() is True


def test_graph_context_synchronizes_before_capture(sim: SimulatedCuda) -> None:
    """torch/cuda/graphs.py graph.__enter__: ``torch.cuda.synchronize()`` first."""
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
    assert sim.stats.host_syncs_by_api["synchronize"] == 1


def test_capture_on_the_default_stream_is_refused(sim: SimulatedCuda) -> None:
    """CUDAGraph::capture_begin: "CUDA graphs must be captured on a non-default stream"."""
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="must be captured on a non-default stream"):
        g.capture_begin()


def test_unknown_capture_error_mode_is_refused(sim: SimulatedCuda) -> None:
    """torch/csrc/cuda/Graph.cpp capture_begin binding: TORCH_CHECK on the mode string."""
    with torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(RuntimeError, match="Unknown capture error mode. Expected `global`, `thread_local`"):
            torch.cuda.CUDAGraph().capture_begin(capture_error_mode="strict")


def test_replay_without_a_capture_is_refused(sim: SimulatedCuda) -> None:
    """CUDAGraph::replay: TORCH_CHECK(has_graph_exec_, ...)."""
    with pytest.raises(RuntimeError, match="replay without a preceding successful capture"):
        torch.cuda.CUDAGraph().replay()


def test_graph_context_calls_capture_methods_through_the_instance(sim: SimulatedCuda) -> None:
    """torch/cuda/graphs.py: ``self.cuda_graph.capture_begin(...)``, so a class-level wrapper sees it."""
    calls: list[str] = []
    cls = torch.cuda.CUDAGraph
    begin, end = cls.capture_begin, cls.capture_end

    def wrapped_begin(self: object, *args: object, **kwargs: object) -> None:
        calls.append(f"begin:{kwargs.get('capture_error_mode')}")
        begin(self, *args, **kwargs)

    def wrapped_end(self: object) -> None:
        calls.append("end")
        end(self)

    cls.capture_begin, cls.capture_end = wrapped_begin, wrapped_end
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
            pass
    finally:
        cls.capture_begin, cls.capture_end = begin, end
    assert calls == ["begin:thread_local", "end"]


def test_capture_in_one_simulation_does_not_leak_class_patches_into_the_next() -> None:
    """Each simulation has its own torch.cuda.CUDAGraph class, so class-level wrappers cannot leak."""
    from gpuprobe.testing.simcuda import simulated_cuda

    with simulated_cuda():
        first = torch.cuda.CUDAGraph
        first.capture_begin = None  # type: ignore[assignment]
    with simulated_cuda():
        assert torch.cuda.CUDAGraph is not first
        assert callable(torch.cuda.CUDAGraph.capture_begin)


def test_pool_is_available_after_capture_and_graph_pool_handle_is_fresh(sim: SimulatedCuda) -> None:
    """CUDAGraph::pool needs a successful capture; torch/cuda/graphs.py graph(pool=...) shares it."""
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
        g.pool()
    with torch.cuda.graph(g):
        pass
    handle = torch.cuda.graph_pool_handle()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g.pool()):
        pass
    assert g2.pool() == g.pool() and handle != g.pool()


def test_a_failed_capture_leaves_the_capture_stream_current(sim: SimulatedCuda) -> None:
    """torch/cuda/graphs.py graph.__exit__ calls ``capture_end()`` before ``stream_ctx.__exit__``: when
    capture_end raises, the side stream stays current."""
    g = torch.cuda.CUDAGraph()
    ctx = torch.cuda.graph(g)
    with pytest.raises(torch.AcceleratorError):
        with ctx:
            _in_thread(torch.cuda.synchronize)
    assert torch.cuda.current_stream() == ctx.capture_stream != torch.cuda.default_stream()


def test_is_current_stream_capturing_does_not_initialize(sim: SimulatedCuda) -> None:
    """torch/cuda/graphs.py: "returns False without initializing the context"."""
    assert torch.cuda.is_current_stream_capturing() is False
    assert torch.cuda.is_initialized() is False
