"""Interleaved A/B rounds under a time budget, and the figures they give.

Every GPU benchmark compares variants (plain and instrumented, or rows of a per-call cost) measured in
the same process, alternating in short runs: each round runs every variant once, in an order rotated
from round to round, so that slow drifts (clocks, temperature, other processes) hit every variant
alike. One round gives one ratio per variant; a figure is the median of those per-round ratios with
their quartiles. Rounds go on until the part's time budget is spent (at least ``min_rounds``, at most
``max_rounds``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Budget:
    """Rounds until ``seconds`` have passed since the budget was made.

    Args:
        seconds: the time the rounds may take.
        min_rounds: rounds run even past ``seconds`` (a figure needs a spread), but never past ``limit``.
        max_rounds: rounds never exceeded (the dry run sets both to its smallest setting).
        limit: seconds after which no round starts, once one has run (default: twice ``seconds``): a part
            whose rounds turn out far slower than planned (a recompilation on every run, say) must not
            take the later parts' time.
    """

    seconds: float
    min_rounds: int = 3
    max_rounds: int = 10_000
    limit: float | None = None
    start: float = field(default_factory=time.perf_counter)
    spent_rounds: int = 0

    def rounds(self) -> Iterator[int]:
        """Round indices; stops once another round would end past ``seconds`` (after ``min_rounds``) or
        past ``limit`` (after one round), judging a round's length by the one before."""
        limit = 2 * self.seconds if self.limit is None else self.limit
        last = 0.0
        for r in range(self.max_rounds):
            now = time.perf_counter()
            end = now + last
            if (r >= self.min_rounds and end > self.start + self.seconds) or (r >= 1 and end > self.start + limit):
                return
            self.spent_rounds = r + 1
            yield r
            last = time.perf_counter() - now

    def left(self) -> float:
        """Seconds left of the budget (negative once spent)."""
        return self.start + self.seconds - time.perf_counter()


def figure(name: str, values: Sequence[float], unit: str, **extra: Any) -> dict[str, Any]:
    """One reported figure: the median of ``values`` with its quartiles and the number of rounds.

    Example:
        >>> figure("ratio", [1.0, 0.98, 1.02, 0.99], "1")["median"]
        0.995
    """
    xs = list(values)
    if not xs:
        raise ValueError(f"figure {name!r}: no values (no round finished)")
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"name": name, "unit": unit, "median": statistics.median(xs), "q1": q[0], "q3": q[2],
            "rounds": len(xs), **extra}


def alternate(variants: Sequence[str], set_variant: Callable[[str], None], run: Callable[[], float],
              budget: Budget, warmup: int = 1, on_warm: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Each variant's run values, round by round (index r of every list is round r).

    Args:
        variants: names; the first is the reference the others are compared with.
        set_variant: switches to a variant (outside the timed run).
        run: one timed run of the current variant; returns its value (e.g. seconds per token).
        budget: when to stop.
        warmup: untimed runs of each variant first (allocations, caches, captures, compilation).
        on_warm: called once the warm-up runs are done, before the first round.
    """
    for v in variants:
        set_variant(v)
        for _ in range(warmup):
            run()
    if on_warm is not None:
        on_warm()
    values: dict[str, list[float]] = {v: [] for v in variants}
    n = len(variants)
    for r in budget.rounds():
        k = r % n
        for v in [*variants[k:], *variants[:k]]:  # rotated: no variant always runs first
            set_variant(v)
            values[v].append(run())
    set_variant(variants[0])
    return values


def throughput_ratios(times: dict[str, list[float]], reference: str) -> dict[str, list[float]]:
    """Per-round throughput ratios (reference time ÷ variant time) of every variant but the reference."""
    return {v: [a / b for a, b in zip(times[reference], ts)] for v, ts in times.items() if v != reference}
