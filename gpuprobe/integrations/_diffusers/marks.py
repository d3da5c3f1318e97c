"""Marks on the denoising steps that ask for them: component ranges for a trace, and the sync audit.

Most steps are neither traced nor audited; for them each component tests one attribute
(``call.marks is None``). A step is *marked* when, at its start,

- a profile window records it (the window's ``gpuprobe.step#N`` range is open on the advancing thread) or
  another torch.profiler session records the thread (the program's own): each step component (the
  denoiser, a ControlNet, the scheduler) becomes a ``record_function``-style range named after it
  (``denoiser``, ``scheduler``), inside the window's step range or, for the program's own profiler, a
  ``gpuprobe.step#N`` range of the step's own, so ``gpuprobe report`` finds the steps and their parts;
- and/or it is audited (``sync_audit=N``: step indexes divisible by N, not while Dynamo compiles nor while
  a CUDA graph capture is underway): a :mod:`gpuprobe._sync_audit` audit runs from the step's start to
  its end, each component sets its attribution while it runs, and the rest of the step counts as
  ``other``; the counts go to ``gpuprobe.diffusion.syncs{component, op}``.
"""

from __future__ import annotations

import sys
from typing import Any

from ... import _sync_audit
from ..._torch_caps import record_function_ops
from ...runtime import Runtime

__all__ = ["StepMarker", "StepMarks"]

_enter: Any = None
_exit: Any = None
_no_torch_function: Any = None


def _bind_ranges() -> None:
    global _enter, _exit, _no_torch_function
    ops = record_function_ops(sys.modules["torch"])
    _enter, _exit = ops.enter, ops.exit
    _no_torch_function = ops.no_torch_function


def _end_range(handle: Any) -> None:
    with _no_torch_function():
        _exit(handle)


class StepMarks:
    """What one marked step does: ranges (when traced) and the audit's attribution (when audited)."""

    __slots__ = ("ranges", "audit", "step")

    def __init__(self, ranges: bool, audit: Any) -> None:
        self.ranges = ranges
        self.audit = audit  # the entered sync audit, or None
        self.step: Any = None  # the step's own range (a profiler that is not a window's), until it closes

    def begin(self, component: str) -> tuple[Any, Any]:
        """Enter ``component`` (its range and attribution); pass the result to :meth:`end`."""
        audit = self.audit
        prev = None
        if audit is not None:
            prev = audit.where
            audit.where = (component, None)
        return prev, (_enter(component, None) if self.ranges else None)

    def end(self, mark: tuple[Any, Any]) -> None:
        prev, handle = mark
        if handle is not None:
            _end_range(handle)
        if prev is not None:
            self.audit.where = prev


class StepMarker:
    """Prepared once per instrumented pipeline: opens and closes the marks of its marked steps."""

    def __init__(self, rt: Runtime, model_name: str) -> None:
        self.rt = rt
        self.model_name = model_name
        self._syncs: dict[tuple[str, str], Any] = {}
        self._audited = rt.family("gpuprobe.diffusion.steps.audited").child(model=model_name).apply

    def open(self, traced: bool, audited: bool, step: int | None = None) -> StepMarks | None:
        """The marks of a step that starts now (None when neither could be set up); ``step``: its index when
        a profiler other than a window's records it (the step's own ``gpuprobe.step#<step>`` range)."""
        if step is not None:
            traced = True
        if traced and _enter is None:
            try:
                _bind_ranges()
            except Exception as exc:
                self.rt.warn_once("ranges", f"gpuprobe: component ranges are not available: {exc!r}")
                traced = False
                step = None
        audit = None
        if audited:
            try:
                audit = _sync_audit.new_audit(self.rt.sync_sites)
                audit.__enter__()
            except Exception as exc:
                self.rt.warn_once("sync_audit", f"gpuprobe: the sync audit could not start: {exc!r}")
                audit = None
        if not traced and audit is None:
            return None
        marks = StepMarks(traced, audit)
        if step is not None:
            # The name a window gives its steps (profiling.ProfileWindow): the report reads either trace alike.
            marks.step = _enter(f"gpuprobe.step#{step}", None)
        return marks

    def close(self, marks: StepMarks, records: Any) -> None:
        """Leave the audit and record its counts; end the step's own range."""
        audit = marks.audit
        if audit is not None:
            marks.audit = None
            audit.__exit__(None, None, None)
            records.append((self._audited, 1))
            _sync_audit.flush(audit, self._sync_child, records)
        handle, marks.step = marks.step, None
        if handle is not None:
            _end_range(handle)

    def _sync_child(self, where: _sync_audit.Where, op: str) -> Any:
        key = (where[0], op)
        found = self._syncs.get(key)
        if found is None:
            found = self.rt.family("gpuprobe.diffusion.syncs").child(
                model=self.model_name, component=where[0], op=op).apply
            if len(self._syncs) < 10_000:  # bounded: components are a fixed set, ops a fixed list
                self._syncs[key] = found
        return found
