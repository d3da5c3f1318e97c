"""Installing a simulation: the ``torch`` attributes it replaces, putting each one back on uninstall, the
CUDA runtime library gpuprobe finds (the simulation's), the process-wide registry (one installed
simulation at a time, over an optional machine one), and what a forked child inherits."""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

from ._torch_compat import (
    ATTACH_OOM_OBSERVER,
    CUDART_ATTRIBUTE,
    INIT_FOR_CUDA_GRAPHS,
    PRIVATE_CUDA_FUNCTIONS,
    PRIVATE_MEMORY_FUNCTIONS,
    check_torch,
    cuda_graphs_warm_up_target,
    import_patched_modules,
    import_torch,
    oom_observer_target,
    profiler_enabled_target,
)
from .functions import _make_api
from .profiler import _make_profiler_classes

__all__ = ["InstallMixin"]

_Sim = TypeVar("_Sim", bound="InstallMixin")

_REGISTRY_LOCK = threading.Lock()
_ACTIVE: InstallMixin | None = None
# A simulation installed with install(as_machine=True): the process's CUDA, which _ACTIVE goes over.
_MACHINE: InstallMixin | None = None
_MISSING = object()


def _after_fork_in_child() -> None:
    """In a forked child, a simulation whose CUDA state poisoned fork marks the child as a bad fork.

    torch registers a ``pthread_atfork`` handler when CUDA initializes or when ``is_available()``
    asks the CUDA runtime for the device count (torch/csrc/utils/device_lazy_init.cpp,
    ``register_fork_handler_for_device_init``); after a fork, ``torch.cuda._is_in_bad_fork()`` is
    True and ``_lazy_init`` raises.
    """
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for sim in (_MACHINE, _ACTIVE):
        if sim is not None:
            sim._lock = threading.RLock()  # a lock held by another thread at fork time would never be released
            if sim._fork_poisoned:
                sim._in_bad_fork = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _rebind_modules(saved: list[tuple[Any, str, Any]]) -> None:
    """Module globals of gpuprobe that hold a replacement now get the original back (a binding made while
    the simulation was installed must not outlive it: the next test would call a simulation that is gone)."""
    import sys

    back: dict[int, Any] = {}
    for target, name, original in saved:
        now = vars(target).get(name, _MISSING)
        if now is not _MISSING and original is not _MISSING and callable(now):
            back[id(now)] = (now, original)
    from ... import _torch_caps

    _torch_caps.forget()  # its capabilities may hold a replacement too
    if not back:
        return
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("gpuprobe"):
            continue
        namespace = vars(module)
        for key, value in list(namespace.items()):
            found = back.get(id(value))
            if found is not None and found[0] is value:
                namespace[key] = found[1]


class InstallMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` that installs and uninstalls it."""

    @property
    def installed(self) -> bool:
        """Whether this simulation is installed now."""
        return self._installed

    def install(self: _Sim, *, as_machine: bool = False) -> _Sim:
        """Replace the ``torch.cuda`` attributes with the simulation's; returns ``self``.

        Args:
            as_machine: install it as the process's own CUDA, what a CUDA build of torch on a GPU
                machine offers, for a whole test run (``pytest --simulate-gpu``). Another simulation
                can then be installed over it, as over real CUDA: that one saves and puts back this
                one's attributes. At most one machine simulation, installed before any other.

        Raises:
            RuntimeError: a simulated CUDA (this one or another) is already installed; for
                ``as_machine``, any simulation is installed; or the installed torch is not a release
                the simulation was checked against (see :func:`._torch_compat.check_torch`: set
                ``GPUPROBE_SIMCUDA_UNCHECKED_TORCH=1`` to install it anyway).
        """
        global _ACTIVE, _MACHINE
        torch = import_torch()
        check_torch(torch)
        import_patched_modules()

        from ... import _capture, _placement, _torch_caps

        with _REGISTRY_LOCK:
            taken = _ACTIVE if _ACTIVE is not None else (_MACHINE if as_machine or _MACHINE is self else None)
            if taken is not None:
                who = "this simulation" if taken is self else "another SimulatedCuda"
                raise RuntimeError(f"simulated CUDA is already installed ({who}); uninstall it first: "
                                   "installs cannot be nested or overlap")
            self._GraphCtx.default_capture_stream = None
            patches = self._patches(torch)
            saved: list[tuple[Any, str, Any]] = []
            try:
                for target, name, value in patches:
                    saved.append((target, name, vars(target).get(name, _MISSING)))
                    setattr(target, name, value)
            except BaseException:
                self._restore(saved)
                raise
            self._saved = saved
            _torch_caps.forget()  # decided anew against the replaced functions
            self._prev_resolver = _placement.set_device_resolver(self.device_of)
            self._prev_runtime_finder = _capture.set_runtime_finder(self._runtime_exchange)
            self._installed = True
            if as_machine:
                _MACHINE = self
            else:
                _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Put every replaced attribute back (the original objects; an attribute that was absent is
        deleted) and the previous device resolver, and give gpuprobe's modules that bound one of the
        replacements while it was installed (``steps.profiling`` bound at ``instrument()``) the original.

        Raises:
            RuntimeError: this simulation is not installed; or it is the machine simulation and
                another one is still installed over it.
        """
        global _ACTIVE, _MACHINE
        from ... import _capture, _placement

        with _REGISTRY_LOCK:
            if _ACTIVE is not self and _MACHINE is not self:
                raise RuntimeError("simulated CUDA: this simulation is not installed")
            if _MACHINE is self and _ACTIVE is not None:
                raise RuntimeError("simulated CUDA: another simulation is installed over this machine "
                                   "simulation; uninstall that one first")
            try:
                _rebind_modules(self._saved)
                self._restore(self._saved)
            finally:
                self._saved = []
                _placement.set_device_resolver(self._prev_resolver)
                self._prev_resolver = None
                _capture.set_runtime_finder(self._prev_runtime_finder)
                self._prev_runtime_finder = None
                self._installed = False
                self._GraphCtx.default_capture_stream = None
                if _MACHINE is self:
                    _MACHINE = None
                else:
                    _ACTIVE = None

    @staticmethod
    def _restore(saved: list[tuple[Any, str, Any]]) -> None:
        for target, name, original in reversed(saved):
            if original is _MISSING:
                if name in vars(target):
                    delattr(target, name)
            else:
                setattr(target, name, original)

    def __enter__(self: _Sim) -> _Sim:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _runtime_exchange(self) -> Any:
        """What gpuprobe finds as the CUDA runtime library torch loaded: this simulation's
        ``cudaThreadExchangeStreamCaptureMode`` (a ``gpuprobe._capture.ModeExchange``)."""
        from ..._capture import ModeExchange

        return ModeExchange(self.libcudart.cudaThreadExchangeStreamCaptureMode, "the simulated CUDA runtime")

    def patched_attributes(self) -> list[tuple[Any, str]]:
        """(object, attribute name) of everything :meth:`install` replaced (empty when not installed)."""
        return [(target, name) for target, name, _ in self._saved]

    def _torch_own(self, target: Any, name: str) -> Any:
        """``target.name`` as torch defines it: under a machine simulation, what that one replaced."""
        machine = _MACHINE
        if machine is not None and machine is not self:
            for t, n, original in machine._saved:
                if t is target and n == name and original is not _MISSING:
                    return original
        return getattr(target, name)

    def _patches(self, torch: Any) -> list[tuple[Any, str, Any]]:
        api = _make_api(self, torch)
        # The profiler classes subclass torch's, not a machine simulation's.
        profile_cls, record_function_cls = _make_profiler_classes(
            self, self._torch_own(torch.profiler.profiler, "profile"),
            self._torch_own(torch.autograd.profiler, "record_function"))
        cuda, memory, graphs, streams = torch.cuda, torch.cuda.memory, torch.cuda.graphs, torch.cuda.streams
        cuda_names = [
            "is_available", "device_count", "is_initialized", "init", "current_device", "set_device",
            "get_device_name", "get_device_capability", "get_device_properties", "synchronize", "current_stream",
            "default_stream", "set_stream", "stream", "graph_pool_handle", "is_current_stream_capturing",
            "set_sync_debug_mode", "get_sync_debug_mode", "cudart", "empty_cache", "memory_stats",
            "memory_stats_as_nested_dict", "memory_allocated", "memory_reserved", "max_memory_allocated",
            "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
            "reset_accumulated_memory_stats", "mem_get_info", "memory_snapshot", *PRIVATE_CUDA_FUNCTIONS,
        ]
        memory_names = [
            "is_initialized", "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
            "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats",
            "mem_get_info", "memory_snapshot", *PRIVATE_MEMORY_FUNCTIONS,
        ]
        out: list[tuple[Any, str, Any]] = [(cuda, n, api[n]) for n in cuda_names]
        out += [
            (cuda, CUDART_ATTRIBUTE, self._cudart),
            (cuda, "device", self._DeviceCtx),
            (cuda, "StreamContext", self._StreamCtx),
            (cuda, "Stream", self._Stream),
            (cuda, "Event", self._Event),
            (cuda, "CUDAGraph", self._Graph),
            (cuda, "graph", self._GraphCtx),
            (streams, "Stream", self._Stream),
            (streams, "Event", self._Event),
            (graphs, "CUDAGraph", self._Graph),
            (graphs, "graph", self._GraphCtx),
            (graphs, "graph_pool_handle", api["graph_pool_handle"]),
            (graphs, "is_current_stream_capturing", api["is_current_stream_capturing"]),
        ]
        out += [(memory, n, api[n]) for n in memory_names]
        rng_names = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]
        out += [(cuda, n, api[n]) for n in rng_names] + [(torch.cuda.random, n, api[n]) for n in rng_names]
        out += [
            (torch.profiler, "profile", profile_cls),
            (torch.profiler.profiler, "profile", profile_cls),
            (torch.profiler, "record_function", record_function_cls),
            (torch.autograd.profiler, "record_function", record_function_cls),
            (*cuda_graphs_warm_up_target(torch), api[INIT_FOR_CUDA_GRAPHS]),
            (*oom_observer_target(torch), api[ATTACH_OOM_OBSERVER]),
        ]
        enabled_target = profiler_enabled_target(torch)
        if enabled_target is not None:
            autograd, enabled_name, real_enabled = enabled_target
            sim = self

            # torch sets the profiler state of the thread that starts a session, whatever its activities:
            # a CUDA-only session (simulated here, without torch's own profiler) is enabled on that thread.
            def _profiler_enabled() -> bool:
                session = sim._session
                if session is not None and session.recording and session.start_thread == threading.get_ident():
                    return True
                return bool(real_enabled())

            out.append((autograd, enabled_name, _profiler_enabled))
        return out
