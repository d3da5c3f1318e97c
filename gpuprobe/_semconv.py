"""Which version of the OpenTelemetry GenAI semantic conventions gpuprobe's ``gen_ai.*`` names follow.

The conventions' own switch decides it: ``OTEL_SEMCONV_STABILITY_OPT_IN``, a comma-separated list of
values each instrumentation reads for its own field. With ``gen_ai_latest_experimental`` in it, gpuprobe
emits the newest GenAI names (the token-usage counters and per-operation histograms that replace
``gen_ai.client.token.usage``, ``gen_ai.client.inference.time_to_first_chunk``); without it, the names
gpuprobe has emitted so far (``gen_ai.client.operation.time_to_first_chunk`` of v1.41.0). Which version
each name follows is in docs/metrics.md.

The variable is read once, at the first question (why once: like prometheus_client picking its value
class at import, the names a process emits never change under a dashboard while it runs). A GenAI value
gpuprobe cannot use (``gen_ai_latest``, ``gen_ai/dup``) is warned about once and the default is used; the
other values are other instrumentations' (``http``, ``database/dup``) and are left to them.

Example:
    >>> parse("http/dup, gen_ai_latest_experimental")
    (True, None)
    >>> parse("gen_ai_latest")[0]
    False
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["ENV", "GENAI_LATEST", "parse", "genai_latest"]

ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""The conventions' own variable."""
GENAI_LATEST = "gen_ai_latest_experimental"
"""Its value for the newest (experimental) GenAI conventions."""

_read: tuple[bool, str | None] | None = None
_lock = threading.Lock()


def parse(raw: str | None) -> tuple[bool, str | None]:
    """Whether ``raw`` (the variable's value) opts into the newest GenAI names, and what is wrong with it
    (None when nothing is): a GenAI value other than :data:`GENAI_LATEST`, when that one is not there.

    Example:
        >>> parse(None), parse("")
        ((False, None), (False, None))
        >>> print(parse("gen_ai/dup")[1])
        OTEL_SEMCONV_STABILITY_OPT_IN='gen_ai/dup': gpuprobe knows one GenAI value, gen_ai_latest_experimental; it emits its default GenAI names
    """
    values = [v.strip() for v in (raw or "").split(",") if v.strip()]
    if GENAI_LATEST in values:
        return True, None
    unknown = [v for v in values if v.lower().startswith("gen_ai") or v.lower().startswith("genai")]
    if unknown:
        return False, f"{ENV}={raw!r}: gpuprobe knows one GenAI value, {GENAI_LATEST}; it emits its default GenAI names"
    return False, None


def genai_latest(warn: Callable[..., None] | None = None) -> bool:
    """Whether this process emits the newest GenAI names (the environment read at the first call).

    Args:
        warn: ``warn(key, message, where=...)`` (the runtime's ``warn_once``), told once of a GenAI value
            gpuprobe cannot use.
    """
    global _read
    found = _read
    if found is None:
        with _lock:
            found = _read
            if found is None:
                found = _read = parse(os.environ.get(ENV))
    if found[1] is not None and warn is not None:
        warn(f"setting:{ENV}", f"gpuprobe: {found[1]}", where="<environment>")
    return found[0]
