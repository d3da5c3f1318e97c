"""The caller's streamer timed inside a step: its ``put`` patched for one call (the ``streamer`` component).

The first ``put`` inside a step (the prompt's comes before the first step) is the call's first chunk of
output: from the call's start to that ``put`` is the GenAI convention's time to first chunk
(``gen_ai.client.operation.time_to_first_chunk``; ``gen_ai.client.inference.time_to_first_chunk`` with the
newest conventions, see :mod:`gpuprobe._semconv`), one sample per streaming call.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from .... import _seams
from .call import Call
from .marks import STREAMER
from .seams import SEAM_STREAMER

__all__ = ["time_streamer"]


def time_streamer(streamer: Any, ctx: Call, state: Any) -> Callable[[], Any] | None:
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
        if not ctx.chunked:  # its first chunk of output: the GenAI convention's time to first chunk
            ctx.chunked = True
            ctx.records.append((state.request_series.first_chunk, t0 - ctx.t0))
        if mark is not None:
            ctx.marks.end(mark)  # type: ignore[union-attr]
        if ctx.nv is not None:
            ctx.nv.pop()

    patch = seam.patch(streamer, _seams.wrap(seam, streamer.put, before, after))
    return patch.undo
