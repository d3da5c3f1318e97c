"""The requests of continuous batching: what gpuprobe keeps of each while it runs, and its samples.

Per request (by its id, never a label): its arrival is the request's ``created_time``; its queue
time runs to the end of the step preparation that first scheduled it; its first token is there
when the update that produced it ends; its duration ends when its output is delivered.
Its inter-token latency: one sample per output token after its first, the time since its previous
token reached the host (the end of the update that produced it; the last one: its delivery), so its
samples add up to its duration less its TTFT, waits between its steps included.
A request preempted (offloaded to the CPU or restarted) and scheduled again keeps its arrival and
first token, and its wait shows in the inter-token sample of its next token.

A request's device TTFT and inter-token latency on a GPU: see :mod:`.loop` ("Latencies on a GPU").

Each request ends with its record (:class:`gpuprobe._requests.RequestRecord`), made when its last output
is delivered from what was kept of it while it ran. Its share of the steps it took part in
(``step_time_s``, ``kv_block_seconds``, ``interference_s``) is each step's time split among the requests
the step carried (:class:`StepShares`), a record target applied off the loop thread when the runtime
drains (on a GPU: once the GPU has reached the step's events); the record's fields fill in then.

:class:`RequestTracking` is a part of :class:`~.loop.Loop` (a base class: no Python call is added).
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from time import perf_counter_ns
from typing import Any

from .... import is_enabled
from ...._requests import RequestRecord, clean_request_id, median_and_max, now_wall, sampled_gaps, take_parent
from ....runtime import Runtime
from ....timing import DeviceClock
from ..compat import ends_with_eos, max_new_tokens, output_fields, waiting_or_running
from ...kit import time_per_output_token_ns

__all__ = ["Req", "FirstSpan", "RequestTracking", "StepShares", "StepSpan", "STEP_SPANS_EVERY", "perf_ns"]


class Req:
    """What gpuprobe keeps of one request while it runs (never exported: no id or text is a label)."""

    __slots__ = ("state", "arrival", "first", "span", "tok_t", "tokens", "selecting", "ended", "scheduled", "gaps",
                 "steps", "resolved", "share_ns", "kv_ns", "interference_ns", "preemptions", "prefilled",
                 "prefill_steps", "blocks", "record", "device_ns", "step_links")

    def __init__(self, state: Any, arrival: int) -> None:
        self.state = state  # the RequestState first scheduled (its end-of-sequence ids)
        self.arrival = arrival  # perf_counter_ns of its creation
        self.first = 0  # perf_counter_ns of its first token on the host; 0: none yet
        self.span: FirstSpan | None = None  # on a GPU, until its first token: its device TTFT's events
        self.tok_t = 0  # perf_counter_ns its latest output token reached the host
        self.tokens = 0  # its output tokens on the host so far (the inter-token samples: one per token after the first)
        self.selecting = 0  # forwards scheduled so far that select a token for it
        self.ended = False  # its output was delivered: its last token is counted
        self.scheduled = 0  # perf_counter_ns its first scheduling ended (its queue time ends there)
        self.gaps: list[int] = []  # its inter-token gaps on the host (the record's median and longest)
        self.steps = 0  # steps that carried it (each one StepShares it waits for)
        self.resolved = 0  # of those, the ones whose time is known and split
        self.share_ns = 0.0  # its share of those steps' time
        self.kv_ns = 0  # KV-cache blocks it held in each of those steps × the step's time
        self.interference_ns = 0  # time of those steps that carried another request's prefill
        self.preemptions = 0  # times it was taken off the GPU (offloaded or restarted)
        self.prefilled = 0  # prompt tokens its forwards processed (a prompt's shared prefix is not processed)
        self.prefill_steps: list[int] = []  # the steps that carried its prefill (their indices)
        self.blocks = 0  # KV-cache blocks it held at its latest step
        self.record: RequestRecord | None = None  # once it ended, its record (the shares fill it in)
        self.device_ns = -1  # on a GPU, the device time of the steps that carried it (-1: none read)
        self.step_links: list[tuple[str, str]] = []  # traces on: (trace id, span id) of the step spans of its prompt


class StepShares:
    """A step's time split among the requests it carried: a record target (``apply(ns)``), applied when
    the runtime drains, with the step's host time on a CPU and its device span on a GPU.

    ``rows``: ``(request, tokens in the step, its prompt tokens in the step, KV blocks it held)``. Each
    request gets ``ns × its tokens ÷ the step's tokens``, ``blocks × ns`` of block-time, and, when another
    request prefilled in the step, ``ns`` of interference. ``target``: the step's own series on the device
    clock (the shared device span), applied first.

    Why a target and not the split on the loop thread: the loop pays one object a step, the drain the
    per-request arithmetic.

    While traces are on, a step that carried a prompt (and one other step in :data:`STEP_SPANS_EVERY`)
    is also a span of its own (:meth:`traced`): its ids are given when it is split, each request it
    prefilled keeps a link to it, and the runtime's requests hand it to the trace exporter, which links it
    to the requests it carried once they have ended.
    """

    __slots__ = ("rows", "prefills", "target", "trace")

    def __init__(self, rows: list[tuple[Req, int, int, int]], prefills: int, target: Any = None) -> None:
        self.rows = rows
        self.prefills = prefills  # requests with prompt tokens in the step
        self.target = target
        # (requests log, index, start ns, host ns, phase, the step's host-clock duration series)
        self.trace: tuple[Any, int, int, int, int, Any] | None = None

    def traced(self, log: Any, index: int, start_ns: int, host_ns: int, phase: int, series: Any = None) -> None:
        """Make the step a span too (``start_ns``: ``perf_counter_ns`` of its start; ``series``: the step
        duration series its host time fed, whose bucket the span becomes the exemplar of)."""
        self.trace = (log, index, start_ns, host_ns, phase, series)

    def apply(self, ns: int) -> None:
        device = self.target is not None
        if device:
            self.target.apply(ns)
        prefills = self.prefills
        tokens = 0
        for row in self.rows:
            tokens += row[1]
        tokens = tokens or 1
        link = self._step_span(ns if device else None, tokens) if self.trace is not None else None
        for req, q, pre, blocks in self.rows:
            if device:
                req.device_ns = ns if req.device_ns < 0 else req.device_ns + ns
            req.share_ns += ns * q / tokens
            req.kv_ns += blocks * ns
            if prefills > (1 if pre else 0):
                req.interference_ns += ns
            if link is not None and pre and len(req.step_links) < 16:
                req.step_links.append(link)
            req.resolved += 1
            if req.record is not None and req.resolved >= req.steps:
                fill_shares(req)

    def _step_span(self, device_ns: int | None, tokens: int) -> tuple[str, str]:
        """The step as a span: its ids, and its figures to the trace exporter (via the runtime's requests)."""
        log, index, start_ns, host_ns, phase, series = self.trace  # type: ignore[misc]
        rand = _random.getrandbits
        step = StepSpan(trace_id=f"{rand(128):032x}", span_id=f"{rand(64):016x}", index=index,
                        start_ns=start_ns + (time.time_ns() - perf_counter_ns()), host_ns=host_ns,
                        device_ns=device_ns, phase=("prefill", "decode", "mixed")[phase], tokens=tokens,
                        prefill_tokens=sum(row[2] for row in self.rows), requests=[row[0] for row in self.rows],
                        series=series)
        log.step_ended(step)
        return step.trace_id, step.span_id


STEP_SPANS_EVERY = 16
"""While traces are on, a continuous-batching step is a span of its own when it carried a prompt, and one
in this many of the others."""

_random = random.Random(int.from_bytes(os.urandom(16), "little"))


class StepSpan:
    """A scheduler step as the trace exporter reads it: its ids, times, figures and the requests it carried
    (their records give the links, once they have ended)."""

    __slots__ = ("trace_id", "span_id", "index", "start_ns", "host_ns", "device_ns", "phase", "tokens",
                 "prefill_tokens", "requests", "series")

    def __init__(self, *, trace_id: str, span_id: str, index: int, start_ns: int, host_ns: int,
                 device_ns: int | None, phase: str, tokens: int, prefill_tokens: int, requests: list[Req],
                 series: Any = None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.index = index
        self.start_ns = start_ns  # wall clock (time.time_ns())
        self.host_ns = host_ns
        self.device_ns = device_ns
        self.phase = phase
        self.tokens = tokens
        self.prefill_tokens = prefill_tokens
        self.requests = requests
        self.series = series  # the step duration series (host clock) its span is an exemplar of, or None

    def links(self) -> tuple[list[tuple[str, str]], bool]:
        """The (trace id, span id) of the requests it carried that have ended with ids, and whether all have."""
        found = []
        done = True
        for req in self.requests:
            record = req.record
            if record is None or record.span_id is None:
                done = done and record is not None  # a request that ended without a span never will have one
                continue
            found.append((record.trace_id, record.span_id))
        return found, done


def fill_shares(req: Req) -> None:
    """Write a request's shares of its steps into its record (every step's time is known)."""
    record = req.record
    if record is None:
        return
    record.step_time_s = req.share_ns / 1e9
    record.kv_block_seconds = req.kv_ns / 1e9
    record.interference_s = req.interference_ns / 1e9
    if req.step_links:
        record.step_links = tuple(req.step_links)
    if req.device_ns >= 0:
        record.device_read(req.device_ns)
    record.pending = 0


class FirstSpan:
    """The device TTFT of requests a step admits: a record target, one sample per request.

    One span is shared by the requests whose first token the admitting step's forward selects; a
    request whose prompt goes on in later steps has one of its own. ``token`` is the start token while
    ``open`` (its event recorded as the admitting forward is launched, at host time ``launched``), then
    the pending pair once the forward that selected the first token has its end event; ``None`` once
    handed over or given back. ``waits``: per request whose first token reached the host, its wait on
    the host clock from its arrival to that launch, which each sample adds to the device span.
    """

    __slots__ = ("ttft", "token", "open", "launched", "waits")

    def __init__(self, ttft: Any) -> None:
        self.ttft = ttft
        self.token: Any = None
        self.open = False
        self.launched = 0
        self.waits: list[int] = []

    def apply(self, ns: int) -> None:
        ttft = self.ttft
        for wait in self.waits:
            ttft(wait + ns)

    def discard(self) -> None:
        """Give the events back without reading them (idempotent: several requests may share the span)."""
        token, self.token = self.token, None
        if token is None:
            return
        if self.open:
            self.open = False
            token[0].release(token[1])  # a start token: (pool, event)
        else:
            DeviceClock.discard(token)


def perf_ns(seconds: float) -> int:
    """A time of ``time.perf_counter()`` on the clock of ``perf_counter_ns()``."""
    # RequestState.created_time comes from time.perf_counter(), the clock of perf_counter_ns().
    return round(seconds * 1e9)


class RequestTracking:
    """The requests of one manager's loop, for :class:`~.loop.Loop` (which holds what is annotated here)."""

    serving: Any
    rt: Runtime
    records: Any
    live: dict[str, Req]
    inflight: deque[tuple[list[tuple[Req, Any]], list[FirstSpan] | None]]
    starting: list[FirstSpan] | None
    stopping: list[FirstSpan] | None
    cancelled: set[str]
    scheduler: Any
    failed_status: int
    prefix_sharing: bool

    def tokens_held(self, selected: list[tuple[Req, Any]], t: int) -> None:
        """An update ended at ``t``: the host holds the tokens of the forward whose requests were ``selected``.

        A request's first token gives its TTFT; each later one the time since its previous token
        reached the host, one sample per request and token (the inter-token latency that request saw,
        waits between steps and preemptions included). A request delivered in this update had its last
        token counted then (:meth:`finish`). Each forward selects one token per request it selects for:
        a request restarted after preemption prefills what it had generated again, and the token that
        restart selects is its next one.
        """
        records = self.records
        ttft = self.serving.request_series.ttft
        gaps: list[int] = []
        for req, state in selected:
            if req.ended:
                continue
            if req.first:
                gap = t - req.tok_t
                gaps.append(gap)
                req.gaps.append(gap)  # the record's median and longest gap (a C append: no Python call)
            elif state.generated_tokens:  # its first token came with this update
                req.first = t
                records.append((ttft, t - req.arrival))
                if req.span is not None:
                    self.landed(req)
            else:
                continue
            req.tokens += 1
            req.tok_t = t
        if gaps:
            # Why one record per update: for 8 requests a step, their samples as one list aggregated by
            # apply_many cost 0.57 us on this thread + 0.65 us at the drain, against 0.89 + 3.7 us for a
            # record each (64 requests: 16 + 6 against 62 + 64 us); a lone request pays 0.3 us more
            # (fastest of 15 rounds of 2,000 updates, test CPU).
            records.append((self.serving.inter_token, gaps))

    def landed(self, req: Req) -> None:
        """``req``'s first token reached the host: its wait until its first launch joins its device span."""
        span, req.span = req.span, None
        if span is None:
            return
        if span.open:  # no end event was recorded for it (device timing switched off meanwhile)
            span.discard()
        elif span.token is not None:  # ended by the forward of this token: handed over after its update
            span.waits.append(max(0, span.launched - req.arrival))

    @staticmethod
    def forget_span(req: Req) -> None:
        """``req`` is gone: a span only it still holds (open, its prompt unfinished) gives its events back;
        one that a forward ended is handed over or given back by that forward's update."""
        span, req.span = req.span, None
        if span is not None and span.open:
            span.discard()

    def hand_over(self, ended: list[FirstSpan]) -> None:
        """A batch's update is done: the spans its forward ended go to the runtime (read when the GPU is there)."""
        records = self.records
        pending = self.rt.pending.apply
        for span in ended:
            token = span.token
            if token is None or span.open:
                continue
            if span.waits:
                span.token = None
                records.append((pending, (span, token)))
            else:  # no request's first token came from it (undone, failed): nothing to read
                span.discard()

    def drop_spans(self) -> None:
        """Give back the events of every device TTFT span still held (the loop starts or ends)."""
        for _, ended in self.inflight:
            for span in ended or ():
                span.discard()
        for req in self.live.values():
            if req.span is not None:
                req.span.discard()
                req.span = None
        for spans in (self.starting, self.stopping):
            for span in spans or ():
                span.discard()
        self.starting = self.stopping = None

    def finish(self, output: Any) -> None:
        """A request's last output was delivered (finished or failed)."""
        rid, created, status, error, tokens, prompt_length = output_fields(output)
        if rid in self.cancelled or not is_enabled():
            return
        req = self.live.pop(rid, None)
        now = perf_counter_ns()
        arrival = req.arrival if req is not None else perf_ns(created)
        dur = max(0, now - arrival)
        serving = self.serving
        records = self.rt.thread_records()
        append = records.append
        if status == self.failed_status or error is not None:
            append((serving.req_failed, dur))
            append((serving.finished["failed"], 1))
            if req is not None:
                req.ended = True
                if req.span is not None:
                    self.forget_span(req)
            self.record_end(rid, req, now, dur, "error", prompt_length, len(tokens))
            return
        n_out = len(tokens)
        requests = serving.request_series
        append((requests.request_ok, dur))
        append((requests.usage_in, prompt_length))
        append((requests.usage_out, n_out))
        first = req.first if req is not None else 0
        if not first and n_out:  # finished by the update that produced its first token
            first = now
            append((requests.ttft, dur))
            if req is not None:
                req.first = now  # the update's own first-token check then counts it no second time
                if req.span is not None:
                    self.landed(req)
        elif req is not None and n_out > req.tokens:
            # Its last token, delivered now (the update's own check then counts it no second time): its
            # inter-token samples add up to its duration less its TTFT.
            append((serving.inter_token, [now - req.tok_t]))
            req.gaps.append(now - req.tok_t)
            req.tok_t = now
        if req is not None:
            req.ended = True
            if req.span is not None:
                self.forget_span(req)
        tpot = time_per_output_token_ns(now - first, n_out)
        if tpot is not None:
            append((requests.tpot, tpot))
        eos = ends_with_eos(req.state if req is not None else None, tokens)
        append((serving.finished["stop" if eos else "length"], 1))
        self.record_end(rid, req, now, dur, "eos" if eos else "length", prompt_length, n_out, first=first, tpot=tpot)

    def record_end(self, rid: Any, req: Req | None, now: int, dur: int, reason: str, prompt_length: int | None,
              n_out: int | None, first: int = 0, tpot: int | None = None) -> None:
        """A request ended: its record, to the runtime's requests (its shares follow as the steps are split)."""
        queue = req.scheduled - req.arrival if req is not None and req.scheduled else None
        ttft = first - req.arrival if req is not None and first else (dur if first else None)
        p50, longest = median_and_max(req.gaps) if req is not None else (None, None)
        sharing = self.prefix_sharing
        record_id = clean_request_id(rid) or ""
        traced = self.rt.requests.wants_parents
        exemplars: tuple[tuple[Any, str], ...] = ()
        if traced:  # the series it fed, for its span's exemplars (four attribute reads: no label lookup)
            serving = self.serving
            requests = serving.request_series
            failed = {"error": serving.req_failed, "cancelled": serving.req_cancelled}
            duration = failed.get(reason, requests.request_ok)
            exemplars = ((duration.__self__, "duration_s"), (requests.ttft.__self__, "ttft_s"),
                         (serving.queue.__self__, "queue_s"), (serving.inter_token.__self__, "itl_max_s"))
        record = RequestRecord(
            request_id=record_id, model=self.serving.model_name, duration_s=dur / 1e9,
            kind="continuous_batching", batch_size=1, input_tokens=prompt_length,
            output_tokens=n_out, finish_reason=reason,
            queue_s=None if queue is None else max(0, queue) / 1e9,
            prefill_s=None if req is None or not first or not req.scheduled else max(0, first - req.scheduled) / 1e9,
            ttft_s=None if ttft is None else ttft / 1e9,
            decode_s=None if req is None or not first else max(0, (req.tok_t if req.tok_t else first) - first) / 1e9,
            tpot_s=None if tpot is None else tpot / 1e9, itl_p50_s=p50, itl_max_s=longest,
            preemptions=req.preemptions if req is not None else None,
            cached_tokens=(max(0, (prompt_length or 0) - req.prefilled) if sharing and req is not None else None),
            started_at=now_wall() - dur / 1e9, ended_at=now_wall(),
            prefill_steps=tuple(req.prefill_steps) if req is not None else (),
            max_tokens=max_new_tokens(req.state) if req is not None else None,
            steps_sampled=sampled_gaps(req.gaps) if req is not None and traced else (),
            parent=take_parent(record_id), pending=1 if req is not None else 0, exemplar_series=exemplars,
        )
        if req is not None:
            req.record = record
            if req.resolved >= req.steps:
                fill_shares(req)
        if sharing and req is not None and prompt_length:
            records = self.rt.thread_records()
            records.append((self.serving.prefix_queries, 1))
            if record.cached_tokens:
                records.append((self.serving.prefix_hits, 1))
                records.append((self.serving.prefix_tokens, record.cached_tokens))
        self.rt.requests.add(record)

    def cancel(self, request_id: str) -> None:
        """The scheduler was told to cancel a request (the client went away)."""
        if request_id in self.cancelled or not is_enabled():
            return
        scheduler = self.scheduler
        if scheduler is None:
            return
        state = waiting_or_running(scheduler, request_id)
        if state is None:  # finished already, or unknown
            return
        self.cancelled.add(request_id)
        req = self.live.pop(request_id, None)
        if req is not None and req.span is not None:  # on the loop's thread (prepare_next_batch applies them)
            self.forget_span(req)
        arrival = req.arrival if req is not None else perf_ns(state.created_time)
        serving = self.serving
        records = self.rt.thread_records()
        now = perf_counter_ns()
        records.append((serving.req_cancelled, max(0, now - arrival)))
        records.append((serving.finished["cancelled"], 1))
        self.record_end(request_id, req, now, max(0, now - arrival), "cancelled", None, req.tokens if req else None,
                   first=req.first if req is not None else 0)
