"""Service-level goals: each finished request counted as having met them or by the first one it missed.

The settings ``slo_ttft``, ``slo_tpot`` and ``slo_e2e`` name the goals (a request's time to first token,
time per output token and whole duration, each at most its goal). When one is set,
:func:`start_from_settings` (run by :mod:`gpuprobe._autostart`) adds a :class:`SloCounter` to the
runtime's request listeners: each request's record, as it ends, counts one in ``gpuprobe.requests.slo``
with ``result`` ``met``, or the first goal it missed (``ttft``, ``tpot``, ``e2e``), or ``error`` (it
failed). Goodput is ``met`` ÷ all. A cancelled request (the client went away) is not counted: it says
nothing about the server. A goal whose figure a request does not have (the time per output token of a
one-token answer) does not apply to it.

The listener runs on the request's thread: it appends one record to that thread's buffer (no lock, no
aggregation there; the runtime applies it at its next drain).

Example:
    >>> from gpuprobe._requests import RequestRecord
    >>> goals = Goals(ttft=0.25, tpot=None, e2e=2.0)
    >>> goals.judge(RequestRecord(request_id="r", model="m", duration_s=1.0, ttft_s=0.1))
    'met'
    >>> goals.judge(RequestRecord(request_id="r", model="m", duration_s=3.0, ttft_s=0.5))
    'ttft'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._requests import RequestRecord
from .config import Config
from .runtime import Runtime

__all__ = ["RESULTS", "Goals", "SloCounter", "start_from_settings"]

RESULTS = ("met", "ttft", "tpot", "e2e", "error")
"""``result`` of ``gpuprobe.requests.slo``: every goal met, the first goal missed (in this order), or failed."""

_MODELS_KEPT = 256  # models whose prepared series are kept (more: looked up each time, still bounded by the cap)


@dataclasses.dataclass(frozen=True)
class Goals:
    """The service-level goals, in seconds; None where no goal is set.

    Example:
        >>> Goals(ttft=None, tpot=0.05, e2e=None).judge(
        ...     RequestRecord(request_id="r", model="m", duration_s=1.0, tpot_s=0.08))
        'tpot'
    """

    ttft: float | None
    tpot: float | None
    e2e: float | None

    @classmethod
    def from_settings(cls, cfg: Config) -> Goals:
        """The goals the settings name."""
        return cls(ttft=cfg.slo_ttft, tpot=cfg.slo_tpot, e2e=cfg.slo_e2e)

    @property
    def any(self) -> bool:
        """At least one goal is set."""
        return self.ttft is not None or self.tpot is not None or self.e2e is not None

    def judge(self, record: RequestRecord) -> str | None:
        """The request's result (one of :data:`RESULTS`), or None for a request not counted (cancelled).

        Example:
            >>> Goals(ttft=0.25, tpot=None, e2e=None).judge(
            ...     RequestRecord(request_id="r", model="m", duration_s=1.0, finish_reason="error"))
            'error'
        """
        reason = record.finish_reason
        if reason == "cancelled":
            return None
        if reason == "error" or record.error is not None:
            return "error"
        ttft, tpot, e2e = self.ttft, self.tpot, self.e2e
        if ttft is not None and record.ttft_s is not None and record.ttft_s > ttft:
            return "ttft"
        if tpot is not None and record.tpot_s is not None and record.tpot_s > tpot:
            return "tpot"
        if e2e is not None and record.duration_s > e2e:
            return "e2e"
        return "met"


class SloCounter:
    """The request listener that counts ``gpuprobe.requests.slo`` (see the module docstring).

    Args:
        rt: the runtime whose buffers and series it records to.
        goals: the goals requests are judged by.
    """

    def __init__(self, rt: Runtime, goals: Goals) -> None:
        self.rt = rt
        self.goals = goals
        self._family = rt.family("gpuprobe.requests.slo")
        self._series: dict[str, dict[str, Any]] = {}  # model -> result -> apply of its series

    def series(self, model: str) -> dict[str, Any]:
        """The ``apply`` of each result's series of ``model``: all five made at its first request, so the
        misses read 0 (not "no data") and a rate counts the first one."""
        found = self._series.get(model)
        if found is None:
            family = self._family
            found = {result: family.child(model=model, result=result).apply for result in RESULTS}
            if len(self._series) < _MODELS_KEPT:
                self._series[model] = found
        return found

    def __call__(self, record: RequestRecord) -> None:
        """Count ``record`` (on the request's thread; never raises)."""
        try:
            result = self.goals.judge(record)
            if result is None:
                return
            # Why appended and not applied: the request's thread takes no lock here; the drain aggregates.
            self.rt.thread_records().append((self.series(record.model)[result], 1))
        except Exception as exc:  # gpuprobe's failure never reaches the request
            self.rt.warn_once("slo", f"gpuprobe: a request could not be counted against its goals: {exc!r}")


class _Listening:
    """Closing it takes the counter off the runtime's request listeners (a reconfiguration starts anew)."""

    def __init__(self, rt: Runtime, counter: SloCounter) -> None:
        self._rt, self._counter = rt, counter

    def close(self) -> None:
        self._rt.requests.remove_listener(self._counter)


def start_from_settings(rt: Runtime) -> SloCounter | None:
    """Count requests against the goals of ``rt.settings`` from now on (owned by the settings); None
    when no goal is set."""
    goals = Goals.from_settings(rt.settings)
    if not goals.any:
        return None
    counter = SloCounter(rt, goals)
    rt.requests.add_listener(counter)
    rt.add_closeable(_Listening(rt, counter), owner="settings")
    return counter
