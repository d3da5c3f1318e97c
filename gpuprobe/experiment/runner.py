"""The experiment: its arguments checked, the model instrumented for it, the dtype copies made, each
workload given an equal share of the budget (:mod:`gpuprobe.experiment.rounds` runs one), the notes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpuprobe.config import parse_duration
from gpuprobe.errors import ConfigError, GpuprobeError

from .apply import Prepared, prepare
from .faults import ModelFailed
from .measure import Meter
from .outputs import match, new_tokens
from .remedies import FACTORY_EXAMPLE, FACTORY_WORDS
from .result import TryResult, WorkloadResult
from .rounds import WorkloadRun
from .stats import FASTER, SLOWER
from .variants import (COPY, GROUPS, Machine, ModelFacts, NotRun, Variant, catalogue, machine_facts,
                       model_facts, wanted)
from .workloads import Workload, normalize_inputs, workloads

__all__ = ["try_remedies", "check_variants", "check_folder_variants", "processor_notes", "asks_processors"]

_NAME = re.compile(r"^[A-Za-z0-9_.:+\-]+$")
_PREFIXES = ("attn:", "dtype:", "no-logits-processor:", "no-stopping-criterion:")
_NAMES = ("static-cache", "static-cache+compile", "continuous-batching")
# Time kept for writing the result after the last round (seconds).
_RESERVE_S = 0.5
#: A variant whose time to first token is at least this many times the baseline's (the rounds agreeing:
#: verdict ``slower`` on it) gets a note, whatever its tokens/s.
TTFT_NOTE_TIMES = 1.5


def check_variants(asked: Sequence[str], extra: Sequence[Variant] = ()) -> list[str]:
    """What ``--variants`` names, checked: each a group, a variant name or prefix, or one of ``extra``.

    Raises:
        ConfigError: an unknown name; the message lists what is known.
    """
    names = [a.strip() for a in asked if a.strip()]
    custom = {v.name for v in extra}
    for name in names:
        if (name in ("auto", "all") or name in GROUPS or name in _NAMES or name in custom
                or any(name.startswith(p) and len(name) > len(p) for p in _PREFIXES)):
            continue
        raise ConfigError(f"--variants: unknown variant or group {name!r}; groups: auto, all, {', '.join(GROUPS)}; "
                          f"variants: {', '.join(_NAMES)}, attn:<implementation>, dtype:<dtype>, "
                          "no-logits-processor:<class>, no-stopping-criterion:<class>")
    return names


def asks_processors(asked: Sequence[str]) -> list[str]:
    """What of ``asked`` (``--variants``) names the run without a logits processor or stopping criterion."""
    prefixes = GROUPS["processors"]
    return [a for a in asked if a == "processors" or any(a.startswith(p) for p in prefixes)]


def _factory_form(named: Sequence[str]) -> str:
    return (f"gpuprobe try {FACTORY_EXAMPLE} --variants {named[0]}, where {FACTORY_WORDS} "
            "(logits_processor=LogitsProcessorList([...]), docs/try.md)")


def check_folder_variants(asked: Sequence[str]) -> None:
    """Refuse processor variants for a model folder, before it loads: a folder passes no processor of the user's.

    Raises:
        ConfigError: ``asked`` names processor variants; the message shows the factory form.

    Example:
        >>> check_folder_variants(["static-cache"])
    """
    named = asks_processors(asked)
    if named:
        raise ConfigError(f"--variants {','.join(named)}: a model folder carries no logits processor or stopping "
                          "criterion of yours (transformers builds its own from the generation config), so there "
                          f"is nothing to run without; name a factory that passes yours: {_factory_form(named)}")


def processor_notes(asked: Sequence[str], kwargs: Mapping[str, Any]) -> list[str]:
    """Why processor variants that ``asked`` names cannot run on these ``generate()`` arguments (empty: they can).

    Example:
        >>> processor_notes(["processors"], {"input_ids": None})[0][:80]
        '--variants processors: nothing was run without a processor: the generate() argum'
    """
    named = asks_processors(asked)
    if not named:
        return []
    held = {key: [type(p).__name__ for p in (kwargs.get(key) or [])] for key in ("logits_processor",
                                                                              "stopping_criteria")}
    if not held["logits_processor"] and not held["stopping_criteria"]:
        return [f"--variants {','.join(named)}: nothing was run without a processor: the generate() arguments pass "
                f"no logits_processor or stopping_criteria list; pass yours from a factory: {_factory_form(named)}."]
    notes = []
    for name in named:
        prefix, _, cls = name.partition(":")
        key = {"no-logits-processor": "logits_processor", "no-stopping-criterion": "stopping_criteria"}.get(prefix)
        if key is not None and cls not in held[key]:
            has = ", ".join(dict.fromkeys(held[key])) or "none"
            notes.append(f"--variants {name}: not run: the generate() arguments' {key} holds no {cls} (it holds: "
                         f"{has}).")
    return notes


def _check_extra(extra: Sequence[Variant]) -> None:
    seen: set[str] = set()
    for v in extra:
        if not isinstance(v, Variant):
            raise ConfigError(f"extra variants must be Variant objects, got {type(v).__name__}")
        if not _NAME.match(v.name) or v.name == "baseline" or v.name in _NAMES or v.name in seen \
                or any(v.name.startswith(p) for p in _PREFIXES):
            raise ConfigError(f"variant name {v.name!r}: taken or not a plain name (letters, digits, _ . : + -)")
        seen.add(v.name)
        try:
            compile(v.code, f"<{v.name}>", "exec")
        except SyntaxError as exc:
            raise ConfigError(f"variant {v.name!r}: its code does not compile: {exc}") from None


@contextlib.contextmanager
def _instrumented(models: Sequence[Any]) -> Iterator[None]:
    from gpuprobe.integrations.transformers import instrument, is_instrumented, uninstrument

    ours = []
    try:
        for m in models:
            if not is_instrumented(m):
                instrument(m, memory_every=1)
                ours.append(m)
        yield
    finally:
        for m in ours:
            uninstrument(m)


def _budget(budget: float | str) -> float:
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        if budget > 0 and budget != float("inf"):
            return float(budget)
    return parse_duration(budget, "budget")


def try_remedies(model: Any, inputs: Any, *, budget: float | str = 60.0, variants: Sequence[str] = (),
                 extra: Sequence[Variant] = (), prompt_lens: Sequence[int] | None = None,
                 batch_sizes: Sequence[int] | None = None, new_tokens: int | None = None,
                 trace_dir: str | os.PathLike[str] | None = None, max_rounds: int = 30, model_label: str | None = None,
                 progress: Callable[[str], None] | None = None) -> TryResult:
    """Measure the baseline and every variant that applies, interleaved, within ``budget``.

    Args:
        model: a transformers model that generates (on the device it should run on).
        inputs: ``generate()`` keyword arguments (``input_ids`` and anything else: ``attention_mask``,
            ``max_new_tokens``, ``logits_processor=``, ``stopping_criteria=``, ...), or a tensor of token ids.
        budget: the whole experiment's time: seconds, or a duration such as ``"120s"`` or ``"2m"``.
        variants: what to run: variant names or groups (``cache``, ``compile``, ``attention``, ``dtype``,
            ``processors``, ``batching``); empty or ``auto``: every one that applies. A variant named here
            runs even when it would be left out by default (an unflagged processor, a compile on a CPU).
        extra: variants of your own (:class:`~gpuprobe.experiment.Variant`: a name and the code).
        prompt_lens: prompt lengths to sweep (the inputs' tokens repeated to each length).
        batch_sizes: batch sizes to sweep (the inputs' prompts, rotated, to fill each batch).
        new_tokens: ``max_new_tokens`` (default: the inputs', else 32).
        trace_dir: keep a kineto trace of one call per variant here.
        max_rounds: stop after this many rounds even when time is left.
        model_label: how the result names the model (default: its class).
        progress: told of each phase (the command line prints it on stderr).

    Returns:
        The :class:`~gpuprobe.experiment.TryResult` (``.to_dict()`` is its JSON); show it with
        :func:`gpuprobe.experiment.render`, draw it with :func:`gpuprobe.experiment.plot`.

    Raises:
        ConfigError: bad inputs, an unknown variant, a bad budget; the message names it.
        GpuprobeError: gpuprobe is disabled in this process (GPUPROBE_DISABLE=1): nothing can be measured.
        ModelFailed: the baseline's call raised (MODEL's own error): its ``fault`` says which call, which
            round, the exception and the line of your code; its ``partial`` holds the rounds measured before
            it (None when there were none).

    Example:
        >>> from gpuprobe.experiment import render, try_remedies
        >>> result = try_remedies(model, {"input_ids": ids, "max_new_tokens": 16}, budget="30s")  # doctest: +SKIP
        >>> print(render(result, "text"))  # doctest: +SKIP
    """
    import gpuprobe

    started = time.perf_counter()
    budget_s = _budget(budget)
    deadline = started + budget_s
    if not callable(getattr(model, "generate", None)):
        raise ConfigError(f"model must be a transformers model that generates, got {type(model).__name__}")
    if gpuprobe.runtime.DISABLED_AT_IMPORT or not gpuprobe.is_enabled():
        raise GpuprobeError("gpuprobe is disabled in this process (GPUPROBE_DISABLE=1 or gpuprobe.disable()): "
                            "gpuprobe try measures with its probes")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ConfigError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
    for name, sweep in (("prompt_lens", prompt_lens), ("batch_sizes", batch_sizes)):
        if sweep is not None and not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sweep):
            raise ConfigError(f"{name} must be positive integers, got {list(sweep)!r}")
    _check_extra(extra)
    asked = check_variants(variants, extra)
    say = progress or (lambda _msg: None)
    kwargs = normalize_inputs(inputs, new_tokens)
    facts, machine = model_facts(model), machine_facts(model)
    count = kwargs.get("max_new_tokens") or max(1, int(kwargs["max_length"]) - int(kwargs["input_ids"].shape[1]))
    loads, skipped = workloads(kwargs, prompt_lens=prompt_lens, batch_sizes=batch_sizes, new_tokens=int(count),
                               max_positions=facts.max_positions)
    if not loads:
        raise ConfigError("no workload fits the model: " + "; ".join(f"{n.name}: {n.reason}" for n in skipped))
    copies, copy_skips = _copies(model, machine, facts, loads[0], asked, extra)
    results: list[WorkloadResult] = []
    failed: ModelFailed | None = None
    with _instrumented([model] + [p.model for p in copies.values()]):
        meter = Meter(machine.cuda, device=machine.device if machine.cuda else None)
        first_call_s: float | None = None  # the last workload's baseline call: the next one's first estimate
        try:
            for i, load in enumerate(loads):
                share = (deadline - time.perf_counter() - _RESERVE_S) / (len(loads) - i)
                if first_call_s is not None and share < first_call_s:
                    skipped.append(NotRun(f"prompt {load.prompt_len} × batch {load.batch_size}",
                                          f"no time left in the budget for its first call (~{first_call_s:.2g} s, "
                                          "as the previous workload's; a larger --budget)"))
                    continue
                say(f"{load.tag}: {share:.0f} s")
                run = WorkloadRun(model, load, facts, machine, meter, asked, extra, copies, copy_skips,
                                  time.perf_counter() + share, trace_dir, len(loads) > 1, max_rounds, say)
                try:
                    results.append(run.run())
                except ModelFailed as exc:  # MODEL's own error: the rounds before it are kept
                    failed = exc
                    if exc.workload is not None:
                        results.append(exc.workload)
                    break
                first_call_s = run.baseline_s
        finally:
            meter.close()
    elapsed = time.perf_counter() - started
    result = TryResult(model=model_label or facts.cls, facts=facts, machine=machine, budget_s=budget_s,
                       elapsed_s=elapsed, workloads=results, not_run_workloads=skipped,
                       notes=processor_notes(asked, kwargs) + _notes(machine, results),
                       fault=failed.fault if failed is not None else None)
    if failed is not None:
        raise ModelFailed(failed.fault, partial=result if results else None) from failed.__cause__
    return result


def _copies(model: Any, machine: Machine, facts: ModelFacts, load: Workload, asked: Sequence[str],
            extra: Sequence[Variant]) -> tuple[dict[str, Prepared], list[NotRun]]:
    """The variants that run on a copy of the model (dtypes), prepared once before anything is instrumented."""
    out: dict[str, Prepared] = {}
    skips: list[NotRun] = []
    items = [v for v in catalogue(model, load.kwargs, batch=load.batch_size, prompt_len=load.prompt_len,
                                  new_tokens=load.new_tokens, asked=asked, facts=facts, machine=machine)
             if isinstance(v, Variant) and v.scope == COPY]
    items += [v for v in extra if v.scope == COPY]
    from gpuprobe.integrations.transformers import is_instrumented

    for v in items:
        if not wanted(v.name, v.group, asked):
            continue
        if is_instrumented(model):
            skips.append(NotRun(v.name, "the model is instrumented already, and a copy would carry gpuprobe's "
                                        "patches: call try_remedies before instrument() (the command line does)"))
            continue
        room = _room_for_copy(model, machine)
        if room:
            skips.append(NotRun(v.name, room))
            continue
        try:
            out[v.name] = prepare(v, model, load.kwargs)
        except ConfigError:
            raise  # the variant's own code fails: the message names it
        except Exception as exc:  # the model cannot be copied (it holds a lock, a file, a handle)
            skips.append(NotRun(v.name, f"a copy of the model cannot be made: {type(exc).__name__}: "
                                        f"{' '.join(str(exc).split())[:200]}"))
    return out, skips


def _room_for_copy(model: Any, machine: Machine) -> str | None:
    if not machine.cuda:
        return None
    import torch

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    free, _total = torch.cuda.mem_get_info(torch.device(machine.device))
    if free < size * 1.2:
        return f"a copy of the model needs ~{size / 2**30:.1f} GiB; {free / 2**30:.1f} GiB of the GPU is free"
    return None


def _notes(machine: Machine, results: list[WorkloadResult]) -> list[str]:
    notes = []
    if not machine.cuda:
        notes.append(
            f"Measured on a {machine.name} with the host clock. A CPU does not show what a GPU would: static caches, "
            "CUDA graphs (torch.compile), fused attention kernels and half precision pay off on a GPU, where "
            "launches and memory bandwidth bound a decode step. Run gpuprobe try where the model serves.")
    for w in results:
        slower = [v.name for v in w.variants if v.verdict == "slower"]
        if slower:
            notes.append(f"{w.label}: slower on this machine: {', '.join(slower)}.")
        differ = [v.name for v in w.variants if v.output is not None and not v.output.identical]
        if differ:
            notes.append(f"{w.label}: greedy output differs from the baseline's with {', '.join(differ)}.")
        for v in w.variants:
            ttft = v.vs_baseline.get("ttft_s")
            if ttft is None or v.error is not None or ttft.verdict != SLOWER or not ttft.ratio.median > 0:
                continue
            times = 1 / ttft.ratio.median
            if times >= TTFT_NOTE_TIMES:
                what = "" if v.verdict != FASTER else ", though faster in tokens/s"
                notes.append(f"{w.label}: {v.name} takes {times:.1f}× the baseline's time to first token "
                             f"({ttft.ratio.median:.2f}× gain{what}): its first token waits longer for every "
                             "request.")
    return notes
