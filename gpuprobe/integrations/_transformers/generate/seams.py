"""The seams table of ``generate()``: every seam gpuprobe puts on an instrumented model, and its hooks.

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
What pickle, ``torch.save`` and ``copy`` see of an instrumented model is what they would see without
gpuprobe: one more seam, on the model's ``__getstate__`` (:data:`SEAM_PICKLED_STATE`), leaves gpuprobe's
attributes (its state and these seams, this one included) out of the state they take, or puts back the
model's own attribute a seam stands in front of. A checkpoint of an instrumented model so loads where
gpuprobe is not installed, as a plain model, and the model in the program stays instrumented. Should that
seam be off, the state still pickles to ``None`` and each seam to a lookup of the method by its name
(``getattr``): the copy loads without gpuprobe too, its leftover attributes passing through to its class.

A hook gets the model's :class:`~.state.ModelState` as its first argument (the seam reads it from
``model.__dict__[STATE_KEY]``); what the hooks call on it lives in :mod:`.steps` (the step machine),
:mod:`.call` (the call), :mod:`.timed` (logits processors and stopping criteria) and :mod:`.streamer`.

**Adding a seam here.** Declare it with :func:`_method_seam` (or ``_seams.declare`` for what is not a
method of the model), write its hooks below, and add a :class:`MethodSeam` row to :data:`METHOD_SEAMS`;
:func:`fit_method_seams` shape-checks it against the model's class and
:func:`~gpuprobe.integrations.transformers.instrument` installs it. ``tests/test_fail_open.py`` iterates
the registry: the new seam needs a ``scenario`` there that reaches it.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any

from .... import _seams
from ..compat import (
    check_version,
    loop_rows,
    model_output_cache,
    peer_finished,
    read_loop,
    sampling_params,
    stop_limits,
)

__all__ = ["STATE_KEY", "METHOD_SEAMS", "MethodSeam", "GROUP_CALL", "GROUP_STEPS", "SEAM_PROCESSOR", "SEAM_CRITERION",
           "SEAM_STREAMER", "SEAM_PICKLED_STATE", "fit_method_seams"]

STATE_KEY = "_gpuprobe_state"

GROUP_CALL = "transformers.generate"
"""The switch of the generate() call's own seam (per-call metrics)."""
GROUP_STEPS = "transformers.generate.steps"
"""The switch of the seams inside the decoding loop (steps, components, layers): they work together."""


# -- the seams on each instrumented model --------------------------------------------------------

def _method_seam(attribute: str, short: str, group: str = GROUP_STEPS, reads: tuple[str, ...] = (),
                 scenario: str = "generate") -> _seams.Seam:
    return _seams.declare(f"transformers.generate.{short}" if short else "transformers.generate",
                          target=f"GenerationMixin.{attribute}, on each instrumented model", library="transformers",
                          attribute=attribute, reads=reads, group=group, scenario=scenario)


SEAM_GENERATE = _method_seam("generate", "", GROUP_CALL)
SEAM_PREFILL = _method_seam("_prefill", "prefill", reads=("input_ids",))
SEAM_CANDIDATES = _method_seam("_get_candidate_generator", "candidate_generator")
SEAM_CHECK = _method_seam("_has_unfinished_sequences", "stop_check")
SEAM_UPDATE = _method_seam("_update_model_kwargs_for_generation", "update_kwargs", reads=("outputs",))
SEAM_LOGITS = _method_seam("_get_logits_processor", "logits_processors")
SEAM_STOPPING = _method_seam("_get_stopping_criteria", "stopping_criteria")
SEAM_COMPILED = _method_seam("get_compiled_call", "compiled_call")
SEAM_CONTINUOUS = _method_seam("init_continuous_batching", "continuous_batching",
                               group="transformers.continuous_batching", scenario="generate_batch")
SEAM_PICKLED_STATE = _seams.declare(
    "transformers.generate.pickled_state", library="torch", attribute="__getstate__", scenario="pickle",
    target="__getstate__ of each instrumented model (nn.Module's: what pickle, torch.save and copy take); "
           "gpuprobe's attributes are left out of the state it returns")
"""Its own group: when it fails, a pickled model carries gpuprobe's attributes (still loadable without
gpuprobe, see the module docstring), and generate() stays measured."""

# What transformers calls inside a step, timed for one call: their stand-ins are in .timed and .streamer.
SEAM_PROCESSOR = _seams.declare(
    "transformers.generate.logits_processor", library="transformers", group=GROUP_STEPS, scenario="generate",
    target="each logits processor in the list _get_logits_processor returns, for one call")
SEAM_CRITERION = _seams.declare(
    "transformers.generate.stopping_criterion", library="transformers", group=GROUP_STEPS, scenario="generate",
    target="each stopping criterion in the list _get_stopping_criteria returns, for one call")
SEAM_STREAMER = _seams.declare(
    "transformers.generate.streamer", library="transformers", attribute="put", group=GROUP_STEPS,
    scenario="generate", target="put() of the caller's streamer, for one call")


def _generate_before(state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return state.begin_call(args, kwargs, state.readers["generate"])


def _generate_after(state: Any, ctx: Any, result: Any, error: BaseException | None) -> None:
    if ctx is not None:
        state.end_call(ctx, result, error)


def _prefill_before(state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is None or not ctx.live:
        return
    t = perf_counter_ns()
    if ctx.step_open:  # a second prefill in one call (unusual): close what runs
        state.close_step(ctx, t)
    reader = state.readers["_prefill"]
    ids = reader.get(args, kwargs, "input_ids")
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) >= 2:
        ctx.prompt_len = int(shape[-1])
        ctx.batch = int(shape[0])
        ctx.records.append((state.batch, ctx.batch))
        if ctx.rows is None:
            config = reader.get(args, kwargs, "generation_config")
            ctx.rows = loop_rows(ctx.batch, config)
            ctx.limit, ctx.other_stops = stop_limits(config, ctx.prompt_len, ctx.kwargs)
            ctx.sampling = sampling_params(config)
    if ctx.step >= 0:  # another decoding loop in this call (a model's own generate() may run several)
        ctx.first_step = ctx.step + 1
    state.place_call(state.model(), ctx, ids)
    ctx.prefilled = True
    ctx.seen_check = False
    state.open_step(ctx, t, decode=False)


def _candidates_before(state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is None or not ctx.live or ctx.prefilled:
        return None
    reader = state.readers["_get_candidate_generator"]
    processors = reader.get(args, kwargs, "logits_processor")
    # The candidate generator keeps a copy of the call's logits processors for its draft model, whose
    # generate() merges them with its own by type: it gets the processors themselves, not stand-ins.
    state.untime_elements(processors)
    return ctx, reader.get(args, kwargs, "input_ids"), reader.get(args, kwargs, "generation_config"), processors


def _candidates_after(state: Any, token: Any, generator: Any, error: BaseException | None) -> None:
    if token is None:
        return
    ctx, ids, generation_config, processors = token
    state.time_elements(processors, ctx, False)  # the main model's verification is timed again
    if error is None:
        state.speculate(ctx, ids, generation_config, generator)


def _check_after(state: Any, token: None, more: Any, error: BaseException | None) -> None:
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
        ctx.stop_check, ctx.synced = read_loop(sys._getframe(2))
        ctx.deferred = ctx.stop_check is not None
        return
    more = error is None and bool(more)
    if more and ctx.synced:  # synced_gpus: once this rank is done, the loop runs forwards that select nothing
        more = not peer_finished(sys._getframe(2))
    if ctx.step_open:
        state.close_step(ctx, t, chain=more)
    if more:
        state.open_step(ctx, t, decode=True)


def _update_before(state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    t = perf_counter_ns()
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and ctx.in_fwd:
        state.end_forward(ctx, t)
        if ctx.cache is None:
            outputs = state.readers["_update_model_kwargs_for_generation"].get(args, kwargs, "outputs")
            ctx.cache = model_output_cache(outputs)


def _logits_after(state: Any, token: None, result: Any, error: BaseException | None) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and error is None:
        state.time_elements(result, ctx, False)


def _stopping_after(state: Any, token: None, result: Any, error: BaseException | None) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None and error is None:
        state.time_elements(result, ctx, True)


def _compiled_before(state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ctx = getattr(state.tls, "ctx", None)
    if ctx is not None:
        ctx.compiled = True  # forward hooks inside a compiled forward would break its graph


def _continuous_after(state: Any, token: None, manager: Any, error: BaseException | None) -> None:
    if error is None:
        state.observe_manager(manager)


def _pickled_state_after(state: Any, token: None, pickled: Any, error: BaseException | None) -> None:
    # nn.Module.__getstate__ returns a copy of the instance's __dict__ (pickle's protocol 2+, torch.save,
    # copy.copy and copy.deepcopy all take it): gpuprobe's attributes are taken out of that copy.
    if error is not None:
        return
    model = state.model()
    found = pickled[0] if isinstance(pickled, tuple) and pickled else pickled  # (dict, slots) of a slotted class
    if not isinstance(found, dict) or model is None or found is getattr(model, "__dict__", None):
        return  # not a copy (a class's own __getstate__ handing out its live __dict__): left as it is
    found.pop(STATE_KEY, None)
    for patch in state.patches:
        name = patch.seam.attribute
        if name is not None and patch.replacement is not None and found.get(name) is patch.replacement:
            if patch.previous is _seams.MISSING:
                del found[name]
            else:
                found[name] = patch.previous  # the model's own attribute, that the seam runs in front of


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
        # Made again when the class's method changed since (patched, then put back): the replacement shows
        # the method it stands for (name, signature), and a model pickled with its seams reads that name.
        if fn is None or fn.__wrapped__ != _seams.unwrapped(cls, self.attribute):
            fn = _replacements[key] = _seams.wrap_method(self.seam, cls, STATE_KEY, self.before, self.after)
        return fn


_replacements: dict[tuple[type, str], Any] = {}

METHOD_SEAMS = (
    MethodSeam(SEAM_GENERATE, _generate_before, _generate_after, optional_reads=("inputs", "streamer")),
    MethodSeam(SEAM_PREFILL, _prefill_before, optional_reads=("generation_config",)),
    MethodSeam(SEAM_CHECK, after=_check_after),
    MethodSeam(SEAM_UPDATE, _update_before),
    MethodSeam(SEAM_LOGITS, after=_logits_after),
    MethodSeam(SEAM_STOPPING, after=_stopping_after),
    MethodSeam(SEAM_COMPILED, _compiled_before, required=False),
    MethodSeam(SEAM_CANDIDATES, _candidates_before, _candidates_after, required=False,
               optional_reads=("input_ids", "generation_config", "logits_processor")),
    MethodSeam(SEAM_CONTINUOUS, after=_continuous_after, required=False),
    MethodSeam(SEAM_PICKLED_STATE, after=_pickled_state_after, required=False),
)
"""The seams :func:`~gpuprobe.integrations.transformers.instrument` installs on a model, in order."""


def fit_method_seams(cls: type) -> tuple[list[MethodSeam], list[tuple[_seams.Seam, str, bool]]]:
    """The shape checks of the method seams against a model class, remembering nothing.

    Returns:
        The method seams that fit ``cls``, and ``(seam, why, consequence)`` for each one refused:
        ``consequence`` when its own shape fits but another seam of its group was refused. When one
        of the loop's seams is refused none of them is installed. ``gpuprobe doctor`` runs this on
        ``GenerationMixin``; :func:`~gpuprobe.integrations.transformers.instrument` on the model's class.
    """
    chosen = []
    refused: list[tuple[_seams.Seam, str, bool]] = []
    refused_groups = set()
    for ms in METHOD_SEAMS:
        seam = ms.seam
        if not callable(getattr(cls, ms.attribute, None)):
            if ms.required:
                refused.append((seam, f"{cls.__qualname__} has no {ms.attribute}() under transformers "
                                      f"{check_version()}", False))
                refused_groups.add(seam.group)
            continue
        why = seam.mismatch(cls)
        if why is not None:
            refused.append((seam, why, False))
            refused_groups.add(seam.group)
            continue
        chosen.append(ms)
    fitting = []
    for ms in chosen:
        if ms.seam.group in refused_groups:
            refused.append((ms.seam, f"not installed: another seam of {ms.seam.group} was refused", True))
        else:
            fitting.append(ms)
    return fitting, refused
