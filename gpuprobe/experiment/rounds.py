"""One workload's experiment: set-up of each variant, the rounds, the traces, the figures compared.

Per workload: the baseline first (one call under the sync audit, one greedy call when the baseline
samples, one warm-up call), from which the logits processors and stopping criteria to try are flagged;
then the same for every variant that applies, admitted while the fewest rounds of all still fit in the
workload's share of the budget. Then rounds: each round calls every variant once, the order rotated by
one each round, until the share leaves no room for another round or ``max_rounds`` are done. With a
trace folder, one more call per variant is traced.

No call starts that would not finish in the share, as far as the calls measured so far tell (the
variant's own last call, else the baseline's): the share is overrun by one call's time at most, and
a round cut short is dropped whole. A variant whose call raises is reported failed and the others go
on; the baseline's call raising is MODEL's fault (:class:`~gpuprobe.experiment.faults.ModelFailed`),
with the rounds measured before it.
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
from .faults import CallFailed, ModelFailed
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


class _SetUpFailed(Exception):
    """A set-up call raised: which one (``audited call``, ``greedy call``, ``warm-up call``) and how."""

    def __init__(self, call: str, failed: CallFailed) -> None:
        super().__init__(f"its {call} raised {failed.text}")
        self.call, self.failed = call, failed


def _error_text(exc: Exception) -> str:
    if isinstance(exc, _SetUpFailed):
        return f"{exc.failed.text} (its {exc.call})"
    if isinstance(exc, CallFailed):
        return exc.text
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


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
        self._base: _Entry | None = None
        # the estimated call time of each variant the budget left out: a round with all of them takes that longer
        self._left_out_s: list[float] = []

    @property
    def baseline_s(self) -> float | None:
        """The time of the baseline's last call (None before one finished): the next workload's first estimate."""
        return self._base.estimate_s if self._base is not None and self._base.estimate_s > 0 else None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def _fits(self, seconds: float) -> bool:
        """Whether a call expected to take ``seconds`` finishes within the share."""
        return self.left() >= seconds

    # ------------------------------------------------------------------ set-up: audit, outputs, warm-up
    def _set_up(self, entry: _Entry) -> bool:
        """The audited call, the greedy one when the baseline samples, the warm-up call; False where the share
        leaves no room for the next of them (``entry.estimate_s`` is the time of its last call).

        Raises:
            _SetUpFailed: one of the calls raised.
        """
        fn, kw = entry.prepared.call_args()
        try:
            (out, audit), entry.estimate_s = timed(lambda: self.meter.audit(fn, kw))
        except CallFailed as exc:
            raise _SetUpFailed("audited call", exc) from exc.error
        finally:
            entry.prepared.restore()
        entry.syncs, entry.launches = audit.syncs, audit.launches_per_step
        if self.sampling:
            if not self._fits(entry.estimate_s):
                return False
            fn, kw = entry.prepared.call_args({"do_sample": False})
            try:
                out = self.meter.call(fn, kw)[0]
            except CallFailed as exc:
                raise _SetUpFailed("greedy call", exc) from exc.error
            finally:
                entry.prepared.restore()
        entry.output = new_tokens(out, [int(self.load.kwargs["input_ids"].shape[1])] * self.load.batch_size,
                                  self.eos)
        if not self._fits(entry.estimate_s):
            return False
        try:
            figures, seconds = timed(lambda: self._call(entry))
        except CallFailed as exc:
            raise _SetUpFailed("warm-up call", exc) from exc.error
        entry.warm, entry.estimate_s = figures, seconds
        return True

    def _call(self, entry: _Entry) -> CallFigures:
        fn, kw = entry.prepared.call_args()
        try:
            return self.meter.call(fn, kw)[1]
        finally:
            entry.prepared.restore()

    def _try_set_up(self, entry: _Entry) -> bool | None:
        """A variant's set-up: True when done, False when the share left no room for it, None when it failed."""
        try:
            return self._set_up(entry)
        except Exception as exc:  # the variant's own failure: reported, the others go on
            entry.error = _error_text(exc)
            return None

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
        """Set up, run the rounds, trace; returns the workload's result.

        Raises:
            ModelFailed: the baseline's call raised (MODEL's own error); its ``workload`` holds the rounds
                measured before it, when there are any.
        """
        base = self._base = _Entry(BASELINE, prepare(BASELINE, self.model, self.load.kwargs))
        self.say(f"{self.load.tag}: baseline: audit and warm-up")
        entries = [base]
        try:
            ready, set_up_s = timed(lambda: self._set_up(base))
        except _SetUpFailed as exc:
            raise self._failed(exc.failed, f"the baseline's {exc.call}", entries, 0) from exc.failed.error
        if not ready:  # the baseline's own set-up outlasts the share: nothing else can run
            for variant in self._candidates(base):
                self.not_run.append(NotRun(variant.name, "no time left in the budget: the baseline's set-up "
                                                         "took it (a larger --budget)"))
                self._left_out_s.append(base.estimate_s)
            return self._result(entries, 0, "budget")
        for variant in self._candidates(base):
            # room for its set-up, then the fewest rounds (and traces) of everything admitted so far and of it
            need = set_up_s + MIN_ROUNDS * (sum(e.estimate_s for e in entries) + base.estimate_s)
            if self.trace_dir is not None:
                need += self._trace_time(entries) + self._trace_time([base])
            if self.left() < need:
                self.not_run.append(NotRun(variant.name, f"no time left in the budget for {MIN_ROUNDS} rounds "
                                                         "with it (a larger --budget, or fewer --variants)"))
                self._left_out_s.append(base.estimate_s)
                continue
            self.say(f"{self.load.tag}: {variant.name}: audit and warm-up")
            entry = _Entry(variant, self._prepared(variant))
            if self._try_set_up(entry) is False:
                self.not_run.append(NotRun(variant.name, f"its audited call took {entry.estimate_s:.2g} s: no time "
                                                         "left in the budget for its warm-up (a larger --budget)"))
                self._left_out_s.append(entry.estimate_s)
                continue
            entries.append(entry)
        self._fit(entries)
        rounds, ended_by = self._rounds(entries)
        if self.trace_dir is not None:
            traced = [e for e in entries if e.error is None]
            if rounds:
                self._traces(traced)
            else:
                self.not_run.append(NotRun("traces", "no time left in the budget (a larger --budget)"))
        return self._result(entries, rounds, ended_by)

    def _failed(self, failed: CallFailed, what: str, entries: list[_Entry], rounds: int,
                in_round: int | None = None) -> ModelFailed:
        """The baseline's call raised: MODEL's fault, with the rounds measured before it (the round it broke dropped)."""
        for entry in entries:
            del entry.calls[rounds:]
        fault = failed.fault(what, variant=BASELINE.name, workload=self.load.label, round=in_round)
        return ModelFailed(fault, workload=self._result(entries, rounds, "fault") if rounds else None)

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
            self._left_out_s.append(slowest.estimate_s)
            self.not_run.append(NotRun(slowest.variant.name, f"one call takes {slowest.estimate_s:.2g} s: no room "
                                                             f"for {MIN_ROUNDS} rounds of every variant in the budget "
                                                             "(a larger --budget, or fewer --variants)"))

    def _rounds(self, entries: list[_Entry]) -> tuple[int, str]:
        """The rounds; returns how many, and what ended them: ``budget`` or ``max_rounds``.

        Raises:
            ModelFailed: the baseline's call raised.
        """
        active = [e for e in entries if e.error is None]
        rounds = 0
        while rounds < self.max_rounds:
            need = sum(e.estimate_s for e in active) + (self._trace_time(active) if self.trace_dir else 0.0)
            if self.left() < need:
                return rounds, "budget"
            order = active[rounds % len(active):] + active[: rounds % len(active)]
            for entry in order:
                if not self._fits(entry.estimate_s):  # calls slower than their estimates ate the round's room
                    for e in entries:
                        del e.calls[rounds:]  # a round cut short is no round: its ratios would pair with nothing
                    return rounds, "budget"
                try:
                    figures, seconds = timed(lambda: self._call(entry))
                except CallFailed as exc:
                    if entry is entries[0]:
                        raise self._failed(exc, f"the baseline's call in round {rounds + 1}", entries, rounds,
                                           rounds + 1) from exc.error
                    entry.error = _error_text(exc)
                    entry.calls.append(None)
                    continue
                except Exception as exc:
                    if entry is entries[0]:
                        raise  # gpuprobe's own failure
                    entry.error = _error_text(exc)
                    entry.calls.append(None)
                    continue
                entry.estimate_s = max(entry.estimate_s * 0.5, seconds)  # follows the variant's own pace
                entry.calls.append(figures)
            active = [e for e in active if e.error is None]
            rounds += 1
            self.say(f"{self.load.tag}: round {rounds} done, {self.left():.0f} s left")
        return rounds, "max_rounds"

    def _trace_time(self, active: list[_Entry]) -> float:
        # a traced call is slower (the profiler's own bookkeeping), and the trace is written after it
        return sum(3 * e.estimate_s + 1.0 for e in active)

    def _traces(self, entries: list[_Entry]) -> None:
        assert self.trace_dir is not None
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            if not self._fits(self._trace_time([entry])):
                self.not_run.append(NotRun(f"trace of {entry.variant.name}", "no time left in the budget "
                                                                             "(a larger --budget)"))
                continue
            path = self.trace_dir / f"{_file_name(entry.variant.name)}.json.gz"
            fn, kw = entry.prepared.call_args()
            try:
                written = self.meter.trace(fn, kw, path)
            except Exception as exc:
                written = _error_text(exc)
            finally:
                entry.prepared.restore()
            if isinstance(written, Path):
                entry.trace = str(written)
            else:
                self.not_run.append(NotRun(f"trace of {entry.variant.name}", str(written)))

    # ------------------------------------------------------------------ the result
    def _result(self, entries: list[_Entry], rounds: int, ended_by: str) -> WorkloadResult:
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
                             baseline=base_result, variants=measured, not_run=self.not_run, ended_by=ended_by,
                             round_s=sum(e.estimate_s for e in entries if e.error is None) + sum(self._left_out_s)
                             or None)
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
