"""One workload's experiment: set-up of each variant, the rounds, the traces, the figures compared.

Per workload: the baseline first (one call under the sync audit, one greedy call when the baseline
samples, one warm-up call), from which the logits processors and stopping criteria to try are flagged;
then the same for every variant that applies, admitted while the fewest rounds of all still fit in the
workload's share of the budget. Then rounds: each round calls every variant once, the order rotated by
one each round, until the share leaves no room for another round or ``max_rounds`` are done. With a
trace folder, one more call per variant is traced.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .apply import Prepared, prepare
from .measure import FIGURES, CallFigures, Meter, Syncs, timed
from .outputs import match, new_tokens
from .result import VariantResult, WorkloadResult
from .stats import MIN_ROUNDS, compare, spread
from .variants import (COPY, FLAG_SHARE, GROUPS, Machine, ModelFacts, NotRun, Variant, catalogue,
                       processor_variants, wanted)
from .workloads import Workload, eos_ids, is_sampling

__all__ = ["BASELINE", "WorkloadRun"]

BASELINE = Variant("baseline", "the model and generate() arguments as given", "# no change", "baseline")


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



class WorkloadRun:
    """One workload's experiment (see the module docstring); :meth:`run` returns its result."""

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
