"""One manager's generation loop: its scheduler steps, the paged KV cache's gauges, device spans.

A step is one turn of the loop that ran a forward: from the start of ``prepare_next_batch`` to the
end of ``update_batch``, so ``schedule + forward + update`` tile it. With asynchronous batching
(CUDA graphs) the update of a turn is that of the previous batch; a turn is still one step.
Counted per model: the gauges (running, waiting, the KV cache) are read at the end of each preparation
(the loop also prepares every 0.1 s while idle) and written only when they change. The memory gauges
(allocated, reserved, peak) are read as ``generate()`` reads them: at the end of one step in
``memory_every`` and when the loop ends, on the devices of the model.

Latencies on a GPU (``docs/serving.md``, "Latencies and their clocks"): a step's device span is that
of its forward (CUDA events on the processor's compute stream), and it is the device inter-token
latency of each request whose next (not first) token that forward selects. A request's device TTFT
is its wait before its first forward is launched, on the host clock (no work of it is on the GPU
before then), plus the device time from an event recorded at that launch to an event recorded after
the forward that selected its first token.
The requests a step admits and whose first token that same forward selects share one pair of events;
a request whose prompt is split over steps has its own. The record waits for the update that hands
the token to the host, which confirms that the forward's token was the request's first.

The hot path only appends ``(series.apply, value)`` records to the loop thread's buffer; the
runtime aggregates them off the loop. Nothing here waits for the device: CUDA events are read later
by the runtime, when the GPU has reached them.
"""

from __future__ import annotations

import weakref
from collections import deque
from time import perf_counter_ns
from typing import Any

from .... import _seams, is_enabled
from ...._requests import clean_request_id as clean
from ....timing import DeviceClock
from ..compat import (
    fits,
    output_ended,
    page_tokens,
    paged_cache_geometry,
    prefix_sharing_on,
    processor_parts,
    processor_placement,
    request_counts,
    running_ids,
    scheduled_rows,
    used_blocks,
    waiting_arrivals,
)
from .requests import STEP_SPANS_EVERY, FirstSpan, Req, RequestTracking, StepShares, perf_ns
from .seams import PROCESSOR, PROCESSOR_HOOKS, SCHEDULER, SEAM_CANCEL, SEAM_OFFLOAD, SEAM_PREPARE, install_hooks

__all__ = ["Loop"]


class Loop(RequestTracking):
    """One manager's generation loop: the requests it runs, the open step, the last gauges written."""

    def __init__(self, serving: Any) -> None:
        self.serving = serving
        self.rt = serving.rt
        self.live: dict[str, Req] = {}
        # Per batch until its update: the first-token candidates, and the device TTFT spans its forward ended.
        self.inflight: deque[tuple[list[tuple[Req, Any]], list[FirstSpan] | None]] = deque()
        self.starting: list[FirstSpan] | None = None  # spans the open step's forward launch starts
        self.stopping: list[FirstSpan] | None = None  # spans its forward's end stops
        self.cancelled: set[str] = set()
        self.scheduled: list[Any] | None = None
        self.scheduler: Any = None
        self.cache: Any = None
        self.allocators: list[tuple[int, int, Any]] = []  # (pool index, bytes per block, ledger)
        self.last: tuple[int, int, int] | None = None
        self.records: Any = None
        self.open = False
        self.stepping = False
        self.step_t0 = self.sched_ns = self.fwd_ns = 0
        self.phase = 0
        self.next_tokens = 0  # requests whose next token (after their first) the open step's forward selects
        self.device: int | None = None  # CUDA device of the model, else None (no device spans)
        self.stream: Any = None  # the processor's compute stream
        self.dev_tok: Any = None
        self.attached: weakref.ref[Any] | None = None
        self.finished_status = serving.finished_status
        self.failed_status = serving.failed_status
        self.read_output: Any = None  # the routers' and scheduler's ArgReaders, made when observed
        self.read_outputs: Any = None
        self.read_cancel: Any = None
        self.rows: list[tuple[Req, int, int, int]] = []  # the open step's requests: (req, tokens, prompt tokens, blocks)
        self.prefills = 0  # requests with prompt tokens in the open step
        self.prefix_sharing = False  # transformers shares prompt prefixes' blocks among requests
        self.page = 0  # tokens per block of the paged cache
        self.index = 0  # the open step's index (the runtime's step count)
        self.memory = serving.memory  # the model's memory gauges (None: not read)
        self.memory_every = max(1, serving.memory_every)
        self.memory_on: tuple[int, ...] = ()  # the CUDA devices they are read on (none: the process's memory)
        self.rt.requests.add_source(self)  # its running requests, for /requests

    # -- the batch processor ---------------------------------------------------------------------
    def attach(self, bp: Any) -> None:
        """Put the step seams (:data:`~.seams.PROCESSOR_HOOKS`) on a batch processor and its scheduler and
        offloader (once per processor; a processor kept for the next session is only bound again)."""
        if self.attached is not None and self.attached() is bp:
            self._bind(bp)
            return
        scheduler, cache, offloader = processor_parts(bp)
        if not (fits(bp, PROCESSOR) and fits(scheduler, SCHEDULER)):
            return
        if cache is None:
            SEAM_PREPARE.refuse(f"{type(bp).__qualname__} has no cache attribute")
            return
        self.attached = weakref.ref(bp)
        self._bind(bp)
        self.read_cancel = _seams.ArgReader(scheduler.set_request_cancellation, SEAM_CANCEL.reads)
        if offloader is not None and not fits(offloader, (SEAM_OFFLOAD,)):
            offloader = None
        # Every seam runs transformers' own method once, untouched (gpuprobe._seams.wrap); what gpuprobe
        # does around it is in the hooks below, whose failure switches continuous-batching telemetry off.
        install_hooks(self.serving._install, {"processor": bp, "scheduler": scheduler, "offloader": offloader},
                      self, PROCESSOR_HOOKS)

    # -- the hooks (named in seams.MANAGER_HOOKS and seams.PROCESSOR_HOOKS) -------------------------
    def processor_created(self, token: None, bp: Any, error: BaseException | None) -> None:
        if error is None:
            self.attach(bp)

    def loop_begins(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.begin()

    def loop_ends(self, token: None, result: Any, error: BaseException | None) -> None:
        self.end()

    # Recorded before the output is handed over, so a client that has its answer finds it counted.
    def deliver(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        output = self.read_output.get(args, kwargs, "output")
        if output_ended(output, self.finished_status):
            self.finish(output)

    def deliver_batch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        finished = self.finished_status
        for output in self.read_outputs.get(args, kwargs, "outputs"):
            if output_ended(output, finished):
                self.finish(output)

    def prepare_before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        if not is_enabled():
            return None
        t0 = perf_counter_ns()
        if self.open:  # the first turn of asynchronous batching has no update
            self.close_step(t0, 0)
        if self.cancelled:
            self.cancelled.clear()
        self.scheduled = None
        return t0

    def prepare_after(self, t0: int | None, ok: Any, error: BaseException | None) -> None:
        if t0 is None or error is not None:
            return
        t1 = perf_counter_ns()
        self.records = records = self.rt.thread_records()
        self.gauges(records)
        if ok and self.scheduled:
            self.open_step(records, t0, t1)
        elif self.stepping:  # idle again: what a step hook opened for this thread can close
            self.stepping = False
            self.rt.steps_done()

    def batch_scheduled(self, token: None, out: Any, error: BaseException | None) -> None:
        if error is None:
            self.scheduled = out[0]

    def step_before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.open:
            return None
        clock = self.rt.backends.device_clock if self.device is not None else None
        t0 = perf_counter_ns()
        tok = self._device_start(clock, t0) if clock is not None else None
        return (t0, clock, tok)

    def step_after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        t0, clock, tok = token
        if error is not None:
            if tok is not None:  # the events go back to their pool (open spans: when the loop ends)
                clock.discard(self._device_stop(clock, tok, None))
            return
        if clock is not None:
            self.dev_tok = self._device_stop(clock, tok, self.stopping)
        self.fwd_ns = perf_counter_ns() - t0

    def update_before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        if not self.open and not self.inflight:
            return None
        return perf_counter_ns()

    def update_after(self, t0: int | None, result: Any, error: BaseException | None) -> None:
        if t0 is None or error is not None:
            return
        t1 = perf_counter_ns()
        selected, ended = self.inflight.popleft() if self.inflight else ((), None)
        if selected:
            self.tokens_held(selected, t1)
        if ended:
            self.hand_over(ended)
        if self.open:
            self.close_step(t1, t1 - t0)

    # Why this seam and not scheduler.clear_cancelled_requests: that one runs on every step (one more
    # Python frame, ~0.15 us), this one only when a client goes away.
    def cancel_before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.read_cancel.get(args, kwargs, "request_id")

    def cancel_after(self, request_id: Any, result: Any, error: BaseException | None) -> None:
        if error is None:
            self.cancel(request_id)

    def offload_before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> frozenset[Any]:
        scheduler = self.scheduler
        return running_ids(scheduler) if scheduler is not None else frozenset()

    def offload_after(self, before: frozenset[Any], result: Any, error: BaseException | None) -> None:
        scheduler = self.scheduler
        evicted = before - running_ids(scheduler) if scheduler is not None else frozenset()
        if evicted:
            self.rt.thread_records().append((self.serving.preempted, len(evicted)))
            live = self.live
            for rid in evicted:
                req = live.get(rid)
                if req is not None:
                    req.preemptions += 1

    def _bind(self, bp: Any) -> None:
        """Hold the processor's scheduler and cache while its loop runs (:meth:`release` lets go)."""
        self.scheduler, self.cache, _ = processor_parts(bp)
        self.allocators, self.total_bytes, self.num_blocks = paged_cache_geometry(self.cache)
        self.device, self.stream = processor_placement(bp)
        self.prefix_sharing = prefix_sharing_on(self.cache)
        self.page = page_tokens(self.cache)
        self.memory_on = self.serving.memory_devices(self.device)
        self.rt.thread_records().append((self.serving.kv_total, self.num_blocks))

    def release(self) -> None:
        """Let go of the processor's parts, so they (and the KV cache) are freed when transformers drops it."""
        self.scheduler = self.cache = self.stream = self.scheduled = None
        self.allocators = []

    def _device_start(self, clock: Any, t: int) -> Any:
        # The forward runs on the processor's compute stream: the events go there too.
        if self.stream is None:
            return self._start(clock, t)
        import torch

        with torch.cuda.stream(self.stream):
            return self._start(clock, t)

    def _start(self, clock: Any, t: int) -> Any:
        """The step's start event, then one for each device TTFT span its launch starts (no work between)."""
        tok = clock.start(self.device)
        starting = self.starting
        if starting:
            self.starting = None
            for span in starting:
                span.token = clock.start(self.device)
                span.open = span.token is not None
                span.launched = t
        return tok

    def _device_stop(self, clock: Any, tok: Any, stopping: list[FirstSpan] | None) -> Any:
        if self.stream is None:
            return self._stop(clock, tok, stopping)
        import torch

        with torch.cuda.stream(self.stream):
            return self._stop(clock, tok, stopping)

    def _stop(self, clock: Any, tok: Any, stopping: list[FirstSpan] | None) -> Any:
        """The step's end event, then one for each device TTFT span whose first token this forward selected."""
        pending = clock.stop(tok) if tok is not None else None
        if stopping:
            self.stopping = None
            for span in stopping:
                if span.open:
                    span.open = False
                    span.token = clock.stop(span.token)
        return pending

    # -- the requests running, for /requests --------------------------------------------------------
    def in_flight(self) -> list[dict[str, Any]]:
        """The requests this loop runs and those waiting for it: state, age, tokens, blocks (never text)."""
        now = perf_counter_ns()
        model = self.serving.model_name
        rows = []
        for rid, req in list(self.live.items()):
            if req.ended:
                continue
            age = max(0, now - req.arrival) / 1e9
            since = (now - req.first) / 1e9 if req.first else 0.0
            rows.append({"request_id": clean(rid), "model": model, "kind": "continuous_batching",
                         "state": "decode" if req.first else "prefill", "age_s": age, "output_tokens": req.tokens,
                         "tokens_per_s": req.tokens / since if since > 0 else None, "kv_blocks": req.blocks})
        scheduler = self.scheduler
        if scheduler is not None:
            for rid, created in waiting_arrivals(scheduler):
                if rid in self.live:
                    continue  # preempted: it waits again, and shows as the running request it was
                rows.append({"request_id": clean(rid), "model": model, "kind": "continuous_batching",
                             "state": "waiting", "age_s": max(0, now - perf_ns(created)) / 1e9, "output_tokens": 0,
                             "tokens_per_s": None, "kv_blocks": 0})
        return rows

    # -- the loop --------------------------------------------------------------------------------
    def begin(self) -> None:
        """The generation loop starts (on its thread)."""
        self.drop_spans()
        self.live.clear()
        self.inflight.clear()
        self.cancelled.clear()
        self.open = self.stepping = False
        self.last = None
        self.dev_tok = None

    def end(self) -> None:
        """The generation loop ended: the gauges say what is left, the thread's steps are over."""
        self.open = False
        if self.dev_tok is not None:
            DeviceClock.discard(self.dev_tok)
            self.dev_tok = None
        self.drop_spans()
        self.inflight.clear()
        self.live.clear()
        if self.scheduler is not None:
            self.last = None
            self.gauges(self.rt.thread_records())
        if self.memory is not None:  # what the loop leaves allocated, and its peak
            self.memory.read(self.rt.thread_records(), self.memory_on)
        if self.stepping:
            self.stepping = False
            self.rt.steps_done()
        self.release()
        self.rt.drain_if_full(self.rt.thread_records())

    def gauges(self, records: Any) -> None:
        """Running, waiting and the KV cache, appended only when one of them changed."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        running, waiting = request_counts(scheduler)
        blocks, usage = used_blocks(self.cache, self.allocators, self.total_bytes, self.num_blocks)
        now = (running, waiting, blocks)
        # Why only on a change: the idle loop prepares 10 times a second, and appending and applying the
        # four records costs ~1 us a step (8 requests, test CPU) for values a gauge keeps anyway.
        if now == self.last:
            return
        self.last = now
        serving = self.serving
        records.append((serving.running, running))
        records.append((serving.waiting, waiting))
        records.append((serving.kv_used, blocks))
        records.append((serving.kv_usage, usage))

    def open_step(self, records: Any, t0: int, t1: int) -> None:
        """A batch was scheduled: count the step, its tokens by phase, and its new requests."""
        serving = self.serving
        batch = self.scheduled
        index = self.index = self.rt.steps.advance()  # profile windows and kernel sampling see these steps too
        self.stepping = True
        prefill = decode = 0
        live = self.live
        selected: list[tuple[Req, Any]] = []  # the requests this forward selects a token for
        rows: list[tuple[Req, int, int, int]] = []  # what the step's StepShares splits its time by
        prefills = 0
        next_tokens = 0
        append = records.append
        # On a GPU: the device TTFT spans this step's forward launch starts and its end stops.
        starting: list[FirstSpan] | None = None
        stopping: list[FirstSpan] | None = None
        if self.device is not None and self.rt.backends.device_clock is not None:
            starting, stopping = [], []
        admitted: FirstSpan | None = None
        page = self.page or 1
        for state, request_id, created, q, end, n, new_token in scheduled_rows(batch):
            # Tokens at positions below the prompt's length are prompt (prefill) tokens; a request
            # restarted after preemption prefills its prompt and what it had generated again.
            if end <= n:
                pre = q
            elif end - q >= n:
                pre = 0
            else:
                pre = n - end + q
            prefill += pre
            decode += q - pre
            req = live.get(request_id)
            if req is None:
                req = live[request_id] = Req(state, perf_ns(created))
                req.scheduled = t1
                append((serving.queue, max(0, t1 - req.arrival)))
                if starting is not None:
                    if new_token:  # its first token comes from this forward: the step's shared span
                        if admitted is None:
                            admitted = FirstSpan(serving.ttft_dev)
                            starting.append(admitted)
                            stopping.append(admitted)  # type: ignore[union-attr]
                        req.span = admitted
                    else:  # its prompt goes on in later steps: a span of its own, open until then
                        req.span = FirstSpan(serving.ttft_dev)
                        starting.append(req.span)
            # Why kept as a row and split at the drain: the step's time is known only when it ends (on a GPU,
            # when its events are read); the loop pays one tuple a request.
            blocks = -(-end // page)  # the whole-model blocks its tokens fill
            rows.append((req, q, pre, blocks))
            req.steps += 1
            req.blocks = blocks
            if pre:
                prefills += 1
                req.prefilled += pre
                if len(req.prefill_steps) < 64:  # a prompt split over steps: a few; bounded whatever the input
                    req.prefill_steps.append(index)
            if new_token:
                selected.append((req, state))
                if req.selecting:
                    next_tokens += 1  # not its first token: a device inter-token sample
                req.selecting += 1
                if not req.first:
                    span = req.span
                    if span is not None and span.open and stopping is not None:  # the last chunk of its prompt
                        stopping.append(span)
        self.inflight.append((selected, stopping or None))
        self.rows = rows
        self.prefills = prefills
        self.next_tokens = next_tokens
        self.starting = starting or None
        self.stopping = stopping or None
        append((serving.batch_requests, len(batch)))  # type: ignore[arg-type]
        if prefill:
            append((serving.tokens_prefill, prefill))
        if decode:
            append((serving.tokens_decode, decode))
        self.phase = 2 if prefill and decode else (0 if prefill else 1)
        self.step_t0 = t0
        self.sched_ns = t1 - t0
        self.fwd_ns = 0
        self.open = True

    def close_step(self, t: int, update_ns: int) -> None:
        serving = self.serving
        records = self.records
        append = records.append
        dur = t - self.step_t0
        phase = self.phase
        # The step's host duration and (below) its device span: the same two records as generate()'s
        # close_step (gpuprobe.integrations._transformers.generate.steps), on the same StepSeries targets. Why
        # written out in both and not one shared method: one more Python call per step.
        append((serving.step_host[phase], dur))
        append((serving.c_schedule, self.sched_ns))
        append((serving.c_forward, self.fwd_ns))
        if update_ns:
            append((serving.c_update, update_ns))
        tok = self.dev_tok
        shares = StepShares(self.rows, self.prefills)
        self.rows = []
        log = self.rt.requests
        if log.wants_parents and (self.prefills or self.index % STEP_SPANS_EVERY == 0):  # traces are on
            shares.traced(log, self.index, self.step_t0, dur, phase, serving.step_host[phase].__self__)
        if tok is not None:
            # The forward's device span is the device inter-token latency of each next token it selects, and
            # the time its requests share.
            n = self.next_tokens
            shares.target = serving.device_span(phase, n) if n else serving.step_dev[phase]
            append((self.rt.pending.apply, (shares, tok)))
            self.dev_tok = None
        else:  # on the host clock
            append((shares.apply, dur))
        # Why one step in memory_every: a reading costs 24 us on a CPU (RSS from /proc), as in generate().
        if self.memory is not None and self.index % self.memory_every == 0:
            self.memory.read(records, self.memory_on)
        self.open = False
        if len(records) >= self.rt.buffer_size:
            self.rt.drain()
