"""``torch.profiler.profile`` with CUDA activity: GPU kernels, memcpy and memset, GPU user annotations,
sync records and CUDA runtime calls, one session per process, the synchronization on exit; the events
handed out are shaped as the installed torch's ``_KinetoEvent``."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

from ._torch_compat import (
    PROFILER_CHECKED_ON,
    activity_filters,
    activity_filters_keyword,
    drop_processed_events,
    import_torch,
    kineto_event_class,
    prepare_cpu_trace,
    sync_events_reader,
)
from .records import CUDA_RUNTIME, CUDA_SYNC, GPU_MEMCPY, GPU_MEMSET, GPU_USER_ANNOTATION, KERNEL

__all__ = ["ProfilerMixin"]

# ProfilerActivity filter names (torch/profiler/profiler.py _parse_activities) per activity type.
_FILTER_NAMES = {
    KERNEL: "CONCURRENT_KERNEL",
    GPU_MEMCPY: "GPU_MEMCPY",
    GPU_MEMSET: "GPU_MEMSET",
    GPU_USER_ANNOTATION: "GPU_USER_ANNOTATION",
    CUDA_SYNC: "CUDA_SYNC",
    CUDA_RUNTIME: "CUDA_RUNTIME",
}


@dataclasses.dataclass
class _Annotation:
    """An open ``record_function`` range of a thread (for GPU user annotations)."""

    name: str
    ident: int


@dataclasses.dataclass
class _GpuRecord:
    """One record of a CUDA profiling session, times in the device clock (host records: wall clock)."""

    name: str
    activity: str
    device: int
    stream: int  # kineto's stream number; -1 for a context synchronization
    start_ns: int
    end_ns: int
    thread: int  # the simulation's sequential id of the launching thread
    correlation: int
    nbytes: int = 0
    annotation: _Annotation | None = None
    on_host: bool = False


class _Session:
    """The process's CUDA profiling session (kineto allows one)."""

    def __init__(self, owner: Any, cpu: bool, sync_events: bool, allowed: frozenset[str] | None) -> None:
        self.owner = owner
        self.cpu = cpu
        self.sync_events = sync_events
        self.allowed = allowed
        self.recording = False
        self.start_thread = 0
        self.anchor_wall_ns = 0
        self.anchor_dev_ns: list[int] = []
        self.records: list[_GpuRecord] = []

    def wants(self, activity: str) -> bool:
        if activity == CUDA_SYNC and not self.sync_events:
            return False
        if activity == GPU_USER_ANNOTATION and not self.cpu:
            return False
        return self.allowed is None or _FILTER_NAMES[activity] in self.allowed


class _SimKinetoEvent:
    """A GPU-side (or CUDA runtime) record of a simulated profiling session: the data only.

    The events a session hands out are of a subclass made by :func:`_kineto_event_class` for the
    installed torch, with exactly the public methods of its ``torch._C._autograd._KinetoEvent``
    (torch 2.11's has no ``activity_type()``, 2.13's has), taken from :class:`_SimKinetoEventMethods`.
    """

    __slots__ = ("_name", "_activity", "_device_type", "_device", "_resource", "_start", "_end", "_tid",
                 "_corr", "_nbytes")

    def __init__(self, name: str, activity: str, device_type: Any, device: int, resource: int, start: int, end: int,
                 tid: int, corr: int, nbytes: int) -> None:
        self._name = name
        self._activity = activity
        self._device_type = device_type
        self._device = device
        self._resource = resource
        self._start = start
        self._end = end
        self._tid = tid
        self._corr = corr
        self._nbytes = nbytes

    def __repr__(self) -> str:
        return f"<simulated _KinetoEvent {self._activity} {self._name!r} {self._end - self._start} ns>"


class _SimKinetoEventMethods:
    """``_KinetoEvent``'s methods over :class:`_SimKinetoEvent`'s data, for every torch release the
    simulation follows (2.11 to 2.13); never instantiated: :func:`_kineto_event_class` copies those the
    installed torch's class has."""

    _name: str
    _activity: str
    _device_type: Any
    _device: int
    _resource: int
    _start: int
    _end: int
    _tid: int
    _corr: int
    _nbytes: int

    def name(self) -> str:
        return self._name

    def overload_name(self) -> str:
        return ""

    def device_type(self) -> Any:
        """``DeviceType.CUDA`` for every GPU-side record: kernels, memcpy, memset, GPU user
        annotations and sync records; ``DeviceType.CPU`` for CUDA runtime calls."""
        return self._device_type

    def activity_type(self) -> str:
        return self._activity

    def device_index(self) -> int:
        return self._device

    def device_resource_id(self) -> int:
        return self._resource

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def duration_ns(self) -> int:
        return self._end - self._start

    def start_thread_id(self) -> int:
        return self._tid

    def end_thread_id(self) -> int:
        return self._tid

    def fwd_thread_id(self) -> int:
        return 0

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return 0

    def external_id(self) -> int:
        return 0

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return self._activity == GPU_USER_ANNOTATION

    def is_python_function(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False

    def shapes(self) -> list[Any]:
        return []

    def dtypes(self) -> list[str]:
        return []

    def concrete_inputs(self) -> list[Any]:
        return []

    def kwinputs(self) -> dict[str, Any]:
        return {}

    def stack(self) -> list[str]:
        return []

    def scope(self) -> int:
        return 0

    def sequence_nr(self) -> int:
        return -1

    def flops(self) -> int:
        return 0

    def nbytes(self) -> int:
        return self._nbytes

    def cuda_elapsed_us(self) -> int:
        return -1

    def privateuse1_elapsed_us(self) -> int:
        return -1

    def metadata_json(self) -> str:
        return ""

    def typed_metadata(self) -> dict[str, Any]:  # torch 2.15: the metadata as a dict (none here)
        return {}

    def extra_meta(self) -> dict[str, str]:
        return {}

    def flow_id(self) -> int:
        return 0

    def flow_type(self) -> int:
        return 0

    def flow_start(self) -> bool:
        return False

    def structured_input_shapes(self) -> list[Any]:
        return []

    def structured_input_strides(self) -> list[Any]:
        return []

    def python_id(self) -> int:
        return 0

    def python_parent_id(self) -> int:
        return 0

    def python_module_id(self) -> int:
        return 0


# The simulated event class made for each torch _KinetoEvent class (a stand-in of another release's
# shape included), so that events of one session share one class.
_EVENT_CLASSES: weakref.WeakKeyDictionary[type, type[_SimKinetoEvent]] = weakref.WeakKeyDictionary()


def _kineto_event_class(torch: Any) -> type[_SimKinetoEvent]:
    """A :class:`_SimKinetoEvent` class with exactly the public methods of ``torch._C._autograd._KinetoEvent``.

    Code that asks what the events offer (``hasattr(event, "activity_type")``) gets the answer the
    installed torch would give. A method the simulation does not know (a torch newer than it) raises
    ``NotImplementedError`` naming it when called.

    Raises:
        RuntimeError: torch has no ``_KinetoEvent`` (the simulated profiler cannot imitate its events).
    """
    real = kineto_event_class(torch)
    if real is None:
        raise RuntimeError(f"simulated CUDA: torch {torch.__version__} has no torch._C._autograd._KinetoEvent; "
                           f"the simulated profiler imitates the kineto events of torch {PROFILER_CHECKED_ON}")
    cls = _EVENT_CLASSES.get(real)
    if cls is None:
        known = {n: f for n, f in vars(_SimKinetoEventMethods).items() if not n.startswith("_") and callable(f)}
        ns: dict[str, Any] = {"__slots__": (), "__module__": __package__, "__qualname__": real.__name__,
                              "__doc__": f"A simulated record shaped as torch {torch.__version__}'s {real.__name__}."}
        for name in dir(real):
            if not name.startswith("_"):
                ns[name] = known.get(name) or _not_simulated(name, str(torch.__version__))
        cls = _EVENT_CLASSES[real] = type(real.__name__, (_SimKinetoEvent,), ns)  # named as torch's class
    return cls


def _not_simulated(method: str, version: str) -> Callable[..., NoReturn]:
    def missing(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"simulated CUDA: _KinetoEvent.{method}() of torch {version} is not simulated "
                                  f"(the simulated profiler imitates torch {PROFILER_CHECKED_ON})")
    missing.__name__ = method
    return missing


class _SimProfilerResult:
    """``prof.profiler.kineto_results``: the CPU session's results (if any) plus the GPU records."""

    def __init__(self, real: Any, gpu: list[_SimKinetoEvent], trace_start_ns: int, sim: Any) -> None:
        self._real = real
        self._gpu = gpu
        self._trace_start_ns = trace_start_ns
        self._sim = sim

    def events(self) -> list[Any]:
        cpu = list(self._real.events()) if self._real is not None else []
        return cpu + list(self._gpu)

    def trace_start_ns(self) -> int:
        return self._real.trace_start_ns() if self._real is not None else self._trace_start_ns

    def legacy_events(self) -> list[Any]:
        return self._real.legacy_events() if self._real is not None else []

    def experimental_event_tree(self) -> list[Any]:
        return self._real.experimental_event_tree() if self._real is not None else []

    def save(self, path: str) -> None:
        """Write a kineto-style chrome trace: the CPU trace (if any) with the GPU records added."""
        if self._real is not None:
            self._real.save(path)
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        else:
            data = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms",
                    "baseTimeNanoseconds": (self._trace_start_ns // 10**9) * 10**9, "traceEvents": []}
        base = int(data.get("baseTimeNanoseconds", 0))
        data["deviceProperties"] = self._sim._kineto_device_properties()
        events = data.setdefault("traceEvents", [])
        pid = os.getpid()
        seen: set[tuple[int, int]] = set()
        for ev in self._gpu:
            ts = round((ev._start - base) / 1000.0, 3)
            dur = round((ev._end - ev._start) / 1000.0, 3)
            if ev._device_type == import_torch().autograd.DeviceType.CPU:
                events.append({"ph": "X", "cat": ev._activity, "name": ev._name, "pid": pid, "tid": ev._resource,
                               "ts": ts, "dur": dur, "args": {"correlation": ev._corr}})
                continue
            args: dict[str, Any] = {"device": ev._device, "context": 1, "stream": ev._resource,
                                    "correlation": ev._corr}
            if ev._activity == KERNEL:
                args.update({"External id": 0, "queued": 0, "registers per thread": 0, "shared memory": 0,
                             "blocks per SM": 0.0, "warps per SM": 0.0, "grid": [1, 1, 1], "block": [1, 1, 1],
                             "est. achieved occupancy %": 0})
            elif ev._activity in (GPU_MEMCPY, GPU_MEMSET):
                secs = max(ev._end - ev._start, 1) / 1e9
                args.update({"bytes": ev._nbytes, "memory bandwidth (GB/s)": ev._nbytes / secs / 1e9})
            elif ev._activity == GPU_USER_ANNOTATION:
                args = {"External id": ev._corr}
            events.append({"ph": "X", "cat": ev._activity, "name": ev._name, "pid": ev._device,
                           "tid": ev._resource, "ts": ts, "dur": dur, "args": args})
            seen.add((ev._device, ev._resource))
        for device in sorted({d for d, _ in seen}):
            events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"name": "python"}})
            events.append({"name": "process_labels", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"labels": f"GPU {device}"}})
            events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"sort_index": 5000000 + device}})
        for device, stream in sorted(seen):
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": device, "tid": stream,
                           "args": {"name": f"stream {stream} "}})
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            raise AttributeError(f"simulated kineto results have no attribute {name!r}")
        return getattr(real, name)


def _wants_cuda(torch: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``torch.profiler.profile(**kwargs)`` would trace CUDA (profiler.py ``profile.__init__``)."""
    act = torch.profiler.ProfilerActivity
    activities = kwargs.get("activities")
    if activities is None:
        wanted = {act.CPU, act.CUDA}  # supported_activities() on a machine with CUDA
    else:
        wanted = set()
        for item in activities:
            if isinstance(item, dict):
                wanted.update(item.keys())
            else:
                wanted.add(item)
    use_cuda = kwargs.get("use_cuda")
    if use_cuda is True:
        wanted.add(act.CUDA)
    elif use_cuda is False:
        wanted.discard(act.CUDA)
    return act.CUDA in wanted


def _make_profiler_classes(sim: Any, real_profile: type, real_record_function: type) -> tuple[type, type]:
    """``torch.profiler.profile`` and ``record_function`` for this simulation (subclasses of torch's).

    What differs between torch releases is decided here, once per install, through
    :mod:`._torch_compat`: the kineto event class (:func:`_kineto_event_class`), how a config asks for
    CUDA sync events, and whether profiles take ``activity_filters`` (torch 2.13, not 2.11).

    Raises:
        RuntimeError: torch's profiler lacks what the simulation drives (the message names it and the
            releases the simulated profiler was checked on).
    """
    torch = import_torch()
    autograd_profiler = torch.autograd.profiler
    act = torch.profiler.ProfilerActivity
    missing = [m for m in ("prepare_trace", "start_trace", "stop_trace")
               if not callable(getattr(real_profile, m, None))]
    if missing:
        raise RuntimeError(f"simulated CUDA: torch {torch.__version__}'s torch.profiler.profile has no "
                           f"{', '.join(missing)}; the simulated profiler imitates torch {PROFILER_CHECKED_ON}")
    _kineto_event_class(torch)  # refuses, now, a torch without _KinetoEvent
    sync_events = sync_events_reader(torch)
    cpu_filters = activity_filters_keyword(torch)

    class record_function(real_record_function):  # type: ignore[misc, valid-type]
        """torch.autograd.profiler.record_function, also telling the simulation which range is open
        (kineto turns the innermost one around GPU work into a ``gpu_user_annotation``)."""

        _sim_annotation = None  # the range as the simulation knows it, while open

        def __enter__(self) -> Any:
            out = super().__enter__()
            self._sim_annotation = sim._annotation_enter(str(getattr(self, "name", "")))
            return out

        def __exit__(self, *exc: Any) -> Any:
            sim._annotation_exit(self._sim_annotation)
            return super().__exit__(*exc)

    class profile(real_profile):  # type: ignore[misc, valid-type]
        """torch.profiler.profile; with CUDA among the activities, a simulated CUDA session.

        The schedule, ``step()``, ``on_trace_ready`` and CPU tracing are torch's own; the CUDA part
        (GPU records, the synchronization on exit, one session per process) is simulated.
        """

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if args or not _wants_cuda(torch, kwargs):
                return real_profile(*args, **kwargs)
            return object.__new__(cls)

        def __init__(self, *, activities: Any = None, **kwargs: Any) -> None:
            if activities is None:
                activities = [act.CPU, act.CUDA]
            super().__init__(activities=activities, **kwargs)
            if kwargs.get("use_cuda") is True:
                self.activities.add(act.CUDA)
            self._sim_cpu = bool(self.activities - {act.CUDA})
            self._sim_sync_events = sync_events is not None and sync_events(self.experimental_config)
            self._sim_filters = activity_filters(self)
            flt = self._sim_filters.get(act.CUDA)
            self._sim_allowed = None if flt is None else frozenset(flt)

        def prepare_trace(self) -> None:
            sim._profiler_prepare(self, self._sim_cpu, self._sim_sync_events, self._sim_allowed)
            try:
                extra = cpu_filters({k: v for k, v in self._sim_filters.items() if k != act.CUDA} or None)
                self.profiler = autograd_profiler.profile(
                    use_cpu=True, use_device=None, record_shapes=self.record_shapes, with_flops=self.with_flops,
                    profile_memory=self.profile_memory, with_stack=self.with_stack, with_modules=self.with_modules,
                    use_kineto=True, experimental_config=self.experimental_config, acc_events=self.acc_events,
                    custom_trace_id_callback=self.custom_trace_id_callback,
                    post_processing_timeout_s=self.post_processing_timeout_s, **extra)
                if self._sim_cpu:
                    prepare_cpu_trace(self.profiler)
            except BaseException:
                sim._profiler_release(self)
                raise

        def start_trace(self) -> None:
            if self._sim_cpu:
                super().start_trace()
            elif self.execution_trace_observer:
                self.execution_trace_observer.start()
            sim._profiler_start(self)

        def stop_trace(self) -> None:
            if self.execution_trace_observer:
                self.execution_trace_observer.stop()
            # torch/autograd/profiler.py profile.__exit__: use_device "cuda" -> torch.cuda.synchronize()
            # before the session is disabled.
            torch.cuda.synchronize()
            real = None
            if self._sim_cpu:
                self.profiler.__exit__(None, None, None)
                real = self.profiler.kineto_results
            gpu, trace_start = sim._profiler_stop(self)
            if not self._sim_cpu:
                drop_processed_events(self.profiler)
            # Set only now: an autograd profile created with use_device="cuda" would take torch's
            # legacy CUDA path on a CPU build. With it, key_averages() reports device time.
            self.profiler.use_device = "cuda"
            self.profiler.kineto_results = _SimProfilerResult(real, gpu, trace_start, sim)

    return profile, record_function


class ProfilerMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind the profiler: the process's
    CUDA profiling session, the open ``record_function`` ranges, and the records turned into events."""

    def _profiler_prepare(self, owner: Any, cpu: bool, sync_events: bool, allowed: frozenset[str] | None) -> None:
        """Claim the process's CUDA profiling session (kineto: one GenericActivityProfiler).

        torch does not refuse a second session: kineto logs "GenericActivityProfiler already busy,
        terminating" and the sessions' results are lost (two overlapping sessions stopping can crash
        torch 2.13 with a segmentation fault). The simulation refuses it so the overlap cannot pass
        unnoticed.
        """
        with self._lock:
            if self._session is not None and self._session.owner is not owner:
                raise RuntimeError(
                    "simulated CUDA: a CUDA profiling session is already active in this process; kineto "
                    "supports one (it logs 'GenericActivityProfiler already busy, terminating' and the "
                    "results of both are lost)")
            self._session = _Session(owner, cpu, sync_events, allowed)

    def _profiler_release(self, owner: Any) -> None:
        with self._lock:
            if self._session is not None and self._session.owner is owner:
                self._session = None

    def _profiler_start(self, owner: Any) -> None:
        with self._lock:
            session = self._session
            if session is None or session.owner is not owner:
                raise RuntimeError("simulated CUDA: profiler session was not prepared")
            session.recording = True
            session.start_thread = threading.get_ident()
            session.anchor_wall_ns = time.time_ns()
            session.anchor_dev_ns = [d.now_ns for d in self._devices]
            self.stats.profiler_sessions += 1
            self._cupti_initialized = True

    def _profiler_stop(self, owner: Any) -> tuple[list[_SimKinetoEvent], int]:
        torch = import_torch()
        cuda_type, cpu_type = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
        event_cls = _kineto_event_class(torch)  # shaped as this torch's _KinetoEvent
        with self._lock:
            session = self._session
            if session is None or session.owner is not owner:
                return [], time.time_ns()
            self._session = None
            session.recording = False
            if session.start_thread != threading.get_ident():
                # disableProfiler on a thread without the session: torch warns "disableProfiler called
                # but no active profiling session found" and returns empty results (torch 2.13).
                self.stats.profiler_cross_thread_stops += 1
                return [], session.anchor_wall_ns
            stopper = self._thread_seq()
            records = list(session.records)
            if session.wants(GPU_USER_ANNOTATION):
                spans: dict[tuple[int, int, int], list[Any]] = {}
                for r in records:
                    if r.annotation is not None and not r.on_host and r.activity != CUDA_SYNC:
                        key = (r.annotation.ident, r.device, r.stream)
                        span = spans.get(key)
                        if span is None:
                            spans[key] = [r.annotation.name, r.start_ns, r.end_ns, r.thread]
                        else:
                            span[1], span[2] = min(span[1], r.start_ns), max(span[2], r.end_ns)
                for (ident, device, stream), (name, start, end, tid) in spans.items():
                    records.append(_GpuRecord(name, GPU_USER_ANNOTATION, device, stream, start, end, tid, ident))
            events = []
            for r in records:
                if r.on_host:
                    events.append(event_cls(r.name, r.activity, cpu_type, os.getpid(), r.stream, r.start_ns,
                                            r.end_ns, r.thread, r.correlation, 0))
                    continue
                offset = session.anchor_wall_ns - session.anchor_dev_ns[r.device]
                tid = r.thread if session.cpu else stopper
                events.append(event_cls(r.name, r.activity, cuda_type, r.device, r.stream, r.start_ns + offset,
                                        r.end_ns + offset, tid, r.correlation, r.nbytes))
            events.sort(key=lambda e: e._start)
            return events, session.anchor_wall_ns

    def _annotation_enter(self, name: str) -> _Annotation:
        """A ``record_function`` range opens on the calling thread; the range as the simulation knows it."""
        ann = _Annotation(name, next(self._correlations))
        self._tls.annotations.append(ann)
        return ann

    def _annotation_exit(self, ann: _Annotation | None) -> None:
        """The range closes (None: it was never opened here)."""
        stack = self._tls.annotations
        if ann is not None and ann in stack:
            del stack[len(stack) - 1 - stack[::-1].index(ann)]

    def _kineto_device_properties(self) -> list[dict[str, Any]]:
        return [{"id": i, "name": p.name, "totalGlobalMem": p.total_memory, "computeMajor": p.major,
                 "computeMinor": p.minor, "maxThreadsPerBlock": p.max_threads_per_block,
                 "maxThreadsPerMultiprocessor": p.max_threads_per_multi_processor,
                 "regsPerBlock": p.regs_per_multiprocessor, "warpSize": p.warp_size,
                 "sharedMemPerBlock": p.shared_memory_per_block, "numSms": p.multi_processor_count,
                 "regsPerMultiprocessor": p.regs_per_multiprocessor,
                 "sharedMemPerMultiprocessor": p.shared_memory_per_multiprocessor}
                for i, p in enumerate(self._properties)]
