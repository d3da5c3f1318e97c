"""The private torch names gpuprobe uses, each looked up once, with what to do where one is missing.

torch changes its private names between releases: ``torch._C._autograd._KinetoEvent`` has
``activity_type()`` in 2.13 but not in 2.11, and 2.2's has no ``is_user_annotation()`` and gives
times in microseconds (``start_us``) where later ones give nanoseconds (``start_ns``). The modules
that use such names read them here: :func:`profiler_caps` says what the installed torch offers,
decided once per ``_KinetoEvent`` class (a test can stand in a class of another release's shape),
and builds the readers that the per-event loops then call without further checks.

A leaf module: it imports nothing of gpuprobe and never imports torch (callers pass the torch they have).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DEVICE_WORK_ACTIVITIES", "SYNC_RECORD_NAMES", "LegacyCpuProfiler", "ProfilerCaps", "cuda_graphs_warm_up",
           "cuda_sleep", "forget", "kineto_event_class", "profiler_caps", "profiler_enabled_here", "RecordFunctionOps",
           "record_function_ops", "memory_history_recorder", "memory_snapshot_dumper", "oom_observer_attacher",
           "DynamoCaps", "dynamo_caps"]

# _KinetoEvent.activity_type() of device work: kineto's ActivityType names of CONCURRENT_KERNEL,
# GPU_MEMCPY and GPU_MEMSET (strings in libtorch_cpu.so).
DEVICE_WORK_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# The names kineto gives CUDA synchronization records (device type CUDA, activity cuda_sync):
# libkineto CuptiActivity.cpp syncTypeString, one per CUpti_ActivitySynchronizationType; the same
# strings are in libtorch_cpu.so of torch 2.11 and 2.13.
SYNC_RECORD_NAMES = frozenset({"Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync", "Unknown"})


@dataclasses.dataclass(frozen=True)
class LegacyCpuProfiler:
    """The autograd profiler's CPU state (``torch._C._autograd._enable_profiler_legacy``), ready to start."""

    enable: Callable[[Any], None]
    disable: Callable[[], Any]
    config: Any


@dataclasses.dataclass(frozen=True)
class ProfilerCaps:
    """What the installed torch offers the kernel sampler.

    Attributes:
        torch_version: ``torch.__version__``.
        event_methods: the public methods of ``torch._C._autograd._KinetoEvent`` (empty if torch has none).
        device_work: how kineto events of device work (kernels, memcpy, memset) are told apart from the
            other GPU-side records (GPU user annotations, synchronization records): ``"activity_type"``;
            ``"device_type"`` (device type CUDA, not a user annotation, not named as a synchronization
            record; kineto's ``cuda_profiler_range`` records, made only for the CUPTI range profiler,
            which the sampler's sessions never ask for, would pass); or None when torch offers neither.
        device_work_why: how, or why not, in words.
        times_ns: the events give ``start_ns()`` and ``duration_ns()`` (not 2.2's microsecond methods).
        profiler_enabled: whether a profiler runs on the calling thread
            (``torch._C._autograd._profiler_enabled``, else ``torch.autograd.profiler._is_profiler_enabled``);
            None if torch has neither.
        legacy_cpu: the autograd profiler's CPU state, or None where torch no longer has it.
        profiler_in_process: whether a ``torch.profiler`` / ``torch.autograd.profiler`` session runs on
            any thread of the process (``torch.autograd.profiler._is_profiler_enabled``, set while one
            records; the CPU state the kernel sampler starts directly does not set it); None if torch
            has no such flag.
    """

    torch_version: str
    event_methods: frozenset[str]
    device_work: str | None
    device_work_why: str
    times_ns: bool
    profiler_enabled: Callable[[], bool] | None
    legacy_cpu: LegacyCpuProfiler | None
    profiler_in_process: Callable[[], bool] | None = None

    def device_work_reader(self, cuda_device_type: Any) -> Callable[[Iterable[Any]], list[tuple[str, int]]]:
        """``events -> [(name, duration_ns)]`` of the device work among kineto events.

        Args:
            cuda_device_type: ``torch.autograd.DeviceType.CUDA``.

        Raises:
            RuntimeError: this torch offers no way to tell device work apart (``device_work`` is None).
        """
        if self.device_work is None:
            raise RuntimeError(f"device work cannot be told apart on torch {self.torch_version}: "
                               f"{self.device_work_why}")
        if self.device_work == "activity_type":
            work = DEVICE_WORK_ACTIVITIES

            def read(events: Iterable[Any]) -> list[tuple[str, int]]:
                return [(e.name(), e.duration_ns()) for e in events if e.activity_type() in work]
        else:
            sync = SYNC_RECORD_NAMES

            def read(events: Iterable[Any]) -> list[tuple[str, int]]:
                # torch's own rule for device time (profiler_util.py: device type CUDA and not a user
                # annotation), less the synchronization records kineto adds with enable_cuda_sync_events.
                out = []
                for e in events:
                    if e.device_type() == cuda_device_type and not e.is_user_annotation():
                        name = e.name()
                        if name not in sync:
                            out.append((name, e.duration_ns()))
                return out
        return read

    def cpu_event_reader(self) -> Callable[[Iterable[Any]], list[tuple[str, int, int, int]]]:
        """``events -> [(name, start_ns, duration_ns, thread)]`` of every kineto event.

        Raises:
            RuntimeError: this torch's kineto events give no start or duration.
        """
        if not self.times_ns:
            raise RuntimeError(f"torch {self.torch_version}'s kineto events give no start_ns() or duration_ns()")
        return lambda events: [(e.name(), e.start_ns(), e.duration_ns(), e.start_thread_id()) for e in events]


_cache: dict[tuple[int, Any], ProfilerCaps] = {}
_cache_lock = threading.Lock()


def profiler_caps(torch: Any) -> ProfilerCaps:
    """What ``torch`` offers the kernel sampler; decided once per ``_KinetoEvent`` class.

    Example:
        >>> import torch
        >>> profiler_caps(torch).device_work in ("activity_type", "device_type", None)
        True
    """
    autograd = _autograd(torch)
    event_cls = kineto_event_class(torch)
    key = (id(torch), event_cls)
    caps = _cache.get(key)
    if caps is None:
        caps = _lookup(torch, autograd, event_cls)
        with _cache_lock:
            _cache[key] = caps
    return caps


def forget() -> None:
    """Decide anew at the next :func:`profiler_caps` (torch's functions were replaced or put back: a
    simulated CUDA was installed or uninstalled)."""
    with _cache_lock:
        _cache.clear()


def _autograd(torch: Any) -> Any:
    return getattr(getattr(torch, "_C", None), "_autograd", None)


def kineto_event_class(torch: Any) -> Any:
    """``torch._C._autograd._KinetoEvent``, or None where torch has none.

    Looked up when called (tests stand in a class of another release's shape); the simulated CUDA's
    events take its shape.
    """
    return getattr(_autograd(torch), "_KinetoEvent", None)


def _lookup(torch: Any, autograd: Any, event_cls: Any) -> ProfilerCaps:
    version = str(getattr(torch, "__version__", "?"))
    methods = frozenset(n for n in dir(event_cls) if not n.startswith("_")) if event_cls is not None else frozenset()
    times_ns = {"start_ns", "duration_ns"} <= methods
    work: str | None
    by_flag = {"device_type", "is_user_annotation", "name"} <= methods
    if event_cls is None:
        work, why = None, "torch._C._autograd._KinetoEvent is missing"
    elif "activity_type" not in methods and not by_flag:
        work, why = None, ("its _KinetoEvent has neither activity_type() nor is_user_annotation(): GPU user "
                           "annotations cannot be told from kernels")
    elif not times_ns:
        work, why = None, "its kineto events give no duration_ns()"
    elif "activity_type" in methods:
        work, why = "activity_type", "device work told apart by activity_type()"
    else:
        work, why = "device_type", ("device work told apart by device_type(), is_user_annotation() and the names of "
                                    "synchronization records (this torch's _KinetoEvent has no activity_type())")
    enabled: Callable[[], bool] | None = getattr(autograd, "_profiler_enabled", None)
    module = getattr(getattr(torch, "autograd", None), "profiler", None)
    in_process = _flag_reader(module) if module is not None and hasattr(module, "_is_profiler_enabled") else None
    if enabled is None:
        enabled = in_process
    return ProfilerCaps(version, methods, work, why, times_ns, enabled, _legacy_cpu(torch, autograd), in_process)


def _flag_reader(module: Any) -> Callable[[], bool]:
    """Reads the flag ``torch.autograd.profiler.profile`` sets while it runs (2.2 to 2.13 have it)."""
    return lambda: bool(module._is_profiler_enabled)


def _legacy_cpu(torch: Any, autograd: Any) -> LegacyCpuProfiler | None:
    enable = getattr(autograd, "_enable_profiler_legacy", None)
    disable = getattr(autograd, "_disable_profiler_legacy", None)
    prof = getattr(torch._C, "_profiler", None)
    if enable is None or disable is None or prof is None or not hasattr(prof.ProfilerState, "CPU"):
        return None
    try:
        config = prof.ProfilerConfig(prof.ProfilerState.CPU, False, False, False, False, False,
                                     prof._ExperimentalConfig())
    except Exception:  # a ProfilerConfig of another shape: kineto's CPU trace stands in
        return None
    return LegacyCpuProfiler(enable, disable, config)


def cuda_graphs_warm_up(torch: Any) -> Callable[[], object] | None:
    """``torch.profiler._utils._init_for_cuda_graphs``, or None where torch has none.

    Looked up when called (the simulated CUDA replaces it while installed); gpuprobe calls it once.
    """
    return getattr(getattr(getattr(torch, "profiler", None), "_utils", None), "_init_for_cuda_graphs", None)


def cuda_sleep(torch: Any) -> Callable[[int], object] | None:
    """``torch.cuda._sleep(cycles)``: one kernel that spins for that many clock cycles on the current
    stream (``gpuprobe doctor`` times it), or None where torch has none.

    Looked up when called (the simulated CUDA replaces it while installed). On a CPU build of torch
    the function exists and raises when called (there is no ``torch._C._cuda_sleep``).
    """
    return getattr(getattr(torch, "cuda", None), "_sleep", None)


def profiler_enabled_here(torch: Any) -> bool:
    """Whether a profiler (torch.profiler, the autograd profiler) records on the calling thread
    (``torch._C._autograd._profiler_enabled()``; False where torch has none).

    Looked up when called (the simulated CUDA may replace it while installed); not for a hot path.
    """
    enabled = getattr(_autograd(torch), "_profiler_enabled", None)
    return enabled is not None and bool(enabled())


@dataclasses.dataclass(frozen=True)
class RecordFunctionOps:
    """The profiler's own operators behind ``torch.profiler.record_function``, for a range without its
    context manager.

    Attributes:
        enter: ``torch.ops.profiler._record_function_enter_new(name, args)``: opens a USER_SCOPE range
            (a ``user_annotation`` in a kineto trace) and returns its handle.
        exit: ``torch.ops.profiler._record_function_exit._RecordFunction(handle)``: closes it.
        no_torch_function: ``torch._C.DisableTorchFunctionSubclass``, the context ``record_function``
            exits under (with ``__torch_function__`` handling on, the exit costs ~2x).
    """

    enter: Callable[..., Any]
    exit: Callable[[Any], Any]
    no_torch_function: Callable[[], Any]


def record_function_ops(torch: Any) -> RecordFunctionOps:
    """The operators of :class:`RecordFunctionOps` in ``torch``.

    Raises:
        AttributeError: this torch has not got one of them (the caller's seam turns itself off).
    """
    profiler = torch.ops.profiler
    return RecordFunctionOps(profiler._record_function_enter_new, profiler._record_function_exit._RecordFunction,
                             torch._C.DisableTorchFunctionSubclass)


# -- the CUDA allocator's private API (gpuprobe.memory); each looked up when called: the simulated CUDA
# replaces them while installed.

def memory_history_recorder(torch: Any) -> Callable[..., Any]:
    """``torch.cuda.memory._record_memory_history`` (an AttributeError where torch has none)."""
    return torch.cuda.memory._record_memory_history


def memory_snapshot_dumper(torch: Any) -> Callable[[str], Any]:
    """``torch.cuda.memory._dump_snapshot(path)`` (an AttributeError where torch has none)."""
    return torch.cuda.memory._dump_snapshot


def oom_observer_attacher(torch: Any) -> Callable[[Callable[..., Any]], Any] | None:
    """``torch._C._cuda_attach_out_of_memory_observer``, or None where torch has none."""
    return getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)


# -- Dynamo's compile records (gpuprobe.testing.budget: recompiles and graph breaks of a block) ------------

@dataclasses.dataclass(frozen=True)
class DynamoCaps:
    """What Dynamo keeps of its compilations, read by the budgets of ``gpuprobe.testing.budget``.

    Attributes:
        counters: ``torch._dynamo.utils.counters``: ``counters["graph_break"]`` maps each graph break's
            message to how many times Dynamo met it while compiling.
        guard_failures: ``torch._dynamo.utils.guard_failures``: code object → the guard failures that
            made Dynamo compile it again, oldest first (``"0/1: tensor 'x' size mismatch at index 0.
            expected 3, actual 4"``).
        add_start_callback: ``torch._dynamo.callback_handler.register_start_callback(fn)``: ``fn(args)``
            at the start of each compilation (``args.compile_id``: ``"frame/compile"``, a recompilation
            when the second number is above 0; ``args.callback_trigger``).
        remove_start_callback: its ``remove_start_callback(fn)``.
        dynamo_trigger: ``CallbackTrigger.DYNAMO``, the trigger of a frame compiled by Dynamo.
    """

    counters: Any
    guard_failures: Any
    add_start_callback: Callable[[Callable[[Any], None]], Any]
    remove_start_callback: Callable[[Callable[[Any], None]], Any]
    dynamo_trigger: Any


def dynamo_caps(torch: Any) -> DynamoCaps | None:
    """:class:`DynamoCaps` of ``torch``, or None where this torch has not got one of them.

    The first look at ``torch._dynamo`` imports it (torch loads it lazily, ~1 s): only a budget that
    counts compilations asks.
    """
    try:
        dynamo = torch._dynamo
        utils, callback = dynamo.utils, dynamo.callback
        handler = callback.callback_handler
        return DynamoCaps(counters=utils.counters, guard_failures=utils.guard_failures,
                          add_start_callback=handler.register_start_callback,
                          remove_start_callback=handler.remove_start_callback,
                          dynamo_trigger=callback.CallbackTrigger.DYNAMO)
    except Exception:  # another torch's shape (or no Dynamo on this platform): the budgets say so
        return None
