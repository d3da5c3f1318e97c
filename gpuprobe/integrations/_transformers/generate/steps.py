"""The step machine of ``generate()``: a step opens, its forward ends, it closes; latencies of its token.

Steps tile the decoding loop: a step runs from the return of one ``_has_unfinished_sequences`` call
to the return of the next (step 0 from the ``_prefill`` call), so ``forward + logits processors +
stopping criteria + streamer + other`` is exactly the step's duration. On a GPU the steps of one call
share their boundary events: the end event of step N is the start event of step N + 1 (one event
record per decode step; :meth:`~gpuprobe.timing.DeviceClock.split`), and so are those of decoder
layers that run one after the other in a sampled step.

Latencies (``docs/transformers.md``, "Latencies and their clocks"): a step's end is when the host
holds its token, or, under transformers' deferred stop check, the next step's end (see
:meth:`StepMachine.token_on_host`); on a GPU the device TTFT runs from an event recorded as the call
starts to step 0's end event, and a decode step's device span is its token's inter-token latency.
The time per output token is computed once per successful call.

No device synchronisation is added: token counts come from tensor shapes, KV-cache bytes from
``Tensor.nbytes``, sequence lengths from the prompt length and the step index, device times from
CUDA events read later by the runtime.

Where the work runs: a step's device events go on the device of its input ids, a layer's on the
device of its parameters (so ``device_map="auto"`` layers on other GPUs are timed on their own
device); memory gauges are read for every CUDA device the model uses. A call whose inputs are on the
CPU takes no device time. Every hook steps aside while Dynamo traces (``torch.compile`` of the
forward with ``fullgraph=True`` sees no graph break) and inside a CUDA graph capture no device time
is taken (see ``docs/gpu.md``).

A step that a profile window or the program's own torch.profiler records, or that the sync audit
counts, is *marked* (``ctx.marks``, see :mod:`.marks`): its components become ranges in the
trace (with a step range of its own outside a window) and/or set the attribution of the sync audit.
Decided once when the step opens; on other steps each component call tests ``ctx.marks is None``
and nothing else.

:class:`StepMachine` is a part of :class:`~.state.ModelState` (a base class: its methods are the
state's own, so no Python call is added to a step); :mod:`.seams` calls it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from ...._placement import tensor_device
from ...._torch_caps import profiler_caps
from ....runtime import Runtime
from ...kit import DecodeSpan, RequestSeries
from .call import Call
from .marks import StepMarker
from .utilization import Utilization

__all__ = ["StepMachine", "compiling", "profiling", "bind_torch"]


def _never() -> bool:
    return False


# torch.compiler.is_dynamo_compiling once torch is there (bound when the first model is instrumented):
# a plain `return False` in eager code that Dynamo folds to True while it traces.
compiling: Callable[[], bool] = _never


def bind_torch() -> None:
    """Bind :func:`compiling` and :func:`profiling` to torch's own (when a model is instrumented)."""
    global compiling, profiling
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        compiling = getattr(compiler, "is_dynamo_compiling", compiler.is_compiling)
    if torch is not None:
        profiling = profiler_caps(torch).profiler_enabled or _never


# Whether a torch.profiler session records on the calling thread (bound with compiling, from
# gpuprobe._torch_caps): a program's own profiler gets the step and component ranges (see .marks).
profiling: Callable[[], bool] = _never


class StepMachine:
    """Opening and closing the steps of a call, for :class:`~.state.ModelState` (which prepares what is
    annotated here: the series, the options, the parts)."""

    rt: Runtime
    request_series: RequestSeries
    marker: StepMarker
    utilization: Utilization
    step_host: tuple[Any, ...]
    step_dev: tuple[Any, ...]
    itl_host: Any
    itl_dev: Any
    decode_span: DecodeSpan
    c_forward: Any
    c_stopping: Any
    c_streamer: Any
    c_other: Any
    layers: list[Any]
    layer_every: int
    decode_count: int
    memory: bool
    kv_cache: bool
    memory_every: int
    # Methods of the other parts of ModelState (layers.LayerTiming, state.ModelState) the steps call.
    nvtx: Callable[..., Any]
    devices_for: Callable[[Any, int], tuple[int, ...]]
    acquire_layers: Callable[[], None]
    release_layers: Callable[[], None]
    no_layer_ran: Callable[[], None]
    read_gauges: Callable[[Call], None]

    def place_call(self, model: Any, ctx: Call, ids: Any) -> None:
        """Where this call's work runs: the device of its input ids (CPU inputs: no device time)."""
        dev = tensor_device(ids) if ids is not None else None
        if dev is None or dev.type != "cuda":
            if ctx.call_tok is not None:  # the call's inputs were on a GPU, its steps are not: no device TTFT
                ctx.clock.discard(ctx.clock.stop(ctx.call_tok))
                ctx.call_tok = None
            ctx.clock = None
            ctx.util = self.utilization.for_call(None) if ctx.prompt_len else None
            return
        index = dev.index if dev.index is not None else 0
        ctx.device = index
        ctx.devices = self.devices_for(model, index)
        ctx.util = self.utilization.for_call(index) if ctx.prompt_len else None

    def open_step(self, ctx: Call, t: int, decode: bool) -> None:
        rt = self.rt
        # The global step counter marks step starts (profile windows, snapshot triggers); hooks
        # such as a profiler start are kept out of the step's own time.
        steps = rt.steps
        boundary = ctx.boundary
        ctx.boundary = None
        if steps.hooks:
            index = steps.advance()
            traced = steps.traced(index)  # a profile window records this step: mark its components
            # Another profiler records it (the program's own; not the kernel sampler's): the step's own range.
            own = not traced and profiling() and not steps.sampled(index)
            t = perf_counter_ns()
            if boundary is not None:  # the hooks may have queued device work: the step starts after it
                ctx.clock.drop(boundary)
                boundary = None
        else:
            # Why tick: without hooks, advancing is one C call instead of a Python call (1 of the ~10
            # Python calls a decode step adds).
            index = steps.tick()
            traced = False
            # Why asked on every step: a profiler may start or stop between steps (a schedule's
            # prof.step() in a streamer); torch._C._autograd._profiler_enabled costs 43 ns with no
            # profiler running (one C call, no Python frame; test CPU), against ~22 us the seams add.
            own = profiling()
        ctx.step += 1
        ctx.step_open = True
        ctx.step_t0 = t
        ctx.fwd_ns = ctx.counted_ns = ctx.streamer_ns = 0
        ctx.criteria_ns = -1
        ctx.streamed = False
        nv = ctx.nv
        if nv is not None:
            nv.push(self.nvtx(nv, "decode" if decode else "prefill", "step", ctx.step))
            ctx.depth += 1
        clock = ctx.clock
        if clock is not None:
            # Why resume: the previous step's end event, recorded just now, starts this step: one event
            # record per decode step instead of two (on an H200 two records and an NVTX range cost 8.9 us
            # of host time per call, docs/gpu.md).
            ctx.dev_tok = clock.start(ctx.device) if boundary is None else clock.resume(boundary, ctx.device)
        else:
            ctx.dev_tok = None
        if decode and self.layers and not ctx.compiled:
            self.decode_count += 1  # racy across threads: fine for sampling
            if self.decode_count % self.layer_every == 0:
                self.acquire_layers()
                ctx.layers_on = True
                ctx.layers_ran = 0
        # Decided once per step: most steps are neither traced nor audited, and their components then
        # test one attribute (ctx.marks is None). The audit stays out of compiled
        # forwards (Dynamo) and of CUDA graph captures.
        every = ctx.audit
        audited = (every != 0 and index % every == 0 and not ctx.compiled and not rt.capture.underway
                   and not compiling())
        if traced or audited or own:
            ctx.marks = self.marker.open(traced, audited, index if own else None)
        if ctx.spec is not None:  # a speculative step starts with its draft; the forward follows it (.speculative)
            return
        # The forward starts with the step: in a decode step prepare_inputs_for_generation follows the
        # stop check at once (why no seam there: 3 Python calls fewer per decode step). start_forward
        # written out: one Python call fewer per decode step.
        ctx.in_fwd = True
        if nv is not None:
            nv.push(self.nvtx(nv, "forward", "component", ctx.step))
            ctx.depth += 1
        if ctx.marks is not None:
            ctx.marks.begin_forward()
        ctx.fwd_t0 = perf_counter_ns()

    def start_forward(self, ctx: Call) -> None:
        """The running step's forward starts now (a speculative step's, once its draft is done)."""
        ctx.in_fwd = True
        nv = ctx.nv
        if nv is not None:
            nv.push(self.nvtx(nv, "forward", "component", ctx.step))
            ctx.depth += 1
        if ctx.marks is not None:
            ctx.marks.begin_forward()
        ctx.fwd_t0 = perf_counter_ns()

    def end_forward(self, ctx: Call, t: int) -> None:
        ctx.fwd_ns += t - ctx.fwd_t0
        ctx.in_fwd = False
        if ctx.marks is not None:
            ctx.marks.end_forward()
        if ctx.nv is not None:
            ctx.nv.pop()
            ctx.depth -= 1

    def token_on_host(self, ctx: Call, t: int) -> None:
        """The host holds the call's next output token since ``t``: its TTFT, or the time since the last one.

        When that is: transformers' stop check reads a flag computed from each step's token on the host
        (``bool(unfinished.max() == 0)``), which waits for the kernels that selected the token, so the
        host holds step k's token when step k ends. transformers' deferred stop check
        (``DeferredStopCheck``) reads step k's flag and tokens in step k + 1 (and the last step's in
        ``finish()``, before ``generate()`` returns), so the host holds them one step later; a streamer
        receives each token at that moment.
        """
        if ctx.ttft_ns >= 0:
            gap = t - ctx.tok_t
            ctx.records.append((self.itl_host, gap))
            ctx.gaps.append(gap)
        else:
            ctx.ttft_ns = t - ctx.t0
            ctx.records.append((self.request_series.ttft, ctx.ttft_ns))
        ctx.tok_t = t

    def last_tokens(self, ctx: Call, t: int, n_out: int | None, failed: bool = False) -> None:
        """At the call's end ``t``: the deferred stop check's last token, and the device record kept for it.

        ``n_out``: output tokens per sequence, if known. With the deferred check, the last step's token
        reaches the host in ``finish()``, unless that step is undone: it ran only because the flag that
        said the sequences had stopped was read one step late, and the output then holds one token
        fewer than the steps run.
        """
        if ctx.call_tok is not None:  # no step ended (a failure before the first token): no device TTFT
            ctx.clock.discard(ctx.clock.stop(ctx.call_tok))
            ctx.call_tok = None
        held_record = ctx.held_record
        if ctx.deferred and not failed and ctx.step >= 0:
            if n_out is None or n_out > ctx.step:
                self.token_on_host(ctx, t)
            elif held_record is not None:  # the undone step ran, but selected no output token
                held_record[1][0].tokens = 0
        if held_record is not None:
            ctx.held_record = None
            ctx.records.append(held_record)

    def close_step(self, ctx: Call, t: int, chain: bool = False) -> None:
        """End the running step at ``t``; ``chain``: the next step opens at once, starting at this one's end event."""
        if ctx.in_fwd:
            self.end_forward(ctx, t)
        marks = ctx.marks
        if marks is not None:
            ctx.marks = None
            syncs = self.marker.close(marks, ctx.records)
            if syncs >= 0:  # an audited step: its syncs count for the call's record
                ctx.syncs = syncs if ctx.syncs < 0 else ctx.syncs + syncs
        dur = t - ctx.step_t0
        decode = ctx.step > ctx.first_step
        records = ctx.records
        append = records.append
        # The step's host duration and (below) its device span: the same two records as continuous
        # batching's close_step (gpuprobe.integrations._transformers.continuous.loop), on the same StepSeries
        # targets (DecodeSpan, series.py). Why written out in both and not one shared method: a call is
        # one more Python call per decode step (of the 9.75 gpuprobe makes, benchmarks/step_calls.py), and
        # the device record differs here (a shared boundary event, MBU/MFU, a token held back one step).
        append((self.step_host[decode], dur))
        tok = ctx.dev_tok
        util = ctx.util
        pending: Any = None
        if tok is not None:
            # A decode step's device span is also the device inter-token latency of the token it selected.
            target: Any
            spans = ctx.spans
            if spans is None:  # no record's device time (the call began without a device clock)
                if not decode:
                    target = self.step_dev[0]
                else:
                    target = DecodeSpan(self.step_dev[1], self.itl_dev) if ctx.deferred else self.decode_span
            else:  # the call's own targets, which add to its record's device time
                ctx.tally.expected += 1
                if not decode:
                    target = spans[0]
                else:
                    target = DecodeSpan(self.step_dev[1], self.itl_dev, 1, ctx.tally) if ctx.deferred else spans[1]
            if chain:
                pending, ctx.boundary = ctx.clock.split(tok)
            else:
                pending = ctx.clock.stop(tok)
            rec: Any
            if util is None:
                rec = (self.rt.pending.apply, (target, pending))
            else:  # the device step time, then MBU/MFU from it, once the events are read
                rec = (util.device_step, (target, pending, ctx.batch, ctx.prompt_len, ctx.step - ctx.first_step))
            if decode and ctx.deferred:  # kept back one step: the token of the last step run may be undone
                rec, ctx.held_record = ctx.held_record, rec
            if rec is not None:
                append(rec)
            ctx.dev_tok = None
        elif util is not None and ctx.clock is None:  # CPU (or device timing off): the host step time
            # Why a record of four integers: counting bytes and FLOPs and dividing costs 1.26 us per step,
            # appending this record 0.19 us (test CPU); the drain pays the rest.
            append((util.host_step, (dur, ctx.batch, ctx.prompt_len, ctx.step - ctx.first_step)))
        if not decode and ctx.call_tok is not None:  # device TTFT: the call's start event → after token 0
            call_tok, ctx.call_tok = ctx.call_tok, None
            if pending is not None and pending[0] is call_tok[0]:
                # Why shared: step 0's end event is the moment TTFT ends; another record is host time for nothing.
                pending[0].share(pending[2])
                target = (self.request_series.ttft_device, (pending[0], call_tok[1], pending[2]))
                append((self.rt.pending.apply, target))
            else:
                append((self.rt.pending.apply, (self.request_series.ttft_device, ctx.clock.stop(call_tok))))
        other = dur - ctx.fwd_ns - ctx.counted_ns
        append((self.c_forward, ctx.fwd_ns))
        if ctx.criteria_ns >= 0:
            append((self.c_stopping, ctx.criteria_ns))
            other -= ctx.criteria_ns
        if ctx.streamed:
            append((self.c_streamer, ctx.streamer_ns))
            other -= ctx.streamer_ns
        append((self.c_other, other))
        if decode or not ctx.deferred:  # this step's token (deferred: the previous step's) is on the host now
            # token_on_host written out for the common case (one Python call fewer per decode step).
            if ctx.ttft_ns >= 0:
                gap = t - ctx.tok_t
                append((self.itl_host, gap))
                # Why kept per call: the record's median and longest gap; a list append is a C call, no
                # Python frame on the step (benchmarks/step_calls.py counts frames).
                ctx.gaps.append(gap)
                ctx.tok_t = t
            else:
                self.token_on_host(ctx, t)
        if ctx.nv is not None:
            ctx.nv.pop()
            ctx.depth -= 1
        ctx.step_open = False
        if ctx.layers_on:
            ctx.layers_on = False
            self.release_layers()
            if ctx.layer_next is not None:
                ctx.clock.drop(ctx.layer_next[1])
                ctx.layer_next = None
            if not ctx.layers_ran:
                self.no_layer_ran()
        # Why every memory_every steps: one memory reading costs 24 us on CPU (RSS from /proc);
        # gauges keep only the last value anyway, and every call ends with a reading.
        if ctx.step % self.memory_every == 0 and (self.memory or self.kv_cache):
            self.read_gauges(ctx)
        if len(records) >= self.rt.buffer_size:
            self.rt.drain()
