"""Assisted decoding and prompt lookup: speculative steps, their draft and verification, and what they accept.

transformers runs both in ``_assisted_decoding`` (``assistant_model=``, ``prompt_lookup_num_tokens=``,
``assistant_early_exit=``, …): each iteration of its loop is one forward of the main model that checks
the tokens a *candidate generator* proposed (a draft model's ``generate()``, or n-grams of the prompt)
and keeps those it agrees with, plus one token of its own. gpuprobe sees it at these points::

    _get_candidate_generator(...)           seam: the call is speculative; step 0 opens (phase prefill)
    while _has_unfinished_sequences():      as it returns: ends the running step, starts the next (decode)
        get_candidates(input_ids)           stand-in, for the call: "draft" (NVTX range, component)
        prepare_inputs, model(**inputs)     "forward": from the draft's end to the model's forward hook
        logits processors, selection,       "verify": from the forward's end to the return of
        streamer.put, cache crop,           update_candidate_strategy, less the logits processors and the
        update_candidate_strategy(...)      streamer (components of their own); counts: draft, accepted
        _update_model_kwargs(...), stopping criteria, ...     as in any step

A step's tokens all reach the host at its end: the first of them gets the time since the previous token
(or the TTFT), each other one an inter-token sample of 0 (they land with it). While the draft runs, the
main model's call is hidden from this thread (``state.tls.ctx`` is None) and :data:`DRAFTING` is set, so
a draft model that is instrumented too (or the main model itself, for ``assistant_early_exit``) runs
unmeasured: its work is the step's ``draft`` time, not requests of its own.

The candidate generator's two methods are timed for the call only (their seams are declared here,
installed by :func:`begin` and undone when the call ends); the forward's end is a forward hook on the
main model for the length of the call (a hooked module call costs ~6 us, so never outside a speculative
call). A failure of gpuprobe's own work in any of them switches the loop's seams off
(:data:`~.seams.GROUP_STEPS`).
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any

from .... import _seams
from ..compat import draft_length, model_output_cache, speculative_method
from ..series import MODEL_LABEL
from .call import Call
from .seams import GROUP_STEPS

__all__ = ["DRAFTING", "SEAM_DRAFT", "SEAM_VERIFY", "MAX_POSITIONS", "SpeculativeSeries", "Speculation", "begin"]

SEAM_DRAFT = _seams.declare(
    "transformers.generate.draft", library="transformers", attribute="get_candidates", group=GROUP_STEPS,
    scenario="generate", target="get_candidates() of the candidate generator of an assisted or prompt-lookup call")
SEAM_VERIFY = _seams.declare(
    "transformers.generate.verify", library="transformers", attribute="update_candidate_strategy",
    reads=("scores", "num_matches"), group=GROUP_STEPS, scenario="generate",
    target="update_candidate_strategy() of the candidate generator of an assisted or prompt-lookup call")

MAX_POSITIONS = 32
"""Draft positions counted one by one in ``accepted_tokens_per_position``; later ones are ``32+``."""

DRAFT = ("draft", None)
VERIFY = ("verify", None)


class _Drafting(threading.local):
    on = False


DRAFTING = _Drafting()
"""``DRAFTING.on``: a measured call's draft runs on this thread (no ``generate()`` call begins here)."""


class SpeculativeSeries:
    """One model's speculative-decoding series for one ``method``, prepared at its first such call."""

    __slots__ = ("drafts", "draft_tokens", "accepted", "emitted", "positions", "draft", "verify", "_family",
                 "_labels")

    def __init__(self, rt: Any, steps: Any, model_name: str, method: str) -> None:
        fam = rt.family
        labels = self._labels = {MODEL_LABEL: model_name, "method": method}
        self.drafts = fam("gpuprobe.speculative.drafts").child(**labels).apply
        self.draft_tokens = fam("gpuprobe.speculative.draft_tokens").child(**labels).apply
        self.accepted = fam("gpuprobe.speculative.accepted_tokens").child(**labels).apply
        self.emitted = fam("gpuprobe.speculative.emitted_tokens").child(**labels).apply
        self._family = fam("gpuprobe.speculative.accepted_tokens_per_position")
        self.positions: list[Any] = []
        self.draft = steps.component("draft")
        self.verify = steps.component("verify")

    def position(self, index: int) -> Any:
        """The ``apply`` of the accepted-per-position counter of draft position ``index`` (0: the first)."""
        index = min(index, MAX_POSITIONS)
        while len(self.positions) <= index:
            i = len(self.positions)
            label = str(i) if i < MAX_POSITIONS else f"{MAX_POSITIONS}+"
            self.positions.append(self._family.child(**self._labels, position=label).apply)
        return self.positions[index]


class Speculation:
    """What a speculative call knows of its running step (``ctx.spec``)."""

    __slots__ = ("series", "verify_t0", "verify_base", "fwd_base", "mark")

    def __init__(self, series: SpeculativeSeries) -> None:
        self.series = series
        self.verify_t0 = -1  # host time the forward ended (the verification's start); -1: not yet
        self.verify_base = 0  # the step's counted + streamer time then (what ran inside is not verification)
        self.fwd_base = 0  # the same when the forward started
        self.mark: Any = None  # the verification's mark in a marked step (profile window, sync audit)


def _series(state: Any, method: str) -> SpeculativeSeries:
    found = state.speculative.get(method)
    if found is None:
        found = state.speculative[method] = SpeculativeSeries(state.rt, state.step_series, state.model_name, method)
    return found


def begin(state: Any, ctx: Call, input_ids: Any, generation_config: Any, generator: Any, rows: Any) -> None:
    """A call turned out to be speculative: time its candidate generator for the call, and open step 0.

    ``rows``: :func:`~..compat.loop_rows` of the loop, for the call's counts.
    """
    shape = getattr(input_ids, "shape", None)
    if shape is None or len(shape) < 2:
        return
    for seam in (SEAM_DRAFT, SEAM_VERIFY):
        if not seam.switch.on or not hasattr(generator, "__dict__") or seam.check(generator) is not None:
            return  # no steps: the call keeps its per-call metrics
    t = perf_counter_ns()
    model = state.model()
    spec = Speculation(_series(state, speculative_method(generator)))
    ctx.prompt_len = int(shape[-1])
    ctx.batch = int(shape[0])
    ctx.rows = rows(ctx.batch, generation_config)
    ctx.records.append((state.batch, ctx.batch))
    state.place_call(model, ctx, input_ids)
    # Why no MBU/MFU: a speculative step's forward reads the prompt or the draft, not one new position
    # per sequence, and the arithmetic of .utilization counts one.
    ctx.util = None
    ctx.undo.append(SEAM_DRAFT.patch(generator, _seams.wrap(SEAM_DRAFT, generator.get_candidates,
                                                             _draft_before(state), _draft_after(state))).undo)
    verify_reader = _seams.ArgReader(generator.update_candidate_strategy, SEAM_VERIFY.reads)
    ctx.undo.append(SEAM_VERIFY.patch(generator, _seams.wrap(
        SEAM_VERIFY, generator.update_candidate_strategy, _verify_before(state, verify_reader),
        _verify_after(state))).undo)
    if model is not None:
        ctx.undo.append(model.register_forward_hook(_forward_done(state)).remove)
    ctx.spec = spec
    ctx.prefilled = True
    ctx.seen_check = False
    state.open_step(ctx, t, decode=False)  # the forward starts after the draft (open_step leaves it to us)


def _begin(state: Any, ctx: Call, where: Any) -> Any:
    """A component of the running step starts: its NVTX range, and its mark in a marked step."""
    name = where[0]
    nv = ctx.nv
    if nv is not None:
        nv.push(state.nvtx(nv, name, "component", ctx.step))
        ctx.depth += 1
    marks = ctx.marks
    return marks.begin(where, name) if marks is not None else None


def _end(ctx: Call, mark: Any) -> None:
    """The component :func:`_begin` started ends."""
    if mark is not None:
        ctx.marks.end(mark)  # type: ignore[union-attr]
    if ctx.nv is not None:
        ctx.nv.pop()
        ctx.depth -= 1


def _draft_before(state: Any) -> Any:
    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = getattr(state.tls, "ctx", None)
        if ctx is None or not ctx.step_open or ctx.spec is None:
            return None
        mark = _begin(state, ctx, DRAFT)
        previous = DRAFTING.on
        # Last, after all that could fail: the call is hidden from this thread while the draft runs.
        DRAFTING.on = True
        state.tls.ctx = None
        return (perf_counter_ns(), mark, previous, ctx)

    return before


def _draft_after(state: Any) -> Any:
    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        t = perf_counter_ns()
        t0, mark, previous, ctx = token
        state.tls.ctx = ctx  # first: the call is this thread's again
        DRAFTING.on = previous
        dt = t - t0
        ctx.records.append((ctx.spec.series.draft, dt))
        ctx.counted_ns += dt
        _end(ctx, mark)
        if error is not None:
            return
        # The forward starts now: preparing the inputs, then the main model's forward.
        ctx.spec.fwd_base = ctx.counted_ns + ctx.streamer_ns
        ctx.spec.verify_t0 = -1
        state.start_forward(ctx)

    return after


def _forward_done(state: Any) -> Any:
    def hook(module: Any, args: Any, output: Any) -> None:
        try:
            ctx = getattr(state.tls, "ctx", None)
            if ctx is None or not ctx.in_fwd or ctx.spec is None:
                return None
            t = perf_counter_ns()
            state.end_forward(ctx, t)
            if ctx.cache is None:
                ctx.cache = model_output_cache(output)
            spec = ctx.spec
            spec.verify_t0 = t
            spec.verify_base = ctx.counted_ns + ctx.streamer_ns
            spec.mark = _begin(state, ctx, VERIFY)
        except Exception as exc:  # gpuprobe's own failure: the loop's seams go off, the forward's output stands
            SEAM_VERIFY.fail(exc)
        return None

    return hook


def _verify_before(state: Any, reader: _seams.ArgReader) -> Any:
    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = getattr(state.tls, "ctx", None)
        if ctx is None or not ctx.step_open or ctx.spec is None:
            return None
        return (ctx, draft_length(reader.get(args, kwargs, "scores")), reader.get(args, kwargs, "num_matches"))

    return before


def _verify_after(state: Any) -> Any:
    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        t = perf_counter_ns()
        ctx, drafted, accepted = token
        spec = ctx.spec
        records = ctx.records
        inner = ctx.counted_ns + ctx.streamer_ns  # components recorded as they ran (processors, streamer)
        if ctx.in_fwd:  # the forward hook did not run (a compiled forward): the forward ends here, no verify
            state.end_forward(ctx, t)
            ctx.fwd_ns -= inner - spec.fwd_base
        elif spec.verify_t0 >= 0:
            verify = t - spec.verify_t0 - (inner - spec.verify_base)
            records.append((spec.series.verify, verify))
            ctx.counted_ns += verify
            spec.verify_t0 = -1
            mark, spec.mark = spec.mark, None
            _end(ctx, mark)
        if error is not None or isinstance(accepted, bool) or not isinstance(accepted, int) or drafted is None:
            return
        series = spec.series
        records.append((series.emitted, accepted + 1))
        if drafted:
            records.append((series.drafts, 1))
            records.append((series.draft_tokens, drafted))
            if accepted:
                records.append((series.accepted, accepted))
                for i in range(accepted):
                    records.append((series.position(i), 1))
        if accepted:
            # The step's tokens reach the host together at its end: the first gets the time since the
            # previous token (close_step), the others land with it.
            ctx.extra_tokens += accepted
            records.append((state.step_series.itl_host.apply_many, [0] * accepted))
            if ctx.dev_tok is not None:
                records.append((state.step_series.itl_device.apply_many, [0] * accepted))

    return after
