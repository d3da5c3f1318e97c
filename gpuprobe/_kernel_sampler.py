"""Live kernel categories: :class:`KernelSampler` (``kernel_sampling=N``) profiles one step in every N,
categorizes its kernels in-process (GEMM, attention, softmax, …, see :func:`gpuprobe.report.categorize_kernel`)
and adds them to ``gpuprobe.kernel.time`` and ``gpuprobe.kernel.launches`` by category.

Without CUDA there are no kernels; the sampler then categorizes the leaf CPU operators of the step instead
(the CPU analog, so the whole path runs and can be checked on any machine). How device work is told apart
from the other GPU-side records depends on the installed torch (``_KinetoEvent.activity_type()`` where it
exists, else device type, user-annotation flag and record names); where torch offers neither, sampling is
off and :func:`kernel_sampling_status` (``gpuprobe.info()["kernel_sampling"]``) says why.

The public names are imported from :mod:`gpuprobe.profiling`, beside the profile windows whose steps the
sampler leaves alone.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any

from ._cuda import torch_with_cuda
from ._lifecycle import Owner
from ._torch_caps import ProfilerCaps, cuda_graphs_warm_up, profiler_caps
from .errors import ConfigError, GpuprobeError
from .runtime import Runtime, runtime

__all__ = ["KernelSampler", "categorize_events", "kernel_sampling_status", "warm_up_for_cuda_graphs",
           "profiler_torch"]


def profiler_torch() -> Any:
    """``torch``, imported when it is not yet: profile windows and kernel sampling need it."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 - profiling needs torch; imported only when asked for
        except ImportError as exc:
            raise GpuprobeError("profile windows need PyTorch: pip install 'gpuprobe[transformers]'") from exc
    return torch


# Operators that only make views, allocate or convert dtype metadata: no compute of their own.
_METADATA_OPS = {
    "view", "as_strided", "reshape", "transpose", "t", "slice", "unsqueeze", "squeeze", "narrow", "expand",
    "resolve_conj", "resolve_neg", "_unsafe_view", "empty", "empty_strided", "empty_like", "result_type",
    "to", "_to_copy", "select", "permute", "contiguous", "detach", "alias", "lift_fresh", "split",
    "chunk", "unbind", "flatten", "expand_as", "view_as", "_reshape_alias", "is_nonzero", "item",
    "_local_scalar_dense", "clone",
}
_METADATA_NAMES = frozenset("aten::" + op for op in _METADATA_OPS)


def categorize_events(events: list[tuple[str, int]], *, cpu_ops: bool = False) -> dict[str, tuple[int, int]]:
    """Sum ``(name, duration_ns)`` events by kernel category → ``{category: (total_ns, count)}``.

    Args:
        events: kernels (or, with ``cpu_ops=True``, leaf CPU operators) of one profiled step.
        cpu_ops: categorize ATen operator names (``aten::mm`` → gemm) instead of kernel names.

    Example:
        >>> categorize_events([("ampere_sgemm_128x64_nn", 5000), ("void at::native::vectorized_elementwise_kernel<4>()", 700)])
        {'gemm': (5000, 1), 'elementwise': (700, 1)}
    """
    from ._kernel_names import categorize_cpu_op, categorize_kernel

    # Why sum by name first: a step repeats a few dozen names hundreds of times; one dict update per
    # event, then one category lookup per distinct name.
    by_name: dict[str, list[int]] = {}
    for name, dur in events:
        acc = by_name.get(name)
        if acc is None:
            by_name[name] = [int(dur), 1]
        else:
            acc[0] += int(dur)
            acc[1] += 1
    name_to_cat = categorize_cpu_op if cpu_ops else categorize_kernel
    out: dict[str, tuple[int, int]] = {}
    for name, (total_ns, count) in by_name.items():
        cat = name_to_cat(name)
        total, n = out.get(cat, (0, 0))
        out[cat] = (total + total_ns, n + count)
    return out


class _SamplingUnavailable(GpuprobeError):
    """The installed torch offers no way to sample kernels; the message says which torch and why."""


class KernelSampler:
    """Profile one step in every ``every`` and export kernel time and launches by category.

    With CUDA the sampled step is recorded by ``torch.profiler`` with only the CUDA activity, and only
    kernels, copies and sets count (not GPU-side annotations or synchronization records); without CUDA
    its ATen operators stand in for kernels. How device work is told apart is decided once, at the
    first sampled step, from what the installed torch's kineto events offer; where they offer no way,
    the sampler warns once and samples nothing (:func:`kernel_sampling_status` says why).

    A sample starts at a step start and ends at the next step start *on the same thread* (or when
    that thread's ``generate()`` call ends): profilers are started and stopped by one thread. A step
    whose thread already runs a profiler (a profile window, your own ``torch.profiler``) or that an
    nsys bracket covers is not sampled; it is counted in
    ``gpuprobe.telemetry.dropped{reason="kernel_sampling_busy"}``. Before the first sample on CUDA,
    the profiler is warmed up for CUDA graphs (``torch.profiler._utils._init_for_cuda_graphs``, where
    torch has it), as PyTorch documents for graphs captured before profiling.

    Args:
        every: sampling period in steps (``kernel_sampling=N``); the first sampled step is ``every``.

    Example:
        >>> sampler = KernelSampler(100).attach()  # doctest: +SKIP
    """

    def __init__(self, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"kernel_sampling must be an integer >= 1, got {every!r}")
        self.every = every
        self.samples = 0
        self._recorder: _Recorder | None = None
        self._unavailable: str | None = None  # why this torch cannot be sampled, once known
        self._owner: int | None = None  # the thread recording a sample, if one is
        self._rt: Runtime | None = None
        self._worker: threading.Thread | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "user") -> KernelSampler:
        """Start sampling on ``rt``'s step clock."""
        self._rt = rt or runtime()
        torch = torch_with_cuda()
        if torch is not None:
            # CUDA graphs must be captured after the profiler's warm-up for their replays to be
            # profiled: warm up before the first capture (or now, if CUDA is already up).
            self._rt.capture.add_before_capture(warm_up_for_cuda_graphs)
            if torch.cuda.is_initialized():
                warm_up_for_cuda_graphs()
        # First in line, so that a sample is finished before a profile window's hook starts one.
        self._rt.add_step_hook(self.on_step, first=True)
        self._rt.add_steps_done_hook(self.on_steps_done)
        self._rt.add_closeable(self, owner=owner)
        return self

    def detach(self) -> None:
        """Stop sampling (a step being profiled on this thread is finished and exported first)."""
        if self._owner == threading.get_ident():
            self._finish()
        self.wait()
        if self._worker is not None:
            self._queue.put(None)  # the worker ends once the queue is read
            self._worker = None
        if self._rt is not None:
            self._rt.capture.remove_before_capture(warm_up_for_cuda_graphs)
            self._rt.remove_step_hook(self.on_step)
            self._rt.remove_steps_done_hook(self.on_steps_done)
            self._rt.remove(self)

    close = detach

    def on_steps_done(self) -> None:
        """The calling thread's generation ended: end its sample, if it records one."""
        if self._owner == threading.get_ident():
            self._finish()

    def on_step(self, index: int) -> None:
        """Step hook: end this thread's sample; start one every ``every`` steps."""
        me = threading.get_ident()
        if self._owner is not None:
            if self._owner != me:
                return  # another thread's sample runs: only it may stop it
            self._finish()
        if index > 0 and index % self.every == 0 and self._unavailable is None:
            rt = self._rt or runtime()
            if self._recorder is None:
                try:
                    self._recorder = _recorder()  # decided once: the CUDA check and API lookups are not free
                except _SamplingUnavailable as exc:
                    self._unavailable = str(exc)
                    rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling is {exc}; sampling is off")
                    return
            if self._recorder.busy() or _window_owns(rt, index):
                rt.drop("kernel_sampling_busy")  # another profiler owns this step: never disturb it
                return
            try:
                self._recorder.start()
            except Exception as exc:
                rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling failed to start: {exc!r}")
                return
            self._owner = me
            # The transformers integration records its step and component ranges into any profiler
            # session that runs; this one's events are read for kernels only, so it is told apart.
            rt.steps.mark_sampled(index)

    def _finish(self) -> None:
        self._owner = None
        rt = self._rt or runtime()
        assert self._recorder is not None
        try:
            raw = self._recorder.stop()
        except Exception as exc:
            rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling failed: {exc!r}")
            return
        if not self._idle.is_set():
            rt.drop("kernel_sampling_busy")  # the previous sample is still being read: skip this one
            return
        if self._worker is None or not self._worker.is_alive():
            # Why one long-lived thread: starting a thread per sample made the generation thread wait
            # for the GIL while the new thread ran (~5 ms, the interpreter's switch interval).
            self._worker = threading.Thread(target=self._work, args=(self._queue,), name="gpuprobe-kernels",
                                            daemon=True)
            self._worker.start()
        self._idle.clear()
        self._queue.put((self._recorder, raw, rt))

    def _work(self, q: queue.SimpleQueue[Any]) -> None:
        # Reading and categorizing a step's events costs milliseconds of Python. Off the generation
        # thread it overlaps the time that thread spends without the GIL (operators, waiting on the
        # GPU). On a CPU-bound step the two compete for the GIL and it costs about as much as inline.
        while True:
            item = q.get()
            if item is None:
                return
            recorder, raw, rt = item
            try:
                events = recorder.events(raw)
                del raw
                time_fam = rt.family("gpuprobe.kernel.time")
                launch_fam = rt.family("gpuprobe.kernel.launches")
                for category, (total_ns, count) in categorize_events(events, cpu_ops=recorder.cpu_ops).items():
                    rt.emit(time_fam.child(category=category), total_ns / 1e9)
                    rt.emit(launch_fam.child(category=category), count)
                self.samples += 1
            except _SamplingUnavailable as exc:
                self._unavailable = str(exc)  # the next sampled step starts no profiler
                rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling is {exc}; sampling is off")
            except Exception as exc:
                rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling failed: {exc!r}")
            finally:
                self._idle.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the last sample has been read and exported; False if ``timeout`` ran out."""
        return self._idle.wait(timeout)

    def status(self) -> str:
        """What this sampler records, in words (the first sampled step decides), or why it records nothing."""
        if self._unavailable is not None:
            return self._unavailable
        if self._recorder is not None:
            return f"every {self.every} steps: {self._recorder.describe()}"
        if "torch" not in sys.modules:
            return f"every {self.every} steps (torch is not imported yet)"
        try:
            return f"every {self.every} steps: {_recorder().describe()}"
        except _SamplingUnavailable as exc:
            return str(exc)


def kernel_sampling_status(rt: Runtime | None = None) -> str:
    """``gpuprobe.info()["kernel_sampling"]``: ``"off"``, what the attached sampler records, or why it cannot.

    Example:
        >>> kernel_sampling_status()
        'off'
    """
    rt = rt or runtime()
    for hook in rt.steps.hooks:
        sampler = getattr(hook, "__self__", None)
        if isinstance(sampler, KernelSampler):
            return sampler.status()
    return "off"


def _window_owns(rt: Runtime, index: int) -> bool:
    """True when a profile window (torch.profiler or an nsys bracket) records step ``index``.

    A profile window (:class:`gpuprobe.profiling.ProfileWindow`) is the step hook's owner with an ``owns``
    method; it is recognized by that method so that this module does not import the one that imports it.
    """
    for hook in rt.steps.hooks:
        owns = getattr(getattr(hook, "__self__", None), "owns", None)
        if owns is not None and owns(index):
            return True
    return False


class _Recorder:
    """Records one step on the calling thread; :meth:`events` turns the result into ``(name, ns)``."""

    cpu_ops = False

    def __init__(self, torch: Any, caps: ProfilerCaps | None = None) -> None:
        self._torch = torch
        self._caps = caps = caps or profiler_caps(torch)
        if caps.profiler_enabled is None:
            raise _SamplingUnavailable(f"not available on torch {caps.torch_version} (it cannot tell whether "
                                       "another profiler runs: no torch._C._autograd._profiler_enabled)")
        self._enabled = caps.profiler_enabled

    def busy(self) -> bool:
        """True when a profiler is already running on this thread."""
        return bool(self._enabled())

    def describe(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> Any:
        raise NotImplementedError

    def events(self, raw: Any) -> list[tuple[str, int]]:
        raise NotImplementedError


class _KinetoRecorder(_Recorder):
    """The step through ``torch.profiler``: with ``cuda``, its kernels, memcpy and memset (CUDA
    activity only); without, its ATen operators with their self time (CPU activity)."""

    def __init__(self, torch: Any, cuda: bool, caps: ProfilerCaps | None = None) -> None:
        super().__init__(torch, caps)
        self.cuda = cuda
        self.cpu_ops = not cuda
        act = torch.profiler.ProfilerActivity
        self._activities = [act.CUDA] if cuda else [act.CPU]
        caps = self._caps
        try:
            if cuda:
                self._read_device_work = caps.device_work_reader(torch.autograd.DeviceType.CUDA)
            else:
                self._read_cpu = caps.cpu_event_reader()
        except RuntimeError:
            why = caps.device_work_why if cuda else "its kineto events give no start_ns() or duration_ns()"
            raise _SamplingUnavailable(f"not available on torch {caps.torch_version} ({why})") from None

    def describe(self) -> str:
        if self.cuda:
            return f"kernels, memcpy and memset ({self._caps.device_work_why})"
        return "CPU operators with their self time, through kineto (no CUDA device)"

    def start(self) -> None:
        if self.cuda:
            warm_up_for_cuda_graphs()
        self._prof = self._torch.profiler.profile(activities=self._activities)
        self._prof.__enter__()

    def stop(self) -> Any:
        prof, self._prof = self._prof, None
        # With CUDA, torch.profiler synchronizes the device here: the step's last kernels are in.
        prof.__exit__(None, None, None)
        return prof

    def events(self, raw: Any) -> list[tuple[str, int]]:
        # Why raw kineto events: prof.events() builds the whole event tree in Python (~65 ms for
        # one tiny-model step); the raw results take ~2 ms.
        results = getattr(getattr(raw, "profiler", None), "kineto_results", None)
        if results is None:
            raise _SamplingUnavailable(f"not available on torch {self._caps.torch_version} (its torch.profiler.profile "
                                       "keeps no profiler.kineto_results)")
        events = results.events()
        if self.cuda:
            # Device type CUDA alone also admits GPU-side annotations and synchronization records: the
            # reader, picked once for this torch, keeps kernels, memcpy and memset.
            return self._read_device_work(events)
        return _cpu_self_times(self._read_cpu(events))


class _CpuLegacyRecorder(_Recorder):
    """ATen operators of the step with their self time, through the autograd profiler's CPU state.

    Why not kineto on CPU: for a step of ~1,800 operators the kineto CPU trace costs ~12 ms on the
    generation thread (start 0.6, recording 2.9, stop 8.3); this state records the same operators for
    ~6 ms (0.1, 2.4, 3.3). A whole sample costs a third less (benchmarks/RESULTS-kernel-sampling.md),
    and, unlike a kineto session, it keeps no memory afterwards. Chosen only when torch still has it.
    """

    cpu_ops = True

    def __init__(self, torch: Any, caps: ProfilerCaps | None = None) -> None:
        super().__init__(torch, caps)
        legacy = self._caps.legacy_cpu
        if legacy is None:
            raise _SamplingUnavailable(f"not available on torch {self._caps.torch_version} (no legacy CPU profiler)")
        self._config = legacy.config
        self._enable = legacy.enable
        self._disable = legacy.disable

    def describe(self) -> str:
        return "CPU operators with their self time, through the autograd profiler's CPU state (no CUDA device)"

    def start(self) -> None:
        self._enable(self._config)

    def stop(self) -> Any:
        return self._disable()

    def events(self, raw: Any) -> list[tuple[str, int]]:
        return _legacy_self_times(raw)


_warmed_up = False
_warm_up_lock = threading.Lock()


def warm_up_for_cuda_graphs() -> None:
    """Initialize the profiler for CUDA graphs once per process (``torch.profiler._utils._init_for_cuda_graphs``).

    Graphs captured before the profiler's first use do not show their kernels when replayed inside a
    profile (PyTorch issues #75504, #100441); graphs captured after this warm-up do. Run before the
    first capture once kernel sampling is on, and before the first sample; never before the program has
    initialized CUDA.
    """
    global _warmed_up
    if _warmed_up:
        return
    with _warm_up_lock:
        if _warmed_up:
            return
        _warmed_up = True
        warm_up = cuda_graphs_warm_up(profiler_torch())
        if warm_up is not None:  # a torch without it: nothing to warm up with
            warm_up()


def _recorder() -> _Recorder:
    """The recorder for this process: CUDA kernels where there is a device, else CPU operators.

    Making one starts nothing: :meth:`KernelSampler.status` makes one to say what sampling would record.

    Raises:
        _SamplingUnavailable: the installed torch offers no way to sample (the message says why).
    """
    torch = profiler_torch()
    caps = profiler_caps(torch)
    if torch_with_cuda() is not None:
        return _KinetoRecorder(torch, cuda=True, caps=caps)
    if caps.legacy_cpu is not None:
        return _CpuLegacyRecorder(torch, caps)
    return _KinetoRecorder(torch, cuda=False, caps=caps)


def _legacy_self_times(threads: list[list[Any]]) -> list[tuple[str, int]]:
    """Self time of each ATen operator from the autograd profiler's push/pop events, per thread.

    Args:
        threads: ``_disable_profiler_legacy()``'s result: one list of events per thread, in order.
            On one thread, operator scopes nest, so each pop closes the latest open push.
    """
    # Why parallel lists and no handle matching: this loop runs over every push and pop of the
    # sampled step (~3,500 for a tiny model) and each accessor is a call into C++; three plain stacks
    # and two accessors per event keep it near 3 ms.
    out: list[tuple[str, float]] = []
    skip = _METADATA_NAMES
    for evs in threads:
        names: list[str] = []
        starts: list[float] = []
        children: list[float] = []
        for e in evs:
            kind = e.kind()
            if kind == "push":
                names.append(e.name())
                starts.append(e.start_us())
                children.append(0.0)
            elif kind == "pop" and names:
                dur = e.start_us() - starts.pop()
                name = names.pop()
                own = dur - children.pop()
                if children:
                    children[-1] += dur
                if name.startswith("aten::") and name not in skip:
                    out.append((name, own))
    return [(n, max(0, round(1000 * t))) for n, t in out]


def _cpu_self_times(events: list[tuple[str, int, int, int]]) -> list[tuple[str, int]]:
    """CPU analog of kernels: computing ATen operators with their self time (children subtracted).

    Args:
        events: ``(name, start_ns, duration_ns, thread)`` of every recorded CPU event.
    """
    by_thread: dict[int, list[tuple[int, int, str]]] = {}
    for name, start, dur, tid in events:
        by_thread.setdefault(tid, []).append((start, -dur, name))
    out: list[tuple[str, int]] = []
    for evs in by_thread.values():
        evs.sort()  # by start; the longer (enclosing) event first on ties
        stack: list[list[Any]] = []  # [end, name, self_ns]
        for start, neg_dur, name in evs:
            dur = -neg_dur
            while stack and stack[-1][0] <= start:
                end, nm, self_ns = stack.pop()
                out.append((nm, self_ns))
            if stack:
                stack[-1][2] -= dur
            stack.append([start + dur, name, dur])
        while stack:
            _, nm, self_ns = stack.pop()
            out.append((nm, self_ns))
    return [(n, max(0, t)) for n, t in out if n.startswith("aten::") and n not in _METADATA_NAMES]
