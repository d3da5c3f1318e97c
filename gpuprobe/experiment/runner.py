"""The experiment: warm every variant up, then measure them in rounds, in rotating order, within a budget.

Per workload: the baseline first (one call under the sync audit, one greedy call when the baseline
samples, one warm-up call), from which the logits processors and stopping criteria to try are flagged;
then the same for every variant that applies. Then rounds: each round calls every variant once, the
order rotated by one each round, until the workload's share of the budget leaves no room for another
round or ``max_rounds`` are done. With ``trace_dir``, one more call per variant is traced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprobe.config import parse_duration
from gpuprobe.errors import ConfigError, GpuprobeError

from .apply import Prepared, prepare
from .measure import FIGURES, CallFigures, Meter, Syncs, timed
from .outputs import match, new_tokens
from .result import TryResult, VariantResult, WorkloadResult
from .stats import MIN_ROUNDS, compare, spread
from .variants import (COPY, FLAG_SHARE, GROUPS, Machine, ModelFacts, NotRun, Variant, catalogue,
                       machine_facts, model_facts, processor_variants, wanted)
from .workloads import Workload, eos_ids, is_sampling, normalize_inputs, workloads

__all__ = ["try_remedies", "check_variants", "BASELINE"]

BASELINE = Variant("baseline", "the model and generate() arguments as given", "# no change", "baseline")
_NAME = re.compile(r"^[A-Za-z0-9_.:+\-]+$")
_PREFIXES = ("attn:", "dtype:", "no-logits-processor:", "no-stopping-criterion:")
_NAMES = ("static-cache", "static-cache+compile", "continuous-batching")
# Time kept for writing the result after the last round (seconds).
_RESERVE_S = 0.5


@dataclasses.dataclass
class _Entry:
    variant: Variant
    prepared: Prepared
    output: list[list[int]] | None = None
    syncs: Syncs | None = None
    warm: CallFigures | None = None
    estimate_s: float = 0.0
    calls: list[CallFigures | None] = dataclasses.field(default_factory=list)
    error: str | None = None
    trace: str | None = None
    launches: float | None = None


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
    with _instrumented([model] + [p.model for p in copies.values()]):
        meter = Meter(machine.cuda, device=machine.device if machine.cuda else None)
        try:
            for i, load in enumerate(loads):
                share = (deadline - time.perf_counter() - _RESERVE_S) / (len(loads) - i)
                say(f"{load.tag}: {share:.0f} s")
                results.append(_Workload(model, load, facts, machine, meter, asked, extra, copies, copy_skips,
                                         time.perf_counter() + share, trace_dir, len(loads) > 1, max_rounds,
                                         say).run())
        finally:
            meter.close()
    elapsed = time.perf_counter() - started
    return TryResult(model=model_label or facts.cls, facts=facts, machine=machine, budget_s=budget_s,
                     elapsed_s=elapsed, workloads=results, not_run_workloads=skipped,
                     notes=_notes(machine, results))


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
        out[v.name] = prepare(v, model, load.kwargs)
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


class _Workload:
    """One workload's experiment (see the module docstring)."""

    def __init__(self, model: Any, load: Workload, facts: ModelFacts, machine: Machine, meter: Meter,
                 asked: Sequence[str], extra: Sequence[Variant], copies: Mapping[str, Prepared],
                 copy_skips: Sequence[NotRun], deadline: float, trace_dir: str | os.PathLike[str] | None,
                 several: bool, max_rounds: int, say: Callable[[str], None]) -> None:
        self.model, self.load, self.facts, self.machine, self.meter = model, load, facts, machine, meter
        self.asked, self.extra, self.copies, self.copy_skips = asked, extra, copies, copy_skips
        self.deadline, self.max_rounds, self.say = deadline, max_rounds, say
        self.trace_dir = Path(trace_dir) / load.tag if trace_dir is not None and several else (
            Path(trace_dir) if trace_dir is not None else None)
        self.sampling = is_sampling(model, load.kwargs)
        self.eos = eos_ids(model, load.kwargs)
        self.not_run: list[NotRun] = []

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    # ------------------------------------------------------------------ set-up: audit, outputs, warm-up
    def _set_up(self, entry: _Entry) -> None:
        fn, kw = entry.prepared.call_args()
        try:
            out, audit = self.meter.audit(fn, kw)
        finally:
            entry.prepared.restore()
        entry.syncs, entry.launches = audit.syncs, audit.launches_per_step
        if self.sampling:
            fn, kw = entry.prepared.call_args({"do_sample": False})
            try:
                out = fn(**kw)
            finally:
                entry.prepared.restore()
        entry.output = new_tokens(out, [int(self.load.kwargs["input_ids"].shape[1])] * self.load.batch_size,
                                  self.eos)
        figures, seconds = timed(lambda: self._call(entry))
        entry.warm, entry.estimate_s = figures, seconds

    def _call(self, entry: _Entry) -> CallFigures:
        fn, kw = entry.prepared.call_args()
        try:
            return self.meter.call(fn, kw)[1]
        finally:
            entry.prepared.restore()

    def _try_set_up(self, entry: _Entry) -> bool:
        try:
            self._set_up(entry)
            return True
        except Exception as exc:  # the variant's own failure: reported, the others go on
            entry.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            return False

    def _flags(self, base: _Entry) -> dict[tuple[str, str], str]:
        flags: dict[tuple[str, str], str] = {}
        if base.syncs is not None:
            for (component, processor), _n in base.syncs.by_place.items():
                per = base.syncs.of(component, processor)
                if component in ("logits_processor", "stopping_criteria") and processor and per > 0:
                    flags[(component, processor)] = f"{per:g} syncs per step"
        warm = base.warm
        if warm is not None and warm.steps_s > 0:
            for (component, processor), seconds in warm.components.items():
                share = seconds / warm.steps_s
                if component == "logits_processor" and share >= FLAG_SHARE:
                    flags.setdefault((component, processor), f"{share * 100:.0f} % of the step")
            crit = sum(s for (c, _p), s in warm.components.items() if c == "stopping_criteria") / warm.steps_s
            if crit >= FLAG_SHARE:
                for item in self.load.kwargs.get("stopping_criteria") or []:
                    flags.setdefault(("stopping_criteria", type(item).__name__),
                                     f"stopping criteria take {crit * 100:.0f} % of the step")
        return flags

    def _candidates(self, base: _Entry) -> list[Variant]:
        load = self.load
        # yours first, then what the baseline's own steps flag, then the catalogue: the budget admits in order
        found: list[Variant | NotRun] = list(self.extra)
        found += processor_variants(load.kwargs, self._flags(base), self.asked)
        found += catalogue(self.model, load.kwargs, batch=load.batch_size, prompt_len=load.prompt_len,
                           new_tokens=load.new_tokens, asked=self.asked, facts=self.facts, machine=self.machine)
        out: list[Variant] = []
        skipped = {n.name for n in self.copy_skips}
        self.not_run += [n for n in self.copy_skips]
        for item in found:
            if isinstance(item, NotRun):
                if self.asked and not wanted(item.name, _group_of(item.name), self.asked):
                    continue
                self.not_run.append(item)
            elif item.name in skipped:
                continue
            elif not wanted(item.name, item.group, self.asked):
                self.not_run.append(NotRun(item.name, f"not asked for (--variants {','.join(self.asked)})"))
            else:
                out.append(item)
        return out

    def _prepared(self, variant: Variant) -> Prepared:
        if variant.scope == COPY:
            ready = self.copies[variant.name]
            return Prepared(variant, ready.model, self.load.kwargs)
        return prepare(variant, self.model, self.load.kwargs)

    # ------------------------------------------------------------------ the rounds
    def run(self) -> WorkloadResult:
        base = _Entry(BASELINE, prepare(BASELINE, self.model, self.load.kwargs))
        self.say(f"{self.load.tag}: baseline: audit and warm-up")
        set_up_s = timed(lambda: self._set_up(base))[1]  # the baseline's own failure is the caller's: it raises
        entries = [base]
        for variant in self._candidates(base):
            # room for its set-up, then the fewest rounds (and traces) of everything admitted so far and of it
            need = set_up_s + MIN_ROUNDS * (sum(e.estimate_s for e in entries) + base.estimate_s)
            if self.trace_dir is not None:
                need += self._trace_time(entries) + self._trace_time([base])
            if self.left() < need:
                self.not_run.append(NotRun(variant.name, f"no time left in the budget for {MIN_ROUNDS} rounds "
                                                         "with it (a larger --budget, or fewer --variants)"))
                continue
            self.say(f"{self.load.tag}: {variant.name}: audit and warm-up")
            entry = _Entry(variant, self._prepared(variant))
            entries.append(entry)
            self._try_set_up(entry)
        self._fit(entries)
        rounds = self._rounds(entries)
        if self.trace_dir is not None:
            traced = [e for e in entries if e.error is None]
            if rounds and self.left() >= self._trace_time(traced) * 0.5:
                self._traces(traced)
            else:
                self.not_run.append(NotRun("traces", "no time left in the budget (a larger --budget)"))
        return self._result(entries, rounds)

    def _fit(self, entries: list[_Entry]) -> None:
        """Leave out the slowest variants while the fewest rounds of all would not fit in the time left."""
        while True:
            active = [e for e in entries[1:] if e.error is None]
            need = MIN_ROUNDS * (entries[0].estimate_s + sum(e.estimate_s for e in active))
            if self.trace_dir is not None:
                need += self._trace_time([entries[0], *active])
            if self.left() >= need or len(active) <= 1:
                return
            slowest = max(active, key=lambda e: e.estimate_s)
            entries.remove(slowest)
            self.not_run.append(NotRun(slowest.variant.name, f"one call takes {slowest.estimate_s:.2g} s: no room "
                                                             f"for {MIN_ROUNDS} rounds of every variant in the budget "
                                                             "(a larger --budget, or fewer --variants)"))

    def _rounds(self, entries: list[_Entry]) -> int:
        active = [e for e in entries if e.error is None]
        rounds = 0
        while rounds < self.max_rounds:
            need = sum(e.estimate_s for e in active) + (self._trace_time(active) if self.trace_dir else 0.0)
            if self.left() < need:
                break
            order = active[rounds % len(active):] + active[: rounds % len(active)]
            for entry in order:
                try:
                    figures, seconds = timed(lambda: self._call(entry))
                except Exception as exc:
                    if entry is entries[0]:
                        raise  # the baseline's own failure is the caller's
                    entry.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                    entry.calls.append(None)
                    continue
                entry.estimate_s = max(entry.estimate_s * 0.5, seconds)  # follows the variant's own pace
                entry.calls.append(figures)
            active = [e for e in active if e.error is None]
            rounds += 1
            self.say(f"{self.load.tag}: round {rounds} done, {self.left():.0f} s left")
        return rounds

    def _trace_time(self, active: list[_Entry]) -> float:
        # a traced call is slower (the profiler's own bookkeeping), and the trace is written after it
        return sum(3 * e.estimate_s + 1.0 for e in active)

    def _traces(self, entries: list[_Entry]) -> None:
        assert self.trace_dir is not None
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            path = self.trace_dir / f"{_file_name(entry.variant.name)}.json.gz"
            fn, kw = entry.prepared.call_args()
            try:
                written = self.meter.trace(fn, kw, path)
            except Exception as exc:
                written = f"{type(exc).__name__}: {exc}"
            finally:
                entry.prepared.restore()
            if isinstance(written, Path):
                entry.trace = str(written)
            else:
                self.not_run.append(NotRun(f"trace of {entry.variant.name}", str(written)))

    # ------------------------------------------------------------------ the result
    def _result(self, entries: list[_Entry], rounds: int) -> WorkloadResult:
        base = entries[0]
        base_result = self._figures(base)
        measured = []
        for entry in entries[1:]:
            result = self._figures(entry)
            for name, (lower, _unit, _label) in FIGURES.items():
                pairs = _pairs(name, base.calls, entry.calls)
                if pairs:
                    result.vs_baseline[name] = compare([b for b, _ in pairs], [v for _, v in pairs],
                                                       lower_is_better=lower, min_rounds=MIN_ROUNDS)
            if entry.output is not None and base.output is not None:
                result.output = match(base.output, entry.output)
            measured.append(result)
        measured.sort(key=lambda r: (r.error is not None, -(r.speedup or 0.0)))
        out = WorkloadResult(prompt_len=self.load.prompt_len, batch_size=self.load.batch_size,
                             new_tokens=self.load.new_tokens, sampling=self.sampling, rounds=rounds,
                             baseline=base_result, variants=measured, not_run=self.not_run)
        winner = out.winner
        if winner is not None and winner.trace and base_result.trace:
            out.diff_command = f"gpuprobe diff {base_result.trace} {winner.trace}"
        return out

    def _figures(self, entry: _Entry) -> VariantResult:
        result = VariantResult(entry.variant, rounds=sum(1 for c in entry.calls if c is not None),
                               syncs_per_step=entry.syncs.per_step if entry.syncs is not None else None,
                               launches_per_step=entry.launches, trace=entry.trace, error=entry.error)
        for name in FIGURES:
            values = [v for v in (c.figure(name) for c in entry.calls if c is not None) if v is not None]
            if values:
                result.figures[name] = spread(values)
        return result


def _pairs(name: str, base: Sequence[CallFigures | None], variant: Sequence[CallFigures | None]
           ) -> list[tuple[float, float]]:
    """Round by round, the figure ``name`` of the baseline and of the variant, where both have it."""
    out = []
    for b, v in zip(base, variant):
        x = b.figure(name) if b is not None else None
        y = v.figure(name) if v is not None else None
        if x is not None and y is not None:
            out.append((x, y))
    return out


def _group_of(name: str) -> str:
    for group, prefixes in GROUPS.items():
        if any(name.startswith(p) for p in prefixes):
            return group
    return "custom"


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", name)


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
        if w.rounds < MIN_ROUNDS:
            notes.append(f"{w.label}: {w.rounds} round(s) in the budget, fewer than {MIN_ROUNDS}: figures without "
                         "verdicts (a larger --budget, or fewer variants).")
        differ = [v.name for v in w.variants if v.output is not None and not v.output.identical]
        if differ:
            notes.append(f"{w.label}: greedy output differs from the baseline's with {', '.join(differ)}.")
    return notes
