"""The series both transformers paths record — ``generate()`` and continuous batching — and the one
formula they share, prepared once per model.

A request's series are the OpenTelemetry GenAI ones (time to first token on both clocks, time per output
token, request duration by error type, token usage), labelled with :func:`genai_labels`; gpuprobe's own
step series (step duration by phase and clock, its components, inter-token latency on both clocks)
carry :data:`MODEL_LABEL`. Each path keeps the bound ``apply`` of the series it records on its hot path
(a record is ``(apply, value)``, see :mod:`gpuprobe.runtime`).

Both paths close a step the same way: the step's host duration goes to ``StepSeries.host[phase]``, and on a
GPU its device span, a pending record whose target is ``StepSeries.device[phase]`` or, when the step's
forward selected output tokens after the first, a :class:`DecodeSpan` (:meth:`StepSeries.device_span`),
which is also the device inter-token latency of those tokens. Each ``close_step`` writes those two
appends itself (why: see the comment there).
"""

from __future__ import annotations

from typing import Any

from ...runtime import Runtime

__all__ = ["MODEL_LABEL", "OPERATION", "PROVIDER", "DecodeSpan", "RequestSeries", "StepSeries", "genai_labels",
           "time_per_output_token_ns"]

PROVIDER = "transformers"
# OpenTelemetry GenAI semantic conventions: generate() on token ids is a text completion.
OPERATION = "text_completion"
# The model's label on gpuprobe's own metrics (the GenAI ones use gen_ai.request.model).
MODEL_LABEL = "model"


def genai_labels(model: str) -> dict[str, str]:
    """The GenAI convention's attributes of a request to ``model``."""
    return {"gen_ai.request.model": model, "gen_ai.provider.name": PROVIDER, "gen_ai.operation.name": OPERATION}


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
    """A model's GenAI request series, prepared once (the ``apply`` of each, ready for records)."""

    __slots__ = ("labels", "ttft", "ttft_device", "tpot", "request_ok", "usage_in", "usage_out", "_request",
                 "_errors")

    def __init__(self, rt: Runtime, model: str) -> None:
        fam = rt.family
        gen = self.labels = genai_labels(model)
        ttft = fam("gen_ai.server.time_to_first_token")
        self.ttft = ttft.child(**gen, clock="host").apply
        #: The device clock's series itself: a pending device timing's target.
        self.ttft_device = ttft.child(**gen, clock="device")
        self.tpot = fam("gen_ai.server.time_per_output_token").child(**gen).apply
        self._request = fam("gen_ai.server.request.duration")
        self.request_ok = self._request.child(**gen).apply
        usage = fam("gen_ai.client.token.usage")
        self.usage_in = usage.child(**gen, **{"gen_ai.token.type": "input"}).apply
        self.usage_out = usage.child(**gen, **{"gen_ai.token.type": "output"}).apply
        self._errors: dict[str, Any] = {}

    def request_error(self, error_type: str) -> Any:
        """The request-duration series of requests that ended with ``error_type`` (prepared on first use;
        the values come from code: exception class names and a fixed set of statuses)."""
        found = self._errors.get(error_type)
        if found is None:
            found = self._errors[error_type] = self._request.child(**self.labels, **{"error.type": error_type}).apply
        return found


class DecodeSpan:
    """A decoding step's device span as a record target: the step's device series once, and the device
    inter-token latency once for each of the ``tokens`` output tokens (after a request's first) that the
    step's forward selected. generate() sets ``tokens`` to 0 on its own copy when the token turns out not
    to be an output token."""

    __slots__ = ("step", "itl", "tokens")

    def __init__(self, step: Any, itl: Any, tokens: int = 1) -> None:
        self.step = step  # the device step series of the step's phase
        self.itl = itl  # the device inter-token series (a histogram child)
        self.tokens = tokens

    def apply(self, ns: int) -> None:
        self.step.apply(ns)
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
        other caches; never changed: generate() makes its own :class:`DecodeSpan` when it may undo one)."""
        key = (phase, tokens)
        found = self._spans.get(key)
        if found is None:
            found = DecodeSpan(self.device[phase], self.itl_device, tokens)
            # Why a cache: a step's target then costs one dict hit instead of an object a step.
            if len(self._spans) < 4096:
                self._spans[key] = found
        return found
