"""The caching allocator's counters, OOM, history and snapshots (torch/cuda/memory.py, c10 allocator)."""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path

import pytest
import torch

from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda

MiB = 2**20
MISSING = object()


def test_allocations_round_to_512_bytes_and_reserve_a_2mib_segment(sim: SimulatedCuda) -> None:
    """AllocatorConfig.h kMinBlockSize / kSmallBuffer."""
    sim.allocate(1)
    sim.allocate(513)
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == 512 + 1024
    assert stats["requested_bytes.all.current"] == 514
    assert stats["reserved_bytes.small_pool.current"] == 2 * MiB
    assert stats["segment.all.current"] == 1
    assert stats["allocation.all.current"] == 2


def test_large_allocations_use_20mib_then_2mib_rounded_segments(sim: SimulatedCuda) -> None:
    """kLargeBuffer for 1-10 MiB, else rounded to kRoundLarge."""
    sim.allocate(3 * MiB)
    assert torch.cuda.memory_reserved() == 20 * MiB
    sim.allocate(3 * MiB)  # fits in the same segment
    assert torch.cuda.memory_reserved() == 20 * MiB
    sim.allocate(15 * MiB + 1)  # the 14 MiB left are too few: a new segment, rounded to 2 MiB
    assert torch.cuda.memory_reserved() == 20 * MiB + 16 * MiB
    sim.allocate(13 * MiB)  # reuses the rest of the first segment
    assert torch.cuda.memory_reserved() == 36 * MiB


def test_freed_memory_stays_reserved_until_empty_cache(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py empty_cache: releases unoccupied cached memory."""
    h = sim.allocate(4 * MiB)
    sim.free(h)
    assert torch.cuda.memory_allocated() == 0
    assert torch.cuda.memory_reserved() == 20 * MiB
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0


def test_peak_is_a_lifetime_maximum_until_reset(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py max_memory_allocated: "the peak ... since the beginning of this program"."""
    h = sim.allocate(64 * MiB)
    sim.free(h)
    sim.allocate(MiB // 2)
    assert torch.cuda.max_memory_allocated() == 64 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == MiB // 2
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()


def test_counters_are_per_device(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py: every reading takes a device (default: the current one)."""
    sim.allocate(MiB, device=1)
    assert torch.cuda.memory_allocated(0) == 0
    assert torch.cuda.memory_allocated(1) == MiB
    assert torch.cuda.memory_allocated("cuda:1") == MiB


def test_memory_allocated_reads_through_memory_stats(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py memory_allocated: ``memory_stats(device=device).get(...)``, each time."""
    torch.cuda.current_device()
    sim.reset_stats()
    torch.cuda.memory_allocated()
    torch.cuda.memory_reserved()
    torch.cuda.max_memory_allocated()
    assert sim.calls["memory_stats"] == 3
    assert sim.calls["memory_stats_as_nested_dict"] == 3
    assert sim.calls["current_device"] == 3  # device=None resolves the current device each time


def test_memory_stats_has_torchs_key_names(sim: SimulatedCuda) -> None:
    """The keys memory_summary reads (torch/cuda/memory.py) and THCPModule_memoryStats builds."""
    torch.cuda.current_device()
    stats = torch.cuda.memory_stats()
    for key in ("allocation.all.current", "active_bytes.large_pool.peak", "inactive_split.small_pool.freed",
                "reserved_bytes.all.allocated", "oversize_segments.current", "num_alloc_retries", "num_ooms",
                "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"):
        assert key in stats
    assert 120 <= len(stats) <= 140
    assert stats["max_split_size"] == -1
    assert "CUDA OOMs: 0" in torch.cuda.memory_summary()  # torch's own memory_summary over the stats


def test_reset_peak_before_initialization_raises_like_the_allocator(sim: SimulatedCuda) -> None:
    """CUDACachingAllocator assertValidDevice; the DeviceIndex prints as a character."""
    with pytest.raises(RuntimeError, match="did you call init"):
        torch.cuda.reset_peak_memory_stats(0)


def test_reset_max_memory_allocated_warns_and_resets_the_peak(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py reset_max_memory_allocated: FutureWarning, then reset_peak_memory_stats."""
    sim.allocate(8 * MiB)
    with pytest.warns(FutureWarning, match="now calls torch.cuda.reset_peak_memory_stats"):
        torch.cuda.reset_max_memory_allocated()
    assert sim.calls["reset_peak_memory_stats"] == 1


def test_exceeding_device_memory_raises_torchs_out_of_memory_error(small_sim: SimulatedCuda) -> None:
    """torch.cuda.OutOfMemoryError is torch.OutOfMemoryError; the cache is freed and the malloc retried."""
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    cached = small_sim.allocate(30 * MiB)
    small_sim.free(cached)
    small_sim.allocate(40 * MiB)  # needs the cached 30 MiB segment released first
    stats = torch.cuda.memory_stats()
    assert stats["num_alloc_retries"] == 1
    with pytest.raises(torch.OutOfMemoryError, match=r"^CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0"):
        small_sim.allocate(40 * MiB)
    assert torch.cuda.memory_stats()["num_ooms"] == 1


def test_mem_get_info_is_total_minus_reserved(small_sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py mem_get_info: ``torch.cuda.cudart().cudaMemGetInfo(device)``."""
    small_sim.allocate(MiB)
    free, total = torch.cuda.mem_get_info()
    assert (free, total) == (62 * MiB, 64 * MiB)


def test_free_of_an_unknown_pointer_is_refused(sim: SimulatedCuda) -> None:
    """CUDACachingAllocator free: TORCH_CHECK(block, "invalid device pointer: ", ptr)."""
    with pytest.raises(RuntimeError, match="invalid device pointer: 0x1234"):
        sim.free(0x1234)


def test_history_records_allocations_with_python_frames_and_dumps_a_snapshot(sim: SimulatedCuda, tmp_path) -> None:
    """torch/cuda/memory.py _record_memory_history / _snapshot / _dump_snapshot; _memory_viz.py layout."""
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100)
    h = sim.allocate(1000)
    sim.free(h)
    keep = sim.allocate(2000)
    path = tmp_path / "snap.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    snap = pickle.loads(path.read_bytes())
    assert set(snap) >= {"segments", "device_traces"}
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions[:4] == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    alloc = snap["device_traces"][0][1]
    assert alloc["frames"][0]["name"] == "test_history_records_allocations_with_python_frames_and_dumps_a_snapshot"
    seg = snap["segments"][0]
    live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert [b["address"] for b in live] == [keep] and live[0]["requested_size"] == 2000
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"] == 2 * MiB
    assert sim.stats.memory_history_cpp_unwinds == 0  # stacks="python"


def test_state_history_keeps_stacks_but_no_trace(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py _record_memory_history: "state" keeps information for current allocations only."""
    torch.cuda.memory._record_memory_history(enabled="state")
    sim.allocate(100)
    snap = torch.cuda.memory._snapshot()
    assert snap["device_traces"] == [[], []]
    assert snap["segments"][0]["blocks"][0]["frames"]
    assert sim.stats.memory_history_cpp_unwinds == 1  # stacks="all" is the default


def test_history_is_off_by_default_and_dropped_when_disabled(sim: SimulatedCuda) -> None:
    """torch/cuda/memory.py _record_memory_history: enabled=None disables recording."""
    sim.allocate(100)
    assert torch.cuda.memory._snapshot()["device_traces"] == [[], []]
    torch.cuda.memory._record_memory_history()
    sim.allocate(100)
    assert len(torch.cuda.memory._snapshot()["device_traces"][0]) >= 1
    torch.cuda.memory._record_memory_history(enabled=None)
    assert torch.cuda.memory._snapshot()["device_traces"] == [[], []]


def test_record_memory_history_validates_its_options(sim: SimulatedCuda) -> None:
    """CachingDeviceAllocator.h parseTraceEntryAction: "Unknown TraceEntry action: "; stacks checked by torch."""
    with pytest.raises(RuntimeError, match="expected stacks to be 'python', or 'all'"):
        torch.cuda.memory._record_memory_history(stacks="cpp")
    with pytest.raises(RuntimeError, match="Unknown TraceEntry action: alloc_free"):
        torch.cuda.memory._record_memory_history(skip_actions=["alloc_free"])


# ---- the caching allocator's out-of-memory observers (torch._C._cuda_attach_out_of_memory_observer)

ATTACH = "_cuda_attach_out_of_memory_observer"


def test_oom_observer_gets_the_allocators_arguments_once_before_the_error(tmp_path: Path) -> None:
    """DeviceCachingAllocator::malloc: trace and count the OOM, call each observer with (device, alloc_size,
    device_total, device_free), then raise; a snapshot taken by the observer shows the failed state."""
    calls: list[tuple[int, ...]] = []
    seen: dict[str, object] = {}
    path = tmp_path / "oom.pickle"

    def observer(device: int, alloc: int, device_total: int, device_free: int) -> None:
        calls.append((device, alloc, device_total, device_free))
        seen["exc_info"] = sys.exc_info()
        seen["num_ooms"] = torch.cuda.memory_stats(device)["num_ooms"]
        seen["mem_get_info"] = torch.cuda.mem_get_info(device)
        torch.cuda.memory._dump_snapshot(str(path))

    with simulated_cuda(devices=2, memory_per_device=64 * MiB) as sim:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")
        torch._C._cuda_attach_out_of_memory_observer(observer)
        live = sim.allocate(30 * MiB, device=1)
        with pytest.raises(torch.OutOfMemoryError, match=r"^CUDA out of memory. Tried to allocate 40.00 MiB. GPU 1"):
            sim.allocate(39 * MiB + 1, device=1)  # rounded to 39 MiB + 512, in a segment of 40 MiB
        assert calls == [(1, 40 * MiB, 64 * MiB, 34 * MiB)]  # the segment size; the total, not the allocated
        assert seen["exc_info"] == (None, None, None)  # called before anything was raised
        assert seen["num_ooms"] == 1
        assert seen["mem_get_info"] == (34 * MiB, 64 * MiB)
        assert torch.cuda.memory_stats(0)["num_ooms"] == 0
        assert sim.calls[ATTACH] == 1
    snap = pickle.loads(path.read_bytes())
    actions = [e["action"] for e in snap["device_traces"][1]]
    assert actions == ["segment_alloc", "alloc", "oom", "snapshot"]  # the snapshot was taken after the OOM
    oom = snap["device_traces"][1][2]
    assert (oom["size"], oom["device_free"]) == (39 * MiB + 512, 34 * MiB)  # record_trace: the rounded size
    assert [b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"] == [live]


def test_oom_observer_is_not_called_when_the_allocation_succeeds(small_sim: SimulatedCuda) -> None:
    """Observers run only on the OOM path: not for allocations that fit, nor for one that fits once the
    cache is released (the retry), nor for zero bytes."""
    calls: list[tuple[int, ...]] = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: calls.append(args))
    small_sim.allocate(0)
    cached = small_sim.allocate(30 * MiB)
    small_sim.free(cached)
    small_sim.allocate(40 * MiB)
    small_sim.allocate(MiB)
    assert torch.cuda.memory_stats()["num_alloc_retries"] == 1
    assert calls == []
    with pytest.raises(torch.OutOfMemoryError):
        small_sim.allocate(40 * MiB)
    assert calls == [(0, 40 * MiB, 64 * MiB, 22 * MiB)]  # 64 - 40 - 2 (the small segment) reserved


def test_an_observers_exception_propagates_from_the_allocation_instead_of_the_oom(small_sim: SimulatedCuda) -> None:
    """Module.cpp: the observer's Python exception becomes py::error_already_set, thrown out of malloc and
    restored by the allocating call: later observers are skipped, no OutOfMemoryError; observers stay."""
    error = ValueError("observer failed")
    order: list[str] = []

    def failing(*args: int) -> None:
        order.append("failing")
        raise error

    torch._C._cuda_attach_out_of_memory_observer(failing)
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: order.append("second"))
    small_sim.allocate(30 * MiB)
    with pytest.raises(ValueError) as info:
        small_sim.allocate(40 * MiB)
    assert info.value is error
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert order == ["failing"]
    assert torch.cuda.memory_stats()["num_ooms"] == 1  # counted before the observers ran
    assert torch.cuda.memory_allocated() == 30 * MiB  # the failed request left nothing behind
    with pytest.raises(ValueError):
        small_sim.allocate(40 * MiB)  # observers cannot be detached
    assert order == ["failing", "failing"]


def test_attaching_accepts_any_object_and_a_non_callable_fails_at_the_oom(small_sim: SimulatedCuda) -> None:
    """THCPModule_attachOutOfMemoryObserver is METH_O and checks nothing; PyObject_CallFunction raises."""
    torch._C._cuda_attach_out_of_memory_observer(42)
    small_sim.allocate(MiB)  # no OOM: nothing is called
    with pytest.raises(TypeError, match="'int' object is not callable"):
        small_sim.allocate(80 * MiB)


def test_observers_run_on_the_allocating_thread_without_the_allocator_lock(small_sim: SimulatedCuda) -> None:
    """The allocator unlocks before calling observers: another thread can read the stats meanwhile."""
    seen: dict[str, object] = {}

    def read_stats() -> None:
        seen["reader_num_ooms"] = torch.cuda.memory_stats(0)["num_ooms"]

    def observer(*args: int) -> None:
        seen["thread"] = threading.get_ident()
        reader = threading.Thread(target=read_stats)
        reader.start()
        reader.join(timeout=10)
        seen["reader_done"] = not reader.is_alive()

    def allocate() -> None:
        seen["allocating_thread"] = threading.get_ident()
        try:
            small_sim.allocate(80 * MiB)
        except torch.OutOfMemoryError:
            seen["raised"] = True

    torch._C._cuda_attach_out_of_memory_observer(observer)
    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert seen["thread"] == seen["allocating_thread"] != threading.get_ident()
    assert seen["reader_done"] is True and seen["reader_num_ooms"] == 1
    assert seen["raised"] is True


def test_attach_function_exists_only_while_installed_and_observers_are_per_simulation() -> None:
    """A CPU build has no torch._C._cuda_attach_out_of_memory_observer: it is deleted again on exit (a
    CUDA build, or a simulated GPU machine, gets its own back)."""
    before = vars(torch._C).get(ATTACH, MISSING)
    calls: list[str] = []
    with simulated_cuda(devices=1, memory_per_device=64 * MiB) as first:
        assert (torch._C, ATTACH) in first.patched_attributes()
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: calls.append("first"))
    assert vars(torch._C).get(ATTACH, MISSING) is before
    if before is MISSING:  # whether torch has the binding depends on the build, not on a GPU being present
        assert not hasattr(torch._C, ATTACH)
    with simulated_cuda(devices=1, memory_per_device=64 * MiB) as second:
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: calls.append("second"))
        with pytest.raises(torch.OutOfMemoryError):
            second.allocate(80 * MiB)
    assert calls == ["second"]
    first.install()  # the first simulation kept its observer
    try:
        with pytest.raises(torch.OutOfMemoryError):
            first.allocate(80 * MiB)
    finally:
        first.uninstall()
    assert calls == ["second", "first"]


def test_an_existing_attach_function_is_restored_as_the_same_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA build torch._C has the function: uninstall puts the very object back."""
    def original(observer: object) -> None:
        raise AssertionError("the simulation's function must be the one called while installed")

    monkeypatch.setattr(torch._C, ATTACH, original, raising=False)
    with simulated_cuda(devices=1):
        assert torch._C._cuda_attach_out_of_memory_observer is not original
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: None)
    assert vars(torch._C)[ATTACH] is original
