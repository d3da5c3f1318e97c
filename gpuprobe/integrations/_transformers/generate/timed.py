"""Logits processors and stopping criteria timed inside a step: stand-ins in transformers' lists, for one call.

Each element of the lists transformers builds for a call (``_get_logits_processor``,
``_get_stopping_criteria``) is replaced by a stand-in for the call's length: a logits processor's time
goes to its own series (``processor`` label) and the step's processor time, a stopping criterion's to
the ``stopping_criteria`` component. Their seams are declared in :mod:`.seams`.
"""

from __future__ import annotations

import inspect
import types
from time import perf_counter_ns
from typing import Any

from .... import _seams
from ..series import StepSeries
from .call import Call
from .seams import SEAM_CRITERION, SEAM_PROCESSOR

__all__ = ["Timed", "TimedCriterion", "ElementTiming"]


class Timed:
    """Stands in for one logits processor or stopping criterion in the list transformers built for a call.

    The list is transformers' own object and its own ``__call__`` runs as written (a list subclass
    too); only its elements are these stand-ins, for the length of the call (:meth:`~.state.ModelState.end_call`
    puts the originals back). A stand-in looks like what it holds: ``isinstance`` (through
    ``__class__``), attributes, copies and pickles are the element's, and ``inspect.signature`` of its
    ``__call__`` is the element's (transformers reads it to decide which keywords to pass).
    """

    __slots__ = ("_gp_inner", "_gp_state", "_gp_name", "_gp_child")
    _gp_seam: _seams.Seam = SEAM_PROCESSOR

    def __init__(self, inner: Any, state: Any, name: str, child: Any) -> None:
        object.__setattr__(self, "_gp_inner", inner)
        object.__setattr__(self, "_gp_state", state)
        object.__setattr__(self, "_gp_name", name)
        object.__setattr__(self, "_gp_child", child)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The seam's guard written out (see gpuprobe._seams.wrap), and its bookkeeping inline: one Python
        # call per element and step (the template's replacement and hooks would be four: +3 per element).
        # The element runs exactly once; gpuprobe's own failure switches the seam off.
        inner = self._gp_inner
        state = self._gp_state
        ctx = getattr(state.tls, "ctx", None)
        seam = self._gp_seam
        if ctx is None or not ctx.step_open or not seam.switch.on:
            return inner(*args, **kwargs)
        mark: Any = None
        try:
            nv = ctx.nv
            if nv is not None:
                nv.push(state.nvtx(nv, self._gp_message, self._gp_kind, ctx.step))
                if self._gp_detail:
                    nv.push(state.nvtx(nv, self._gp_name, "stopping_criterion", ctx.step))
            marks = ctx.marks
            if marks is not None:
                mark = marks.begin(self._gp_where, self._gp_range)
            t0 = perf_counter_ns()
        except Exception as exc:
            seam.fail(exc)
            return inner(*args, **kwargs)
        try:
            result = inner(*args, **kwargs)
        except BaseException:
            try:
                if mark is not None:
                    marks.end(mark)
                if nv is not None:
                    nv.pop()
                    if self._gp_detail:
                        nv.pop()
            except Exception as exc:
                seam.fail(exc)
            raise
        try:
            dt = perf_counter_ns() - t0
            if mark is not None:
                marks.end(mark)
            if nv is not None:
                nv.pop()
                if self._gp_detail:
                    nv.pop()
            child = self._gp_child
            if child is not None:  # a logits processor: its own series, and the step's processor time
                ctx.records.append((child, dt))
                ctx.counted_ns += dt
            else:  # a stopping criterion: the stopping_criteria component
                ctx.criteria_ns = (ctx.criteria_ns if ctx.criteria_ns > 0 else 0) + dt
        except Exception as exc:
            seam.fail(exc)
        return result

    # What each kind of element is and where its time goes.
    _gp_kind = "logits_processor"
    _gp_detail = False  # a range of the element's class inside its own range (stopping criteria)

    @property
    def _gp_message(self) -> str:  # the NVTX range: the processor's class
        return self._gp_name

    @property
    def _gp_where(self) -> tuple[str, str]:
        return ("logits_processor", self._gp_name)

    @property
    def _gp_range(self) -> str:
        return self._gp_name

    # -- looking like the element ------------------------------------------------------------------
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(stand_in, TopKLogitsWarper) is True
        return type(self._gp_inner)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_gp_"):
            raise AttributeError(name)
        return getattr(self._gp_inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._gp_inner, name, value)

    def __reduce_ex__(self, protocol: Any) -> Any:  # copies and pickles are of the element itself
        return self._gp_inner.__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return repr(self._gp_inner)


class TimedCriterion(Timed):
    """A stopping criterion's stand-in: its time joins the ``stopping_criteria`` component."""

    __slots__ = ()
    _gp_seam = SEAM_CRITERION
    _gp_kind = "component"
    _gp_message = "stopping_criteria"  # the NVTX range of the component (ncu/nsys filters name it)
    # Inside it, a range of the criterion's class: without it a step showed two identical
    # "stopping_criteria" ranges (max length and EOS) on a timeline.
    _gp_detail = True

    @property
    def _gp_where(self) -> tuple[str, str]:
        return ("stopping_criteria", self._gp_name)

    @property
    def _gp_range(self) -> str:
        return "stopping_criteria/" + self._gp_name


_stand_in_types: dict[tuple[type, type], type] = {}


def _stand_in_type(base: type, element_type: type) -> type:
    """A stand-in class for elements of ``element_type`` whose ``__call__`` has the element's signature.

    transformers decides which keywords to pass an element from ``inspect.signature(element.__call__)``;
    the stand-in's ``__call__`` carries ``__wrapped__`` = the element class's ``__call__``, which
    ``inspect`` follows. One class per element class (bounded like the processor series).
    """
    key = (base, element_type)
    cls = _stand_in_types.get(key)
    if cls is None:
        impl = base.__call__
        call = types.FunctionType(impl.__code__, impl.__globals__, "__call__", impl.__defaults__, impl.__closure__)
        call.__wrapped__ = element_type.__call__  # type: ignore[attr-defined]
        try:
            # Why the signature itself, read once per class: transformers reads it for every element on
            # every step, and a ready __signature__ is found at once (1.5 us) where following
            # __wrapped__ parses the element's parameters again (14.6 us, against 12.8 us for the
            # element itself; test CPU).
            call.__signature__ = inspect.signature(element_type.__call__)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        call.__qualname__ = f"{element_type.__qualname__}.__call__"
        cls = type(base.__name__, (base,), {"__slots__": (), "__call__": call, "__module__": base.__module__})
        if len(_stand_in_types) < 1000:
            _stand_in_types[key] = cls
    return cls


def _untime_elements(lst: list[Any]) -> None:
    for i, element in enumerate(lst):
        if issubclass(type(element), Timed):
            lst[i] = element._gp_inner


class ElementTiming:
    """Putting the stand-ins in place, for :class:`~.state.ModelState` (which holds the series)."""

    step_series: StepSeries
    processors: dict[Any, tuple[Any, str]]
    criteria: dict[Any, tuple[Any, str]]

    def element_info(self, element: Any, criterion: bool) -> tuple[Any, str]:
        """Series (logits processors only) and name of one logits processor or stopping criterion,
        cached per class (a plain function or partial: per object, named by its code)."""
        key: Any = type(element)
        if key.__name__ in ("function", "method", "partial"):
            key = element
        cache = self.criteria if criterion else self.processors
        info = cache.get(key)
        if info is None:
            name = None
            if key is element:
                name = (getattr(element, "__qualname__", None)
                        or getattr(getattr(element, "func", None), "__qualname__", None))
            name = name or type(element).__name__
            child = None if criterion else self.step_series.component("logits_processor", processor=name)
            info = (child, name)
            if len(cache) < 1000:
                cache[key] = info
        return info

    def untime_elements(self, lst: Any) -> None:
        """Put the elements of ``lst`` back for a while (a speculative call's candidate generator copies them:
        its draft model merges them with its own by their type, which a stand-in's is not)."""
        if isinstance(lst, list):
            _untime_elements(lst)

    def time_elements(self, lst: Any, ctx: Call, criterion: bool) -> None:
        """Put stand-ins in place of the elements of ``lst`` (transformers' list for this call); the call's
        end puts the elements back."""
        if not isinstance(lst, list) or not lst:
            return
        base = TimedCriterion if criterion else Timed
        swapped = False
        for i, element in enumerate(lst):
            if isinstance(type(element), type) and issubclass(type(element), Timed):
                continue  # already timed (a list built once and passed again)
            child, name = self.element_info(element, criterion)
            lst[i] = _stand_in_type(base, type(element))(element, self, name, child)
            swapped = True
        if swapped:
            ctx.undo.append(lambda: _untime_elements(lst))
