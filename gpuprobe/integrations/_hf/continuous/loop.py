"""Continuous batching seen from the inside: requests, scheduler steps and the paged KV cache.

transformers' continuous batching (``generate_batch``, ``continuous_batching_context_manager``,
``init_continuous_batching`` — and ``transformers serve --continuous-batching``, which calls the
last) runs a generation loop on a thread of its own::

    ContinuousBatchingManager                    seam: observed when init_continuous_batching returns it
      _run_generation_loop()   (its thread)      seam: the loop's start and end (gauges, steps done)
        _create_batch_processor()                seam: the processor, scheduler, cache are observed
        loop:
          prepare_next_batch()                   seam: a step opens (component schedule); gauges
            scheduler.schedule_batch()           seam: the requests of the batch
            offloading_manager.offload_requests  seam: preemptions
          _generation_step(model)                seam: component forward (device span on GPUs)
          update_batch()                         seam: component update; first tokens; the step closes
            output_router.deliver(_batch)()      seam: finished and failed requests
      scheduler.set_request_cancellation()       seam: cancelled requests

Every seam is an instance attribute of the object transformers calls it on (the manager, its batch
processor, scheduler, offloading manager and output router), so only observed managers change and
:meth:`ServingState.close` takes them all away again.

A step is one turn of the loop that ran a forward: from the start of ``prepare_next_batch`` to the
end of ``update_batch``, so ``schedule + forward + update`` tile it. With asynchronous batching
(CUDA graphs) the update of a turn is that of the previous batch; a turn is still one step.

Per request (by its id, never a label): its arrival is the request's ``created_time``; its queue
time runs to the end of the step preparation that first scheduled it; its first token is there
when the update that produced it ends; its duration ends when its output is delivered.
Its inter-token latency: one sample per output token after its first, the time since its previous
token reached the host (the end of the update that produced it; the last one: its delivery), so its
samples add up to its duration less its TTFT, waits between its steps included.
A request preempted (offloaded to the CPU or restarted) and scheduled again keeps its arrival and
first token, and its wait shows in the inter-token sample of its next token. Counted per model: the
gauges are read at the end of each preparation (the loop also prepares every 0.1 s while idle) and
written only when they change.

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

import inspect
import weakref
from collections import deque
from time import perf_counter_ns
from typing import Any

from .... import _seams, is_enabled
from ...._placement import tensor_device
from ....runtime import Runtime
from ....timing import DeviceClock
from ..series import RequestSeries, StepSeries, time_per_output_token_ns

__all__ = ["ServingState", "PHASES", "FINISH_REASONS"]

PHASES = ("prefill", "decode", "mixed")
"""The ``phase`` of a continuous-batching step: only prompt tokens, only generated tokens, or both."""
FINISH_REASONS = ("stop", "length", "cancelled", "failed")
"""``finish_reason`` of ``gpuprobe.requests.finished``: an end-of-sequence token, the token limit,
cancelled (the client went away), failed (an error)."""

GROUP = "transformers.continuous_batching"
"""The switch of every continuous-batching seam: they work together."""


OWNERS: dict[str, str] = {}
"""The transformers class whose instances each continuous-batching seam patches, by seam name."""


def _declare(owner: str, attribute: str, short: str, reads: tuple[str, ...] = ()) -> _seams.Seam:
    seam = _seams.declare(f"transformers.continuous_batching.{short}", library="transformers", attribute=attribute,
                          reads=reads, group=GROUP, scenario="generate_batch",
                          target=f"{owner}.{attribute}, on each observed manager's objects")
    OWNERS[seam.name] = owner
    return seam


def owner_classes() -> dict[str, type]:
    """The classes of the installed transformers that :data:`OWNERS` names, by seam name, for a shape
    check before any manager exists (``gpuprobe doctor``); a class not found is left out.

    Imports every module of transformers' continuous-batching package (a few seconds): the classes
    live in several of them, and which one has moved between releases.
    """
    import importlib
    import pkgutil
    import sys

    import transformers.generation.continuous_batching as package

    for found in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(found.name)
        except Exception:  # a module that needs what is not installed (a kernel library): not ours to judge
            pass
    classes: dict[str, type] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package.__name__ or name.startswith(package.__name__ + ".")):
            continue
        for owner in set(OWNERS.values()):
            cls = getattr(module, owner, None)
            if isinstance(cls, type) and cls.__module__.startswith(package.__name__):
                classes.setdefault(owner, cls)
    return {seam: classes[owner] for seam, owner in OWNERS.items() if owner in classes}


# The methods that become seams, on the objects transformers calls them on; shapes checked before patching.
SEAM_CREATE = _declare("ContinuousBatchingManager", "_create_batch_processor", "create_batch_processor")
SEAM_LOOP = _declare("ContinuousBatchingManager", "_run_generation_loop", "generation_loop")
SEAM_DELIVER = _declare("OutputRouter", "deliver", "deliver", ("output",))
SEAM_DELIVER_BATCH = _declare("OutputRouter", "deliver_batch", "deliver_batch", ("outputs",))
SEAM_PREPARE = _declare("ContinuousBatchProcessor", "prepare_next_batch", "prepare_next_batch")
SEAM_STEP = _declare("ContinuousBatchProcessor", "_generation_step", "generation_step")
SEAM_UPDATE = _declare("ContinuousBatchProcessor", "update_batch", "update_batch")
SEAM_SCHEDULE = _declare("Scheduler", "schedule_batch", "schedule_batch")
SEAM_CANCEL = _declare("Scheduler", "set_request_cancellation", "cancel", ("request_id",))
SEAM_OFFLOAD = _declare("OffloadingManager", "offload_requests", "offload_requests")
_MANAGER = (SEAM_CREATE, SEAM_LOOP)
_ROUTER = (SEAM_DELIVER, SEAM_DELIVER_BATCH)
_PROCESSOR = (SEAM_PREPARE, SEAM_STEP, SEAM_UPDATE)
_SCHEDULER = (SEAM_SCHEDULE, SEAM_CANCEL)
_MARK = "_gpuprobe_loop"  # the manager's _Loop, in its __dict__


class _Req:
    """What gpuprobe keeps of one request while it runs (never exported: no id or text is a label)."""

    __slots__ = ("state", "arrival", "first", "span", "tok_t", "tokens", "selecting", "ended")

    def __init__(self, state: Any, arrival: int) -> None:
        self.state = state  # the RequestState first scheduled (its end-of-sequence ids)
        self.arrival = arrival  # perf_counter_ns of its creation
        self.first = 0  # perf_counter_ns of its first token on the host; 0: none yet
        self.span: _FirstSpan | None = None  # on a GPU, until its first token: its device TTFT's events
        self.tok_t = 0  # perf_counter_ns its latest output token reached the host
        self.tokens = 0  # its output tokens on the host so far (the inter-token samples: one per token after the first)
        self.selecting = 0  # forwards scheduled so far that select a token for it
        self.ended = False  # its output was delivered: its last token is counted


class _FirstSpan:
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


class _DecodeSpans:
    """A decoding step's device span as a record target: the step series once, and the device
    inter-token latency once for each request whose next token (not its first) the forward selects."""

    __slots__ = ("step", "itl", "requests")

    def __init__(self, step: Any, itl: Any, requests: int) -> None:
        self.step = step
        self.itl = itl  # the device inter-token series (a histogram child)
        self.requests = requests

    def apply(self, ns: int) -> None:
        self.step.apply(ns)
        self.itl.apply_many([ns] * self.requests)


def _ns(seconds: float) -> int:
    # RequestState.created_time comes from time.perf_counter(), the clock of perf_counter_ns().
    return round(seconds * 1e9)


def _ends_with_eos(state: Any, tokens: list[int]) -> bool:
    if not tokens or state is None:
        return False
    eos = getattr(state, "eos_token_id", None)
    if eos is None:
        return False
    if isinstance(eos, int):
        return tokens[-1] == eos
    return tokens[-1] in eos


class ServingState:
    """The series of one model's continuous batching, prepared once, and the objects observed.

    Made by the model's :class:`~gpuprobe.integrations._hf.generate.ModelState` the first time a
    manager is created for the model.
    """

    def __init__(self, rt: Runtime, name: str, request_series: RequestSeries) -> None:
        from transformers.generation.continuous_batching.requests import RequestStatus

        self.rt = rt
        self.model_name = name
        self.finished_status = int(RequestStatus.FINISHED)
        self.failed_status = int(RequestStatus.FAILED)
        fam = rt.family
        # Records are (bound apply of a series, value), as in the generate() integration: prepared here.
        # A request's GenAI series are the model's, shared with its generate() calls.
        self.request_series = requests = request_series
        self.ttft_dev = requests.ttft_device.apply  # called by _FirstSpan targets
        self.req_cancelled = requests.request_error("cancelled")
        self.req_failed = requests.request_error("failed")
        steps = StepSeries(rt, name, PHASES)
        ml = steps.model
        self.queue = fam("gpuprobe.request.queue.duration").child(**ml).apply
        finished = fam("gpuprobe.requests.finished")
        self.finished = {r: finished.child(**ml, finish_reason=r).apply for r in FINISH_REASONS}
        self.preempted = fam("gpuprobe.requests.preempted").child(**ml).apply
        self.running = fam("gpuprobe.requests.running").child(**ml).apply
        self.waiting = fam("gpuprobe.requests.waiting").child(**ml).apply
        self.kv_usage = fam("gpuprobe.kv_cache.usage").child(**ml).apply
        blocks = fam("gpuprobe.kv_cache.blocks")
        self.kv_used = blocks.child(**ml, state="used").apply
        self.kv_total = blocks.child(**ml, state="total").apply
        tokens = fam("gpuprobe.batch.tokens")
        self.tokens_prefill = tokens.child(**ml, phase="prefill").apply
        self.tokens_decode = tokens.child(**ml, phase="decode").apply
        self.batch_requests = fam("gpuprobe.batch.requests").child(**ml).apply
        self.step_host, self.step_dev = steps.host, steps.device
        self.c_schedule = steps.component("schedule")
        self.c_forward = steps.component("forward")
        self.c_update = steps.component("update")
        # Per request and output token after its first (see _Loop.tokens_held): the host samples of one
        # update go as one batch, the device ones with the step's device span (_DecodeSpans).
        self.inter_token = steps.itl_host.apply_many
        self.itl_dev = steps.itl_device
        self._spans: dict[tuple[int, int], _DecodeSpans] = {}
        self._patched: list[_seams.Patch] = []
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()

    def decode_spans(self, phase: int, requests: int) -> _DecodeSpans:
        """The prepared device record target of a decoding step whose forward selects the next token of
        ``requests`` requests (cached per phase and count, bounded like the other caches)."""
        key = (phase, requests)
        found = self._spans.get(key)
        if found is None:
            found = _DecodeSpans(self.step_dev[phase], self.itl_dev, requests)
            # Why a cache: a step's target then costs one dict hit instead of an object a step.
            if len(self._spans) < 4096:
                self._spans[key] = found
        return found

    # -- observing ------------------------------------------------------------------------------
    def observe(self, manager: Any) -> Any:
        """Put the seams on ``manager`` (once); returns it. Another transformers shape: not installed
        (``info()["seams"]`` says why), the manager runs unobserved."""
        d = getattr(manager, "__dict__", None)
        if d is None or d.get(_MARK) is not None:
            return manager
        router = getattr(manager, "output_router", None)
        if not (_fits(manager, _MANAGER) and _fits(router, _ROUTER)):
            return manager
        loop = _Loop(self)
        d[_MARK] = loop
        self._managers.add(manager)
        finished = self.finished_status

        def created(token: None, bp: Any, error: BaseException | None) -> None:
            if error is None:
                loop.attach(bp)

        def loop_ends(token: None, result: Any, error: BaseException | None) -> None:
            loop.end()

        read_output = _seams.ArgReader(router.deliver, SEAM_DELIVER.reads)
        read_outputs = _seams.ArgReader(router.deliver_batch, SEAM_DELIVER_BATCH.reads)

        # Recorded before the output is handed over, so a client that has its answer finds it counted.
        def deliver(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            output = read_output.get(args, kwargs, "output")
            if output.status >= finished:
                loop.finish(output)

        def deliver_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            for output in read_outputs.get(args, kwargs, "outputs"):
                if output.status >= finished:
                    loop.finish(output)

        self._install(manager, SEAM_CREATE, after=created)
        self._install(manager, SEAM_LOOP, before=lambda args, kwargs: loop.begin(), after=loop_ends)
        self._install(router, SEAM_DELIVER, before=deliver)
        self._install(router, SEAM_DELIVER_BATCH, before=deliver_batch)
        bp = getattr(manager, "batch_processor", None)
        if bp is not None:  # a manager kept from an earlier session
            loop.attach(bp)
        return manager

    def _install(self, obj: Any, seam: _seams.Seam, before: Any = None, after: Any = None) -> Any:
        """Put ``seam``'s replacement on ``obj`` (its instance attribute); :meth:`close` takes it away."""
        original = _original(obj, seam.attribute)  # type: ignore[arg-type]
        self._patched.append(seam.patch(obj, _seams.wrap(seam, original, before, after)))
        return original

    def close(self) -> None:
        """Take every seam away again (the model is uninstrumented)."""
        for patch in reversed(self._patched):
            patch.undo()  # gone, or replaced since: left as it is
        self._patched.clear()
        for manager in list(self._managers):
            manager.__dict__.pop(_MARK, None)
        self._managers = weakref.WeakSet()


def _original(obj: Any, name: str) -> Any:
    """``obj.<name>`` as a callable that does not keep ``obj`` alive.

    A bound method stored on the object it is bound to is a reference cycle. transformers frees its
    batch processor — and the KV cache with it — by reference counting when it stops; a cycle would
    keep the cache until the next garbage collection.
    """
    own = obj.__dict__.get(name)
    if own is not None:  # an instance attribute put there by someone else: it runs underneath
        return own
    func = getattr(type(obj), name)
    ref = weakref.ref(obj)

    def call(*args: Any, **kwargs: Any) -> Any:
        return func(ref(), *args, **kwargs)

    call.__name__ = getattr(func, "__name__", name)
    call.__qualname__ = getattr(func, "__qualname__", name)
    try:  # the bound method's signature (self left out), for inspect.signature of the replacement
        call.__signature__ = inspect.signature(getattr(obj, name))  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return call


def _fits(obj: Any, seams: tuple[_seams.Seam, ...]) -> bool:
    """Whether ``obj`` has every method of ``seams`` with the parameters gpuprobe reads (the first
    mismatch is recorded on its seam: ``info()["seams"]``)."""
    if obj is None or not hasattr(obj, "__dict__"):
        for seam in seams:
            seam.refuse(f"the object that should have {seam.attribute} is missing or has no __dict__")
        return False
    return all(seam.check(obj) is None for seam in seams)


class _Loop:
    """One manager's generation loop: the requests it runs, the open step, the last gauges written."""

    def __init__(self, serving: ServingState) -> None:
        self.serving = serving
        self.rt = serving.rt
        self.live: dict[str, _Req] = {}
        # Per batch until its update: the first-token candidates, and the device TTFT spans its forward ended.
        self.inflight: deque[tuple[list[tuple[_Req, Any]], list[_FirstSpan] | None]] = deque()
        self.starting: list[_FirstSpan] | None = None  # spans the open step's forward launch starts
        self.stopping: list[_FirstSpan] | None = None  # spans its forward's end stops
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

    # -- the batch processor ---------------------------------------------------------------------
    def attach(self, bp: Any) -> None:
        """Put the step seams on a batch processor and its scheduler (once per processor; a processor
        kept for the next session is only bound again)."""
        if self.attached is not None and self.attached() is bp:
            self._bind(bp)
            return
        scheduler = getattr(bp, "scheduler", None)
        cache = getattr(bp, "cache", None)
        if not (_fits(bp, _PROCESSOR) and _fits(scheduler, _SCHEDULER)):
            return
        if cache is None:
            SEAM_PREPARE.refuse(f"{type(bp).__qualname__} has no cache attribute")
            return
        self.attached = weakref.ref(bp)
        self._bind(bp)
        serving = self.serving
        install = serving._install

        # Every seam runs transformers' own method once, untouched (gpuprobe._seams.wrap); what gpuprobe
        # does around it is in hooks whose failure switches continuous-batching telemetry off.
        def prepare_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
            if not is_enabled():
                return None
            t0 = perf_counter_ns()
            if self.open:  # the first turn of asynchronous batching has no update
                self.close_step(t0, 0)
            if self.cancelled:
                self.cancelled.clear()
            self.scheduled = None
            return t0

        def prepare_after(t0: int | None, ok: Any, error: BaseException | None) -> None:
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

        def scheduled(token: None, out: Any, error: BaseException | None) -> None:
            if error is None:
                self.scheduled = out[0]

        def step_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not self.open:
                return None
            clock = self.rt.backends.device_clock if self.device is not None else None
            t0 = perf_counter_ns()
            tok = self._device_start(clock, t0) if clock is not None else None
            return (t0, clock, tok)

        def step_after(token: Any, result: Any, error: BaseException | None) -> None:
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

        def update_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
            if not self.open and not self.inflight:
                return None
            return perf_counter_ns()

        def update_after(t0: int | None, result: Any, error: BaseException | None) -> None:
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
        read_cancel = _seams.ArgReader(scheduler.set_request_cancellation, SEAM_CANCEL.reads)

        def cancel_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return read_cancel.get(args, kwargs, "request_id")

        def cancelled(request_id: Any, result: Any, error: BaseException | None) -> None:
            if error is None:
                self.cancel(request_id)

        install(bp, SEAM_PREPARE, prepare_before, prepare_after)
        install(bp, SEAM_STEP, step_before, step_after)
        install(bp, SEAM_UPDATE, update_before, update_after)
        install(scheduler, SEAM_SCHEDULE, after=scheduled)
        install(scheduler, SEAM_CANCEL, cancel_before, cancelled)
        offloader = getattr(bp, "offloading_manager", None)
        if offloader is not None and _fits(offloader, (SEAM_OFFLOAD,)):

            def offload_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
                scheduler = self.scheduler
                return len(scheduler.active_requests) if scheduler is not None else 0

            def offloaded(before: int, result: Any, error: BaseException | None) -> None:
                scheduler = self.scheduler
                evicted = before - len(scheduler.active_requests) if scheduler is not None else 0
                if evicted > 0:
                    self.rt.thread_records().append((serving.preempted, evicted))

            install(offloader, SEAM_OFFLOAD, offload_before, offloaded)

    def _bind(self, bp: Any) -> None:
        """Hold the processor's scheduler and cache while its loop runs (:meth:`release` lets go)."""
        self.scheduler, self.cache = bp.scheduler, bp.cache
        self._read_cache_geometry(bp.cache)
        self._place(bp)
        self.rt.thread_records().append((self.serving.kv_total, self.num_blocks))

    def release(self) -> None:
        """Let go of the processor's parts, so they (and the KV cache) are freed when transformers drops it."""
        self.scheduler = self.cache = self.stream = self.scheduled = None
        self.allocators = []

    def _read_cache_geometry(self, cache: Any) -> None:
        allocators = []
        for allocator in getattr(cache, "cache_allocators", {}).values():
            ledger = getattr(allocator, "ledger", None)
            allocators.append((allocator.index, allocator.bytes_per_block, ledger))
        self.allocators = allocators
        self.total_bytes = int(cache.num_sectors) * int(cache.bytes_per_sector)
        self.num_blocks = int(getattr(cache, "num_blocks", 0))

    def _place(self, bp: Any) -> None:
        # Where the paged cache lives is where the model runs (transformers makes both on model.device);
        # read through gpuprobe's one reader of tensor devices.
        cache_tensor = getattr(getattr(bp, "cache", None), "cache_tensor", None)
        device: Any = tensor_device(cache_tensor) if cache_tensor is not None else getattr(bp, "model_device", None)
        if getattr(device, "type", None) != "cuda":
            self.device = None
            return
        import torch

        self.device = device.index if device.index is not None else torch.cuda.current_device()
        self.stream = getattr(getattr(bp, "inputs_and_outputs", None), "compute_stream", None)

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

    def _device_stop(self, clock: Any, tok: Any, stopping: list[_FirstSpan] | None) -> Any:
        if self.stream is None:
            return self._stop(clock, tok, stopping)
        import torch

        with torch.cuda.stream(self.stream):
            return self._stop(clock, tok, stopping)

    def _stop(self, clock: Any, tok: Any, stopping: list[_FirstSpan] | None) -> Any:
        """The step's end event, then one for each device TTFT span whose first token this forward selected."""
        pending = clock.stop(tok) if tok is not None else None
        if stopping:
            self.stopping = None
            for span in stopping:
                if span.open:
                    span.open = False
                    span.token = clock.stop(span.token)
        return pending

    def tokens_held(self, selected: list[tuple[_Req, Any]], t: int) -> None:
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
                gaps.append(t - req.tok_t)
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

    def landed(self, req: _Req) -> None:
        """``req``'s first token reached the host: its wait until its first launch joins its device span."""
        span, req.span = req.span, None
        if span is None:
            return
        if span.open:  # no end event was recorded for it (device timing switched off meanwhile)
            span.discard()
        elif span.token is not None:  # ended by the forward of this token: handed over after its update
            span.waits.append(max(0, span.launched - req.arrival))

    @staticmethod
    def forget_span(req: _Req) -> None:
        """``req`` is gone: a span only it still holds (open, its prompt unfinished) gives its events back;
        one that a forward ended is handed over or given back by that forward's update."""
        span, req.span = req.span, None
        if span is not None and span.open:
            span.discard()

    def hand_over(self, ended: list[_FirstSpan]) -> None:
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
        if self.stepping:
            self.stepping = False
            self.rt.steps_done()
        self.release()
        self.rt.drain_if_full(self.rt.thread_records())

    def used_blocks(self) -> tuple[int, float]:
        """Blocks in use and the fraction of the cache they hold. Blocks kept only for prefix reuse
        (no request holds them; the scheduler evicts them when it needs room) count as free."""
        cache = self.cache
        pool = cache.pool
        free = len(pool.free_sectors) * cache.bytes_per_sector
        for index, per_block, ledger in self.allocators:
            n = pool.count_free_blocks(index)
            if ledger is not None:
                n += len(ledger.cached_blocks)
            free += n * per_block
        used = 1.0 - free / self.total_bytes if self.total_bytes else 0.0
        used = min(1.0, max(0.0, used))
        return round(used * self.num_blocks), used

    def gauges(self, records: Any) -> None:
        """Running, waiting and the KV cache, appended only when one of them changed."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        running, waiting = len(scheduler.active_requests), len(scheduler.waiting_requests)
        blocks, usage = self.used_blocks()
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
        self.rt.steps.advance()  # profile windows and kernel sampling see continuous-batching steps too
        self.stepping = True
        prefill = decode = 0
        live = self.live
        selected: list[tuple[_Req, Any]] = []  # the requests this forward selects a token for
        next_tokens = 0
        append = records.append
        # On a GPU: the device TTFT spans this step's forward launch starts and its end stops.
        starting: list[_FirstSpan] | None = None
        stopping: list[_FirstSpan] | None = None
        if self.device is not None and self.rt.backends.device_clock is not None:
            starting, stopping = [], []
        admitted: _FirstSpan | None = None
        for fs in batch:  # type: ignore[union-attr]
            state = fs.state
            q = fs.query_length
            end = state.position_offset  # already moved past this step's tokens
            n = len(state.initial_tokens)
            # Tokens at positions below the prompt's length are prompt (prefill) tokens; a request
            # restarted after preemption prefills its prompt and what it had generated again.
            if end <= n:
                prefill += q
            elif end - q >= n:
                decode += q
            else:
                k = n - end + q
                prefill += k
                decode += q - k
            req = live.get(state.request_id)
            if req is None:
                req = live[state.request_id] = _Req(state, _ns(state.created_time))
                append((serving.queue, max(0, t1 - req.arrival)))
                if starting is not None:
                    if fs.has_new_token:  # its first token comes from this forward: the step's shared span
                        if admitted is None:
                            admitted = _FirstSpan(serving.ttft_dev)
                            starting.append(admitted)
                            stopping.append(admitted)  # type: ignore[union-attr]
                        req.span = admitted
                    else:  # its prompt goes on in later steps: a span of its own, open until then
                        req.span = _FirstSpan(serving.ttft_dev)
                        starting.append(req.span)
            if fs.has_new_token:
                selected.append((req, state))
                if req.selecting:
                    next_tokens += 1  # not its first token: a device inter-token sample
                req.selecting += 1
                if not req.first:
                    span = req.span
                    if span is not None and span.open and stopping is not None:  # the last chunk of its prompt
                        stopping.append(span)
        self.inflight.append((selected, stopping or None))
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
        append((serving.step_host[phase], dur))
        append((serving.c_schedule, self.sched_ns))
        append((serving.c_forward, self.fwd_ns))
        if update_ns:
            append((serving.c_update, update_ns))
        tok = self.dev_tok
        if tok is not None:
            # The forward's device span is the device inter-token latency of each next token it selects.
            n = self.next_tokens
            append((self.rt.pending.apply, (serving.decode_spans(phase, n) if n else serving.step_dev[phase], tok)))
            self.dev_tok = None
        self.open = False
        if len(records) >= self.rt.buffer_size:
            self.rt.drain()

    # -- requests --------------------------------------------------------------------------------
    def finish(self, output: Any) -> None:
        """A request's last output was delivered (finished or failed)."""
        rid = output.request_id
        if rid in self.cancelled or not is_enabled():
            return
        req = self.live.pop(rid, None)
        now = perf_counter_ns()
        arrival = req.arrival if req is not None else _ns(output.created_time)
        dur = max(0, now - arrival)
        serving = self.serving
        records = self.rt.thread_records()
        append = records.append
        if output.status == self.failed_status or output.error is not None:
            append((serving.req_failed, dur))
            append((serving.finished["failed"], 1))
            if req is not None:
                req.ended = True
                if req.span is not None:
                    self.forget_span(req)
            return
        tokens = output.generated_tokens
        n_out = len(tokens)
        requests = serving.request_series
        append((requests.request_ok, dur))
        append((requests.usage_in, len(output.prompt_ids)))
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
        if req is not None:
            req.ended = True
            if req.span is not None:
                self.forget_span(req)
        tpot = time_per_output_token_ns(now - first, n_out)
        if tpot is not None:
            append((requests.tpot, tpot))
        reason = "stop" if _ends_with_eos(req.state if req is not None else None, tokens) else "length"
        append((serving.finished[reason], 1))

    def cancel(self, request_id: str) -> None:
        """The scheduler was told to cancel a request (the client went away)."""
        if request_id in self.cancelled or not is_enabled():
            return
        scheduler = self.scheduler
        if scheduler is None:
            return
        state = scheduler.active_requests.get(request_id) or scheduler.waiting_requests.get(request_id)
        if state is None:  # finished already, or unknown
            return
        self.cancelled.add(request_id)
        req = self.live.pop(request_id, None)
        if req is not None and req.span is not None:  # on the loop's thread (prepare_next_batch applies them)
            self.forget_span(req)
        arrival = req.arrival if req is not None else _ns(state.created_time)
        serving = self.serving
        records = self.rt.thread_records()
        records.append((serving.req_cancelled, max(0, perf_counter_ns() - arrival)))
        records.append((serving.finished["cancelled"], 1))

