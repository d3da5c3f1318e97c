"""One ``generate()`` call on one thread: what it knows while it runs.

:meth:`~.state.ModelState.begin_call` makes it, the seams and the step machine (:mod:`.steps`) fill it,
:meth:`~.state.ModelState.end_call` turns it into the call's samples.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .marks import StepMarks

__all__ = ["Call"]


class Call:
    """What one generate() call on one thread knows while it runs (the thread's ``state.tls.ctx``)."""

    __slots__ = (
        "t0", "records", "nv", "clock", "device", "devices", "step", "step_t0", "step_open", "seen_check",
        "prefilled", "in_fwd", "fwd_t0", "fwd_ns", "counted_ns", "criteria_ns", "streamer_ns", "streamed", "chunked",
        "dev_tok", "depth", "first_step", "extra_tokens", "rows", "stop_check", "synced", "spec",
        "prompt_len", "batch", "cache", "layers_on", "layer_stack", "layers_ran", "compiled", "live", "util",
        "marks", "audit",
        "call_tok", "deferred", "tok_t", "ttft_ns", "held_record",  # latencies of the tokens (see token_on_host)
        "args", "kwargs", "inputs", "prev", "undo", "boundary", "layer_next",
        "gaps", "tally", "spans", "syncs", "request_id", "limit", "other_stops", "sampling", "parent",  # its record
    )

    def __init__(self, t0: int, records: deque[Any], nv: Any, clock: Any) -> None:
        self.t0 = t0
        self.records = records
        self.nv = nv  # the NVTX backend when a tool is attached, else None
        self.clock = clock  # the device clock while the call's inputs are on a CUDA device, else None
        self.device: int | None = None  # the CUDA device of the call's inputs
        self.devices: tuple[int, ...] = ()  # every CUDA device the model uses (memory gauges)
        self.step = -1
        self.step_t0 = 0
        self.step_open = False
        self.seen_check = False
        self.prefilled = False
        self.in_fwd = False
        self.fwd_t0 = 0
        self.fwd_ns = 0
        # The step's components recorded as they ran (logits processors; a speculative step's draft and
        # verification): the step's "other" is what is left.
        self.counted_ns = 0
        self.criteria_ns = -1
        self.streamer_ns = 0
        self.streamed = False  # the streamer was given a chunk in the running step
        self.chunked = False  # ... in any step: its time to first chunk is recorded
        self.dev_tok: Any = None
        self.depth = 0  # NVTX ranges this call opened outside try/finally blocks (step, forward)
        self.first_step = 0  # the index of the running decoding loop's first step (a model's generate() may run several)
        self.extra_tokens = 0  # output tokens per sequence beyond one per step (speculative steps accept several)
        self.rows: tuple[int, int] | None = None  # (prompts, sequences) of the first loop (compat.loop_rows)
        self.stop_check: Any = None  # the loop's DeferredStopCheck, when it reads each step's tokens one step late
        self.synced = False  # the loop runs with synced_gpus: it may go on after this rank's sequences are done
        self.spec: Any = None  # a speculative call's running step (speculative.Speculation), else None
        self.prompt_len: int | None = None
        self.batch: int | None = None
        self.cache: Any = None
        self.layers_on = False
        self.layer_stack: list[tuple[int, Any]] = []
        self.layers_ran = 0  # layer samples taken in the running sampled step
        self.compiled = False
        self.live = True
        self.util: Any = None  # MBU/MFU record targets when the call's device has known peaks
        self.marks: StepMarks | None = None  # the running step's ranges and sync audit, if it is marked
        self.audit = 0  # the sync_audit setting when the call started: audit one step in this many
        self.call_tok: Any = None  # device start event of the call (device TTFT), until step 0 ends
        self.deferred = False  # transformers reads each step's token on the host one step late
        self.tok_t = 0  # host time the last output token reached the host
        self.ttft_ns = -1  # host TTFT of this call, once the first token reached the host
        self.held_record: Any = None  # deferred: the last decode step's device record, until its token is known kept
        self.args: Any = None  # the call's arguments, as passed (read, never changed)
        self.kwargs: Any = None
        self.inputs: Any = None  # generate()'s `inputs` parameter, read by name
        self.prev: Call | None = None  # the call this one runs inside on this thread (rare), put back at its end
        self.undo: list[Any] = []  # what the call patched for its length (streamer, list elements): put back at its end
        self.boundary: Any = None  # the end event of the step just closed, for the next step to start at
        self.layer_next: Any = None  # (the layer expected next, the end event of the layer just run)
        self.gaps: list[int] = []  # host time between two consecutive tokens (the record's median and longest)
        self.tally: Any = None  # on a GPU: the call's device time (kit.DeviceTally), summed from its steps' spans
        self.spans: Any = None  # on a GPU: (prefill, decode) device-span targets that add to ``tally``
        self.syncs = -1  # host syncs the sync audit counted in the call's audited steps (-1: none audited)
        self.request_id: str | None = None  # the id the caller's context gave (a server's x-request-id), if any
        self.limit: int | None = None  # new tokens at most (its finish reason: the limit reached is "length")
        self.other_stops = False  # stop strings or the caller's own stopping criteria may end it ("stop")
        self.sampling: tuple[Any, Any, Any] = (None, None, None)  # temperature, top_p, top_k when it samples
        self.parent: Any = None  # the caller's span context, while traces are on
