"""torch.cuda.set_sync_debug_mode (torch/cuda/__init__.py; c10/cuda/CUDAFunctions.h)."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpuprobe.testing.simcuda import SimulatedCuda


def test_names_map_to_numbers_and_setting_initializes(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py set_sync_debug_mode: _lazy_init(), names to 0/1/2, torch's error text."""
    with pytest.warns(UserWarning, match="prototype feature"):
        torch.cuda.set_sync_debug_mode("warn")
    assert torch.cuda.get_sync_debug_mode() == 1
    assert torch.cuda.is_initialized()
    torch.cuda.set_sync_debug_mode("error")
    assert torch.cuda.get_sync_debug_mode() == 2
    with pytest.raises(RuntimeError, match="invalid value of debug_mode, expected one of `default`, `warn`"):
        torch.cuda.set_sync_debug_mode("loud")


def test_warn_mode_warns_on_stream_synchronize_and_on_a_copy_to_host(sim: SimulatedCuda) -> None:
    """c10::cuda::stream_synchronize and memcpy_and_sync call warn_or_error_on_sync first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode(1)
    with pytest.warns(UserWarning, match="^called a synchronizing CUDA operation$"):
        torch.cuda.current_stream().synchronize()
    with pytest.warns(UserWarning, match="^called a synchronizing CUDA operation$"):
        sim.memcpy_and_sync()
    assert sim.stats.host_syncs == 2


def test_error_mode_raises_before_synchronizing(sim: SimulatedCuda) -> None:
    """warn_or_error_on_sync runs before cudaStreamSynchronize (CUDAFunctions.h memcpy_and_sync)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("error")
    sim.launch(1_000)
    with pytest.raises(RuntimeError, match="^called a synchronizing CUDA operation$"):
        sim.memcpy_and_sync()
    assert sim.stats.host_syncs == 0 and sim.now_ns() == 0


def test_explicit_device_and_event_synchronize_are_not_flagged(sim: SimulatedCuda) -> None:
    """device_synchronize and CUDAEvent::synchronize (CUDAEvent.h) do not call warn_or_error_on_sync."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("error")
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    ev.synchronize()
    assert sim.stats.host_syncs == 2
