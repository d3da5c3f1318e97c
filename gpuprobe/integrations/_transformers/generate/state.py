"""The state of one instrumented model: its options, series and parts, prepared once, and its calls.

What a seam (:mod:`.seams`) finds in ``model.__dict__[STATE_KEY]``. A ``generate()`` call begins
(:meth:`ModelState.begin_call`: its :class:`~.call.Call` on this thread) and ends
(:meth:`ModelState.end_call`: request duration, token usage, time per output token, the last gauges)
here; its steps run in :mod:`.steps`.

Pickling and copies of a model leave its state out (the seam on ``__getstate__``, :mod:`.seams`); where
that seam is off, the state deep-copies and pickles to ``None`` (``NoneType()``, nothing of gpuprobe to
import when loaded): a copy of an instrumented model is a plain, uninstrumented model.
"""

from __future__ import annotations

import threading
import weakref
from time import perf_counter_ns
from typing import Any

from .... import _seams, is_enabled
from ...._requests import (
    RequestRecord,
    current_parent,
    current_request_id,
    median_and_max,
    new_request_id,
    now_wall,
    sampled_gaps,
    take_parent,
)
from ....runtime import Runtime
from ..compat import (
    cache_bytes,
    device_map_devices,
    input_device,
    input_tokens,
    input_width,
    is_encoder_decoder,
    loop_rows,
    steps_undone,
)
from ..continuous import ServingState
from ...kit import DecodeSpan, DeviceTally, MemoryGauges, StepSeries, time_per_output_token_ns
from ..series import RequestSeries
from . import steps as _steps
from .call import Call
from .layers import LayerTiming
from .marks import StepMarker
from .speculative import DRAFTING
from .speculative import begin as begin_speculation
from .steps import StepMachine
from .streamer import time_streamer
from .timed import ElementTiming
from .utilization import Utilization

__all__ = ["ModelState"]


class ModelState(StepMachine, LayerTiming, ElementTiming):
    """Everything prepared once for one instrumented model: options, series, NVTX strings, originals.

    Its parts are base classes, each in its own module: :class:`~.steps.StepMachine` (the steps),
    :class:`~.layers.LayerTiming` (layer hooks), :class:`~.timed.ElementTiming` (logits processors and
    stopping criteria). Why base classes and not objects of their own: their methods are then the
    state's own, and a decode step makes no Python call more than with one class.
    """

    def __init__(self, model: Any, rt: Runtime, *, name: str, layers: list[tuple[Any, int]],
                 layer_every: int, layer_index: bool, memory: bool, kv_cache: bool, memory_every: int,
                 options: dict[str, Any]) -> None:
        self.model_name = name
        self.model = weakref.ref(model)
        # A decoder-only model's generate() returns the prompt and what follows it (what a call whose steps
        # were not seen is counted from); an encoder-decoder's returns the decoder's tokens only.
        self.encoder_decoder = is_encoder_decoder(model)
        self.rt = rt
        self.options = options
        self.tls = threading.local()
        self.layer_every = layer_every
        self.memory = memory
        self.kv_cache = kv_cache
        self.memory_every = memory_every
        self.originals: dict[str, Any] = {}  # attribute -> callable (bound) run underneath
        self.readers: dict[str, _seams.ArgReader] = {}  # attribute -> reads the parameters gpuprobe uses, by name
        self.patches: list[_seams.Patch] = []  # the seams installed on the model (undone by uninstrument)
        self.decode_count = 0
        self._nvtx_cache: dict[tuple[str, str, int], Any] = {}
        self._devices: dict[int, tuple[int, ...]] = {}  # input device -> every CUDA device the model uses
        _steps.bind_torch()
        fam = rt.family
        # Records are (bound apply method of a series, value), the runtime's Record type. Why bound
        # once: a step then appends tuples (0.11 us each) instead of calling Runtime.emit (0.57 us).
        self.request_series = RequestSeries(rt, name)
        steps = self.step_series = StepSeries(rt, name, ("prefill", "decode"))
        self.step_host, self.step_dev = steps.host, steps.device
        self.itl_host, self.itl_dev = steps.itl_host.apply, steps.itl_device
        # Why one prepared target: a decode step's device span feeds the step and the inter-token series;
        # building the pair per step costs 0.18 us (test CPU), needed only when a token may be undone.
        self.decode_span = steps.device_span(1, 1)
        # Traces on: the series a call's record names for its span's exemplars, with the record's field of each
        # one's value (its longest token gap stands for its slowest decode step too), prepared once.
        self.exemplars_ok = ((self.request_series.request_ok.__self__, "duration_s"),
                             (self.request_series.ttft.__self__, "ttft_s"), (steps.itl_host, "itl_max_s"),
                             (steps.host[1].__self__, "itl_max_s"))
        self.c_forward = steps.component("forward")
        self.c_stopping = steps.component("stopping_criteria")
        self.c_streamer = steps.component("streamer")
        self.c_other = steps.component("other")
        ml = steps.model
        self.processors: dict[Any, tuple[Any, str]] = {}  # logits processor class -> (series, name)
        self.criteria: dict[Any, tuple[Any, str]] = {}  # stopping criterion class -> (None, name)
        self.batch = fam("gpuprobe.step.batch_size").child(**ml).apply
        self.active = fam("gpuprobe.generate.active").child(**ml).apply
        self.kv_mem = fam("gpuprobe.kv_cache.memory").child(**ml).apply
        self.kv_seq = fam("gpuprobe.kv_cache.sequence_length").child(**ml).apply
        self.memory_gauges = MemoryGauges(rt)  # shared with the model's continuous batching
        self.prepare_layers(layers, ml, layer_index)
        self.generate_message = f"generate {name}"
        self.utilization = Utilization(model, rt, name)  # measured once (MBU, MFU)
        self.marker = StepMarker(rt, name)  # component ranges in profile windows, the sync audit
        self.serving: Any = None  # continuous batching's series (continuous.ServingState), at first use
        self.speculative: dict[str, Any] = {}  # speculative-decoding series per method, at first use
        self.calls: dict[int, Call] = {}  # the calls running now, on any thread (for /requests)
        rt.requests.add_source(self)

    def current(self) -> Call | None:
        """The call running on this thread, if any."""
        return getattr(self.tls, "ctx", None)

    def nvtx(self, nv: Any, message: str, kind: str, payload: int | None) -> Any:
        """A prepared NVTX range (cached per message and step; only used when a tool is attached)."""
        key = (message, kind, -1 if payload is None else payload)
        h = self._nvtx_cache.get(key)
        if h is None:
            h = nv.prepare(message, kind, payload)
            # Why a cache: preparing a range with a payload costs 1.3 us; a dict hit 0.12 us.
            if len(self._nvtx_cache) < 65536:
                self._nvtx_cache[key] = h
        return h

    def observe_manager(self, manager: Any) -> None:
        """Continuous batching: observe the manager ``init_continuous_batching`` returned (once)."""
        if self.serving is None:
            self.serving = ServingState(self.rt, self.model_name, self.request_series,
                                        memory=self.memory_gauges if self.memory else None,
                                        memory_every=self.memory_every, memory_devices=self.memory_devices)
        self.serving.observe(manager)

    def devices_for(self, model: Any, device: int) -> tuple[int, ...]:
        """Every CUDA device the model uses, given the device of its inputs (cached per input device).

        The input device, and those of ``hf_device_map`` (``device_map="auto"``) and of the timed layers.
        """
        found = self._devices.get(device)
        if found is None:
            used = {device} | device_map_devices(model)
            used.update(d for d in (self.module_device(m) for m in self.layers) if d is not None)
            found = self._devices[device] = tuple(sorted(used))
        return found

    def memory_devices(self, device: int | None) -> tuple[int, ...]:
        """The CUDA devices whose memory work on ``device`` reads: those of the model (:meth:`devices_for`);
        none on a CPU (the process's memory is read)."""
        model = self.model()
        if device is None:
            return ()
        return self.devices_for(model, device) if model is not None else (device,)

    def read_gauges(self, ctx: Call) -> None:
        """Memory and KV-cache gauges (no device sync: allocator counters, shapes and nbytes)."""
        records = ctx.records
        if self.memory:  # the devices the call's model uses; a call on the CPU reads the process's memory
            self.memory_gauges.read(records, ctx.devices)
        if self.kv_cache and ctx.cache is not None:
            records.append((self.kv_mem, cache_bytes(ctx.cache)))
            if ctx.prompt_len is not None:
                records.append((self.kv_seq, ctx.prompt_len + max(ctx.step - ctx.first_step, 0) + ctx.extra_tokens))

    # -- the call ----------------------------------------------------------------------------
    def begin_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], reader: _seams.ArgReader) -> Call | None:
        """A generate() call starts on this thread: its context, or None when it is not measured.

        Nothing of the call's arguments is changed: the streamer is timed through its own ``put``
        (patched for the call, see :func:`.streamer.time_streamer`).
        """
        if not is_enabled() or _steps.compiling() or DRAFTING.on:  # a draft is the measured call's work
            return None
        rt = self.rt
        backends = rt.backends
        nv = backends.nvtx if backends.nvtx.enabled else None
        ctx = Call(perf_counter_ns(), rt.thread_records(), nv, backends.device_clock)
        ctx.args, ctx.kwargs = args, kwargs
        ctx.inputs = reader.get(args, kwargs, "inputs")
        if ctx.clock is not None:  # the call's start on the device of its inputs (device TTFT)
            dev = input_device(ctx.inputs, kwargs)
            if dev is not None and dev.type == "cuda":
                ctx.call_tok = ctx.clock.start(dev.index if dev.index is not None else 0)
            # The call's own device-span targets: its steps' spans add up to its record's device time.
            tally = ctx.tally = DeviceTally()
            ctx.spans = (DecodeSpan(self.step_dev[0], self.itl_dev, 0, tally),
                         DecodeSpan(self.step_dev[1], self.itl_dev, 1, tally))
        ctx.request_id = current_request_id()
        if rt.requests.wants_parents:  # traces are on: the caller's span, that the request's span joins
            ctx.parent = current_parent()
        ctx.audit = rt.settings.sync_audit
        tls = self.tls
        ctx.prev = getattr(tls, "ctx", None)
        tls.ctx = ctx
        streamer = reader.get(args, kwargs, "streamer")
        if streamer is not None:
            ctx.undo.append(time_streamer(streamer, ctx, self))
        ctx.records.append((self.active, 1))
        self.calls[id(ctx)] = ctx
        self.layers_moved = True
        if nv is not None:
            nv.push(self.nvtx(nv, self.generate_message, "generate", None))
        return ctx

    def speculate(self, ctx: Call, input_ids: Any, generation_config: Any, generator: Any) -> None:
        """The call runs assisted decoding or prompt lookup with ``generator``: its steps (see :mod:`.speculative`)."""
        begin_speculation(self, ctx, input_ids, generation_config, generator, loop_rows)

    def end_call(self, ctx: Call, out: Any, err: BaseException | None) -> None:
        """The call ``ctx`` returned ``out`` or raised ``err``: its samples; what it patched is put back."""
        try:
            self._finish(ctx, out, err)
        finally:
            self.calls.pop(id(ctx), None)
            self.tls.ctx = ctx.prev
            ctx.args = ctx.kwargs = ctx.inputs = ctx.prev = None
            undo, ctx.undo = ctx.undo, []
            for restore in undo:
                if restore is not None:
                    restore()

    def _finish(self, ctx: Call, out: Any, err: BaseException | None) -> None:
        t1 = perf_counter_ns()
        nv = ctx.nv
        if ctx.step_open:
            if err is None:
                self.close_step(ctx, t1)
            else:  # a failed step leaves no sample, only its ranges to close
                ctx.step_open = False
                marks = ctx.marks
                if marks is not None:  # its ranges and audit too (the syncs it ran are counted)
                    ctx.marks = None
                    syncs = self.marker.close(marks, ctx.records)
                    if syncs >= 0:
                        ctx.syncs = syncs if ctx.syncs < 0 else ctx.syncs + syncs
                if ctx.dev_tok is not None and ctx.clock is not None:
                    ctx.clock.discard(ctx.clock.stop(ctx.dev_tok))
                    ctx.dev_tok = None
                if ctx.layers_on:
                    ctx.layers_on = False
                    self.release_layers()
        if ctx.clock is not None:  # a boundary no step started at (a failure between two steps)
            ctx.clock.drop(ctx.boundary)
            ctx.boundary = None
            if ctx.layer_next is not None:
                ctx.clock.drop(ctx.layer_next[1])
                ctx.layer_next = None
        if nv is not None:
            for _ in range(ctx.depth):
                nv.pop()
            ctx.depth = 0
            nv.pop()  # generate
        ctx.live = False
        records = ctx.records
        dur = t1 - ctx.t0
        n_in = n_out = None
        sequences = 0
        tpot = None
        if err is not None:
            records.append((self.request_series.request_error(type(err).__qualname__), dur))
            self.rt.observe_exception(err)
            self.last_tokens(ctx, t1, None, failed=True)
        else:
            records.append((self.request_series.request_ok, dur))
            n_in = input_tokens(ctx.inputs, ctx.kwargs or {})
            if n_in is None and ctx.prompt_len is not None and ctx.rows is not None:
                n_in = ctx.prompt_len * ctx.rows[0]
            if n_in is not None:
                records.append((self.request_series.usage_in, n_in))
            n_out = None  # output tokens of each sequence
            sequences = 0
            if ctx.step >= 0 and ctx.rows is not None:
                # What the decoding loop selected, step by step: one token per sequence and step, more in a
                # speculative step, none in a step the deferred stop check undid. Never the returned
                # tensor's shape: a model's own generate() may strip or reshape it (Whisper, MusicGen).
                n_out = ctx.step + 1 + ctx.extra_tokens - (steps_undone(ctx.stop_check) if ctx.deferred else 0)
                sequences = ctx.rows[1]
            elif ctx.step < 0 and not self.encoder_decoder:  # no step seen (custom_generate): the returned shape
                seq = out if hasattr(out, "shape") else getattr(out, "sequences", None)
                shape = getattr(seq, "shape", None)
                width = input_width(ctx.inputs, ctx.kwargs or {})
                if shape is not None and len(shape) == 2 and width is not None and int(shape[1]) >= width:
                    n_out = int(shape[1]) - width
                    sequences = int(shape[0])
            if n_out is not None:
                records.append((self.request_series.usage_out, sequences * n_out))
            self.last_tokens(ctx, t1, n_out)
            tpot = time_per_output_token_ns(dur - ctx.ttft_ns, n_out) if n_out and ctx.ttft_ns >= 0 else None
            if tpot is not None:
                records.append((self.request_series.tpot, tpot))
            if self.memory or self.kv_cache:
                self.read_gauges(ctx)
        records.append((self.active, -1))
        ctx.cache = None
        self.rt.steps_done()
        self.rt.requests.add(self.request_record(ctx, dur, err, n_in, n_out, sequences, tpot))
        self.rt.drain_if_full(records)

    def request_record(self, ctx: Call, dur: int, err: BaseException | None, n_in: int | None,
                       n_out: int | None, sequences: int, tpot: int | None) -> RequestRecord:
        """The call's record (:mod:`gpuprobe._requests`): what the call kept while it ran, in seconds.

        A call's finish reason: ``error`` if it raised; ``length`` when its sequences got as many new tokens
        as the call allowed; otherwise ``eos`` when nothing but the end-of-sequence token could stop it early,
        else ``stop`` (stop strings or the caller's own criteria). Its device time arrives when the GPU has
        reached its steps' events (the tally delivers it then).
        """
        ttft = ctx.ttft_ns
        if err is not None:
            reason = "error"
        elif n_out is not None and ctx.limit is not None and n_out >= ctx.limit:
            reason = "length"
        elif n_out is None:
            reason = None
        else:
            reason = "stop" if ctx.other_stops else "eos"
        gaps = ctx.gaps
        p50, longest = median_and_max(gaps)
        end = now_wall()
        temperature, top_p, top_k = ctx.sampling
        rid = ctx.request_id or new_request_id()
        traced = self.rt.requests.wants_parents
        exemplars = self.exemplars_ok if traced else ()
        if traced and err is not None:  # the failed calls' duration series, by error type
            failed = self.request_series.request_error(type(err).__qualname__).__self__
            exemplars = ((failed, "duration_s"), *exemplars[1:])
        record = RequestRecord(
            request_id=rid, model=self.model_name, duration_s=dur / 1e9,
            kind="generate", batch_size=sequences or (ctx.rows[1] if ctx.rows is not None else None),
            input_tokens=n_in, output_tokens=n_out, finish_reason=reason,
            error=type(err).__qualname__ if err is not None else None,
            prefill_s=ttft / 1e9 if ttft >= 0 else None, ttft_s=ttft / 1e9 if ttft >= 0 else None,
            decode_s=max(0, ctx.tok_t - ctx.t0 - ttft) / 1e9 if ttft >= 0 else None,
            tpot_s=None if tpot is None else tpot / 1e9, itl_p50_s=p50, itl_max_s=longest,
            host_syncs=ctx.syncs if ctx.syncs >= 0 else None, started_at=end - dur / 1e9, ended_at=end,
            max_tokens=ctx.limit, temperature=temperature, top_p=top_p, top_k=top_k,
            steps_sampled=sampled_gaps(gaps) if traced else (),
            parent=ctx.parent or take_parent(ctx.request_id), exemplar_series=exemplars,
        )
        tally = ctx.tally
        if tally is not None:
            ctx.tally = ctx.spans = None
            if tally.expected:
                record.pending = 1
            tally.deliver(record.device_read)
        return record

    def in_flight(self) -> list[dict[str, Any]]:
        """The calls running now: state, age, tokens so far (never text)."""
        now = perf_counter_ns()
        rows = []
        for ctx in list(self.calls.values()):
            if not ctx.live:
                continue
            tokens = max(0, ctx.step + 1 - ctx.first_step + ctx.extra_tokens) if ctx.ttft_ns >= 0 else 0
            since = (now - ctx.t0 - ctx.ttft_ns) / 1e9 if ctx.ttft_ns >= 0 else 0.0
            rows.append({"request_id": ctx.request_id, "model": self.model_name, "kind": "generate",
                         "state": "decode" if ctx.ttft_ns >= 0 else "prefill", "age_s": (now - ctx.t0) / 1e9,
                         "output_tokens": tokens, "tokens_per_s": tokens / since if since > 0 else None,
                         "batch_size": ctx.rows[1] if ctx.rows is not None else None, "kv_blocks": None})
        return rows

    # pickling and deep copies of a model drop its instrumentation (see the module docstring)
    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (type(None), ())  # NoneType() is None: loading imports nothing of gpuprobe
