"""Requests, one record each: what one ``generate()`` call or one continuous-batching request did, in
figures a user reads (TTFT, queue, prefill, decode, tokens, syncs, device time, its share of the GPU).

An integration makes a :class:`RequestRecord` when a request ends, from what it already recorded while
the request ran (never by work per token), and hands it to the runtime's :class:`RequestLog`, which keeps
the most recent ones (setting ``requests_kept``), gives them to whoever catches them
(:func:`catch_requests`), and tells the runtime's listeners (service-level goals, the trace exporter).
Requests still running are read from the integrations on demand (:meth:`RequestLog.in_flight`), for the
live table at ``/requests``.

No record carries prompt text or token ids: only counts, times and a request's id.

Example:
    >>> log = RequestLog(2)
    >>> for i in range(3):
    ...     log.add(RequestRecord(request_id=f"r{i}", model="tiny", duration_s=0.1))
    >>> [r.request_id for r in log.finished()]
    ['r1', 'r2']
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["RequestRecord", "RequestLog", "Caught", "catch_requests", "new_request_id", "clean_request_id",
           "current_request_id", "FINISH_REASONS", "MAX_REQUEST_ID"]

FINISH_REASONS = ("length", "eos", "stop", "cancelled", "error")
"""Why a request ended: its token limit, an end-of-sequence token, another stopping criterion (or a stop
string), the client went away, or it failed."""

MAX_REQUEST_ID = 128
"""Characters of a request id kept; a longer one is cut (ids come from clients: nothing of theirs grows
gpuprobe's memory, and none is ever a metric label)."""


# slots: a record is made right after a request's last step, when little of the interpreter's state is in the
# CPU's caches; there, with no instance dict, making one cost ~25 µs instead of ~36 (medians of 2,000 one-token
# generate() calls, 2-core VM; 0.6 µs either way in a warm loop).
@dataclasses.dataclass(eq=False, slots=True)
class RequestRecord:
    """What one request did. Times in seconds; ``None`` where the figure cannot be known (never a guess).

    Attributes:
        request_id: the client's ``x-request-id`` under a server, else one gpuprobe made (process-unique).
        model: the model's name (as in the metrics).
        kind: ``generate`` (one ``generate()`` call; a batch is one request) or ``continuous_batching``.
        batch_size: sequences the request generated (``generate()``: rows × ``num_return_sequences``; 1
            under continuous batching).
        input_tokens: prompt tokens (all rows).
        output_tokens: tokens generated per sequence.
        finish_reason: one of :data:`FINISH_REASONS`.
        error: the exception's type when ``finish_reason`` is ``error``.
        queue_s: from arrival to first being scheduled (continuous batching; ``None`` for ``generate()``,
            which has no queue).
        prefill_s: from being scheduled (``generate()``: called) to the first token on the host.
        ttft_s: time to first token: ``queue_s`` + ``prefill_s``.
        decode_s: from the first token to the last on the host.
        duration_s: from arrival (``generate()``: the call) to the end (the call returned, the output
            was delivered).
        tpot_s: time per output token after the first: (``duration_s`` − ``ttft_s``) ÷ (tokens − 1).
        itl_p50_s, itl_max_s: the median and the longest gap between two of its tokens on the host.
        host_syncs: device-to-host syncs the sync audit counted in its audited steps (``None`` when the
            audit is off or audited none of its steps).
        device_s: on a GPU, its steps' time on the device (``None`` on a CPU, and until the GPU has
            reached the events).
        step_time_s: continuous batching: its share of every scheduler step it took part in, each step's
            time split by the tokens each request had in it (the device clock on a GPU, else the host's).
        kv_block_seconds: continuous batching: KV-cache blocks it held × the time of the steps it held
            them in.
        cached_tokens: continuous batching: prompt tokens read from blocks shared with earlier requests
            (``None`` where transformers' prefix sharing is off).
        preemptions: continuous batching: times it was taken off the GPU and scheduled again.
        interference_s: continuous batching: time in steps that also carried another request's prefill.
        started_at, ended_at: wall-clock times (``time.time()``) of its arrival and end.
        prefill_steps: continuous batching: the steps that carried its prefill (their indices; for links
            between request and step records).
        max_tokens, temperature, top_p, top_k: what the request asked for, where set.
        steps_sampled: a few of its token gaps as ``(token index, seconds, seconds since its first token)``:
            the first four, then every k-th, at most 16 (a trace's step events).
        trace_id, span_id: its span, when traces are on (hex; the caller's trace when it joined one).
        step_links: continuous batching, traces on: ``(trace id, span id)`` of the step spans that carried
            its prompt (at most 16).
        capture: an on-demand capture that recorded some of its steps (its trace file), if any.
    """

    request_id: str
    model: str
    duration_s: float
    kind: str = "generate"
    batch_size: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    tpot_s: float | None = None
    itl_p50_s: float | None = None
    itl_max_s: float | None = None
    host_syncs: int | None = None
    device_s: float | None = None
    step_time_s: float | None = None
    kv_block_seconds: float | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None
    interference_s: float | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    prefill_steps: tuple[int, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    steps_sampled: tuple[tuple[int, float, float], ...] = ()
    trace_id: str | None = None
    span_id: str | None = None
    capture: str | None = None
    step_links: tuple[tuple[str, str], ...] = ()
    #: The span context of the caller's span (OpenTelemetry), that its own span is a child of; not exported.
    parent: Any = dataclasses.field(default=None, repr=False, compare=False)
    #: Figures still to come (a GPU's device time, continuous batching's shares): 0 once all are in.
    pending: int = dataclasses.field(default=0, repr=False, compare=False)
    #: Traces on: the histogram series the request fed, each with the name of the field holding the value it
    #: fed them (``(series, "ttft_s")``); its span becomes their exemplar for that value. Set by the
    #: integration, prepared once per model; not exported.
    exemplar_series: tuple[tuple[Any, str], ...] = dataclasses.field(default=(), repr=False, compare=False)

    def device_read(self, ns: int) -> None:
        """The GPU reached the request's last step: its device time is ``ns``."""
        self.device_s = ns / 1e9
        self.pending = 0

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (JSON-ready).

        Example:
            >>> RequestRecord(request_id="r1", model="tiny", duration_s=0.5).as_dict()["duration_s"]
            0.5
        """
        return {f.name: (_plain(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self) if f.name not in _NOT_EXPORTED}

    def server_timing(self) -> str:
        """The record as an HTTP ``Server-Timing`` header value (milliseconds; what is unknown left out).

        Example:
            >>> RequestRecord(request_id="r", model="m", duration_s=0.25, ttft_s=0.05).server_timing()
            'ttft;dur=50.0, total;dur=250.0'
        """
        parts = []
        for name, value in (("queue", self.queue_s), ("prefill", self.prefill_s), ("ttft", self.ttft_s),
                            ("decode", self.decode_s), ("total", self.duration_s)):
            if value is not None:
                parts.append(f"{name};dur={value * 1e3:.1f}")
        return ", ".join(parts)


_NOT_EXPORTED = frozenset({"parent", "pending", "exemplar_series"})


def _plain(value: tuple[Any, ...]) -> list[Any]:
    return [list(v) if isinstance(v, tuple) else v for v in value]


def sampled_gaps(gaps: list[int], first: int = 4, most: int = 16) -> tuple[tuple[int, float, float], ...]:
    """A few of a request's token gaps (ns) as ``(index, seconds, seconds since the first token)``: the first
    ``first``, then every k-th, at most ``most`` in all.

    Example:
        >>> [i for i, *_ in sampled_gaps(list(range(100)), first=2, most=6)]
        [0, 1, 25, 50, 75]
    """
    n = len(gaps)
    if not n:
        return ()
    since = list(itertools.accumulate(gaps))  # C: the whole sum costs less than a Python loop over a few
    if n <= most:  # all of them, without a generator's frame
        return tuple(zip(range(n), [g / 1e9 for g in gaps], [s / 1e9 for s in since]))
    k = -(-n // (most - first))
    picked = list(range(first)) + [i for i in range(k, n, k) if i >= first]
    return tuple([(i, gaps[i] / 1e9, since[i] / 1e9) for i in picked[:most]])


def median_and_max(values: list[int]) -> tuple[float | None, float | None]:
    """The median (lower middle of an even count) and the largest of ``values`` (ns), in seconds.

    Example:
        >>> median_and_max([3_000_000, 1_000_000, 2_000_000])
        (0.002, 0.003)
    """
    if not values:
        return None, None
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] / 1e9, ordered[-1] / 1e9


# -- request ids -----------------------------------------------------------------------------------------

_ids = itertools.count(1)
_id_prefix = f"{os.getpid():x}"


def new_request_id() -> str:
    """A request id unique in this process (and, with its pid prefix, among processes on a machine).

    Example:
        >>> new_request_id() != new_request_id()
        True
    """
    return f"{_id_prefix}-{next(_ids)}"


def clean_request_id(raw: Any) -> str | None:
    """A client's request id as gpuprobe keeps it: printable ASCII only (others replaced by ``?``), cut to
    :data:`MAX_REQUEST_ID` characters; None for none or an empty one.

    Example:
        >>> clean_request_id("abc\\r\\nSet-Cookie: x")
        'abc??Set-Cookie: x'
        >>> len(clean_request_id("x" * 10_000))
        128
    """
    if raw is None:
        return None
    text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    text = text[: MAX_REQUEST_ID]
    text = "".join(c if " " <= c <= "~" else "?" for c in text).strip()
    return text or None


_given_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpuprobe_request_id", default=None)
_catchers: contextvars.ContextVar[tuple[Caught, ...]] = contextvars.ContextVar("gpuprobe_caught_requests",
                                                                                 default=())


_parents: dict[str, Any] = {}  # request id -> the caller's span context, for requests made on another thread
_MAX_PARENTS = 4096


def current_parent() -> Any:
    """The span context of the caller's current OpenTelemetry span, if OpenTelemetry is in use and one is
    recording; None otherwise (never imports OpenTelemetry)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        context = trace.get_current_span().get_span_context()
    except Exception:
        return None
    return context if context.is_valid else None


def remember_parent(request_id: str, span_context: Any) -> None:
    """A server's seam: the request ``request_id`` (made on another thread, as continuous batching's are)
    joins the trace of ``span_context`` (bounded: the oldest are forgotten past 4,096 waiting)."""
    if len(_parents) >= _MAX_PARENTS:
        _parents.pop(next(iter(_parents)), None)
    _parents[request_id] = span_context


def take_parent(request_id: str | None) -> Any:
    """The span context remembered for ``request_id`` (then forgotten), or None."""
    return _parents.pop(request_id, None) if request_id is not None and _parents else None


def current_request_id() -> str | None:
    """The request id the caller's context names (:func:`catch_requests`, a server's ``x-request-id``)."""
    return _given_id.get()


class Caught(list):  # type: ignore[type-arg]
    """The records :func:`catch_requests` caught, oldest first (a list of :class:`RequestRecord`)."""

    def add(self, record: RequestRecord, most: int | None) -> None:
        """Keep ``record``, and at most ``most`` records (the oldest go first; None: no bound)."""
        self.append(record)
        if most is not None and len(self) > most:
            del self[: len(self) - most]

    @property
    def record(self) -> RequestRecord:
        """The one record caught (the last, if several).

        Raises:
            LookupError: no request ended inside the block.
        """
        if not self:
            raise LookupError("no request ended inside catch_requests(): was generate() called in the block, on "
                              "this thread (or a task or thread started from it), with an instrumented model?")
        return self[-1]


@contextlib.contextmanager
def catch_requests(request_id: str | None = None) -> Iterator[Caught]:
    """Catch the records of the requests that end inside the block, on this thread and what it starts
    with a copy of its context (``asyncio`` tasks, ``asyncio.to_thread``).

    Args:
        request_id: the id the requests made inside the block get (cleaned as a client's id is:
            printable ASCII, at most 128 characters); by default each gets one of its own.

    Yields:
        A list that fills as requests end (:attr:`Caught.record`: the one request), holding at most as
        many as ``requests_kept`` (the newest).

    Example:
        >>> import gpuprobe
        >>> with gpuprobe.catch_requests(request_id="demo-1") as caught:
        ...     pass   # model.generate(...) with an instrumented model
        >>> list(caught)
        []
    """
    caught = Caught()
    token_catch = _catchers.set((*_catchers.get(), caught))
    token_id = _given_id.set(clean_request_id(request_id)) if request_id is not None else None
    try:
        yield caught
    finally:
        _catchers.reset(token_catch)
        if token_id is not None:
            _given_id.reset(token_id)


@contextlib.contextmanager
def given_request_id(request_id: str | None) -> Iterator[None]:
    """Requests made in the block take ``request_id`` (a server's seam: the client's ``x-request-id``)."""
    token = _given_id.set(request_id)
    try:
        yield
    finally:
        _given_id.reset(token)


# -- the log -------------------------------------------------------------------------------------------

InFlight = Callable[[], list[dict[str, Any]]]


class RequestLog:
    """The runtime's requests: the most recent finished ones, the listeners told of each, and the
    sources of those still running.

    Args:
        kept: how many finished records are kept (the ``requests_kept`` setting; 0 keeps none).
    """

    def __init__(self, kept: int) -> None:
        self._finished: deque[RequestRecord] = deque(maxlen=kept)
        self._listeners: tuple[Callable[[RequestRecord], None], ...] = ()
        self._step_listeners: tuple[Callable[[Any], None], ...] = ()
        self._sources: list[weakref.ref[Any]] = []
        self._lock = threading.Lock()
        self.ended = 0  # records added so far (the table says how many it no longer shows)
        #: Integrations note the caller's span context on each request while this is true (traces are on).
        self.wants_parents = False
        #: ``find_capture(start, end)``: the trace of an on-demand capture that recorded some of that time (set
        #: by the runtime's on-demand captures), else None.
        self.find_capture: Callable[[float, float], str | None] | None = None
        self._parent_wanted = 0

    def resize(self, kept: int) -> None:
        """Keep ``kept`` records from now on (the newest of those kept so far stay)."""
        with self._lock:
            if kept != self._finished.maxlen:
                self._finished = deque(self._finished, maxlen=kept)

    def add(self, record: RequestRecord) -> None:
        """A request ended: keep its record, give it to the blocks catching it, tell the listeners.
        Never raises (a listener's failure is its own)."""
        self._finished.append(record)
        self.ended += 1
        for caught in _catchers.get():
            caught.add(record, self._finished.maxlen)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # pragma: no cover - listeners guard themselves; this keeps the request's path safe
                pass

    def finished(self) -> list[RequestRecord]:
        """The kept records, oldest first."""
        return list(self._finished)

    def find(self, request_id: str) -> RequestRecord | None:
        """The newest kept record with this id."""
        for record in reversed(self._finished):
            if record.request_id == request_id:
                return record
        return None

    def add_listener(self, listener: Callable[[RequestRecord], None]) -> None:
        """Call ``listener(record)`` for every request that ends from now on (on the request's thread:
        it must be quick and must not raise)."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[RequestRecord], None]) -> None:
        with self._lock:
            self._listeners = tuple(f for f in self._listeners if f != listener)

    def want_parents(self, on: bool) -> None:
        """A trace exporter starts (or stops) wanting each request's caller span context."""
        with self._lock:
            self._parent_wanted = max(0, self._parent_wanted + (1 if on else -1))
            self.wants_parents = self._parent_wanted > 0

    def add_step_listener(self, listener: Callable[[Any], None]) -> None:
        """Call ``listener(step)`` for each scheduler step made a span (traces on); on the draining thread."""
        with self._lock:
            self._step_listeners = (*self._step_listeners, listener)

    def remove_step_listener(self, listener: Callable[[Any], None]) -> None:
        with self._lock:
            self._step_listeners = tuple(f for f in self._step_listeners if f != listener)

    def step_ended(self, step: Any) -> None:
        """A scheduler step that is a span of its own was split (never raises)."""
        for listener in self._step_listeners:
            try:
                listener(step)
            except Exception:  # pragma: no cover - listeners guard themselves
                pass

    def add_source(self, source: Any) -> None:
        """``source.in_flight()`` lists requests still running (held weakly: a source that is gone is dropped)."""
        with self._lock:
            self._sources = [r for r in self._sources if r() is not None and r() is not source]
            self._sources.append(weakref.ref(source))

    def in_flight(self) -> list[dict[str, Any]]:
        """Requests running now, from every source (oldest first); a source that fails is left out."""
        with self._lock:
            sources = [r() for r in self._sources]
        rows: list[dict[str, Any]] = []
        for source in sources:
            if source is None:
                continue
            try:
                rows.extend(source.in_flight())
            except Exception:  # a source racing its own end: its rows are missing from this reading
                continue
        rows.sort(key=lambda row: -row.get("age_s", 0.0))
        return rows

    def clear(self) -> None:
        """Forget every finished record (a reset); sources and listeners stay."""
        self._finished.clear()
        self.ended = 0


#: Wall-clock seconds (``time.time()``), the records' ``started_at`` / ``ended_at`` clock. The C function
#: itself, not a Python function calling it: one frame fewer on every finished request.
now_wall: Callable[[], float] = time.time
