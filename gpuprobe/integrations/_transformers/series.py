"""The transformers integration's binding of :mod:`gpuprobe.integrations.kit`: its GenAI provider name,
and the series ``generate()`` and continuous batching both record (prepared once per model).

Both paths close a step the same way (see the kit); each ``close_step`` writes its two appends itself
(why: see the comment there).
"""

from __future__ import annotations

from ...runtime import Runtime
from .. import kit
from ..kit import MODEL_LABEL, OPERATION, DecodeSpan, StepSeries, time_per_output_token_ns

__all__ = ["MODEL_LABEL", "OPERATION", "PROVIDER", "DecodeSpan", "RequestSeries", "StepSeries", "genai_labels",
           "time_per_output_token_ns"]

PROVIDER = "transformers"
"""``gen_ai.provider.name`` of every request the transformers integration records."""


def genai_labels(model: str) -> dict[str, str]:
    """The GenAI convention's attributes of a request to ``model`` run by transformers."""
    return kit.genai_labels(model, PROVIDER)


class RequestSeries(kit.RequestSeries):
    """A model's GenAI request series with transformers as the provider."""

    __slots__ = ()

    def __init__(self, rt: Runtime, model: str) -> None:
        super().__init__(rt, model, PROVIDER)
