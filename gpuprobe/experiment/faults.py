"""MODEL's own errors told apart from gpuprobe's: what failed, where in the user's code, and what was measured.

An exception raised by the user's folder, factory, model or ``generate()`` call is a fault of MODEL:
:class:`ModelFailed` carries a :class:`Fault` (which variant, which round, the exception, the user's
file and line) and the rounds measured before it. Any other exception is gpuprobe's own. Where an
exception was raised decides: inside gpuprobe's package (or code gpuprobe generated) it is gpuprobe's.

Example:
    >>> try:
    ...     int("many")
    ... except ValueError as exc:
    ...     fault = Fault.of(exc, "the factory")
    >>> fault.error_type, fault.message
    ('ValueError', "invalid literal for int() with base 10: 'many'")
"""

from __future__ import annotations

import dataclasses
import os
import site
import sysconfig
import traceback
from typing import Any

from gpuprobe.errors import GpuprobeError

__all__ = ["Fault", "ModelFailed", "CallFailed", "is_gpuprobes", "user_frame"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GENERATED = "<gpuprobe"  # the file name of the code gpuprobe compiles (wrappers, seams)


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    try:
        roots.add(site.getusersitepackages())
    except AttributeError:  # site without user packages (an embedded interpreter)
        pass
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots if r)


_LIBRARIES = _library_roots()


def _ours(filename: str) -> bool:
    return filename.startswith(_GENERATED) or os.path.abspath(filename).startswith(os.path.join(_PACKAGE, ""))


def is_gpuprobes(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside gpuprobe's own code (its innermost frame is gpuprobe's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and _ours(frames[-1].filename)


def user_frame(exc: BaseException) -> str | None:
    """Where in the user's own code ``exc`` was raised: ``file:line, in function`` of the innermost frame that
    is neither gpuprobe's nor an installed library's (torch, transformers, the standard library); None if none.

    A syntax error names the line it is on.
    """
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{exc.filename}:{exc.lineno}"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if name.startswith("<") or _ours(name) or os.path.abspath(name).startswith(_LIBRARIES):
            continue
        return f"{name}:{frame.lineno}, in {frame.name}"
    return None


@dataclasses.dataclass(frozen=True)
class Fault:
    """An error of MODEL: what was running, the exception, and where in the user's code it was raised.

    Attributes:
        what: what was running, in words (``the baseline's call in round 3``, ``loading MODEL 'tiny'``).
        error_type: the exception's class name.
        message: the exception's message, on one line.
        where: the user's file and line (``mine.py:14, in forward``), a damaged file of a model folder, or None.
        variant: the variant whose call raised (``baseline``), or None outside a call.
        workload: the workload it ran (``prompt 6 tokens × batch 1, 2 new tokens``), or None.
        round: the round the call was in (1 = the first), or None outside the rounds.
    """

    what: str
    error_type: str
    message: str
    where: str | None = None
    variant: str | None = None
    workload: str | None = None
    round: int | None = None

    @classmethod
    def of(cls, exc: BaseException, what: str, *, where: str | None = None, variant: str | None = None,
           workload: str | None = None, round: int | None = None) -> Fault:
        """The fault of ``exc``, raised while ``what`` ran; ``where`` defaults to :func:`user_frame`."""
        return cls(what=what, error_type=type(exc).__name__, message=" ".join(str(exc).split())[:500],
                   where=where if where is not None else user_frame(exc), variant=variant, workload=workload,
                   round=round)

    @property
    def text(self) -> str:
        """One line: ``the baseline's call in round 3 (WORKLOAD) raised RuntimeError: ... (at mine.py:14, in forward)``."""
        head = self.what + (f" ({self.workload})" if self.workload else "")
        error = self.error_type + (f": {self.message}" if self.message else "")
        return f"{head} raised {error}" + (f" (at {self.where})" if self.where else "")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "text": self.text}


class ModelFailed(GpuprobeError):
    """MODEL's own code raised (its folder, factory, model or ``generate()``): bad input, not gpuprobe's error.

    Attributes:
        fault: what failed and where.
        partial: the experiment as far as it went, a :class:`~gpuprobe.experiment.TryResult` (the rounds
            measured before the fault; the fault in its ``fault``), or None when no round was measured.
        workload: the failing workload's rounds before the fault (a
            :class:`~gpuprobe.experiment.WorkloadResult`, or None), of which :attr:`partial` is made.
    """

    # typed Any: the results import this module (TryResult.fault), and a cycle is not allowed even for types
    def __init__(self, fault: Fault, partial: Any = None, workload: Any = None) -> None:
        super().__init__(fault.text)
        self.fault = fault
        self.partial = partial
        self.workload = workload


class CallFailed(Exception):
    """A call of MODEL (``generate()``, or the variant's generate function) raised ``error``; raised by the meter
    around the call alone, so that what gpuprobe does before and after it is never taken for MODEL's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error

    def fault(self, what: str, *, variant: str, workload: str, round: int | None = None) -> Fault:
        return Fault.of(self.error, what, variant=variant, workload=workload, round=round)

    @property
    def text(self) -> str:
        """The error on one line, with where in the user's code: ``RuntimeError: ... (at mine.py:14, in forward)``."""
        where = user_frame(self.error)
        return (f"{type(self.error).__name__}: {' '.join(str(self.error).split())[:300]}"
                + (f" (at {where})" if where else ""))
