"""Profile windows, driven by the step counter; live kernel categories (:class:`KernelSampler`) are
imported from here too.

Steps are counted by the transformers integration (one per generation step) or by your own
``gpuprobe.step()`` calls; each call marks the *start* of a step.

- :func:`profile` — capture steps A–B with ``torch.profiler`` (a kineto trace written atomically to
  a file, ``.json`` or ``.json.gz``) and/or bracket them with ``cudaProfilerStart/Stop`` for
  ``nsys profile --capture-range=cudaProfilerApi``. ``GPUPROBE_PROFILE_STEPS=100-150`` does the same
  from the environment.
- :class:`KernelSampler` (``kernel_sampling=N``) — profiles one step in every N, categorizes its kernels
  in-process (GEMM, attention, softmax, …, see :func:`gpuprobe.report.categorize_kernel`) and adds
  them to ``gpuprobe.kernel.time`` and ``gpuprobe.kernel.launches`` by category; it skips the steps a
  profile window records. Without CUDA it categorizes the step's leaf CPU operators instead; where the
  installed torch offers no way to sample, :func:`kernel_sampling_status`
  (``gpuprobe.info()["kernel_sampling"]``) says why. It lives in ``gpuprobe/_kernel_sampler.py``.
"""
from __future__ import annotations

import enum
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._cuda import torch_with_cuda
from ._files import atomic_write
from ._kernel_sampler import (
    KernelSampler,
    categorize_events,
    kernel_sampling_status,
    profiler_torch,
    warm_up_for_cuda_graphs,
)
from ._lifecycle import Owner
from ._torch_caps import profiler_caps
from .config import parse_steps
from .errors import ConfigError, GpuprobeError
from .runtime import Runtime, runtime

__all__ = ["profile", "ProfileWindow", "WindowState", "KernelSampler", "parse_steps", "categorize_events",
           "kernel_sampling_status", "warm_up_for_cuda_graphs"]


class WindowState(str, enum.Enum):
    """Where a :class:`ProfileWindow` is: ``WAITING`` → ``RECORDING`` → ``WRITING`` → ``DONE`` (or ``FAILED``).

    A ``str`` enum: ``window.state == "done"`` reads as it should.
    """

    WAITING = "waiting"
    RECORDING = "recording"
    WRITING = "writing"
    DONE = "done"
    FAILED = "failed"


class ProfileWindow:
    """One capture of steps ``first``–``last``; made by :func:`profile`.

    Its :meth:`on_step` hook runs at every step start: at ``first`` it starts ``torch.profiler``
    (when ``output`` is set) and/or ``cudaProfilerStart`` (``nsys``); after ``last`` it stops them and
    writes the trace atomically. A window still recording at exit (or at ``gpuprobe.testing.reset``)
    is written then.
    """

    def __init__(self, first: int, last: int, output: str | None, nsys: bool, record_shapes: bool,
                 with_stack: bool, rt: Runtime, with_flops: bool = False) -> None:
        self.first, self.last = first, last
        self.output = output
        self.nsys = nsys
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.path: Path | None = None
        self.state = WindowState.WAITING
        self.error: str | None = None
        self._prof: Any = None
        self._step_mark: Any = None
        self._rt = rt
        self._lock = threading.Lock()
        # Told when the window starts recording and when it is done (written or failed); never raise.
        self.on_started: Callable[[ProfileWindow], None] | None = None
        self.on_finished: Callable[[ProfileWindow], None] | None = None

    def _tell(self, listener: Callable[[ProfileWindow], None] | None) -> None:
        if listener is None:
            return
        try:
            listener(self)
        except Exception as exc:
            self._rt.warn_once(f"profile-listener:{id(self)}", f"gpuprobe: profile window {self.first}-{self.last}: "
                               f"a listener failed: {exc!r}")

    def owns(self, index: int) -> bool:
        """Whether this window records step ``index`` (it starts there, or records and does not end there).

        The kernel sampler reads it (by this name) to leave the window's steps alone.
        """
        if self.state == WindowState.RECORDING:
            return index <= self.last
        return self.state == WindowState.WAITING and self.first <= index <= self.last

    def on_step(self, index: int) -> None:
        """Step hook: start at ``first``, mark each step, stop after ``last``."""
        if self.state == WindowState.WAITING and index >= self.first:
            if index > self.first:
                self.first = index  # started late (the window's first step had passed): say so
            self._start()
        elif self.state == WindowState.RECORDING and index > self.last:
            self._finish(say=True)
            return
        if self.state == WindowState.RECORDING and self._prof is not None:
            self._mark_step(index)

    def _mark_step(self, index: int) -> None:
        # kineto does not see NVTX ranges: mark each step as a record_function range in the trace,
        # named "gpuprobe.step#N", which `gpuprobe report` finds as the per-step table.
        torch = profiler_torch()
        self._end_step_mark()
        mark = torch.profiler.record_function(f"gpuprobe.step#{index}")
        mark.__enter__()
        self._step_mark = mark
        # Tell whoever advanced the step (the transformers integration) to mark its components inside.
        self._rt.steps.mark_traced(index)

    def _end_step_mark(self) -> None:
        mark, self._step_mark = self._step_mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _start(self) -> None:
        torch = profiler_torch()
        try:
            cuda = torch_with_cuda() is not None
            if self.nsys and not cuda:
                raise GpuprobeError("nsys=True brackets steps with cudaProfilerStart/Stop and needs CUDA")
            if self.output is not None:
                if _profiler_running(torch):
                    # kineto holds one session per process: a second one inside it ends the first one's
                    # recording and the program's own export of it then crashes (torch 2.13, CPU).
                    raise GpuprobeError("a torch.profiler session already records in this process (your own?); "
                                        "kineto holds one at a time, so gpuprobe's step and component ranges go "
                                        "into that session's trace instead")
                activities = [torch.profiler.ProfilerActivity.CPU]
                if cuda:
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self._prof = torch.profiler.profile(activities=activities, record_shapes=self.record_shapes,
                                                    with_stack=self.with_stack, with_flops=self.with_flops)
                self._prof.__enter__()
            if self.nsys:
                torch.cuda.cudart().cudaProfilerStart()
            self.state = WindowState.RECORDING
        except Exception as exc:
            self._fail(f"could not start: {exc}")
            self._tell(self.on_finished)
            return
        self._tell(self.on_started)

    def stop(self) -> Path | None:
        """End the window now (also done at step ``last + 1`` and at exit) and write the trace.

        Returns:
            The trace's path (None when none was written: see :attr:`error`). Ended here, by its caller, the
            window says nothing; ended on its own (after its last step, at exit) it says on stderr where its
            trace went, unless a listener (an on-demand capture) says it.
        """
        return self._finish(say=False)

    def _finish(self, say: bool) -> Path | None:
        with self._lock:
            if self.state != WindowState.RECORDING:
                self._detach()
                return self.path
            self.state = WindowState.WRITING
        torch = profiler_torch()
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
                self.path = atomic_write(self.output, prof.export_chrome_trace, suffix=suffix)
            self.state = WindowState.DONE
        except Exception as exc:
            self._fail(f"could not write the trace: {exc}")
        finally:
            self._prof = None
            self._detach()
        if say and self.on_finished is None and self.path is not None:
            _say(f"profile window steps {self.first}-{self.last}: trace written to {os.path.abspath(self.path)} "
                 f"(gpuprobe report {os.path.abspath(self.path)} reads it)")
        self._tell(self.on_finished)
        return self.path

    def _detach(self) -> None:
        self._rt.remove_step_hook(self.on_step)
        self._rt.remove(self)

    def _fail(self, why: str) -> None:
        self.state = WindowState.FAILED
        self.error = why
        self._rt.warn_once(f"profile:{id(self)}", f"gpuprobe: profile window {self.first}-{self.last}: {why}")

    def close(self) -> None:
        """At exit or reset: write a window still recording, so nothing asked for is lost."""
        self._finish(say=True)

    def __repr__(self) -> str:
        return f"<gpuprobe profile window steps {self.first}-{self.last} {self.state.value} {self.path or self.output}>"


def profile(steps: str | tuple[int, int], *, output: str | os.PathLike[str] | None = "auto",
            nsys: bool = False, record_shapes: bool = False, with_stack: bool = False,
            with_flops: bool = False, runtime_: Runtime | None = None, owner: Owner = "user") -> ProfileWindow:
    """Capture generation steps A–B with ``torch.profiler`` and/or for Nsight Systems.

    Args:
        steps: ``"A-B"`` (inclusive), ``"A"``, or ``(A, B)``; step indexes count from 0.
        output: the kineto trace file (``.json`` or ``.json.gz``); ``"auto"`` for
            ``gpuprobe-steps-A-B-rank<R>.json.gz`` in the current folder — or, with ``nsys=True``, for
            no torch.profiler trace at all, since nsys and torch.profiler would be two CUPTI clients at
            once; None for no torch.profiler trace. Pass a path with ``nsys=True`` to ask for both.
        nsys: call ``cudaProfilerStart`` at step A and ``cudaProfilerStop`` after step B, for
            ``nsys profile --capture-range=cudaProfilerApi``. Kernel sampling pauses meanwhile.
        record_shapes: record input shapes (bigger trace).
        with_stack: record Python stacks (much bigger trace).
        with_flops: record what FLOP counts need (input shapes, so ``record_shapes`` too);
            ``gpuprobe report`` shows the FLOP/s achieved per category.

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
    rt = runtime_ or runtime()
    out: str | None
    if output == "auto":
        out = None if nsys else f"gpuprobe-steps-{first}-{last}-rank{rt.settings.rank}.json.gz"
    else:
        out = None if output is None else os.fspath(output)
    if out is None and not nsys:
        raise ConfigError("profile() needs output= (a trace file) or nsys=True, or both")
    if out is not None and not (out.endswith(".json") or out.endswith(".json.gz")):
        raise ConfigError(f"profile output must end in .json or .json.gz, got {out!r}")
    window = ProfileWindow(first, last, out, nsys, record_shapes or with_flops, with_stack, rt, with_flops=with_flops)
    rt.add_step_hook(window.on_step)
    rt.add_closeable(window, owner=owner)  # written at exit if still recording
    return window


def start_window_from_settings(rt: Runtime) -> ProfileWindow:
    """The window ``profile_steps`` / ``profile_output`` / ``profile_nsys`` ask for."""
    cfg = rt.settings
    assert cfg.profile_steps is not None
    output = None if cfg.profile_output == "none" else cfg.profile_output
    return profile(cfg.profile_steps, output=output, nsys=cfg.profile_nsys, runtime_=rt, owner="settings")


def _say(message: str) -> None:
    """One line on stderr: a trace the user asked for is said where they look; never raises."""
    try:
        sys.stderr.write(f"gpuprobe: {message}\n")
        sys.stderr.flush()
    except Exception:  # no usable stderr (a daemon): the trace is still there
        pass


def _profiler_running(torch: Any) -> bool:
    """Whether a torch.profiler session records: on any thread, or (the autograd profiler's CPU state)
    on this one."""
    caps = profiler_caps(torch)
    return any(check is not None and check() for check in (caps.profiler_in_process, caps.profiler_enabled))

