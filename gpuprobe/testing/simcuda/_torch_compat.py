"""Every private torch name the simulated CUDA uses, each written here once, and the torch releases the
simulation was checked against.

torch renames and reshapes its private names between releases (``_KinetoEvent`` has ``activity_type()``
in 2.13, not in 2.11; ``enable_cuda_sync_events`` sits at another position of an
``_ExperimentalConfig``'s state in 2.2; profiles take ``activity_filters`` in 2.13 and
``activity_configs`` in 2.15). The other modules of the simulation reach such a name only through the
accessors and constants below, so a release that moves one is mended here (tests/simcuda checks that no
other module reaches a private torch attribute).

Where gpuprobe's core reads the same name, the lookup is :mod:`gpuprobe._torch_caps`'s (the
``_KinetoEvent`` class). The names the simulation replaces while installed (``torch.cuda._lazy_init``,
``torch.profiler._utils._init_for_cuda_graphs``, ...) are looked up when called, as the core does, so
that code running under the simulation gets the simulated ones.

Checked releases: :func:`check_torch` refuses to install the simulation on a torch outside
:data:`CHECKED_RELEASES` (2.11 to 2.15), unless ``GPUPROBE_SIMCUDA_UNCHECKED_TORCH=1`` is set; the tests
of tests/simcuda then say what no longer holds.

This module never imports torch at import time: :func:`import_torch` does, on first use.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from ... import _torch_caps

__all__ = [
    "CHECKED_RELEASES",
    "PRIVATE_CUDA_FUNCTIONS",
    "PRIVATE_MEMORY_FUNCTIONS",
    "PROFILER_CHECKED_ON",
    "UNCHECKED_TORCH_VARIABLE",
    "check_torch",
    "import_torch",
]

# The torch releases (major, minor) the simulation was checked against: tests/simcuda and the GPU paths'
# tests pass on 2.11.0 and 2.15.0 (docs/compatibility.md) and on the pinned 2.13.0. Older releases differ
# where it matters: torch 2.2's profiler computes its events on exit and gives kineto times in
# microseconds, and much else the simulation imitates (torch.AcceleratorError, ...) is newer than 2.2.
CHECKED_RELEASES = ((2, 11), (2, 12), (2, 13), (2, 14), (2, 15))
# The releases whose profiler the simulated one was run against (its messages name them).
PROFILER_CHECKED_ON = "2.11.0, 2.13.0 and 2.15.0"
# Set to 1, it lets the simulation install on a torch outside CHECKED_RELEASES.
UNCHECKED_TORCH_VARIABLE = "GPUPROBE_SIMCUDA_UNCHECKED_TORCH"

# ------------------------------------------------------------------------------ torch and its release


def import_torch() -> Any:
    """The torch module, imported on first use only."""
    mod = sys.modules.get("torch")
    if mod is None:
        import torch as mod  # noqa: PLC0415 (kept out of import time on purpose)
    return mod


def torch_version(torch: Any) -> str:
    """``torch.__version__`` as a string: the version :func:`check_torch` reads."""
    return str(getattr(torch, "__version__", "?"))


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string (``"2.13.0+cpu"`` -> ``(2, 13)``); None when it does not start so."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_torch(torch: Any) -> None:
    """Refuse a torch the simulation was not checked against, before anything is patched.

    Raises:
        RuntimeError: ``torch.__version__`` is not of a release in :data:`CHECKED_RELEASES` and
            ``GPUPROBE_SIMCUDA_UNCHECKED_TORCH`` is not ``1``; the message names the installed version,
            the checked range and the variable.

    Example:
        >>> import torch
        >>> check_torch(torch)  # the pinned torch is among the checked releases
    """
    version = torch_version(torch)
    if release(version) in CHECKED_RELEASES or os.environ.get(UNCHECKED_TORCH_VARIABLE, "") == "1":
        return
    first, last = CHECKED_RELEASES[0], CHECKED_RELEASES[-1]
    raise RuntimeError(
        f"simulated CUDA: torch {version} is installed, and the simulation was checked against torch "
        f"{first[0]}.{first[1]} to {last[0]}.{last[1]} only (its profiler imitates torch {PROFILER_CHECKED_ON}); "
        f"set {UNCHECKED_TORCH_VARIABLE}=1 to install it on this torch anyway")


def import_patched_modules() -> None:
    """Import the torch modules whose attributes the simulation replaces (so they exist to be patched)."""
    import torch.autograd.profiler  # noqa: F401, PLC0415
    import torch.cuda.graphs  # noqa: F401, PLC0415
    import torch.cuda.memory  # noqa: F401, PLC0415
    import torch.cuda.random  # noqa: F401, PLC0415
    import torch.cuda.streams  # noqa: F401, PLC0415
    import torch.profiler  # noqa: F401, PLC0415
    import torch.profiler._utils  # noqa: F401, PLC0415
    import torch.profiler.profiler  # noqa: F401, PLC0415


# ------------------------------------------------------------------------------ what install replaces

# The private functions of torch.cuda the simulation replaces (twins in functions.py, of the same names).
PRIVATE_CUDA_FUNCTIONS = ("_lazy_init", "_is_in_bad_fork", "_exchange_device", "_maybe_exchange_device",
                          "_set_stream_by_id", "_sleep")
# The private functions of torch.cuda.memory the simulation replaces.
PRIVATE_MEMORY_FUNCTIONS = ("_lazy_init", "_record_memory_history", "_snapshot", "_dump_snapshot")
# torch.cuda's cached runtime module, which torch.cuda.cudart() returns once set.
CUDART_ATTRIBUTE = "_cudart"
# The names of the simulated functions that stand for torch's private ones, as counted in
# SimStats.calls (keyed by torch's attribute name).
LAZY_INIT = "_lazy_init"
SLEEP = "_sleep"
RECORD_MEMORY_HISTORY = "_record_memory_history"
SNAPSHOT = "_snapshot"
DUMP_SNAPSHOT = "_dump_snapshot"
ATTACH_OOM_OBSERVER = "_cuda_attach_out_of_memory_observer"
INIT_FOR_CUDA_GRAPHS = "_init_for_cuda_graphs"
PROFILER_ENABLED = "_profiler_enabled"


def cuda_graphs_warm_up_target(torch: Any) -> tuple[Any, str]:
    """(module, name) of ``torch.profiler._utils._init_for_cuda_graphs``, which the simulation replaces."""
    return torch.profiler._utils, INIT_FOR_CUDA_GRAPHS


def oom_observer_target(torch: Any) -> tuple[Any, str]:
    """(module, name) of ``torch._C._cuda_attach_out_of_memory_observer`` (absent on a CPU build)."""
    return torch._C, ATTACH_OOM_OBSERVER


def profiler_enabled_target(torch: Any) -> tuple[Any, str, Callable[[], bool]] | None:
    """(module, name, the function there now) of ``torch._C._autograd._profiler_enabled``; None if absent.

    Read at install, not through :func:`gpuprobe._torch_caps.profiler_caps`: that one keeps the function
    it first found, which may be another installed simulation's.
    """
    autograd = torch._C._autograd
    enabled = getattr(autograd, PROFILER_ENABLED, None)
    return None if enabled is None else (autograd, PROFILER_ENABLED, enabled)


# ------------------------------------------------------------------------------ torch.cuda internals


def lazy_init(torch: Any) -> None:
    """``torch.cuda._lazy_init()``, looked up when called (the simulated one while installed)."""
    torch.cuda._lazy_init()


def get_device_index(torch: Any) -> Callable[..., int]:
    """``torch.cuda._utils._get_device_index(device, optional=False)``: torch's parsing of a device argument."""
    return torch.cuda._utils._get_device_index


def exchange_device(torch: Any, device: int) -> int:
    """``torch.cuda._exchange_device(device)``: makes ``device`` current (initializing); the previous one."""
    return torch.cuda._exchange_device(device)


def maybe_exchange_device(torch: Any, device: int) -> int:
    """``torch.cuda._maybe_exchange_device(device)``: as :func:`exchange_device`, without initializing."""
    return torch.cuda._maybe_exchange_device(device)


def set_stream_by_id(torch: Any, stream_id: int, device_index: int, device_type: int) -> None:
    """``torch.cuda._set_stream_by_id``: the stream's device becomes current, then the stream."""
    torch.cuda._set_stream_by_id(stream_id=stream_id, device_index=device_index, device_type=device_type)


def allocator_snapshot(torch: Any, augment_with_fx_traces: bool) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot(augment_with_fx_traces=...)``."""
    return torch.cuda.memory._snapshot(augment_with_fx_traces=augment_with_fx_traces)


# ------------------------------------------------------------------------------ the profiler


def kineto_event_class(torch: Any) -> type | None:
    """``torch._C._autograd._KinetoEvent`` (what gpuprobe's core reads too); None if torch has none."""
    cls = _torch_caps.kineto_event_class(torch)
    return cls if isinstance(cls, type) else None


def sync_events_reader(torch: Any) -> Callable[[Any], bool] | None:
    """``config -> bool``: whether an ``_ExperimentalConfig`` asks for CUDA sync events; None where this
    torch cannot set them.

    The config offers no getter: ``enable_cuda_sync_events`` is a position of ``__getstate__()`` (4 in
    torch 2.11 and 2.13; 3 in 2.2), found here by setting it.
    """
    config = torch._C._profiler._ExperimentalConfig
    try:
        off, on = config().__getstate__(), config(enable_cuda_sync_events=True).__getstate__()
    except Exception:
        return None
    changed = [i for i, (a, b) in enumerate(zip(off, on)) if a != b]
    if len(changed) != 1:
        return None
    field = changed[0]
    return lambda cfg: bool(cfg is not None and cfg.__getstate__()[field])


def activity_filters_keyword(torch: Any) -> Callable[[dict[Any, Any] | None], dict[str, Any]]:
    """``filters -> keyword arguments`` giving ``torch.autograd.profiler.profile`` its activity filters:
    ``{"activity_filters": filters}`` where it takes them (torch 2.13), ``{}`` where not (2.11)."""
    if "activity_filters" in inspect.signature(torch.autograd.profiler.profile.__init__).parameters:
        return lambda filters: {"activity_filters": filters}
    return lambda filters: {}


def activity_filters(profile: Any) -> dict[Any, Any]:
    """``{activity: [names]}`` of a ``torch.profiler.profile``: torch 2.13's ``activity_filters``, or
    torch 2.15's ``activity_configs`` (``{activity: ProfilerActivityConfig(activity_types=[names])}``)."""
    filters = getattr(profile, "activity_filters", None)
    if filters is None:
        configs = getattr(profile, "activity_configs", None) or {}
        filters = {a: c.activity_types for a, c in configs.items() if getattr(c, "activity_types", None) is not None}
    return dict(filters or {})


def prepare_cpu_trace(autograd_profile: Any) -> None:
    """``torch.autograd.profiler.profile._prepare_trace()``: the CPU session's warm-up."""
    autograd_profile._prepare_trace()


def drop_processed_events(autograd_profile: Any) -> None:
    """Make a ``torch.autograd.profiler.profile`` compute its function events again from its
    ``kineto_results`` (its ``_function_events`` and ``_needs_processing``)."""
    autograd_profile._function_events = None
    autograd_profile._needs_processing = True
