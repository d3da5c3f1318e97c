"""The simulated ``torch.cuda`` functions: twins of torch's Python code (torch/cuda/__init__.py,
memory.py, random.py, graphs.py) over the simulation's C-level calls, with torch's names and signatures."""

from __future__ import annotations

import collections
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from . import _torch_compat
from ._torch_compat import (
    ATTACH_OOM_OBSERVER,
    DUMP_SNAPSHOT,
    INIT_FOR_CUDA_GRAPHS,
    LAZY_INIT,
    RECORD_MEMORY_HISTORY,
    SLEEP,
    SNAPSHOT,
    get_device_index,
    lazy_init,
    allocator_snapshot,
    set_stream_by_id,
)
from .clock import _Op
from .devices import SimCudart
from .messages import _SYNC_PROTOTYPE_WARNING
from .records import KERNEL, SimDeviceProperties
from .streams import SimStream, SimStreamContext

__all__: list[str] = []

_QUALNAME_ALIASES = (
    ("_make_api.<locals>.", ""),
    ("SimEvent.", "Event."),
    ("SimStream.", "Stream."),
    ("SimCUDAGraph.", "CUDAGraph."),
    ("SimGraphContext.", "graph."),
    ("SimDeviceContext.", "device."),
    ("SimStreamContext.", "StreamContext."),
)


def _caller_name() -> str:
    """The API that led to a ``_lazy_init`` call: the first caller not named with a leading underscore
    (dunder methods count) and not an accessor of ``_torch_compat``, with the simulation's class names
    spelled as torch's."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        public = not code.co_name.startswith("_") or (code.co_name.startswith("__") and code.co_name.endswith("__"))
        if public and frame.f_globals.get("__name__") != _torch_compat.__name__:
            name = getattr(code, "co_qualname", code.co_name)
            for prefix, alias in _QUALNAME_ALIASES:
                if name.startswith(prefix):
                    name = alias + name[len(prefix):]
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return LAZY_INIT


def _make_api(sim: Any, torch: Any) -> dict[str, Callable[..., Any]]:
    """Functions with torch's names and signatures, bound to ``sim``."""
    _get_device_index = get_device_index(torch)

    def count(name: str) -> None:
        with sim._lock:
            sim.stats.calls[name] += 1

    def is_available() -> bool:
        """torch/cuda/__init__.py is_available: ``torch._C._cuda_getDeviceCount() > 0``, which registers
        the fork handler (poisons fork) unless PYTORCH_NVML_BASED_CUDA_CHECK=1 asks NVML instead."""
        count("is_available")
        if os.getenv("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            return torch.cuda.device_count() > 0
        with sim._lock:
            sim._fork_poisoned = True
        return sim.devices > 0

    def device_count() -> int:
        """torch/cuda/__init__.py device_count: NVML before initialization (fork stays usable), the
        CUDA runtime after. Does not initialize."""
        count("device_count")
        return sim.devices

    def is_initialized() -> bool:
        """torch/cuda/__init__.py is_initialized: ``_initialized and not _is_in_bad_fork()``."""
        count("is_initialized")
        return sim._initialized and not sim._in_bad_fork

    def _is_in_bad_fork() -> bool:
        """torch._C._cuda_isInBadFork: a forked child of a process whose CUDA state poisoned fork."""
        return sim._in_bad_fork

    def _lazy_init() -> None:
        """torch/cuda/__init__.py _lazy_init: initializes once; in a bad fork raises torch's message."""
        caller = LAZY_INIT
        if not sim._initialized:
            caller = _caller_name()
        sim._init(caller)

    def init() -> None:
        """torch/cuda/__init__.py init: ``_lazy_init()``."""
        count("init")
        lazy_init(torch)

    def current_device() -> int:
        """torch/cuda/__init__.py current_device: ``_lazy_init()``, then the thread's current device."""
        count("current_device")
        lazy_init(torch)
        return sim._tls.device

    def set_device(device: Any) -> None:
        """torch/cuda/__init__.py set_device: no-op for a negative index; ``_cuda_setDevice``
        initializes and sets the calling thread's device."""
        count("set_device")
        device = _get_device_index(device)
        if device >= 0:
            sim._c_set_device(device)

    def _exchange_device(device: int) -> int:
        """torch._C._cuda_exchangeDevice: -1 for a negative index; else initializes and swaps."""
        return sim._c_exchange_device(int(device))

    def _maybe_exchange_device(device: int) -> int:
        """torch._C._cuda_maybeExchangeDevice: swaps without initializing."""
        return sim._c_maybe_exchange_device(int(device))

    def get_device_properties(device: Any = None) -> SimDeviceProperties:
        """torch/cuda/__init__.py get_device_properties: ``_lazy_init()``; "Invalid device id"."""
        count("get_device_properties")
        lazy_init(torch)
        device = _get_device_index(device, optional=True)
        if device < 0 or device >= torch.cuda.device_count():
            raise AssertionError("Invalid device id")
        return sim._properties[device]

    def get_device_name(device: Any = None) -> str:
        """torch/cuda/__init__.py get_device_name: ``get_device_properties(device).name``."""
        count("get_device_name")
        return torch.cuda.get_device_properties(device).name

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        """torch/cuda/__init__.py get_device_capability: (major, minor) of the properties."""
        count("get_device_capability")
        prop = torch.cuda.get_device_properties(device)
        return prop.major, prop.minor

    def _sleep(cycles: int) -> None:
        """torch/cuda/__init__.py _sleep → torch._C._cuda_sleep → at::cuda::sleep: one kernel
        (``spin_kernel``) on the current stream of the current device that spins for ``cycles``
        clock cycles, here ``cycles / clock_rate``. It creates the device's context (fork is
        poisoned) without torch's Python-level initialization: ``is_initialized()`` stays False
        (seen on a real H200, design/CUDA.md)."""
        count(SLEEP)
        t0 = time.time_ns()
        with sim._lock:
            sim._fork_poisoned = True
            stream = sim._current_stream(sim._tls.device)
            khz = sim._properties[stream.device_index].clock_rate
            sim._enqueue(stream, _Op("spin_kernel", KERNEL, int(cycles) * 1_000_000 // khz, 0), t0)

    def synchronize(device: Any = None) -> None:
        """torch/cuda/__init__.py synchronize: ``_lazy_init()``, then within ``torch.cuda.device(device)``
        cudaDeviceSynchronize. A counted host synchronization; refused during a capture that forbids it."""
        count("synchronize")
        lazy_init(torch)
        with torch.cuda.device(device):
            return sim._c_device_synchronize()

    def current_stream(device: Any = None) -> SimStream:
        """torch/cuda/__init__.py current_stream: ``_lazy_init()``, then the calling thread's current
        stream of the device (default: the current device)."""
        count("current_stream")
        lazy_init(torch)
        return sim._c_current_stream(_get_device_index(device, optional=True))

    def default_stream(device: Any = None) -> SimStream:
        """torch/cuda/__init__.py default_stream: ``_lazy_init()``, then the device's default stream."""
        count("default_stream")
        lazy_init(torch)
        return sim._c_default_stream(_get_device_index(device, optional=True))

    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        """torch._C._cuda_setStream: the stream's device becomes current, then the stream."""
        sim._c_set_stream(int(stream_id), int(device_index))

    def set_stream(stream: Any) -> None:
        """torch/cuda/__init__.py set_stream: no-op for None; else ``_set_stream_by_id``."""
        count("set_stream")
        if stream is None:
            return
        set_stream_by_id(torch, stream.stream_id, stream.device_index, stream.device_type)

    def stream(stream: Any) -> SimStreamContext:
        """torch/cuda/__init__.py stream: ``StreamContext(stream)``."""
        count("stream")
        return torch.cuda.StreamContext(stream)

    def graph_pool_handle() -> tuple[int, int]:
        """torch/cuda/graphs.py graph_pool_handle: an opaque memory pool id."""
        count("graph_pool_handle")
        return (0, next(sim._pool_ids))

    def is_current_stream_capturing() -> bool:
        """torch/cuda/graphs.py is_current_stream_capturing: whether the calling thread's current stream
        is capturing (an invalidated capture still is); False, without initializing, before init."""
        count("is_current_stream_capturing")
        with sim._lock:
            if not sim._initialized:
                return False
            return sim._current_stream(sim._tls.device)._capture is not None

    def set_sync_debug_mode(debug_mode: int | str) -> None:
        """torch/cuda/__init__.py set_sync_debug_mode: ``_lazy_init()``; names map to 0/1/2."""
        count("set_sync_debug_mode")
        lazy_init(torch)
        if isinstance(debug_mode, str):
            if debug_mode == "default":
                debug_mode = 0
            elif debug_mode == "warn":
                debug_mode = 1
            elif debug_mode == "error":
                debug_mode = 2
            else:
                raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        if not sim._sync_warned:
            sim._sync_warned = True
            warnings.warn(_SYNC_PROTOTYPE_WARNING, UserWarning, stacklevel=2)
        if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
            raise RuntimeError("invalid argument to set_sync_debug_mode")
        if not 0 <= debug_mode <= 2:
            raise RuntimeError("invalid value of debug_mode, expected one of 0,1, 2")
        sim._sync_debug_mode = debug_mode

    def get_sync_debug_mode() -> int:
        """torch/cuda/__init__.py get_sync_debug_mode: ``_lazy_init()``, then the mode (0, 1 or 2)."""
        count("get_sync_debug_mode")
        lazy_init(torch)
        return sim._sync_debug_mode

    def cudart() -> SimCudart:
        """torch/cuda/__init__.py cudart: ``_lazy_init()``, then the runtime module."""
        count("cudart")
        lazy_init(torch)
        return sim._cudart

    # ---- memory (torch/cuda/memory.py)

    def empty_cache() -> None:
        """torch/cuda/memory.py empty_cache: only if initialized; frees cached, unused segments."""
        count("empty_cache")
        if torch.cuda.memory.is_initialized():
            sim._c_empty_cache()

    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        """torch/cuda/memory.py memory_stats_as_nested_dict: {} when not initialized (does not
        initialize); else the allocator's DeviceStats as torch/csrc/cuda/Module.cpp builds them."""
        count("memory_stats_as_nested_dict")
        if not torch.cuda.memory.is_initialized():
            return {}
        device = _get_device_index(device, optional=True)
        with sim._lock:
            return sim._allocator_for_stats(device).nested()

    def memory_stats(device: Any = None) -> dict[str, Any]:
        """torch/cuda/memory.py memory_stats: the nested dict flattened with dotted keys, sorted."""
        count("memory_stats")
        result = []

        def _format_key(key: Any) -> str:
            if isinstance(key, str):
                return key
            if isinstance(key, tuple):
                return "_".join(str(part) for part in key)
            return str(key)

        def _recurse_add_to_result(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                if len(prefix) > 0:
                    prefix += "."
                for k, v in obj.items():
                    _recurse_add_to_result(prefix + _format_key(k), v)
            else:
                result.append((prefix, obj))

        stats = torch.cuda.memory.memory_stats_as_nested_dict(device=device)
        _recurse_add_to_result("", stats)
        result.sort()
        return collections.OrderedDict(result)

    def memory_allocated(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["allocated_bytes.all.current"]`` (0 if absent)."""
        count("memory_allocated")
        return torch.cuda.memory.memory_stats(device=device).get("allocated_bytes.all.current", 0)

    def max_memory_allocated(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["allocated_bytes.all.peak"]``."""
        count("max_memory_allocated")
        return torch.cuda.memory.memory_stats(device=device).get("allocated_bytes.all.peak", 0)

    def memory_reserved(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["reserved_bytes.all.current"]``."""
        count("memory_reserved")
        return torch.cuda.memory.memory_stats(device=device).get("reserved_bytes.all.current", 0)

    def max_memory_reserved(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["reserved_bytes.all.peak"]``."""
        count("max_memory_reserved")
        return torch.cuda.memory.memory_stats(device=device).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(device: Any = None) -> None:
        """torch/cuda/memory.py reset_peak_memory_stats: every "peak" becomes "current"; before CUDA
        initialization the allocator refuses ("Invalid device argument ...: did you call init?")."""
        count("reset_peak_memory_stats")
        device = _get_device_index(device, optional=True)
        with sim._lock:
            sim._allocator_for_stats(device).reset_peak()

    def reset_accumulated_memory_stats(device: Any = None) -> None:
        """torch/cuda/memory.py reset_accumulated_memory_stats: zero "allocated"/"freed" and counters."""
        count("reset_accumulated_memory_stats")
        device = _get_device_index(device, optional=True)
        with sim._lock:
            sim._allocator_for_stats(device).reset_accumulated()

    def reset_max_memory_allocated(device: Any = None) -> None:
        """torch/cuda/memory.py reset_max_memory_allocated: FutureWarning, then reset_peak_memory_stats."""
        count("reset_max_memory_allocated")
        warnings.warn(
            "torch.cuda.reset_max_memory_allocated now calls torch.cuda.reset_peak_memory_stats, "
            "which resets /all/ peak memory stats.",
            FutureWarning,
            stacklevel=2,
        )
        return torch.cuda.memory.reset_peak_memory_stats(device=device)

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """torch/cuda/memory.py mem_get_info: ``torch.cuda.cudart().cudaMemGetInfo(device)`` (initializes)."""
        count("mem_get_info")
        if device is None:
            device = torch.cuda.current_device()
        device = _get_device_index(device, optional=True)
        return torch.cuda.cudart().cudaMemGetInfo(device)

    def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
        """torch/cuda/memory.py memory_snapshot: the snapshot's "segments"."""
        count("memory_snapshot")
        return sim._c_snapshot()["segments"]

    def _record_memory_history(enabled: Any = "all", context: str | None = "all", stacks: str = "all",
                               max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                               compile_context: bool = False, global_record_annotations: bool = False,
                               skip_actions: list[str] | None = None, **legacy: Any) -> None:
        """torch/cuda/memory.py _record_memory_history: "state" keeps stacks of live allocations, "all"
        also a history of alloc/free events (up to ``max_entries``); None stops and drops the history.
        A bool ``enabled`` is the legacy form (``record_context``, ``trace_alloc_max_entries``)."""
        count(RECORD_MEMORY_HISTORY)
        if isinstance(enabled, bool):
            record_context = legacy.get("record_context", context not in (None, False))
            max_entries = legacy.get("trace_alloc_max_entries", 1)
            sim._c_record_history("all" if enabled else None, "all" if record_context else None, "python",
                                  max_entries, bool(legacy.get("clear_history", clear_history)), None)
            return
        if legacy:
            raise TypeError(f"_record_memory_history() got unexpected keyword arguments {sorted(legacy)}")
        sim._c_record_history(enabled, context, stacks, max_entries, clear_history, skip_actions)

    def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        """torch/cuda/memory.py _snapshot: {"segments", "device_traces", ...} for all devices."""
        count(SNAPSHOT)
        return sim._c_snapshot()

    def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        """torch/cuda/memory.py _dump_snapshot: pickle ``_snapshot()`` to ``filename``."""
        count(DUMP_SNAPSHOT)
        s = allocator_snapshot(torch, augment_with_fx_traces)
        with open(filename, "wb") as f:
            pickle.dump(s, f)

    # ---- RNG seeds (torch/cuda/random.py); the generators themselves are not simulated

    def manual_seed(seed: int) -> None:
        """torch/cuda/random.py manual_seed: the seed of the current device's generator (queued by
        ``_lazy_call`` in torch; does not initialize)."""
        count("manual_seed")
        with sim._lock:
            sim._seeds[sim._tls.device] = int(seed) & 0xFFFFFFFFFFFFFFFF

    def manual_seed_all(seed: int) -> None:
        """torch/cuda/random.py manual_seed_all: the seed of every device's generator."""
        count("manual_seed_all")
        with sim._lock:
            sim._seeds = [int(seed) & 0xFFFFFFFFFFFFFFFF] * sim.devices

    def seed() -> None:
        """torch/cuda/random.py seed: a random seed for the current device."""
        count("seed")
        with sim._lock:
            sim._seeds[sim._tls.device] = int.from_bytes(os.urandom(8), "little")

    def seed_all() -> None:
        """torch/cuda/random.py seed_all: one random seed for every device."""
        count("seed_all")
        with sim._lock:
            sim._seeds = [int.from_bytes(os.urandom(8), "little")] * sim.devices

    def initial_seed() -> int:
        """torch/cuda/random.py initial_seed: ``_lazy_init()``, then the current device's seed."""
        count("initial_seed")
        lazy_init(torch)
        with sim._lock:
            return sim._seeds[sim._tls.device]

    def _cuda_attach_out_of_memory_observer(observer: Callable[[int, int, int, int], object]) -> None:
        """torch._C._cuda_attach_out_of_memory_observer (CUDA builds only): the caching allocator calls
        ``observer(device, alloc, device_total, device_free)`` right before raising OutOfMemoryError. The
        binding's C++ device initialization is not simulated: ``torch.cuda.is_initialized()`` does not
        change (it is not ``torch.cuda._lazy_init``)."""
        count(ATTACH_OOM_OBSERVER)
        sim._c_attach_oom_observer(observer)

    def _init_for_cuda_graphs() -> None:
        """torch/profiler/_utils.py _init_for_cuda_graphs: a short profiler session that initializes
        CUPTI, so graphs captured afterwards can be profiled. Counted; no session is run."""
        with sim._lock:
            sim.stats.calls[INIT_FOR_CUDA_GRAPHS] += 1
            sim.stats.init_for_cuda_graphs_calls += 1
            sim._cupti_initialized = True

    return {f.__name__: f for f in (
        is_available, device_count, is_initialized, _is_in_bad_fork, _lazy_init, init, current_device, set_device,
        _exchange_device, _maybe_exchange_device, get_device_properties, get_device_name, get_device_capability,
        _sleep, synchronize, current_stream, default_stream, _set_stream_by_id, set_stream, stream, graph_pool_handle,
        is_current_stream_capturing, set_sync_debug_mode, get_sync_debug_mode, cudart, empty_cache,
        memory_stats_as_nested_dict, memory_stats, memory_allocated, max_memory_allocated, memory_reserved,
        max_memory_reserved, reset_peak_memory_stats, reset_accumulated_memory_stats, reset_max_memory_allocated,
        mem_get_info, memory_snapshot, _record_memory_history, _snapshot, _dump_snapshot, _init_for_cuda_graphs,
        manual_seed, manual_seed_all, seed, seed_all, initial_seed, _cuda_attach_out_of_memory_observer,
    )}
