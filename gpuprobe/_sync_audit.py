"""The sync audit: count the operators that force a device→host synchronisation, where they run.

The operators that can synchronise (``.item()`` arrives as ``aten::_local_scalar_dense``, ``x[mask]``
as ``aten::index.Tensor`` with a bool index, ...) get a Python kernel at the dispatcher's
``PreDispatch`` key, registered once (:func:`_build`). That key is off unless a thread includes it,
and every other operator falls through it in C++: an audit (:class:`SyncAudit`) includes it on its
thread while entered — for an audited generation step, or a probe with ``sync_audit=True`` — so
only the few synchronising operators reach Python. Their kernel checks the condition that makes
them synchronise (a bool index, a missing ``output_size``, a copy whose source is on a device and
whose destination is on the host), counts the operator under the attribution the caller set on the
audit (``audit.where``: ``(component, processor)``), and runs it with the key excluded, so what it
calls inside is not counted again. It works on the CPU too: there it counts what *would*
synchronise on an accelerator (no copy to the host exists on a CPU, so none is counted).

Why not a ``TorchDispatchMode``: a mode brings every operator of the step into Python, ~9 us each on
the test CPU (a decode step of the benchmark's 4-layer Llama went from 1.5 to 3.7 ms); the
PreDispatch key costs ~1 us an operator in C++ and the kernels ~5 us per synchronising operator or
copy (the same step: 1.9 ms, 2.3 ms with its 21 dtype copies).

The first time a ``(component, processor, op)`` is seen in the process, the Python source line that
ran it (the nearest frame outside torch, transformers and gpuprobe) is kept in :class:`SyncSites` (the
last 20 are in ``gpuprobe.info()["sync_sites"]``) and warned about once, unless it is transformers' own
(the operator ran inside transformers, outside a logits processor or stopping criterion: the stop
check, ``masking_utils``), which is kept as expected and not warned about.

torch is imported only when an audit is made; this module imports nothing of gpuprobe but the leaves
:mod:`gpuprobe._placement` and :mod:`gpuprobe._seams`, so the runtime can hold a :class:`SyncSites`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ._placement import tensor_device
from ._seams import declare

SEAM_KERNELS = declare(
    "torch.sync_audit.kernels", library="torch", scenario="sync_audit",
    target="PreDispatch kernels of the synchronising ATen operators (aten::_local_scalar_dense, nonzero, ...)")

__all__ = ["SYNC_OPS", "USERS_COMPONENTS", "SyncAudit", "SyncSites", "active", "new_audit", "op_name", "source_line",
           "flush"]

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

# Hits of one (where, op) in an audited step looked at while only expected sightings of it are known.
_RECHECKS = 16

#: Components whose syncs are the user's to act on wherever they run: a logits processor or stopping
#: criterion the call passed (or asked for). In any other component a sync that ran inside transformers'
#: own code is expected (see :meth:`SyncSites.seen`).
USERS_COMPONENTS = frozenset({"logits_processor", "stopping_criteria"})

_ops: frozenset[Any] | None = None
_names: dict[Any, str] = {}
_library: Any = None  # the torch.library.Library holding the kernels: they live as long as it does
_include: Any = None
_exclude: Any = None
_pre_dispatch: Any = None
_is_included: Any = None
_exclude_keys: Any = None
_fake_mode: Callable[[], Any] = lambda: None  # the fake-tensor mode in force on this thread, if any
_hops: dict[str, Any] = {}  # torch's table of higher-order operators, by name
_hops_seen = 0  # how many of them have a PreDispatch kernel (see _let_hops_through)
_local = threading.local()  # .audits: the audits entered on this thread, innermost last
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
    """The operator set, the checks and the kernels, once torch is there."""
    global _ops, _BOOL_TYPES, _library, _include, _exclude, _pre_dispatch, _is_included, _exclude_keys, _hops
    global _fake_mode
    with _build_lock:
        if _ops is not None:
            return
        import torch
        from torch._C import DispatchKey, DispatchKeySet

        _BOOL_TYPES = (torch.bool, torch.uint8)
        include = torch._C._IncludeDispatchKeyGuard
        exclude = torch._C._ExcludeDispatchKeyGuard
        key = DispatchKey.PreDispatch
        keys = DispatchKeySet(key)
        aten = torch.ops.aten
        library = torch.library.Library("aten", "IMPL")
        ops = set()
        skip_code = _dynamo_skip_code()
        for name, _ in SYNC_OPS:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                if (name, overload) in _NEVER:
                    continue
                op = getattr(packet, overload)
                check = _CHECKS_BY_NAME.get(name)
                try:
                    library.impl(op, _kernel(op, check, op._op, exclude, keys), "PreDispatch")
                except Exception:  # an overload this torch cannot register a kernel for: not counted
                    continue
                ops.add(op)
        if skip_code is not None:
            # Dynamo's frame evaluator skips the kernels (one code object for all) and what they call,
            # as torch does for a dispatch mode's handler, checked in C at no cost per call.
            try:
                skip_code(_kernel(None, None, None, exclude, keys).__code__)
            except Exception:  # an API that changed: the kernels run as plain Python
                pass
        _library = library
        _include = include
        _exclude = exclude
        _pre_dispatch = key
        _is_included = torch._C._dispatch_tls_is_dispatch_key_included
        _exclude_keys = keys
        fake_key = torch._C._TorchDispatchModeKey.FAKE
        get_mode = torch._C._get_dispatch_mode
        _fake_mode = lambda: get_mode(fake_key)  # noqa: E731
        _hops = getattr(torch._ops, "_higher_order_ops", {})
        _ops = frozenset(ops)


def _kernel(op: Any, check: Any, raw: Any, exclude: Any, keys: Any) -> Callable[..., Any]:
    """The PreDispatch kernel of ``op``: count it for the thread's audits, then run it, unseen below."""

    # The seam's guard written out (see gpuprobe._seams.wrap): Dynamo skips this one code object, shared
    # by every kernel, which a replacement built from the seams' template would share with other seams.
    switch, fail = SEAM_KERNELS.switch, SEAM_KERNELS.fail

    def kernel(*args: Any, **kwargs: Any) -> Any:
        audits = getattr(_local, "audits", None)
        if audits and switch.on:
            try:
                # Not under a fake-tensor mode (Dynamo tracing a graph, shape propagation): nothing runs.
                if (check is None or check(args, kwargs)) and _fake_mode() is None:
                    for audit in audits:
                        audit.hit(op)
            except Exception as exc:  # gpuprobe's own failure: the audit is off, the operator runs
                fail(exc)
        # From the top again with the key excluded: the operator runs as without the audit, and what
        # it runs inside (nonzero inside index, copy_ inside _to_copy) is not counted a second time.
        with exclude(keys):
            return raw(*args, **kwargs)

    return kernel


class SyncAudit:
    """Counts synchronising operators on this thread by ``where`` (see the module docstring) while entered.

    Entered and exited on one thread, innermost first; audits nest (a probe with ``sync_audit=True``
    inside an audited step): each counts what runs while it is entered.
    """

    __slots__ = ("where", "counts", "sites", "_guard", "_unsettled")

    def __init__(self, sites: SyncSites) -> None:
        self.where: Where = ("other", None)
        self.counts: dict[tuple[Where, Any], int] = {}
        self.sites = sites
        self._guard: Any = None
        # (where, op) whose sightings so far were all expected: their next few hits are looked at too, so
        # that a sync of the user's behind one of transformers' (same component and operator) is found
        self._unsettled: set[tuple[Where, Any]] = set()

    def __enter__(self) -> SyncAudit:
        audits = getattr(_local, "audits", None)
        if audits is None:
            audits = _local.audits = []
        if not audits and _is_included(_pre_dispatch):
            raise RuntimeError("pre-dispatch tracing (torch.export) is underway on this thread")
        if len(_hops) != _hops_seen:
            _let_hops_through()
        if not SEAM_KERNELS.switch.on:  # switched off after a failure of its own: this audit counts nothing
            return self
        guard = _include(_pre_dispatch)
        guard.__enter__()
        self._guard = guard
        audits.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        audits = _local.audits
        if audits and audits[-1] is self:
            audits.pop()
        elif self in audits:
            audits.remove(self)
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.__exit__(None, None, None)

    def hit(self, func: Any) -> None:
        key = (self.where, func)
        n = self.counts.get(key)
        if n is None:
            self.counts[key] = 1
            self._sight(key, func)
        else:
            self.counts[key] = n + 1
            if n < _RECHECKS and key in self._unsettled:
                self._sight(key, func)

    def _sight(self, key: tuple[Where, Any], func: Any) -> None:
        try:
            if self.sites.seen(self.where, op_name(func)):
                self._unsettled.discard(key)
            else:
                self._unsettled.add(key)
        except Exception:  # reporting a site must never break the operator
            pass


def _let_hops_through() -> None:
    """Give each higher-order operator (cond, flex_attention, ...) a PreDispatch kernel that passes it on.

    An ATen operator passes through PreDispatch in C++ (the key's fallback redispatches to the next
    one), but a higher-order operator dispatches in Python and raises at a key it has no kernel for.
    The kernel added does what the fallback does: the operator again, PreDispatch excluded. Only
    operators without one get it, and torch.export's pre-dispatch tracing is untouched: its modes are
    served before the kernel is looked up.
    """
    global _hops_seen
    with _build_lock:
        for hop in list(_hops.values()):
            try:
                if _pre_dispatch in hop.py_kernels:
                    continue
                hop.py_impl(_pre_dispatch)(_hop_kernel(hop))
            except Exception as exc:
                # A higher-order operator without a kernel would raise at PreDispatch inside an audit: the
                # audit is switched off instead (no thread includes the key any more).
                SEAM_KERNELS.fail(exc)
                continue
        _hops_seen = len(_hops)


def _hop_kernel(hop: Any) -> Callable[..., Any]:
    exclude, keys = _exclude, _exclude_keys

    def passed_on(*args: Any, **kwargs: Any) -> Any:
        with exclude(keys):
            return hop(*args, **kwargs)

    return passed_on


def active() -> SyncAudit | None:
    """The innermost audit entered on this thread, or None."""
    audits = getattr(_local, "audits", None)
    return audits[-1] if audits else None


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
        torch_file = getattr(sys.modules.get("torch"), "__file__", None)
        if torch_file:
            dirs.append(os.path.dirname(os.path.abspath(torch_file)))
        _skip_dirs = tuple(d + os.sep for d in dirs)
        tr_file = getattr(sys.modules.get("transformers"), "__file__", None)
        if tr_file:
            _transformers_dir = os.path.dirname(os.path.abspath(tr_file)) + os.sep
    return _skip_dirs, _transformers_dir


def new_audit(sites: SyncSites) -> SyncAudit:
    """A fresh audit counting into its ``counts`` under ``where`` (not entered yet)."""
    if _ops is None:
        _build()
    return SyncAudit(sites)


def source_line() -> tuple[str, str | None]:
    """``file:line`` of the nearest frame outside torch, transformers and gpuprobe ("?" if none), and
    ``file:line`` of the innermost transformers frame passed on the way there (None if none)."""
    skip, tr = _library_dirs()
    frame: Any = sys._getframe(1)
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
        self._seen: set[tuple[tuple[str, str | None, str], bool]] = set()  # (component, processor, op), expected
        self.recent: deque[dict[str, str]] = deque(maxlen=keep)
        self._limit = limit
        self._lock = threading.Lock()

    def seen(self, where: Where, op: str) -> bool:
        """Called from inside an audit when a step sees ``(where, op)``; new ones are reported. Returns whether
        there is nothing more to learn of it (the user's sighting is known), False while only transformers'
        own sightings are.

        A sync that transformers' own code runs (the stop check, ``masking_utils``, its streamer's copy: the
        operator ran inside transformers, below the user's ``generate()`` line) is *expected*: kept with
        ``"expected": True``, counted as any other, and not warned about, since the user cannot change it.
        One in a logits processor or stopping criterion is the user's whoever wrote the class: they passed it.
        """
        key = (where[0], where[1], op)
        if len(self._seen) >= self._limit:
            return True
        theirs = where[0] in USERS_COMPONENTS
        if (key, False) in self._seen:
            return True
        # A key seen only as expected walks the stack again at its hits in each audited step (the first
        # _RECHECKS), to find a sync of the user's under the same key: medians of 24-35 us a walk on the busy
        # 2-core test CPU, two a step for a tiny Llama's generate() (the stop check, masking_utils), against
        # the ~1.3 ms an audited step costs.
        site, via = source_line()
        expected = via is not None and not theirs
        with self._lock:
            if (key, expected) in self._seen:
                return not expected
            self._seen.add((key, expected))
            entry: dict[str, Any] = {"component": where[0], "op": op, "source": site}
            if where[1] is not None:
                entry["processor"] = where[1]
            if via is not None:
                entry["via"] = via
            if expected:
                entry["expected"] = True
            self.recent.append(entry)
        if expected:
            return False
        who = where[0] if where[1] is None else f"{where[0]} {where[1]}"
        inside = f" (inside transformers at {via})" if via is not None else ""
        try:
            # a leaf table; read on a first sighting only
            from ._remedies import FACTORY_EXAMPLE, FACTORY_WORDS, variant_for_sync_site

            variant = variant_for_sync_site(where[0], where[1])
            measure = (f"; gpuprobe try {FACTORY_EXAMPLE} --variants {variant} measures the run without it "
                       f"({FACTORY_WORDS})" if variant else "")
            self._warn(f"sync:{key}", f"gpuprobe: sync audit: {op} in {who} forces a device-to-host "
                                      f"synchronisation on an accelerator, at {site}{inside}{measure}")
        except Exception:  # warnings turned into errors (-W error): telemetry never raises into the program
            pass
        return True

    def only_expected(self) -> frozenset[tuple[str, str | None, str]]:
        """The ``(component, processor, op)`` seen so far whose every sighting was expected (transformers'
        own, see :meth:`seen`); a key the user's code ran too is not among them.

        Example:
            >>> sites = SyncSites(lambda key, message: None)
            >>> sites.only_expected()
            frozenset()
        """
        with self._lock:
            kept = list(self._seen)
        users = {key for key, expected in kept if not expected}
        return frozenset(key for key, expected in kept if expected and key not in users)

    def clear(self) -> None:
        """Forget every site (reset)."""
        with self._lock:
            self._seen.clear()
            self.recent.clear()

    def reset_after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()


def flush(audit: Any, child_for: Callable[[Where, str], Any], records: Any) -> None:
    """Append ``(series.apply, count)`` for each ``(where, op)`` the audit counted; empty its counts.

    Args:
        mode: an audit made by :func:`new_audit`, already exited.
        child_for: ``(where, op name) -> series.apply`` (prepared and cached by the caller).
        records: the thread's record deque.
    """
    counts = audit.counts
    if not counts:
        return
    for (where, func), n in counts.items():
        records.append((child_for(where, op_name(func)), n))
    audit.counts = {}
