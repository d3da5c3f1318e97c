"""The sync audit: count the operators that force a device→host synchronisation, where they run.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every ATen operator below autograd
(``.item()`` arrives as ``aten::_local_scalar_dense``, ``x[mask]`` as ``aten::index.Tensor`` with a
bool index). While one is active — for an audited generation step, or a probe with
``sync_audit=True`` — each operator pays one membership test in a frozenset of operator overloads;
the few that can synchronise are then checked (a bool index, a missing ``output_size``, a copy whose
source is on a device and whose destination is on the host) and counted under the attribution the
caller set on the mode (``mode.where``: ``(component, processor)``). It works on the CPU too: there
it counts what *would* synchronise on an accelerator (no copy to the host exists on a CPU, so none
is counted).

The first time a ``(component, processor, op)`` is seen in the process, the Python source line that
ran it (the nearest frame outside torch, transformers and gpuprobe) is warned about once and kept in
:class:`SyncSites` (the last 20 are in ``gpuprobe.info()["sync_sites"]``).

torch is imported only when a mode is made; this module imports nothing of gpuprobe but the leaf
:mod:`gpuprobe._placement`, so the runtime can hold a :class:`SyncSites`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ._placement import tensor_device

__all__ = ["SYNC_OPS", "SyncSites", "new_mode", "op_name", "source_line", "flush"]

# What is counted: every overload of these ATen operators, under the condition in the comment.
SYNC_OPS: tuple[tuple[str, str], ...] = (
    ("_local_scalar_dense", "always: .item(), bool(t), int(t), float(t)"),
    ("nonzero", "always (also torch.where(cond), argwhere)"),
    ("masked_select", "always"),
    ("_unique", "always"),
    ("_unique2", "always (torch.unique)"),
    ("unique_dim", "always (torch.unique(dim=))"),
    ("unique_consecutive", "always"),
    ("unique_dim_consecutive", "always"),
    ("index", "with a bool or uint8 index tensor (x[mask])"),
    ("index_put", "with a bool or uint8 index, unless it is one mask and a one-element value (masked_fill)"),
    ("index_put_", "as index_put"),
    ("_index_put_impl_", "as index_put"),
    ("repeat_interleave", "with a repeats tensor and no output_size"),
    ("_to_copy", "blocking copy from a device tensor to the host (.cpu(), .to('cpu'), .tolist() on a device)"),
    ("copy_", "blocking copy from a device tensor into a host tensor"),
    ("copy", "as copy_"),
)

Where = tuple[str, "str | None"]  # (component, processor)

_ops: frozenset[Any] | None = None
_checks: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], bool]] = {}
_names: dict[Any, str] = {}
_mode_cls: Any = None
_skip_dirs: tuple[str, ...] = ()
_transformers_dir: str | None = None
_build_lock = threading.Lock()


def op_name(func: Any) -> str:
    """``aten::name`` of an operator overload, the overload dropped (``aten.index.Tensor`` → ``aten::index``)."""
    name = _names.get(func)
    if name is None:
        name = str(func._schema.name)
        _names[func] = name
    return name


def _is_host(t: Any) -> bool:
    return bool(tensor_device(t).type == "cpu")


def _bool_index(indices: Any) -> bool:
    bool_types = _BOOL_TYPES
    return any(t is not None and t.dtype in bool_types for t in indices)


def _index_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return _bool_index(indices)


def _index_put_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    if not _bool_index(indices):
        return False
    given = [t for t in indices if t is not None]
    values = args[2] if len(args) > 2 else kwargs.get("values")
    # ATen turns one mask with a one-element value into masked_fill_: no nonzero, no sync.
    return not (len(given) == 1 and values is not None and values.numel() == 1)


def _repeat_interleave_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return kwargs.get("output_size") is None


def _to_copy_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    if device is None or device.type != "cpu" or kwargs.get("non_blocking", False):
        return False
    return not _is_host(args[0])


def _copy_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    # The source first: on a CPU every copy stops there, after one look.
    return not non_blocking and not _is_host(args[1]) and _is_host(args[0])


_BOOL_TYPES: tuple[Any, ...] = ()
_CHECKS_BY_NAME = {
    "index": _index_syncs,
    "index_put": _index_put_syncs,
    "index_put_": _index_put_syncs,
    "_index_put_impl_": _index_put_syncs,
    "repeat_interleave": _repeat_interleave_syncs,
    "_to_copy": _to_copy_syncs,
    "copy_": _copy_syncs,
    "copy": _copy_syncs,
}
# Overloads that never synchronise: an integer repeats count.
_NEVER = {("repeat_interleave", "self_int")}


def _build() -> None:
    """The operator set, the checks and the mode class, once torch is there."""
    global _ops, _mode_cls, _BOOL_TYPES
    with _build_lock:
        if _ops is not None:
            return
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        _BOOL_TYPES = (torch.bool, torch.uint8)
        aten = torch.ops.aten
        ops = set()
        for name, _ in SYNC_OPS:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                if (name, overload) in _NEVER:
                    continue
                op = getattr(packet, overload)
                ops.add(op)
                check = _CHECKS_BY_NAME.get(name)
                if check is not None:
                    _checks[op] = check
        frozen = frozenset(ops)
        checks = _checks
        skip_code = _dynamo_skip_code()

        class SyncAuditMode(TorchDispatchMode):
            """Counts synchronising operators by ``where`` (see the module docstring); calls every one through."""

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo (a Python wrapper
                # around every operator) unless this says no; then the handler's code is marked for
                # Dynamo to skip instead, with everything it calls, at no cost per call (below).
                return skip_code is None

            # Without this, a higher-order operator run under the mode raises (torch.cond, FlexAttention
            # in eager): they go through unchanged, and the operators inside them are not seen.
            supports_higher_order_operators = True

            def __init__(self, sites: SyncSites) -> None:
                super().__init__()
                self.where: Where = ("other", None)
                self.counts: dict[tuple[Where, Any], int] = {}
                self.sites = sites

            # Why so little: while the mode is on, every ATen operator of the step comes through here
            # (~350 per decode step of the benchmark's 4-layer Llama). The mode's machinery costs ~9 us an
            # operator on the test CPU, about what the operator itself costs; this body adds one
            # frozenset test (~40 ns). Calling func._op skips OpOverload.__call__'s Python frame.
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if func in frozen:
                    self.hit(func, args, kwargs)
                try:
                    op = func._op
                except AttributeError:  # a higher-order operator (cond, flex_attention, ...): through, unseen
                    return func(*args, **kwargs)
                return op(*args, **kwargs)

            def hit(self, func: Any, args: Any, kwargs: Any) -> None:
                check = checks.get(func)
                try:
                    if check is not None and not check(args, kwargs or {}):
                        return
                except Exception:  # an odd call shape: not counted rather than breaking the program
                    return
                key = (self.where, func)
                n = self.counts.get(key)
                if n is None:
                    self.counts[key] = 1
                    try:
                        self.sites.seen(self.where, op_name(func))
                    except Exception:  # reporting a site must never break the operator
                        pass
                else:
                    self.counts[key] = n + 1

        if skip_code is not None:
            # Why: torch's _disable_dynamo wrapper costs ~1.7 us an operator (mode overhead per step of the
            # benchmark's Llama: 3.71 ms wrapped, 3.13 ms marked, thread CPU time on the test CPU); marking
            # the code object tells Dynamo's frame evaluator to skip the handler and what it calls (the
            # same as the wrapper's recursive disable), checked in C.
            try:
                skip_code(SyncAuditMode.__torch_dispatch__.__code__)
            except Exception:  # an API that changed: torch's own wrapper, as for any other mode
                SyncAuditMode.__torch_dispatch__ = torch._disable_dynamo(  # type: ignore[method-assign]
                    SyncAuditMode.__dict__["__torch_dispatch__"], recursive=True)
        _mode_cls = SyncAuditMode
        _ops = frozen


def _dynamo_skip_code() -> Callable[[Any], None] | None:
    """``mark(code)``: Dynamo skips frames of ``code`` and every frame they call; None without that API."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return None
    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)

    def mark(code: Any) -> None:
        set_code_exec_strategy(code, strategy)

    return mark


def _library_dirs() -> tuple[tuple[str, ...], str | None]:
    """The folders of gpuprobe and torch, and of transformers once imported, each ending in a separator."""
    global _skip_dirs, _transformers_dir
    if _transformers_dir is None or not _skip_dirs:
        dirs = [os.path.dirname(os.path.abspath(__file__))]
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(torch.__file__)))
        _skip_dirs = tuple(d + os.sep for d in dirs)
        tr = sys.modules.get("transformers")
        if tr is not None and getattr(tr, "__file__", None):
            _transformers_dir = os.path.dirname(os.path.abspath(tr.__file__)) + os.sep
    return _skip_dirs, _transformers_dir


def new_mode(sites: SyncSites) -> Any:
    """A fresh dispatch mode counting into its ``counts`` under ``where`` (not entered yet)."""
    if _mode_cls is None:
        _build()
    return _mode_cls(sites)


def source_line() -> tuple[str, str | None]:
    """``file:line`` of the nearest frame outside torch, transformers and gpuprobe ("?" if none), and
    ``file:line`` of the innermost transformers frame passed on the way there (None if none)."""
    skip, tr = _library_dirs()
    frame = sys._getframe(1)
    via = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip) and not filename.startswith("<gpuprobe"):
            if tr is None or not filename.startswith(tr):
                return f"{filename}:{frame.f_lineno}", via
            if via is None:
                via = f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?", via


class SyncSites:
    """Where the audit first saw each ``(component, processor, op)``: warned once, the last 20 kept.

    Args:
        warn: ``warn(key, message)``, the runtime's warn-once.
    """

    def __init__(self, warn: Callable[[str, str], None], keep: int = 20, limit: int = 10_000) -> None:
        self._warn = warn
        self._seen: set[tuple[str, str | None, str]] = set()
        self.recent: deque[dict[str, str]] = deque(maxlen=keep)
        self._limit = limit
        self._lock = threading.Lock()

    def seen(self, where: Where, op: str) -> None:
        """Called from inside the mode the first time a step sees ``(where, op)``; new ones are reported."""
        key = (where[0], where[1], op)
        if key in self._seen or len(self._seen) >= self._limit:
            return
        site, via = source_line()
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            entry = {"component": where[0], "op": op, "source": site}
            if where[1] is not None:
                entry["processor"] = where[1]
            if via is not None:
                entry["via"] = via
            self.recent.append(entry)
        who = where[0] if where[1] is None else f"{where[0]} {where[1]}"
        inside = f" (inside transformers at {via})" if via is not None else ""
        try:
            self._warn(f"sync:{key}", f"gpuprobe: sync audit: {op} in {who} forces a device-to-host "
                                      f"synchronisation on an accelerator, at {site}{inside}")
        except Exception:  # warnings turned into errors (-W error): telemetry never raises into the program
            pass

    def clear(self) -> None:
        """Forget every site (reset)."""
        with self._lock:
            self._seen.clear()
            self.recent.clear()

    def reset_after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()


def flush(mode: Any, child_for: Callable[[Where, str], Any], records: Any) -> None:
    """Append ``(series.apply, count)`` for each ``(where, op)`` the mode counted; empty its counts.

    Args:
        mode: a mode made by :func:`new_mode`, already exited.
        child_for: ``(where, op name) -> series.apply`` (prepared and cached by the caller).
        records: the thread's record deque.
    """
    counts = mode.counts
    if not counts:
        return
    for (where, func), n in counts.items():
        records.append((child_for(where, op_name(func)), n))
    mode.counts = {}
