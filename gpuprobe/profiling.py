"""Profile windows and live kernel categories, driven by the step counter.

Steps are counted by the transformers integration (one per generation step) or by your own
``gpuprobe.step()`` calls; each call marks the *start* of a step.

- :func:`profile` — capture steps A–B with ``torch.profiler`` (a kineto trace written atomically to
  a file, ``.json`` or ``.json.gz``) and/or bracket them with ``cudaProfilerStart/Stop`` for
  ``nsys profile --capture-range=cudaProfilerApi``. ``GPUPROBE_PROFILE_STEPS=100-150`` does the same
  from the environment.
- :class:`KernelSampler` (``kernel_sampling=N``) — profiles one step in every N, categorizes its kernels
  in-process (GEMM, attention, softmax, …, see :func:`gpuprobe.report.categorize_kernel`) and adds
  them to ``gpuprobe.kernel.time`` and ``gpuprobe.kernel.launches`` by category. Without CUDA there are
  no kernels; the sampler then categorizes the leaf CPU operators of the step instead (the CPU analog,
  so the whole path runs and can be checked on any machine).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from . import memory
from .collector import Runtime, runtime
from .errors import ConfigError, GpuprobeError

__all__ = ["profile", "ProfileWindow", "KernelSampler", "parse_steps", "categorize_events"]

_STEPS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_steps(text: str, setting: str = "steps") -> tuple[int, int]:
    """``"100-150"`` → ``(100, 150)``; ``"7"`` → ``(7, 7)``. Bounds are inclusive.

    Raises:
        ConfigError: not ``A`` or ``A-B`` with ``A <= B``; the message names ``setting``.

    Example:
        >>> parse_steps("100-150")
        (100, 150)
    """
    m = _STEPS.match(str(text))
    if not m:
        raise ConfigError(f"{setting} must look like 'A-B' (steps A to B, inclusive) or 'A', got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise ConfigError(f"{setting} must have A <= B in 'A-B', got {text!r}")
    return first, last


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 - profiling needs torch; imported only when asked for
        except ImportError as exc:
            raise GpuprobeError("profile windows need PyTorch: pip install 'gpuprobe[transformers]'") from exc
    return torch


class ProfileWindow:
    """One capture of steps ``first``–``last``; made by :func:`profile`."""

    def __init__(self, first: int, last: int, output: str | None, nsys: bool, record_shapes: bool,
                 with_stack: bool, rt: Runtime) -> None:
        self.first, self.last = first, last
        self.output = output
        self.nsys = nsys
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.path: Path | None = None
        self.state = "waiting"  # waiting → recording → done | failed
        self.error: str | None = None
        self._prof: Any = None
        self._step_mark: Any = None
        self._rt = rt
        self._lock = threading.Lock()

    def _hook(self, idx: int) -> None:
        if self.state == "waiting" and idx >= self.first:
            if idx > self.first:
                self.first = idx  # started late (the window's first step had passed): say so
            self._start()
        elif self.state == "recording" and idx > self.last:
            self.stop()
            return
        if self.state == "recording" and self._prof is not None:
            self._mark_step(idx)

    def _mark_step(self, idx: int) -> None:
        # kineto does not see NVTX ranges: mark each step as a record_function range in the trace,
        # named "gpuprobe.step#N", which `gpuprobe report` finds as the per-step table.
        torch = _torch()
        self._end_step_mark()
        mark = torch.profiler.record_function(f"gpuprobe.step#{idx}")
        mark.__enter__()
        self._step_mark = mark

    def _end_step_mark(self) -> None:
        mark, self._step_mark = self._step_mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _start(self) -> None:
        torch = _torch()
        try:
            if self.output is not None:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self._prof = torch.profiler.profile(activities=activities, record_shapes=self.record_shapes,
                                                    with_stack=self.with_stack)
                self._prof.__enter__()
            if self.nsys:
                if not torch.cuda.is_available():
                    raise GpuprobeError("nsys=True brackets steps with cudaProfilerStart/Stop and needs CUDA")
                torch.cuda.cudart().cudaProfilerStart()
            self.state = "recording"
        except Exception as exc:
            self._fail(f"could not start: {exc}")

    def stop(self) -> Path | None:
        """End the window now (also done at step ``last + 1`` and at exit) and write the trace."""
        with self._lock:
            if self.state != "recording":
                return self.path
            self.state = "writing"
        torch = _torch()
        try:
            self._end_step_mark()
            if self.nsys:
                torch.cuda.cudart().cudaProfilerStop()
            if self._prof is not None:
                self._prof.__exit__(None, None, None)
                assert self.output is not None
                prof = self._prof
                # torch gzips when the name ends in .gz, so the temporary file keeps the ending.
                suffix = ".tmp.json.gz" if self.output.endswith(".gz") else ".tmp.json"
                self.path = memory.atomic_write(self.output, prof.export_chrome_trace, suffix=suffix)
            self.state = "done"
        except Exception as exc:
            self._fail(f"could not write the trace: {exc}")
        finally:
            self._prof = None
            if self._hook in self._rt.step_hooks:
                self._rt.step_hooks.remove(self._hook)
        return self.path

    def _fail(self, why: str) -> None:
        self.state = "failed"
        self.error = why
        self._rt.warn_once(f"profile:{id(self)}", f"gpuprobe: profile window {self.first}-{self.last}: {why}")

    def close(self) -> None:
        """At exit: write a window still recording, so nothing asked for is lost."""
        self.stop()

    def tick(self) -> None:
        """Exporter protocol: nothing periodic."""

    def __repr__(self) -> str:
        return f"<gpuprobe profile window steps {self.first}-{self.last} {self.state} {self.path or self.output}>"


def profile(steps: str | tuple[int, int], *, output: str | os.PathLike[str] | None = "auto",
            nsys: bool = False, record_shapes: bool = False, with_stack: bool = False) -> ProfileWindow:
    """Capture generation steps A–B with ``torch.profiler`` and/or for Nsight Systems.

    Args:
        steps: ``"A-B"`` (inclusive), ``"A"``, or ``(A, B)``; step indexes count from 0.
        output: the kineto trace file (``.json`` or ``.json.gz``), ``"auto"`` for
            ``gpuprobe-steps-A-B-rank<R>.json.gz`` in the current folder, or None for no torch.profiler
            trace (with ``nsys=True``: only the cudaProfilerStart/Stop bracket).
        nsys: call ``cudaProfilerStart`` at step A and ``cudaProfilerStop`` after step B, for
            ``nsys profile --capture-range=cudaProfilerApi``.
        record_shapes: record input shapes (bigger trace).
        with_stack: record Python stacks (much bigger trace).

    Returns:
        The :class:`ProfileWindow`; its ``path`` is set once the trace is written.

    Raises:
        ConfigError: bad ``steps`` or nothing to capture.

    Example:
        >>> import gpuprobe
        >>> window = gpuprobe.profiling.profile("2-3", output="/tmp/steps.json.gz")  # doctest: +SKIP
    """
    first, last = steps if isinstance(steps, tuple) else parse_steps(steps)
    if first < 0 or last < first:
        raise ConfigError(f"steps must satisfy 0 <= A <= B, got {steps!r}")
    if output is None and not nsys:
        raise ConfigError("profile() needs output= (a trace file) or nsys=True, or both")
    rt = runtime()
    out: str | None
    if output == "auto":
        out = f"gpuprobe-steps-{first}-{last}-rank{rt.cfg.rank}.json.gz"
    else:
        out = None if output is None else os.fspath(output)
    if out is not None and not (out.endswith(".json") or out.endswith(".json.gz")):
        raise ConfigError(f"profile output must end in .json or .json.gz, got {out!r}")
    window = ProfileWindow(first, last, out, nsys, record_shapes, with_stack, rt)
    rt.step_hooks.append(window._hook)
    rt.exporters.append(window)  # closed (trace written) at exit if still recording
    return window


_GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "_int_mm"}
_POINTWISE_OPS = {
    "add", "add_", "mul", "mul_", "sub", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "silu", "gelu",
    "relu", "tanh", "sigmoid", "where", "masked_fill", "masked_fill_", "clamp", "lt", "gt", "eq", "ne",
    "ge", "le", "bitwise_and", "bitwise_or", "bitwise_not", "fill_", "zero_", "logical_and", "cos", "sin",
}


# Operators that only make views, allocate or convert dtype metadata: no compute of their own.
_METADATA_OPS = {
    "view", "as_strided", "reshape", "transpose", "t", "slice", "unsqueeze", "squeeze", "narrow", "expand",
    "resolve_conj", "resolve_neg", "_unsafe_view", "empty", "empty_strided", "empty_like", "result_type",
    "to", "_to_copy", "select", "permute", "contiguous", "detach", "alias", "lift_fresh", "split",
    "chunk", "unbind", "flatten", "expand_as", "view_as", "_reshape_alias", "is_nonzero", "item",
    "_local_scalar_dense", "clone",
}


def _cpu_op_category(name: str) -> str:
    from .report._names import categorize_kernel

    short = name.split("::", 1)[-1]
    if short in _GEMM_OPS:
        return "gemm"
    category = categorize_kernel(name)
    if category == "other" and short in _POINTWISE_OPS:
        return "elementwise"
    return category


def categorize_events(events: list[tuple[str, int]], *, cpu_ops: bool = False) -> dict[str, tuple[int, int]]:
    """Sum ``(name, duration_ns)`` events by kernel category → ``{category: (total_ns, count)}``.

    Args:
        events: kernels (or, with ``cpu_ops=True``, leaf CPU operators) of one profiled step.
        cpu_ops: categorize ATen operator names (``aten::mm`` → gemm) instead of kernel names.

    Example:
        >>> categorize_events([("ampere_sgemm_128x64_nn", 5000), ("void at::native::vectorized_elementwise_kernel<4>()", 700)])
        {'gemm': (5000, 1), 'elementwise': (700, 1)}
    """
    from .report._names import categorize_kernel

    name_to_cat = _cpu_op_category if cpu_ops else categorize_kernel
    out: dict[str, tuple[int, int]] = {}
    for name, dur in events:
        cat = name_to_cat(name)
        total, count = out.get(cat, (0, 0))
        out[cat] = (total + int(dur), count + 1)
    return out


class KernelSampler:
    """Profile one step in every ``every`` and export kernel time and launches by category.

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
        self._prof: Any = None
        self._rt: Runtime | None = None
        self._cuda = False
        self._worker: threading.Thread | None = None

    def attach(self, rt: Runtime | None = None) -> KernelSampler:
        """Start sampling on ``rt``'s step counter."""
        self._rt = rt or runtime()
        self._rt.step_hooks.append(self._hook)
        return self

    def detach(self) -> None:
        """Stop sampling (a step being profiled is finished and exported first)."""
        if self._prof is not None:
            self._finish()
        self.wait()
        if self._rt is not None and self._hook in self._rt.step_hooks:
            self._rt.step_hooks.remove(self._hook)

    def _hook(self, idx: int) -> None:
        if self._prof is not None:
            self._finish()
        if idx > 0 and idx % self.every == 0:
            torch = _torch()
            self._cuda = bool(torch.cuda.is_available())
            act = torch.profiler.ProfilerActivity
            self._prof = torch.profiler.profile(activities=[act.CUDA] if self._cuda else [act.CPU])
            self._prof.__enter__()

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        rt = self._rt or runtime()
        try:
            prof.__exit__(None, None, None)
        except Exception as exc:
            rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling failed: {exc!r}")
            return
        worker = self._worker
        if worker is not None and worker.is_alive():
            rt.drop("kernel_sampling_busy")  # the previous sample is still being read: skip this one
            return
        # Why a worker thread: reading and categorizing a step's events costs ~6 ms of Python; the
        # generation thread only pays for stopping the profiler (~4 ms), and the worker overlaps the
        # next steps (torch releases the GIL while it computes).
        self._worker = threading.Thread(target=self._process, args=(prof, rt), name="gpuprobe-kernels",
                                        daemon=True)
        self._worker.start()

    def _process(self, prof: Any, rt: Runtime) -> None:
        try:
            events = self._events(prof)
            time_fam = rt.family("gpuprobe.kernel.time")
            launch_fam = rt.family("gpuprobe.kernel.launches")
            for category, (total_ns, count) in categorize_events(events, cpu_ops=not self._cuda).items():
                rt.emit(time_fam.child(category=category), total_ns / 1e9)
                rt.emit(launch_fam.child(category=category), count)
            self.samples += 1
        except Exception as exc:
            rt.warn_once("kernel_sampling", f"gpuprobe: kernel sampling failed: {exc!r}")

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the last sample has been read and exported."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _events(self, prof: Any) -> list[tuple[str, int]]:
        # Why raw kineto events: prof.events() builds the whole event tree in Python (~65 ms for
        # one tiny-model step here); the raw results take ~2 ms.
        torch = _torch()
        raw = prof.profiler.kineto_results.events()
        if self._cuda:
            cuda = torch.autograd.DeviceType.CUDA
            return [(e.name(), e.duration_ns()) for e in raw if e.device_type() == cuda]
        return _cpu_self_times([(e.name(), e.start_ns(), e.duration_ns(), e.start_thread_id()) for e in raw])


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
    return [(n, max(0, t)) for n, t in out if n.startswith("aten::") and n[6:] not in _METADATA_OPS]
