"""The hot path of the transformers integration: per-model state, per-call context and the seams.

How a generation step is seen (transformers 5.x, ``_sample`` and ``_beam_search``)::

    generate()                                  seam: the call (NVTX "generate"), TTFT, duration, usage
      _prefill(input_ids, ...)                  seam: step 0 opens (phase prefill), forward starts
        self(**inputs)
      loop: _has_unfinished_sequences()         seam: closes the running step, opens the next (decode),
                                                whose forward starts at once
        prepare_inputs_for_generation()
        model_forward(**inputs)
        _update_model_kwargs_for_generation()   seam: forward ends
        logits_processor(ids, logits)           transformers' list; each element a timed stand-in
        token selection, torch.cat              "other"
        stopping_criteria(ids, scores)          transformers' list; each criterion a timed stand-in
        stop_check -> streamer.put(tokens)      the caller's streamer, its put() timed for the call

Every seam (:mod:`gpuprobe._seams`) is looked up on the instance by transformers (``self.<name>(...)``),
so each is installed as an instance attribute: a method bound to the model whose function reads the
model's state from ``model.__dict__``, runs the original once with the arguments as passed, and keeps
gpuprobe's work in guarded hooks (its failure switches the loop's seams off, never the program).
``copy.deepcopy`` rebinds such methods to the copy, and the state deep-copies (and pickles) to ``None``,
so a copy of an instrumented model is a plain, uninstrumented model.

Steps tile the decoding loop: a step runs from the return of one ``_has_unfinished_sequences`` call
to the return of the next (step 0 from the ``_prefill`` call), so ``forward + logits processors +
stopping criteria + streamer + other`` is exactly the step's duration. On a GPU the steps of one call
share their boundary events: the end event of step N is the start event of step N + 1 (one event
record per decode step; :meth:`~gpuprobe.timing.DeviceClock.split`), and so are those of decoder
layers that run one after the other in a sampled step.

Latencies (``docs/transformers.md``, "Latencies and their clocks"): a step's end is when the host
holds its token, or, under transformers' deferred stop check, the next step's end (see
:meth:`ModelState.token_on_host`); on a GPU the device TTFT runs from an event recorded as the call
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
"""

from __future__ import annotations

import inspect
import sys
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from .... import _seams, is_enabled, memory
from ...._placement import tensor_device
from ...._torch_caps import profiler_caps
from ..continuous import ServingState
from .marks import STREAMER, StepMarker, StepMarks
from ..series import RequestSeries, StepSeries, time_per_output_token_ns
from .spans import DecodeSpan
from .utilization import Utilization
from ....runtime import Runtime

__all__ = ["ModelState", "STATE_KEY", "METHOD_SEAMS", "MethodSeam", "GROUP_CALL", "GROUP_STEPS"]

STATE_KEY = "_gpuprobe_state"

GROUP_CALL = "transformers.generate"
"""The switch of the generate() call's own seam (per-call metrics)."""
GROUP_STEPS = "transformers.generate.steps"
"""The switch of the seams inside the decoding loop (steps, components, layers): they work together."""


def _none() -> None:
    return None


def _not_compiling() -> bool:
    return False


_NO_SPAN = object()  # a layer on a CUDA device whose device span could not be taken


# torch.compiler.is_dynamo_compiling once torch is there (bound when the first model is instrumented):
# a plain `return False` in eager code that Dynamo folds to True while it traces.
_compiling: Callable[[], bool] = _not_compiling


def _bind_compiling() -> None:
    global _compiling, _profiling
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        _compiling = getattr(compiler, "is_dynamo_compiling", compiler.is_compiling)
    if torch is not None:
        _profiling = profiler_caps(torch).profiler_enabled or _not_compiling


# Whether a torch.profiler session records on the calling thread (bound with _compiling, from
# gpuprobe._torch_caps): a program's own profiler gets the step and component ranges (see .marks).
_profiling: Callable[[], bool] = _not_compiling


class _Call:
    """What one generate() call on one thread knows while it runs."""

    __slots__ = (
        "t0", "records", "nv", "clock", "device", "devices", "step", "step_t0", "step_open", "seen_check",
        "prefilled", "in_fwd", "fwd_t0", "fwd_ns", "processors_ns", "criteria_ns", "streamer_ns", "streamed",
        "dev_tok", "depth",
        "prompt_len", "batch", "cache", "layers_on", "layer_stack", "compiled", "live", "util",
        "marks", "audit",
        "call_tok", "deferred", "tok_t", "ttft_ns", "held_record",  # latencies of the tokens (see token_on_host)
        "args", "kwargs", "inputs", "prev", "undo", "boundary", "layer_next",
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
        self.processors_ns = 0
        self.criteria_ns = -1
        self.streamer_ns = 0
        self.streamed = False
        self.dev_tok: Any = None
        self.depth = 0  # NVTX ranges this call opened outside try/finally blocks (step, forward)
        self.prompt_len: int | None = None
        self.batch: int | None = None
        self.cache: Any = None
        self.layers_on = False
        self.layer_stack: list[tuple[int, Any]] = []
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
        self.prev: _Call | None = None  # the call this one runs inside on this thread (rare), put back at its end
        self.undo: list[Any] = []  # what the call patched for its length (streamer, list elements): put back at its end
        self.boundary: Any = None  # the end event of the step just closed, for the next step to start at
        self.layer_next: Any = None  # (the layer expected next, the end event of the layer just run)


class ModelState:
    """Everything prepared once for one instrumented model: options, series, NVTX strings, originals."""

    def __init__(self, model: Any, rt: Runtime, *, name: str, layers: list[tuple[Any, int]],
                 layer_every: int, layer_index: bool, memory: bool, kv_cache: bool, memory_every: int,
                 options: dict[str, Any]) -> None:
        self.model_name = name
        self.model = weakref.ref(model)
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
        self._lock = threading.Lock()
        self._nvtx_cache: dict[tuple[str, str, int], Any] = {}
        self._devices: dict[int, tuple[int, ...]] = {}  # input device -> every CUDA device the model uses
        self.layer_device: dict[Any, int | None] = {}
        _bind_compiling()
        fam = rt.family
        # Records are (bound apply method of a series, value), the runtime's Record type. Why bound
        # once: a step then appends tuples (0.11 us each) instead of calling Runtime.emit (0.57 us).
        self.request_series = RequestSeries(rt, name)
        steps = self.step_series = StepSeries(rt, name, ("prefill", "decode"))
        self.step_host, self.step_dev = steps.host, steps.device
        self.itl_host, self.itl_dev = steps.itl_host.apply, steps.itl_device.apply
        # Why one prepared target: a decode step's device span feeds the step and the inter-token series;
        # building the pair per step costs 0.18 us (test CPU), needed only when a token may be undone.
        self.decode_span = DecodeSpan(self.step_dev[1], self.itl_dev)
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
        self._mem: dict[str, tuple[Any, Any, Any]] = {}
        # Layers: one series per block class (and index when asked), prepared here.
        lay = fam("gpuprobe.layer.duration")
        self.layers = [m for m, _ in layers]
        self.layer_children: dict[Any, Any] = {}
        self.layer_messages: dict[Any, str] = {}
        # The block that runs right after each one in its stack: their spans may share a boundary event.
        self.layer_after: dict[Any, Any] = {
            m: n for (m, i), (n, j) in zip(layers, layers[1:]) if j == i + 1}
        for m, i in layers:
            labels = {**ml, "layer.type": type(m).__name__}
            if layer_index:
                labels["layer.index"] = str(i)
            self.layer_children[m] = lay.child(**labels)
            self.layer_messages[m] = f"{type(m).__name__} {i}"
        self._hook_users = 0
        self._hooks: list[Any] = []
        # Where the layers' parameters are is read again at the first sampled step of each call: a model
        # is not moved while it generates. Why not at every sampled step: ~22 Python calls per layer
        # (+19.6 -> +14.1 Python calls per greedy step with layers every 8, benchmarks/step_calls.py).
        self.layers_moved = True
        self.generate_message = f"generate {name}"
        self.utilization = Utilization(model, rt, name)  # measured once (MBU, MFU)
        self.marker = StepMarker(rt, name)  # component ranges in profile windows, the sync audit
        self.serving: Any = None  # continuous batching's series (continuous.ServingState), at first use

    # -- helpers ---------------------------------------------------------------------------
    def current(self) -> _Call | None:
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

    def observe_manager(self, manager: Any) -> None:
        """Continuous batching: observe the manager ``init_continuous_batching`` returned (once)."""
        if self.serving is None:
            self.serving = ServingState(self.rt, self.model_name, self.request_series)
        self.serving.observe(manager)

    def memory_children(self, device: str) -> tuple[Any, Any, Any]:
        found = self._mem.get(device)
        if found is None:
            fam = self.rt.family
            found = (fam("gpuprobe.memory.allocated").child(device=device).apply,
                     fam("gpuprobe.memory.reserved").child(device=device).apply,
                     fam("gpuprobe.memory.peak").child(device=device).apply)
            self._mem[device] = found
        return found

    def devices_for(self, model: Any, device: int) -> tuple[int, ...]:
        """Every CUDA device the model uses, given the device of its inputs (cached per input device).

        The input device, and those of ``hf_device_map`` (``device_map="auto"``) and of the timed layers.
        """
        found = self._devices.get(device)
        if found is None:
            used = {device}
            device_map = getattr(model, "hf_device_map", None)
            if isinstance(device_map, dict):
                used.update(d for d in device_map.values() if isinstance(d, int) and not isinstance(d, bool))
            used.update(d for d in (self.module_device(m) for m in self.layers) if d is not None)
            found = self._devices[device] = tuple(sorted(used))
        return found

    def module_device(self, module: Any) -> int | None:
        """The CUDA device of ``module``'s parameters (cached), or None when they are not on CUDA."""
        try:
            return self.layer_device[module]
        except KeyError:
            pass
        index = None
        for param in module.parameters():
            dev = tensor_device(param)
            index = dev.index if dev.type == "cuda" else None
            break
        self.layer_device[module] = index
        return index

    def read_gauges(self, ctx: _Call) -> None:
        """Memory and KV-cache gauges (no device sync: allocator counters, shapes and nbytes)."""
        records = ctx.records
        if self.memory:
            rt = self.rt
            # The devices the call's model uses; a call on the CPU reads the process's memory.
            reader = rt.backends.read_memory if ctx.devices else memory.process_reading
            for device in ctx.devices or (None,):
                try:
                    reading = reader(device)
                except Exception as exc:
                    rt.warn_once("memory", f"gpuprobe: memory reading failed: {exc!r}")
                    break
                if reading is None:
                    continue
                a, r, p = self.memory_children(reading.device)
                records.append((a, reading.allocated))
                if reading.reserved is not None:
                    records.append((r, reading.reserved))
                records.append((p, reading.peak))
        if self.kv_cache and ctx.cache is not None:
            records.append((self.kv_mem, cache_bytes(ctx.cache)))
            if ctx.prompt_len is not None:
                records.append((self.kv_seq, ctx.prompt_len + max(ctx.step, 0)))

    # -- layer hooks (installed only for sampled steps) -------------------------------------
    def acquire_layers(self) -> None:
        # Why hooks only on sampled steps: a hooked module call costs ~6 us more (11.7 -> 17.8 us
        # for a small Linear on the test CPU), while adding and removing both hooks costs 6.7 us
        # once per sampled step.
        with self._lock:
            self._hook_users += 1
            if self._hook_users == 1:
                if self.layers_moved:  # modules may have moved since the last call
                    self.layers_moved = False
                    self.layer_device.clear()
                    for m in self.layers:
                        self.module_device(m)
                for m in self.layers:
                    self._hooks.append(m.register_forward_pre_hook(self._layer_pre))
                    self._hooks.append(m.register_forward_hook(self._layer_post, always_call=True))

    def release_layers(self) -> None:
        with self._lock:
            self._hook_users -= 1
            if self._hook_users <= 0:
                self._hook_users = 0
                for h in self._hooks:
                    h.remove()
                self._hooks.clear()

    def remove_hooks(self) -> None:
        """Remove every layer hook now (uninstrument)."""
        with self._lock:
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            self._hook_users = 0

    def _layer_pre(self, module: Any, args: Any) -> None:
        if _compiling():  # Dynamo folds this to True while tracing: no graph break from the hook
            return None
        ctx = getattr(self.tls, "ctx", None)
        if ctx is None or not ctx.layers_on:
            return None
        nv = ctx.nv
        if nv is not None:
            nv.push(self.nvtx(nv, self.layer_messages[module], "layer", ctx.step))
        clock = ctx.clock
        token: Any = None
        if clock is not None:
            device = self.layer_device.get(module)
            chain = ctx.layer_next
            if chain is not None:
                ctx.layer_next = None
                if chain[0] is not module or device is None:  # not the block that follows: a fresh start
                    clock.drop(chain[1])
                    chain = None
            if device is not None:
                # On a GPU the host only queues kernels: without a device span (a capture is underway,
                # or no event was free) the layer gets no sample rather than its queuing time.
                token = (clock.start(device) if chain is None else clock.resume(chain[1], device)) or _NO_SPAN
        ctx.layer_stack.append((perf_counter_ns(), token))
        return None

    def _layer_post(self, module: Any, args: Any, output: Any) -> None:
        if _compiling():
            return None
        ctx = getattr(self.tls, "ctx", None)
        if ctx is None or not ctx.layers_on or not ctx.layer_stack:
            return None
        t0, tok = ctx.layer_stack.pop()
        dt = perf_counter_ns() - t0
        child = self.layer_children[module]
        if tok is None:
            ctx.records.append((child.apply, dt))  # the layer runs on the CPU: its host time
        elif tok is not _NO_SPAN:
            following = self.layer_after.get(module)
            if following is None:
                pending = ctx.clock.stop(tok)
            else:  # the next block of the stack starts at this one's end event
                pending, boundary = ctx.clock.split(tok)
                if boundary is not None:
                    if ctx.layer_next is not None:
                        ctx.clock.drop(ctx.layer_next[1])
                    ctx.layer_next = (following, boundary)
            ctx.records.append((self.rt.pending.apply, (child, pending)))
        if ctx.nv is not None:
            ctx.nv.pop()
        return None

    # -- steps -----------------------------------------------------------------------------
    def place_call(self, model: Any, ctx: _Call, ids: Any) -> None:
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

    def open_step(self, ctx: _Call, t: int, decode: bool) -> None:
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
            own = not traced and _profiling() and not steps.sampled(index)
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
            own = _profiling()
        ctx.step += 1
        ctx.step_open = True
        ctx.step_t0 = t
        ctx.fwd_ns = ctx.processors_ns = ctx.streamer_ns = 0
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
        # Decided once per step: most steps are neither traced nor audited, and their components then
        # test one attribute (ctx.marks is None). The audit stays out of compiled
        # forwards (Dynamo) and of CUDA graph captures.
        every = ctx.audit
        audited = (every != 0 and index % every == 0 and not ctx.compiled and not rt.capture.underway
                   and not _compiling())
        if traced or audited or own:
            ctx.marks = self.marker.open(traced, audited, index if own else None)
        # The forward starts with the step: in a decode step prepare_inputs_for_generation follows the
        # stop check at once (why no seam there: 3 Python calls fewer per decode step).
        ctx.in_fwd = True
        if nv is not None:
            nv.push(self.nvtx(nv, "forward", "component", ctx.step))
            ctx.depth += 1
        if ctx.marks is not None:
            ctx.marks.begin_forward()
        ctx.fwd_t0 = perf_counter_ns()

    def end_forward(self, ctx: _Call, t: int) -> None:
        ctx.fwd_ns += t - ctx.fwd_t0
        ctx.in_fwd = False
        if ctx.marks is not None:
            ctx.marks.end_forward()
        if ctx.nv is not None:
            ctx.nv.pop()
            ctx.depth -= 1

    def token_on_host(self, ctx: _Call, t: int) -> None:
        """The host holds the call's next output token since ``t``: its TTFT, or the time since the last one.

        When that is: transformers' stop check reads a flag computed from each step's token on the host
        (``bool(unfinished.max() == 0)``), which waits for the kernels that selected the token, so the
        host holds step k's token when step k ends. transformers' deferred stop check
        (``DeferredStopCheck``) reads step k's flag and tokens in step k + 1 (and the last step's in
        ``finish()``, before ``generate()`` returns), so the host holds them one step later; a streamer
        receives each token at that moment.
        """
        if ctx.ttft_ns >= 0:
            ctx.records.append((self.itl_host, t - ctx.tok_t))
        else:
            ctx.ttft_ns = t - ctx.t0
            ctx.records.append((self.request_series.ttft, ctx.ttft_ns))
        ctx.tok_t = t

    def last_tokens(self, ctx: _Call, t: int, n_out: int | None, failed: bool = False) -> None:
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
                held_record[1][0].itl = None
        if held_record is not None:
            ctx.held_record = None
            ctx.records.append(held_record)

    def close_step(self, ctx: _Call, t: int, chain: bool = False) -> None:
        """End the running step at ``t``; ``chain``: the next step opens at once, starting at this one's end event."""
        if ctx.in_fwd:
            self.end_forward(ctx, t)
        marks = ctx.marks
        if marks is not None:
            ctx.marks = None
            self.marker.close(marks, ctx.records)
        dur = t - ctx.step_t0
        decode = ctx.step > 0
        records = ctx.records
        append = records.append
        append((self.step_host[decode], dur))
        tok = ctx.dev_tok
        util = ctx.util
        pending: Any = None
        if tok is not None:
            # A decode step's device span is also the device inter-token latency of the token it selected.
            target: Any
            if not decode:
                target = self.step_dev[0]
            else:
                target = DecodeSpan(self.step_dev[1], self.itl_dev) if ctx.deferred else self.decode_span
            if chain:
                pending, ctx.boundary = ctx.clock.split(tok)
            else:
                pending = ctx.clock.stop(tok)
            rec: Any
            if util is None:
                rec = (self.rt.pending.apply, (target, pending))
            else:  # the device step time, then MBU/MFU from it, once the events are read
                rec = (util.device_step, (target, pending, ctx.batch, ctx.prompt_len, ctx.step))
            if decode and ctx.deferred:  # kept back one step: the token of the last step run may be undone
                rec, ctx.held_record = ctx.held_record, rec
            if rec is not None:
                append(rec)
            ctx.dev_tok = None
        elif util is not None and ctx.clock is None:  # CPU (or device timing off): the host step time
            # Why a record of four integers: counting bytes and FLOPs and dividing costs 1.26 us per step,
            # appending this record 0.19 us (test CPU); the drain pays the rest.
            append((util.host_step, (dur, ctx.batch, ctx.prompt_len, ctx.step)))
        if not decode and ctx.call_tok is not None:  # device TTFT: the call's start event → after token 0
            call_tok, ctx.call_tok = ctx.call_tok, None
            if pending is not None and pending[0] is call_tok[0]:
                # Why shared: step 0's end event is the moment TTFT ends; another record is host time for nothing.
                pending[0].share(pending[2])
                target = (self.request_series.ttft_device, (pending[0], call_tok[1], pending[2]))
                append((self.rt.pending.apply, target))
            else:
                append((self.rt.pending.apply, (self.request_series.ttft_device, ctx.clock.stop(call_tok))))
        other = dur - ctx.fwd_ns - ctx.processors_ns
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
                append((self.itl_host, t - ctx.tok_t))
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
        # Why every memory_every steps: one memory reading costs 24 us on CPU (RSS from /proc);
        # gauges keep only the last value anyway, and every call ends with a reading.
        if ctx.step % self.memory_every == 0 and (self.memory or self.kv_cache):
            self.read_gauges(ctx)
        if len(records) >= self.rt.buffer_size:
            self.rt.drain()

    # -- the call ----------------------------------------------------------------------------
    def begin_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], reader: _seams.ArgReader) -> _Call | None:
        """A generate() call starts on this thread: its context, or None when it is not measured.

        Nothing of the call's arguments is changed: the streamer is timed through its own ``put``
        (patched for the call, see :func:`_time_streamer`).
        """
        if not is_enabled() or _compiling():
            return None
        rt = self.rt
        backends = rt.backends
        nv = backends.nvtx if backends.nvtx.enabled else None
        ctx = _Call(perf_counter_ns(), rt.thread_records(), nv, backends.device_clock)
        ctx.args, ctx.kwargs = args, kwargs
        ctx.inputs = reader.get(args, kwargs, "inputs")
        if ctx.clock is not None:  # the call's start on the device of its inputs (device TTFT)
            dev = input_device(ctx.inputs, kwargs)
            if dev is not None and dev.type == "cuda":
                ctx.call_tok = ctx.clock.start(dev.index if dev.index is not None else 0)
        ctx.audit = rt.settings.sync_audit
        tls = self.tls
        ctx.prev = getattr(tls, "ctx", None)
        tls.ctx = ctx
        streamer = reader.get(args, kwargs, "streamer")
        if streamer is not None:
            ctx.undo.append(_time_streamer(streamer, ctx, self))
        ctx.records.append((self.active, 1))
        self.layers_moved = True
        if nv is not None:
            nv.push(self.nvtx(nv, self.generate_message, "generate", None))
        return ctx

    def end_call(self, ctx: _Call, out: Any, err: BaseException | None) -> None:
        """The call ``ctx`` returned ``out`` or raised ``err``: its samples; what it patched is put back."""
        try:
            self._finish(ctx, out, err)
        finally:
            self.tls.ctx = ctx.prev
            ctx.args = ctx.kwargs = ctx.inputs = ctx.prev = None
            undo, ctx.undo = ctx.undo, []
            for restore in undo:
                if restore is not None:
                    restore()

    def _finish(self, ctx: _Call, out: Any, err: BaseException | None) -> None:
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
                    self.marker.close(marks, ctx.records)
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
        if err is not None:
            records.append((self.request_series.request_error(type(err).__qualname__), dur))
            self.rt.observe_exception(err)
            self.last_tokens(ctx, t1, None, failed=True)
        else:
            records.append((self.request_series.request_ok, dur))
            n_in = input_tokens(ctx.inputs, ctx.kwargs or {})
            if n_in is None and ctx.prompt_len is not None and ctx.batch is not None:
                n_in = ctx.prompt_len * ctx.batch
            if n_in is not None:
                records.append((self.request_series.usage_in, n_in))
            seq = out if hasattr(out, "shape") else getattr(out, "sequences", None)
            shape = getattr(seq, "shape", None)
            n_out = None  # output tokens of each sequence
            if shape is not None and len(shape) == 2:
                start = ctx.prompt_len if ctx.prompt_len is not None else 0
                n_out = max(0, int(shape[1]) - start)
                records.append((self.request_series.usage_out, int(shape[0]) * n_out))
            self.last_tokens(ctx, t1, n_out)
            tpot = time_per_output_token_ns(dur - ctx.ttft_ns, n_out) if n_out and ctx.ttft_ns >= 0 else None
            if tpot is not None:
                records.append((self.request_series.tpot, tpot))
            if self.memory or self.kv_cache:
                self.read_gauges(ctx)
        records.append((self.active, -1))
        ctx.cache = None
        self.rt.steps_done()
        self.rt.drain_if_full(records)

    # pickling and deep copies of a model drop its instrumentation (see the module docstring)
    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_none, ())


def input_device(inputs: Any, kwargs: dict[str, Any]) -> Any:
    """Where a generate() call's inputs live (``torch.device``), or None when no tensor is found.

    ``inputs``: what was passed as generate()'s ``inputs`` parameter (by position or keyword).
    """
    x = inputs
    if x is None:
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
    return tensor_device(x) if hasattr(x, "device") else None


def defers_stop_check(frame: Any) -> bool:
    """Whether the decoding loop running in ``frame`` reads each step's tokens one step late.

    transformers 5.x (``_sample``) keeps its stop check in the local ``stop_check``: a
    ``DeferredStopCheck`` (mps in 5.23; planned for CUDA) copies the stop flag and the tokens to the
    host without waiting and reads them in the next step. Anything else (beam search, a loop without
    that local, older versions) is taken as reading each step's tokens in that step.
    """
    utils = sys.modules.get("transformers.generation.utils")
    deferred = getattr(utils, "DeferredStopCheck", None)
    if deferred is None:
        return False
    try:
        # Why once per call, at the first check after the prefill: reading a frame's locals copies all of
        # _sample's (~40) into a dict, 6-13 us on the test CPU.
        return isinstance(frame.f_locals.get("stop_check"), deferred)
    except Exception:
        return False


def input_tokens(inputs: Any, kwargs: dict[str, Any]) -> int | None:
    """Prompt tokens of a generate() call from the shape of its token ids (padding included).

    ``inputs``: what was passed as generate()'s ``inputs`` parameter (by position or keyword).
    """
    x = inputs
    if x is None:
        x = kwargs.get("input_ids")
    if x is not None:
        shape = getattr(x, "shape", None)
        dtype = getattr(x, "dtype", None)
        if shape is not None and len(shape) == 2 and dtype is not None and not dtype.is_floating_point:
            return int(shape[0]) * int(shape[1])
        return None
    x = kwargs.get("inputs_embeds")
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) == 3:
        return int(shape[0]) * int(shape[1])
    return None


def model_output_cache(outputs: Any) -> Any:
    """The KV cache a forward returned, read without side effects.

    transformers >= 5.24 names it ``cache`` and keeps ``past_key_values`` as a property that logs a
    deprecation warning; earlier 5.x name it ``past_key_values``. A model output is a dict of the
    fields that are set: read as a dict, neither name logs anything.
    """
    get = getattr(outputs, "get", None)
    if get is None:
        return None
    for key in ("cache", "past_key_values"):
        found = get(key)
        if found is not None:
            return found
    return None


def cache_bytes(cache: Any) -> int:
    """Bytes held by a transformers cache object: the sum of its tensors' ``nbytes`` (no sync)."""
    total = 0
    layers = getattr(cache, "layers", None)
    if layers is None:
        for sub in ("self_attention_cache", "cross_attention_cache"):
            inner = getattr(cache, sub, None)
            if inner is not None:
                total += cache_bytes(inner)
        return total
    for layer in layers:
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if t is not None:
                total += t.nbytes
    return total


# -- timing what transformers calls inside a step: logits processors, stopping criteria, the streamer ----

SEAM_PROCESSOR = _seams.declare(
    "transformers.generate.logits_processor", library="transformers", group=GROUP_STEPS, scenario="generate",
    target="each logits processor in the list _get_logits_processor returns, for one call")
SEAM_CRITERION = _seams.declare(
    "transformers.generate.stopping_criterion", library="transformers", group=GROUP_STEPS, scenario="generate",
    target="each stopping criterion in the list _get_stopping_criteria returns, for one call")
SEAM_STREAMER = _seams.declare(
    "transformers.generate.streamer", library="transformers", attribute="put", group=GROUP_STEPS,
    scenario="generate", target="put() of the caller's streamer, for one call")


class _Timed:
    """Stands in for one logits processor or stopping criterion in the list transformers built for a call.

    The list is transformers' own object and its own ``__call__`` runs as written (a list subclass
    too); only its elements are these stand-ins, for the length of the call (:meth:`ModelState.end_call`
    puts the originals back). A stand-in looks like what it holds: ``isinstance`` (through
    ``__class__``), attributes, copies and pickles are the element's, and ``inspect.signature`` of its
    ``__call__`` is the element's (transformers reads it to decide which keywords to pass).
    """

    __slots__ = ("_gp_inner", "_gp_state", "_gp_name", "_gp_child")
    _gp_seam: _seams.Seam = SEAM_PROCESSOR

    def __init__(self, inner: Any, state: ModelState, name: str, child: Any) -> None:
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
            except Exception as exc:
                seam.fail(exc)
            raise
        try:
            dt = perf_counter_ns() - t0
            if mark is not None:
                marks.end(mark)
            if nv is not None:
                nv.pop()
            child = self._gp_child
            if child is not None:  # a logits processor: its own series, and the step's processor time
                ctx.records.append((child, dt))
                ctx.processors_ns += dt
            else:  # a stopping criterion: the stopping_criteria component
                ctx.criteria_ns = (ctx.criteria_ns if ctx.criteria_ns > 0 else 0) + dt
        except Exception as exc:
            seam.fail(exc)
        return result

    # What each kind of element is and where its time goes.
    _gp_kind = "logits_processor"

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


class _TimedCriterion(_Timed):
    """A stopping criterion's stand-in: its time joins the ``stopping_criteria`` component."""

    __slots__ = ()
    _gp_seam = SEAM_CRITERION
    _gp_kind = "component"
    _gp_message = "stopping_criteria"  # the NVTX range of the component (ncu/nsys filters name it)

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


def _time_elements(lst: Any, ctx: _Call, state: ModelState, base: type) -> None:
    """Put stand-ins in place of the elements of ``lst`` (transformers' list for this call); the call's
    end puts the elements back."""
    if not isinstance(lst, list) or not lst:
        return
    swapped = False
    for i, element in enumerate(lst):
        if isinstance(type(element), type) and issubclass(type(element), _Timed):
            continue  # already timed (a list built once and passed again)
        child, name = state.element_info(element, base is _TimedCriterion)
        lst[i] = _stand_in_type(base, type(element))(element, state, name, child)
        swapped = True
    if swapped:
        ctx.undo.append(lambda: _untime_elements(lst))


def _untime_elements(lst: list[Any]) -> None:
    for i, element in enumerate(lst):
        if issubclass(type(element), _Timed):
            lst[i] = element._gp_inner


def _time_streamer(streamer: Any, ctx: _Call, state: ModelState) -> Callable[[], Any] | None:
    """Time ``streamer.put`` inside steps for this call (the caller's streamer object itself is passed on);
    returns what puts ``put`` back. A streamer whose attributes cannot be set is not timed."""
    seam = SEAM_STREAMER
    if not seam.switch.on or not hasattr(streamer, "__dict__") or _seams.is_replacement(streamer.__dict__.get("put")):
        return None
    if seam.check(streamer) is not None:
        return None

    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not ctx.step_open or not ctx.live:  # the prompt, before the first step
            return None
        nv = ctx.nv
        if nv is not None:
            nv.push(state.nvtx(nv, "streamer", "component", ctx.step))
        marks = ctx.marks
        mark = marks.begin(STREAMER, "streamer") if marks is not None else None
        return (perf_counter_ns(), mark)

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        t0, mark = token
        ctx.streamer_ns += perf_counter_ns() - t0
        ctx.streamed = True
        if mark is not None:
            ctx.marks.end(mark)  # type: ignore[union-attr]
        if ctx.nv is not None:
            ctx.nv.pop()

    patch = seam.patch(streamer, _seams.wrap(seam, streamer.put, before, after))
    return patch.undo


# -- the seams on each instrumented model --------------------------------------------------------

def _method_seam(attribute: str, short: str, group: str = GROUP_STEPS, reads: tuple[str, ...] = (),
                 scenario: str = "generate") -> _seams.Seam:
    return _seams.declare(f"transformers.generate.{short}" if short else "transformers.generate",
                          target=f"GenerationMixin.{attribute}, on each instrumented model", library="transformers",
                          attribute=attribute, reads=reads, group=group, scenario=scenario)


SEAM_GENERATE = _method_seam("generate", "", GROUP_CALL)
SEAM_PREFILL = _method_seam("_prefill", "prefill", reads=("input_ids",))
SEAM_CHECK = _method_seam("_has_unfinished_sequences", "stop_check")
SEAM_UPDATE = _method_seam("_update_model_kwargs_for_generation", "update_kwargs", reads=("outputs",))
SEAM_LOGITS = _method_seam("_get_logits_processor", "logits_processors")
SEAM_STOPPING = _method_seam("_get_stopping_criteria", "stopping_criteria")
SEAM_COMPILED = _method_seam("get_compiled_call", "compiled_call")
SEAM_CONTINUOUS = _method_seam("init_continuous_batching", "continuous_batching",
                               group="transformers.continuous_batching", scenario="generate_batch")


def _generate_before(state: ModelState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call | None:
    return state.begin_call(args, kwargs, state.readers["generate"])


def _generate_after(state: ModelState, ctx: _Call | None, result: Any, error: BaseException | None) -> None:
    if ctx is not None:
        state.end_call(ctx, result, error)


def _prefill_before(state: ModelState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is None or not ctx.live:
        return
    t = perf_counter_ns()
    if ctx.step_open:  # a second prefill in one call (unusual): close what runs
        state.close_step(ctx, t)
    ids = state.readers["_prefill"].get(args, kwargs, "input_ids")
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) >= 2:
        ctx.prompt_len = int(shape[-1])
        ctx.batch = int(shape[0])
        ctx.records.append((state.batch, ctx.batch))
    state.place_call(state.model(), ctx, ids)
    ctx.prefilled = True
    ctx.seen_check = False
    state.open_step(ctx, t, decode=False)


def _check_after(state: ModelState, token: None, more: Any, error: BaseException | None) -> None:
    # Why one hook after the check (not one before and one after): a decode step then costs two Python
    # calls fewer (of the 15.75 gpuprobe made per greedy step before, 9.75 now; benchmarks/RESULTS-probe.md); the check
    # itself (a few host operations) moves into the step that ends, the two steps still tile the loop.
    t = perf_counter_ns()
    ctx = getattr(state.tls, "ctx", None)
    if ctx is None or not ctx.prefilled:
        return
    if ctx.step_open and not ctx.seen_check:
        ctx.seen_check = True  # the check right after prefill: step 0 goes on (token selection)
        # The decoding loop that called: this hook <- the seam's replacement <- the loop.
        ctx.deferred = defers_stop_check(sys._getframe(2))
        return
    more = error is None and bool(more)
    if ctx.step_open:
        state.close_step(ctx, t, chain=more)
    if more:
        state.open_step(ctx, t, decode=True)


def _update_before(state: ModelState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    t = perf_counter_ns()
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and ctx.in_fwd:
        state.end_forward(ctx, t)
        if ctx.cache is None:
            outputs = state.readers["_update_model_kwargs_for_generation"].get(args, kwargs, "outputs")
            ctx.cache = model_output_cache(outputs)


def _logits_after(state: ModelState, token: None, result: Any, error: BaseException | None) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and error is None:
        _time_elements(result, ctx, state, _Timed)


def _stopping_after(state: ModelState, token: None, result: Any, error: BaseException | None) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and error is None:
        _time_elements(result, ctx, state, _TimedCriterion)


def _compiled_before(state: ModelState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None:
        ctx.compiled = True  # forward hooks inside a compiled forward would break its graph


def _continuous_after(state: ModelState, token: None, manager: Any, error: BaseException | None) -> None:
    if error is None:
        state.observe_manager(manager)


class MethodSeam:
    """A seam on a method transformers looks up on the model instance, and its hooks."""

    __slots__ = ("seam", "before", "after", "required", "optional_reads")

    def __init__(self, seam: _seams.Seam, before: Any = None, after: Any = None, required: bool = True,
                 optional_reads: tuple[str, ...] = ()) -> None:
        self.seam = seam
        self.before = before
        self.after = after
        self.required = required  # without it, the loop's seams are not installed (per-call metrics only)
        self.optional_reads = optional_reads  # parameters read when the method has them (no shape check)

    @property
    def attribute(self) -> str:
        return self.seam.attribute  # type: ignore[return-value]

    def replacement(self, cls: type) -> Any:
        """The function to bind to instances of ``cls`` (cached per class)."""
        key = (cls, self.seam.name)
        fn = _replacements.get(key)
        if fn is None:
            fn = _replacements[key] = _seams.wrap_method(self.seam, cls, STATE_KEY, self.before, self.after)
        return fn


_replacements: dict[tuple[type, str], Any] = {}

METHOD_SEAMS = (
    MethodSeam(SEAM_GENERATE, _generate_before, _generate_after, optional_reads=("inputs", "streamer")),
    MethodSeam(SEAM_PREFILL, _prefill_before),
    MethodSeam(SEAM_CHECK, after=_check_after),
    MethodSeam(SEAM_UPDATE, _update_before),
    MethodSeam(SEAM_LOGITS, after=_logits_after),
    MethodSeam(SEAM_STOPPING, after=_stopping_after),
    MethodSeam(SEAM_COMPILED, _compiled_before, required=False),
    MethodSeam(SEAM_CONTINUOUS, after=_continuous_after, required=False),
)
"""The seams :func:`~gpuprobe.integrations.transformers.instrument` installs on a model, in order."""
