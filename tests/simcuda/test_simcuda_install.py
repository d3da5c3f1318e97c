"""Installing and removing the simulation: every patched attribute comes back, nothing leaks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gpuprobe._placement as placement
from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda

# The attributes a simulation must replace (and restore), by module.
PATCHED = {
    "torch.cuda": ["is_available", "device_count", "is_initialized", "_lazy_init", "current_device", "set_device",
                   "device", "synchronize", "current_stream", "default_stream", "Stream", "Event", "CUDAGraph",
                   "graph", "memory_stats", "memory_allocated", "max_memory_allocated", "cudart", "_cudart",
                   "set_sync_debug_mode", "get_sync_debug_mode", "is_current_stream_capturing"],
    "torch.cuda.memory": ["memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "is_initialized",
                          "_lazy_init", "_record_memory_history", "_snapshot", "_dump_snapshot"],
    "torch.cuda.graphs": ["CUDAGraph", "graph"],
    "torch.cuda.streams": ["Stream", "Event"],
    "torch.profiler": ["profile", "record_function"],
    "torch.profiler.profiler": ["profile"],
    "torch.autograd.profiler": ["record_function"],
    "torch.profiler._utils": ["_init_for_cuda_graphs"],
    "torch._C": ["_cuda_attach_out_of_memory_observer"],  # absent on a CPU build: removed again on exit
}


def _snapshot() -> dict[tuple[str, str], object]:
    return {(mod, name): vars(sys.modules[mod]).get(name) for mod, names in PATCHED.items() for name in names}


def test_every_patched_attribute_is_the_original_object_after_exit() -> None:
    """Restoring puts back the very objects torch had (identity, not equality)."""
    before = _snapshot()
    with simulated_cuda() as sim:
        during = _snapshot()
        patched = sim.patched_attributes()
        originals = {(t, n): None for t, n in patched}
    after = _snapshot()
    assert all(after[k] is before[k] for k in before)
    assert all(during[k] is not before[k] for k in before), [k for k in before if during[k] is before[k]]
    assert len(originals) == len(patched)  # no attribute patched twice
    assert sim.patched_attributes() == []


def test_attributes_are_restored_when_the_block_raises() -> None:
    """simulated_cuda restores in a finally block."""
    before, available = _snapshot(), torch.cuda.is_available()
    with pytest.raises(KeyError), simulated_cuda(devices=3):
        assert torch.cuda.device_count() == 3
        raise KeyError("boom")
    assert all(_snapshot()[k] is before[k] for k in before)
    assert torch.cuda.is_available() is available  # torch's own answer again


def test_nested_install_raises_and_leaves_the_first_installed() -> None:
    """One simulation at a time: nested or overlapping installs are refused."""
    real_count = torch.cuda.device_count()
    with simulated_cuda(devices=5) as outer:
        with pytest.raises(RuntimeError, match="already installed"):
            SimulatedCuda().install()
        with pytest.raises(RuntimeError, match="already installed"):
            outer.install()
        assert torch.cuda.device_count() == 5
    assert torch.cuda.device_count() == real_count


def test_uninstall_of_a_simulation_not_installed_raises() -> None:
    """uninstall() refuses to restore what it did not patch."""
    with pytest.raises(RuntimeError, match="not installed"):
        SimulatedCuda().uninstall()


def test_placement_resolver_is_installed_and_the_previous_one_restored() -> None:
    """gpuprobe reads devices only through gpuprobe._placement.tensor_device."""
    def previous(t: object) -> str:
        return "previous"

    old = placement.set_device_resolver(previous)
    try:
        t = torch.zeros(2)
        with simulated_cuda(cpu_tensors_on=1) as sim:
            assert placement.tensor_device(t) == torch.device("cuda", 1)
            assert placement._resolver == sim.device_of
        assert placement.tensor_device(t) == "previous"
    finally:
        placement.set_device_resolver(old)


def test_place_marks_module_parameters_and_buffers_and_their_views() -> None:
    """nn.Module.parameters()/buffers(); views share the placed tensor's storage."""
    with simulated_cuda() as sim:
        model = torch.nn.BatchNorm1d(4)
        sim.place(model, 1)
        stray = torch.zeros(3)
        assert sim.device_of(model.weight) == torch.device("cuda", 1)
        assert sim.device_of(model.running_mean) == torch.device("cuda", 1)
        assert sim.device_of(model.weight[:2]) == torch.device("cuda", 1)  # a view shares the storage
        assert sim.device_of(model.weight.detach()) == torch.device("cuda", 1)
        assert sim.device_of(stray) == torch.device("cpu")  # not placed, no cpu_tensors_on


def test_placement_holds_no_reference_to_the_tensor() -> None:
    """Placement uses weak references: a placed tensor is freed as usual."""
    import gc
    import weakref

    with simulated_cuda() as sim:
        t = torch.zeros(8)
        ref = weakref.ref(t)
        sim.place(t, "cuda:1")
        del t
        gc.collect()
        assert ref() is None
        assert sim._placed == {} and sim._placed_storage == {}


def test_importing_the_module_does_not_import_torch() -> None:
    """gpuprobe.testing may re-export this module without importing torch."""
    code = "import sys, gpuprobe.testing.simcuda; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
