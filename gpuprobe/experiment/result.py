"""What an experiment found: per workload, the baseline and each variant with its figures, spreads,
verdicts and output match, ranked; what was not run and why; the winner and its code change.

Rendering is apart (:func:`gpuprobe.experiment.render`, :func:`gpuprobe.experiment.plot`);
:meth:`TryResult.to_dict` is the JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .faults import Fault
from .outputs import OutputMatch
from .stats import FASTER, MIN_ROUNDS, Comparison, Spread
from .variants import Machine, ModelFacts, NotRun, Variant

__all__ = ["VariantResult", "WorkloadResult", "TryResult", "SCHEMA", "ENDED_BY"]

SCHEMA = 1

#: What ended a workload's rounds: its share of the budget, ``max_rounds`` (``--rounds``), or a fault of MODEL.
ENDED_BY = ("budget", "max_rounds", "fault")


@dataclasses.dataclass
class VariantResult:
    """One variant (or the baseline) in one workload.

    Attributes:
        figures: per figure (``tokens_per_s``, ``ttft_s``, ...; see ``measure.FIGURES``), its values
            over the rounds as a spread.
        vs_baseline: per figure, the paired comparison with the baseline (empty for the baseline).
        output: its greedy output against the baseline's (None for the baseline, or when not compared).
        syncs_per_step: host syncs per step counted by the sync audit (None when no step was audited:
            compiled calls are not).
        launches_per_step: kernel launches per step, sampled in the audited call (on a GPU), else None.
        trace: its kineto trace, when one was asked for and written.
        error: why it stopped, when a call failed.
    """

    variant: Variant
    rounds: int = 0
    figures: dict[str, Spread] = dataclasses.field(default_factory=dict)
    vs_baseline: dict[str, Comparison] = dataclasses.field(default_factory=dict)
    output: OutputMatch | None = None
    syncs_per_step: float | None = None
    launches_per_step: float | None = None
    trace: str | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def verdict(self) -> str | None:
        """The verdict on tokens/s (the ranking figure), or None for the baseline and failures."""
        c = self.vs_baseline.get("tokens_per_s")
        return c.verdict if c is not None else None

    @property
    def speedup(self) -> float | None:
        c = self.vs_baseline.get("tokens_per_s")
        return c.ratio.median if c is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.variant.to_dict(),
            "rounds": self.rounds,
            "verdict": self.verdict,
            "figures": {k: v.to_dict() for k, v in self.figures.items()},
            "vs_baseline": {k: _memory_words(k, v.to_dict()) for k, v in self.vs_baseline.items()},
            "output": self.output.to_dict() if self.output is not None else None,
            "syncs_per_step": self.syncs_per_step,
            "launches_per_step": self.launches_per_step,
            "trace": self.trace,
            "error": self.error,
        }


def _memory_words(figure: str, d: dict[str, Any]) -> dict[str, Any]:
    if figure.endswith("_bytes"):  # less memory is the better side: say it in memory's words
        d["verdict"] = {"faster": "less", "slower": "more"}.get(d["verdict"], d["verdict"])
    return d


@dataclasses.dataclass
class WorkloadResult:
    """One prompt length × batch size: the baseline, the variants ranked (fastest first), what did not run.

    Attributes:
        ended_by: what ended the rounds (one of :data:`ENDED_BY`).
        round_s: one round's time with every variant that applies: the last call of each one measured, and
            an estimate for each the budget left out (None when no call finished).
    """

    prompt_len: int
    batch_size: int
    new_tokens: int
    sampling: bool
    rounds: int
    baseline: VariantResult
    variants: list[VariantResult]
    not_run: list[NotRun]
    diff_command: str | None = None
    ended_by: str = "budget"
    round_s: float | None = None

    @property
    def no_verdict(self) -> str | None:
        """Why there is no verdict, when there are fewer rounds than the verdict rule needs; else None.

        Example:
            >>> from gpuprobe.experiment.variants import Variant
            >>> base = VariantResult(Variant("baseline", "as given", "# no change"))
            >>> WorkloadResult(6, 1, 2, False, 0, base, [], [], round_s=3.14).no_verdict
            'not enough rounds for a verdict: 0 measured in the budget, the rule needs 7; raise --budget (one round takes ~3.1 s)'
        """
        if self.rounds >= MIN_ROUNDS:
            return None
        head = f"not enough rounds for a verdict: {self.rounds}"
        if self.ended_by == "max_rounds":
            return f"{head} measured, as many as asked for (--rounds {self.rounds}); the rule needs {MIN_ROUNDS}"
        if self.ended_by == "fault":
            return f"{head} measured before the baseline failed, the rule needs {MIN_ROUNDS}"
        pace = f" (one round takes ~{self.round_s:.2g} s)" if self.round_s else ""
        return f"{head} measured in the budget, the rule needs {MIN_ROUNDS}; raise --budget{pace}"

    @property
    def winner(self) -> VariantResult | None:
        """The variant with the best tokens/s gain among those found faster, or None."""
        faster = [v for v in self.variants if v.verdict == FASTER and v.error is None]
        return max(faster, key=lambda v: v.speedup or 0.0) if faster else None

    @property
    def label(self) -> str:
        return f"prompt {self.prompt_len} tokens × batch {self.batch_size}, {self.new_tokens} new tokens"

    def to_dict(self) -> dict[str, Any]:
        winner = self.winner
        return {
            "prompt_len": self.prompt_len,
            "batch_size": self.batch_size,
            "new_tokens": self.new_tokens,
            "sampling": self.sampling,
            "rounds": self.rounds,
            "baseline": self.baseline.to_dict(),
            "variants": [v.to_dict() for v in self.variants],
            "not_run": [n.to_dict() for n in self.not_run],
            "winner": winner.name if winner is not None else None,
            "winner_code": winner.variant.code if winner is not None else None,
            "diff_command": self.diff_command,
            "ended_by": self.ended_by,
            "round_s": round(self.round_s, 3) if self.round_s is not None else None,
            "no_verdict": self.no_verdict,
        }


@dataclasses.dataclass
class TryResult:
    """The whole experiment. ``notes`` say what the figures cannot show (a CPU is not a GPU, few rounds).

    Attributes:
        fault: the error of MODEL that ended the experiment early (its workloads are the rounds measured
            before it), or None when it ran to its end.
    """

    model: str
    facts: ModelFacts
    machine: Machine
    budget_s: float
    elapsed_s: float
    workloads: list[WorkloadResult]
    not_run_workloads: list[NotRun]
    notes: list[str]
    fault: Fault | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "model_facts": dataclasses.asdict(self.facts),
            "machine": self.machine.to_dict(),
            "budget_s": self.budget_s,
            "elapsed_s": round(self.elapsed_s, 3),
            "workloads": [w.to_dict() for w in self.workloads],
            "not_run_workloads": [n.to_dict() for n in self.not_run_workloads],
            "notes": list(self.notes),
            "fault": self.fault.to_dict() if self.fault is not None else None,
        }

