"""Installing and removing the simulation: every patched attribute comes back, nothing leaks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gpuprobe._placement as placement
from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda

from helpers import run_python

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


def test_a_simulation_installs_over_a_machine_simulation_as_over_real_cuda() -> None:
    """``install(as_machine=True)`` stands in for the process's CUDA (``pytest --simulate-gpu``): a test's
    simulation goes over it and gives its attributes back; the profiler classes still subclass torch's
    own. In a fresh interpreter: this one may already run on a simulated machine."""
    proc = run_python("""
        import os
        import torch, torch.profiler
        import gpuprobe._placement as placement
        from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda

        def refused(call, needle):
            try:
                call()
            except RuntimeError as exc:
                assert needle in str(exc), exc
            else:
                raise AssertionError(f"not refused: {needle}")

        real_count, torch_profile, torch_available = (torch.cuda.device_count(), torch.profiler.profile,
                                                      torch.cuda.is_available)
        machine = SimulatedCuda(devices=1).install(as_machine=True)
        assert torch.cuda.device_count() == 1 and torch.cuda.is_initialized() is False
        on_machine = {n: vars(torch.cuda)[n] for n in ("device_count", "Event", "current_device", "_lazy_init")}
        with simulated_cuda(devices=3) as sim:
            assert torch.cuda.device_count() == 3 and placement._resolver == sim.device_of
            assert torch.profiler.profile.__mro__[1] is torch_profile  # torch's class, not the machine's
            refused(lambda: SimulatedCuda().install(), "already installed")
            refused(machine.uninstall, "installed over this machine simulation")
        assert all(vars(torch.cuda)[n] is f for n, f in on_machine.items())
        assert placement._resolver == machine.device_of and machine.installed
        refused(lambda: SimulatedCuda().install(as_machine=True), "already installed")
        refused(lambda: machine.install(), "already installed")

        torch.cuda.is_available()  # asks the (simulated) runtime: fork is poisoned
        torch.cuda.current_device()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if torch.cuda._is_in_bad_fork() and not torch.cuda.is_initialized() else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0

        machine.uninstall()
        assert torch.cuda.device_count() == real_count and torch.cuda.is_available is torch_available
        assert torch.profiler.profile is torch_profile and placement._resolver is None
        refused(machine.uninstall, "not installed")
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_a_binding_gpuprobe_made_while_installed_gets_the_original_back() -> None:
    """``steps.profiling`` is bound to torch's profiler check when a model is instrumented; instrumented under
    a simulation, it holds the simulation's check, which must not outlive the simulation."""
    from gpuprobe import _torch_caps
    from gpuprobe.integrations._transformers.generate import steps

    real = torch._C._autograd._profiler_enabled
    previous = steps.profiling
    try:
        with simulated_cuda():
            steps.bind_torch()
            assert steps.profiling is not real  # the simulation's own check, which knows its sessions
            assert _torch_caps.profiler_caps(torch).profiler_enabled is steps.profiling
        assert steps.profiling is real
        assert _torch_caps.profiler_caps(torch).profiler_enabled is real  # decided anew after the uninstall
        steps.bind_torch()
        assert steps.profiling is real
    finally:
        steps.profiling = previous
