"""Devices: availability, lazy initialization, the per-thread current device, fork poisoning."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda

FORK_MESSAGE = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                "you must use the 'spawn' start method")


def test_availability_count_and_is_initialized_do_not_initialize(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py: is_available, device_count and is_initialized never call _lazy_init."""
    assert torch.cuda.is_available() is True
    assert torch.cuda.device_count() == 2
    assert torch.cuda.is_initialized() is False
    assert sim.stats.init_calls == 0


def test_current_device_initializes_and_names_the_first_initializing_call(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py current_device: ``_lazy_init()`` first."""
    assert torch.cuda.current_device() == 0
    assert torch.cuda.is_initialized() is True
    assert sim.stats.first_init_call == "current_device"
    assert sim.stats.init_calls == 1


def test_memory_stats_as_nested_dict_is_empty_and_does_not_initialize_before_init(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py memory_stats_as_nested_dict: ``if not is_initialized(): return {}``."""
    assert torch.cuda.memory_stats_as_nested_dict() == {}
    assert torch.cuda.memory_allocated() == 0
    assert torch.cuda.is_initialized() is False


def test_a_thread_started_inside_a_device_context_starts_at_device_zero(sim: SimulatedCuda) -> None:
    """The CUDA runtime's current device is per host thread; a new thread starts at device 0."""
    seen: list[int] = []
    with torch.cuda.device(1):
        assert torch.cuda.current_device() == 1
        worker = threading.Thread(target=lambda: seen.append(torch.cuda.current_device()))
        worker.start()
        worker.join()
    assert seen == [0]
    assert torch.cuda.current_device() == 0  # restored on exit (torch.cuda.device.__exit__)


def test_set_device_is_per_thread(sim: SimulatedCuda) -> None:
    """torch._C._cuda_setDevice sets the calling thread's device only."""
    done = threading.Event()
    seen: list[int] = []

    def worker() -> None:
        torch.cuda.set_device(1)
        seen.append(torch.cuda.current_device())
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert done.is_set() and seen == [1]
    assert torch.cuda.current_device() == 0


def test_set_device_to_a_missing_device_raises_invalid_device_ordinal(sim: SimulatedCuda) -> None:
    """cudaSetDevice fails with cudaErrorInvalidDevice; C10_CUDA_CHECK raises torch.AcceleratorError."""
    with pytest.raises(torch.AcceleratorError, match="CUDA error: invalid device ordinal") as info:
        torch.cuda.set_device(5)
    assert info.value.error_code == 101


def test_device_properties_look_like_an_h100(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py get_device_properties / get_device_name / get_device_capability."""
    props = torch.cuda.get_device_properties(1)
    assert props.total_memory == 80 * 2**30
    assert props.multi_processor_count == 132
    assert torch.cuda.get_device_name(0) == "NVIDIA H100 80GB HBM3"
    assert torch.cuda.get_device_capability() == (9, 0)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.get_device_properties(2)


def test_device_of_uses_the_simulated_exchange(sim: SimulatedCuda) -> None:
    """torch.cuda.device_of (torch's own class) goes through torch.cuda._exchange_device."""
    t = torch.zeros(1)
    with torch.cuda.device_of(t):  # a CPU tensor: index -1, a no-op
        assert torch.cuda.current_device() == 0


def _in_child(body: object) -> int:
    """Run ``body()`` in a forked child; its return value is the child's exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            code = body()  # type: ignore[operator]
        except BaseException:
            code = 99
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_forked_child_of_an_initialized_parent_cannot_initialize(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py _lazy_init raises in a bad fork; is_initialized() is False there."""
    torch.cuda.current_device()

    def child() -> int:
        if torch.cuda.is_initialized():
            return 3
        try:
            torch.cuda.current_device()
        except RuntimeError as exc:
            return 0 if str(exc) == FORK_MESSAGE else 4
        return 5

    assert _in_child(child) == 0


def test_is_available_poisons_fork_but_device_count_does_not() -> None:
    """is_available() calls torch._C._cuda_getDeviceCount, which registers the fork handler;
    device_count() asks NVML before initialization (torch/cuda/__init__.py notes)."""
    def child() -> int:
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            return 10 if "forked subprocess" in str(exc) else 4
        return 20

    with simulated_cuda():
        torch.cuda.device_count()
        assert _in_child(child) == 20
    with simulated_cuda():
        torch.cuda.is_available()
        assert _in_child(child) == 10


def test_seeding_works_after_initialization(sim: SimulatedCuda) -> None:
    """torch/random.py manual_seed also seeds CUDA (torch.cuda.manual_seed_all); torch/cuda/random.py
    manual_seed seeds the current device; the default seed is c10's default_rng_seed_val."""
    with torch.cuda.device(1):
        assert torch.cuda.initial_seed() == 67280421310721
    torch.manual_seed(5)
    torch.cuda.manual_seed(7)
    assert torch.cuda.initial_seed() == 7
    with torch.cuda.device(1):
        assert torch.cuda.initial_seed() == 5
