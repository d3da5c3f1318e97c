"""The kit every generation integration records with: GenAI request series, step series, the
time-per-output-token formula and a decoding step's device span as a record target.

A library's integration (transformers' ``generate()`` and continuous batching today; a custom decoding
loop, vLLM or SGLang tomorrow) prepares these once per model and appends ``(apply, value)`` records on
its hot path (see :mod:`gpuprobe.runtime`); the metrics are declared in ``gpuprobe._metrics.SPECS``.
Public, so an integration outside gpuprobe (your own decoding loop) records the same series as the ones
inside it; docs/architecture.md, "How to add an integration", shows one.

A request's series are the OpenTelemetry GenAI ones (time to first token on both clocks, time per output
token, request duration by error type, token usage, a streaming request's time to first chunk; the names of
the conventions' version :mod:`gpuprobe._semconv` picks), labelled with :func:`genai_labels`, which name the
provider; gpuprobe's own step series (step duration by phase and clock, its components, inter-token
latency on both clocks) carry :data:`MODEL_LABEL`.

A step closes the same way in every integration: the step's host duration goes to
``StepSeries.host[phase]``, and on a GPU its device span, a pending record whose target is
``StepSeries.device[phase]`` or, when the step's forward selected output tokens after the first, a
:class:`DecodeSpan` (:meth:`StepSeries.device_span`), which is also the device inter-token latency of
those tokens.

Example:
    >>> from gpuprobe.integrations.kit import time_per_output_token_ns, genai_labels
    >>> time_per_output_token_ns(after_first_ns=90, output_tokens=4)
    30
    >>> genai_labels("tiny", "my-loop")["gen_ai.provider.name"]
    'my-loop'
"""

from __future__ import annotations

from typing import Any

from .. import memory
from .._semconv import genai_latest
from ..runtime import Runtime

__all__ = ["MODEL_LABEL", "OPERATION", "DecodeSpan", "DeviceTally", "MemoryGauges", "RequestSeries", "StepSeries",
           "genai_labels", "time_per_output_token_ns"]

# OpenTelemetry GenAI semantic conventions: generation from token ids is a text completion.
OPERATION = "text_completion"
# The model's label on gpuprobe's own metrics (the GenAI ones use gen_ai.request.model).
MODEL_LABEL = "model"


def genai_labels(model: str, provider: str, operation: str = OPERATION) -> dict[str, str]:
    """The GenAI convention's attributes of a request to ``model`` run by ``provider``."""
    return {"gen_ai.request.model": model, "gen_ai.provider.name": provider, "gen_ai.operation.name": operation}


def time_per_output_token_ns(after_first_ns: int, output_tokens: int) -> int | None:
    """The GenAI convention's time per output token: (duration − time to first token) ÷ (output tokens − 1),
    from the time after the first token; ``None`` where it is undefined (fewer than two output tokens).

    Example:
        >>> time_per_output_token_ns(90, 4)
        30
        >>> time_per_output_token_ns(90, 1) is None
        True
    """
    return after_first_ns // (output_tokens - 1) if output_tokens > 1 else None


class RequestSeries:
    """A model's GenAI request series, prepared once (the ``apply`` of each, ready for records).

    Args:
        rt: the runtime (``gpuprobe.runtime.runtime()``).
        model: the model's name (``gen_ai.request.model``).
        provider: the library that runs the model (``gen_ai.provider.name``: ``"transformers"``, ``"vllm"``).
        operation: ``gen_ai.operation.name`` (:data:`OPERATION` for generation from token ids).
    """

    __slots__ = ("labels", "ttft", "ttft_device", "tpot", "request_ok", "usage_in", "usage_out", "first_chunk",
                 "_request", "_errors")

    def __init__(self, rt: Runtime, model: str, provider: str, operation: str = OPERATION) -> None:
        fam = rt.family
        gen = self.labels = genai_labels(model, provider, operation)
        ttft = fam("gen_ai.server.time_to_first_token")
        self.ttft = ttft.child(**gen, clock="host").apply
        #: The device clock's series itself: a pending device timing's target.
        self.ttft_device = ttft.child(**gen, clock="device")
        self.tpot = fam("gen_ai.server.time_per_output_token").child(**gen).apply
        self._request = fam("gen_ai.server.request.duration")
        self.request_ok = self._request.child(**gen).apply
        usage = fam("gen_ai.client.token.usage")
        #: A request's input and output tokens (every sequence's): the token-usage histogram, and with the
        #: newest GenAI conventions (``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``) its
        #: replacements too, the counters and per-operation histograms, from the same record.
        self.usage_in = usage.child(**gen, **{"gen_ai.token.type": "input"}).apply
        self.usage_out = usage.child(**gen, **{"gen_ai.token.type": "output"}).apply
        latest = genai_latest(rt.warn_once)
        if latest:
            modality = {"gen_ai.token.modality": "unknown"}  # token ids: gpuprobe does not know what they encode
            self.usage_in = _Fanout(self.usage_in, fam("gen_ai.client.inference.usage.input_tokens").child(
                **gen, **modality).apply, fam("gen_ai.client.inference.operation.input_tokens").child(**gen).apply)
            self.usage_out = _Fanout(self.usage_out, fam("gen_ai.client.inference.usage.output_tokens").child(
                **gen, **modality).apply, fam("gen_ai.client.inference.operation.output_tokens").child(**gen).apply)
        #: A streaming request's time to its first chunk of output (the convention's time to first chunk).
        self.first_chunk = fam("gen_ai.client.inference.time_to_first_chunk" if latest else
                               "gen_ai.client.operation.time_to_first_chunk").child(**gen).apply
        self._errors: dict[str, Any] = {}

    def request_error(self, error_type: str) -> Any:
        """The request-duration series of requests that ended with ``error_type`` (prepared on first use;
        the values come from code: exception class names and a fixed set of statuses)."""
        found = self._errors.get(error_type)
        if found is None:
            found = self._request.child(**self.labels, **{"error.type": error_type}).apply
            if len(self._errors) < 64:  # bounded like the series: a program's error types never grow it
                self._errors[error_type] = found
        return found


class _Fanout:
    """One record applied to several series (a request's token count under the newest GenAI conventions:
    the histogram it always fed and its replacements). Applied at the drain, off the request's thread."""

    __slots__ = ("_applies",)

    def __init__(self, *applies: Any) -> None:
        self._applies = applies

    def __call__(self, value: int) -> None:
        for apply in self._applies:
            apply(value)


class MemoryGauges:
    """The memory gauges (allocated, reserved, peak) of the devices a model runs on, read through the
    runtime's memory reader: one allocator read per CUDA device, no device sync; on a CPU, the process's
    resident set (``reserved`` then stays unset).

    Example:
        >>> from gpuprobe.runtime import runtime
        >>> records = []
        >>> MemoryGauges(runtime()).read(records, ())  # no CUDA device: the process's memory
        >>> len(records)
        2
    """

    __slots__ = ("rt", "_children", "_families")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._children: dict[str, tuple[Any, Any, Any]] = {}  # device name -> (allocated, reserved, peak) apply
        self._families = (rt.family("gpuprobe.memory.allocated"), rt.family("gpuprobe.memory.reserved"),
                          rt.family("gpuprobe.memory.peak"))

    def read(self, records: Any, devices: tuple[int, ...]) -> None:
        """Append one reading of each CUDA device in ``devices`` (none: the process's memory) to ``records``."""
        rt = self.rt
        reader = rt.backends.read_memory if devices else memory.process_reading
        children = self._children
        for device in devices or (None,):
            try:
                reading = reader(device)
            except Exception as exc:
                rt.warn_once("memory", f"gpuprobe: memory reading failed: {exc!r}")
                return
            if reading is None:  # CUDA not initialized yet: nothing to read
                continue
            # Why looked up here and not in a method: a reading then costs one Python call fewer (a step that
            # reads the gauges, test_step_calls.py).
            found = children.get(reading.device)
            if found is None:
                a, r, p = self._families
                found = (a.child(device=reading.device).apply, r.child(device=reading.device).apply,
                         p.child(device=reading.device).apply)
                if len(children) < 64:  # devices of one process: a handful
                    children[reading.device] = found
            records.append((found[0], reading.allocated))
            if reading.reserved is not None:
                records.append((found[1], reading.reserved))
            records.append((found[2], reading.peak))


class DeviceTally:
    """One request's device time: the sum of its steps' device spans, once every one of them is read.

    The request's steps each count one span (:meth:`expect`, on the step's thread: an integer added); the
    spans' targets (:class:`DecodeSpan` with ``tally=``) add theirs when the runtime reads the events; the
    request's end says where the total goes (:meth:`deliver`), which is called when the last span is in.

    Example:
        >>> got = []
        >>> tally = DeviceTally()
        >>> tally.expect(); tally.expect()
        >>> tally.deliver(got.append)
        >>> tally.add(3); tally.add(4)
        >>> got
        [7]
    """

    __slots__ = ("ns", "expected", "read", "_to")

    def __init__(self) -> None:
        self.ns = 0
        self.expected = 0
        self.read = 0
        self._to: Any = None

    def expect(self) -> None:
        self.expected += 1

    def add(self, ns: int) -> None:
        self.ns += ns
        self.read += 1
        if self._to is not None and self.read >= self.expected:
            to, self._to = self._to, None
            to(self.ns)

    def deliver(self, to: Any) -> None:
        """Call ``to(total ns)`` once every expected span is read (now, if they are)."""
        if self.expected and self.read >= self.expected:
            to(self.ns)
        elif self.expected:
            self._to = to


class DecodeSpan:
    """A decoding step's device span as a record target: the step's device series once, and the device
    inter-token latency once for each of the ``tokens`` output tokens (after a request's first) that the
    step's forward selected. An integration that may undo a step's token (generate()'s deferred stop check) sets ``tokens`` to 0 on
    its own copy when the token turns out not to be an output token. ``tally``: the request's
    :class:`DeviceTally`, which the span is added to."""

    __slots__ = ("step", "itl", "tokens", "tally")

    def __init__(self, step: Any, itl: Any, tokens: int = 1, tally: DeviceTally | None = None) -> None:
        self.step = step  # the device step series of the step's phase
        self.itl = itl  # the device inter-token series (a histogram child)
        self.tokens = tokens
        self.tally = tally

    def apply(self, ns: int) -> None:
        self.step.apply(ns)
        if self.tally is not None:
            self.tally.add(ns)
        tokens = self.tokens
        if tokens == 1:
            self.itl.apply(ns)
        elif tokens:
            self.itl.apply_many([ns] * tokens)


class StepSeries:
    """A model's step series: step duration per phase on both clocks, components, inter-token latency."""

    __slots__ = ("model", "host", "device", "itl_host", "itl_device", "_components", "_spans")

    def __init__(self, rt: Runtime, model: str, phases: tuple[str, ...]) -> None:
        fam = rt.family
        self.model = {MODEL_LABEL: model}
        step = fam("gpuprobe.step.duration")
        #: Per phase (in ``phases`` order): the host clock's ``apply``, and the device clock's series.
        self.host = tuple(step.child(**self.model, phase=p, clock="host").apply for p in phases)
        self.device = tuple(step.child(**self.model, phase=p, clock="device") for p in phases)
        itl = fam("gpuprobe.inter_token.duration")
        self.itl_host = itl.child(**self.model, clock="host")
        self.itl_device = itl.child(**self.model, clock="device")
        self._components = fam("gpuprobe.step.component.duration")
        self._spans: dict[tuple[int, int], DecodeSpan] = {}

    def component(self, component: str, **labels: str) -> Any:
        """The ``apply`` of a component's series (``processor=`` for a logits processor's class)."""
        return self._components.child(**self.model, component=component, **labels).apply

    def device_span(self, phase: int, tokens: int) -> DecodeSpan:
        """The shared record target of a step of ``phase`` (an index of ``phases``) whose forward selected
        ``tokens`` output tokens after a request's first (cached per phase and count, bounded like the
        other caches; never changed: an integration that may undo a token makes its own :class:`DecodeSpan`)."""
        key = (phase, tokens)
        found = self._spans.get(key)
        if found is None:
            found = DecodeSpan(self.device[phase], self.itl_device, tokens)
            # Why a cache: a step's target then costs one dict hit instead of an object a step.
            if len(self._spans) < 4096:
                self._spans[key] = found
        return found
