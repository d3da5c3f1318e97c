"""Marks on the steps that ask for them: step and component ranges for a trace, and the sync audit.

Most steps are neither traced nor audited; for them the seams test one attribute (``ctx.marks is
None``) per component call. A step is *marked* when, at its start,

- a profile window records it (the window marks the step on the advancing thread,
  :meth:`gpuprobe._steps.StepClock.traced`): each component becomes a ``record_function``-style range
  inside the window's ``gpuprobe.step#N`` range, so the kineto trace attributes CPU operators, kernels
  and syncs to it. Range names: ``forward``, the logits processor's class name (the ``processor``
  label and NVTX message), ``stopping_criteria/<criterion class>``, ``streamer``;
- or any other torch.profiler session records on the advancing thread (the program's own
  ``torch.profiler.profile()``): the step gets the same component ranges inside a
  ``gpuprobe.step#N`` range of its own (a window's step already has one: never two), so
  ``gpuprobe report`` of that trace finds the same steps and components. The kernel sampler's short
  sessions are not among them (:meth:`gpuprobe._steps.StepClock.sampled`): nobody reads their ranges;
- and/or it is audited (``sync_audit=N``: step indexes divisible by N, not while Dynamo compiles the
  forward nor while a CUDA graph capture is underway): a :mod:`gpuprobe._sync_audit` audit is
  entered from the step's start to its end, and each component sets the audit's attribution
  (``component``, ``processor``) while it runs; everything else in the step counts as ``other``.

Nothing here runs on an unmarked step.
"""

from __future__ import annotations

import sys
from typing import Any

from .... import _sync_audit
from ...._torch_caps import record_function_ops
from ....runtime import Runtime
from ..compat import stock_criteria_call
from ...kit import MODEL_LABEL

__all__ = ["StepMarker", "StepMarks"]

FORWARD: _sync_audit.Where = ("forward", None)
STREAMER: _sync_audit.Where = ("streamer", None)

_enter: Any = None
_exit: Any = None
_no_torch_function: Any = None


def _bind_ranges() -> None:
    global _enter, _exit, _no_torch_function
    torch = sys.modules["torch"]
    # Why the profiler's ops and not torch.profiler.record_function: the same USER_SCOPE range (a
    # `user_annotation` in the trace, which `gpuprobe report` reads as a range) without the context
    # manager's object and CUPTI-monitor checks; enter + exit cost 5.2 us against 6.9 us under a kineto
    # CPU trace on the test CPU. torch's _RecordFunctionFast (0.8 us) makes a `cpu_op` event, not a range.
    ops = record_function_ops(torch)
    _enter, _exit = ops.enter, ops.exit
    # As record_function does: exiting with __torch_function__ handling on costs ~2x.
    _no_torch_function = ops.no_torch_function


def _end_range(handle: Any) -> None:
    with _no_torch_function():
        _exit(handle)


class StepMarks:
    """What one marked step does: ranges (when traced) and the audit's attribution (when audited)."""

    __slots__ = ("ranges", "audit", "fwd", "step")

    def __init__(self, ranges: bool, audit: Any) -> None:
        self.ranges = ranges
        self.audit = audit  # the entered sync audit, or None
        self.fwd: Any = None  # the forward's mark while it runs (it spans two seams)
        self.step: Any = None  # the step's own range (a profiler that is not a window's), until it closes

    def begin(self, where: _sync_audit.Where, name: str) -> tuple[Any, Any]:
        """Enter the component ``where`` (range ``name``); pass the result to :meth:`end`."""
        audit = self.audit
        prev = None
        if audit is not None:
            prev = audit.where
            audit.where = where
        return prev, (_enter(name, None) if self.ranges else None)

    def end(self, mark: tuple[Any, Any]) -> None:
        prev, handle = mark
        if handle is not None:
            _end_range(handle)
        if prev is not None:
            self.audit.where = prev

    def begin_forward(self) -> None:
        if self.fwd is None:
            self.fwd = self.begin(FORWARD, "forward")

    def end_forward(self) -> None:
        mark, self.fwd = self.fwd, None
        if mark is not None:
            self.end(mark)

    def call_criteria(self, criteria: Any, base: type, input_ids: Any, scores: Any, kwargs: dict[str, Any]) -> Any:
        """``StoppingCriteriaList.__call__`` with each criterion marked as ``stopping_criteria/<class>``.

        transformers' own loop, run here for marked steps only; a list class with its own ``__call__``
        is marked as one ``stopping_criteria/<list class>``.
        """
        if base.__call__ is not stock_criteria_call():
            name = type(criteria).__name__
            mark = self.begin(("stopping_criteria", name), "stopping_criteria/" + name)
            try:
                return base.__call__(criteria, input_ids, scores, **kwargs)
            finally:
                self.end(mark)
        torch = sys.modules["torch"]
        is_done = torch.full((input_ids.shape[0],), False, device=input_ids.device, dtype=torch.bool)
        for criterion in criteria:
            name = type(criterion).__name__
            mark = self.begin(("stopping_criteria", name), "stopping_criteria/" + name)
            try:
                is_done = is_done | criterion(input_ids, scores, **kwargs)
            finally:
                self.end(mark)
        return is_done


class StepMarker:
    """Prepared once per instrumented model: opens and closes the marks of its marked steps."""

    def __init__(self, rt: Runtime, model_name: str) -> None:
        self.rt = rt
        self.model_name = model_name
        self._syncs: dict[tuple[_sync_audit.Where, str], Any] = {}
        self._audited = rt.family("gpuprobe.step.audited").child(model=model_name).apply

    def open(self, traced: bool, audited: bool, step: int | None = None) -> StepMarks | None:
        """The marks of a step that starts now (None when neither could be set up).

        Args:
            traced: a profile window records the step (its ``gpuprobe.step#N`` range is open).
            audited: the sync audit counts the step.
            step: the step's index when a profiler other than a window's records it: the step's own
                ``gpuprobe.step#<step>`` range opens here and :meth:`close` ends it.
        """
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
            # The name a window gives its steps (profiling.ProfileWindow), so the report's default
            # step pattern and its component attribution read either trace alike.
            marks.step = _enter(f"gpuprobe.step#{step}", None)
        return marks

    def close(self, marks: StepMarks, records: Any) -> int:
        """End what the step left open (its forward, after a failure), leave the audit, record its counts,
        end the step's own range. Returns the syncs the audit counted in the step (-1: not audited)."""
        marks.end_forward()
        audit = marks.audit
        syncs = -1
        if audit is not None:
            marks.audit = None
            audit.__exit__(None, None, None)
            records.append((self._audited, 1))
            syncs = sum(audit.counts.values())
            _sync_audit.flush(audit, self._sync_child, records)
        handle, marks.step = marks.step, None
        if handle is not None:
            _end_range(handle)
        return syncs

    def _sync_child(self, where: _sync_audit.Where, op: str) -> Any:
        key = (where, op)
        found = self._syncs.get(key)
        if found is None:
            labels = {MODEL_LABEL: self.model_name, "component": where[0], "op": op}
            if where[1] is not None:
                labels["processor"] = where[1]
            found = self.rt.family("gpuprobe.step.syncs").child(**labels).apply
            # Bounded like the processor cache: class names come from code, ops from a fixed list.
            if len(self._syncs) < 10_000:
                self._syncs[key] = found
        return found
