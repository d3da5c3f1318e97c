"""The statistics of an experiment: medians with their spread (:mod:`gpuprobe._stats`), and a verdict only
past the spread.

Variants are measured in rounds (every variant once per round, the order rotated), so each round
gives one ratio of a variant against the baseline measured a moment apart: drifts of the machine
(another program starting) touch both sides of a ratio alike. A variant is faster (or slower) only
when the rounds agree beyond chance (a sign test: so many rounds on one side would happen by chance
less than 1 % of the time), its interquartile range lies on that side of 1, *and* its median gain
exceeds the spread of the ratios (their interquartile range, in log terms so that 2× faster and 2×
slower weigh alike); otherwise there is no difference to report. Under :data:`MIN_ROUNDS` rounds
there is no verdict at all (fewer rounds cannot pass the sign test).

Example:
    >>> compare([10, 11, 10, 12, 10, 11, 12], [5, 5.5, 5, 6, 5, 5.5, 6], lower_is_better=True).verdict
    'faster'
    >>> compare([10, 11, 10, 12, 10, 11, 12], [10.5, 10, 11, 10, 12, 11.5, 11], lower_is_better=True).verdict
    'no difference'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from gpuprobe._stats import Spread, spread

__all__ = ["MIN_ROUNDS", "ALPHA", "Spread", "Comparison", "spread", "compare", "sign_test"]

#: The sign test's threshold: rounds this unlikely to agree by chance are agreement.
ALPHA = 0.01

#: Fewer rounds than this give figures but no verdict: 7 rounds all on one side are the fewest the sign
#: test accepts (2^-7 < 1 %).
MIN_ROUNDS = 7

FASTER, SLOWER, SAME, TOO_FEW = "faster", "slower", "no difference", "too few rounds"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A variant against the baseline on one figure.

    Attributes:
        ratio: the gain per round, as a spread: baseline ÷ variant for times and memory (2.0: twice as
            fast, half the memory), variant ÷ baseline for rates (tokens/s). Above 1 is better.
        noise: the spread the gain must exceed: the interquartile range of the log ratios (0.1: about 10 %).
        verdict: ``faster``, ``slower``, ``no difference`` or ``too few rounds`` (for memory, less memory
            reads ``faster``).
    """

    ratio: Spread
    noise: float
    verdict: str

    def to_dict(self) -> dict[str, object]:
        return {"ratio": self.ratio.to_dict(), "noise": self.noise, "verdict": self.verdict}


def compare(baseline: Sequence[float], variant: Sequence[float], *, lower_is_better: bool,
            min_rounds: int = MIN_ROUNDS) -> Comparison:
    """Compare paired per-round values (``baseline[i]`` and ``variant[i]`` from the same round).

    ``faster`` when the rounds above 1 pass the sign test (:data:`ALPHA`), the ratios' lower quartile is
    above 1 and the median log ratio exceeds the log ratios' interquartile range; ``slower``
    symmetrically; else ``no difference``; ``too few rounds`` under ``min_rounds`` pairs.

    Raises:
        ValueError: the sequences differ in length or are empty.

    Example:
        >>> c = compare([2.0] * 7, [1.0] * 7, lower_is_better=True)
        >>> c.ratio.median, c.verdict
        (2.0, 'faster')
    """
    if len(baseline) != len(variant) or not baseline:
        raise ValueError(f"compare() needs paired values, got {len(baseline)} and {len(variant)}")
    ratios = [_ratio(b, v, lower_is_better) for b, v in zip(baseline, variant)]
    r = spread(ratios)
    logs = spread([math.log(x) if 0 < x < math.inf else (-math.inf if x <= 0 else math.inf) for x in ratios])
    noise = logs.q3 - logs.q1 if math.isfinite(logs.q3 - logs.q1) else math.inf
    above = sum(1 for x in ratios if x > 1)
    below = sum(1 for x in ratios if x < 1)
    if len(ratios) < min_rounds:
        verdict = TOO_FEW
    elif sign_test(above, len(ratios)) <= ALPHA and r.q1 > 1 and logs.median > noise:
        verdict = FASTER
    elif sign_test(below, len(ratios)) <= ALPHA and r.q3 < 1 and -logs.median > noise:
        verdict = SLOWER
    else:
        verdict = SAME
    return Comparison(ratio=r, noise=noise, verdict=verdict)


def sign_test(k: int, n: int) -> float:
    """The chance of ``k`` or more of ``n`` rounds on one side when each side is as likely (one-sided).

    Example:
        >>> sign_test(7, 7), round(sign_test(16, 20), 4)
        (0.0078125, 0.0059)
    """
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def _ratio(base: float, value: float, lower_is_better: bool) -> float:
    num, den = (base, value) if lower_is_better else (value, base)
    if den == 0:
        return 1.0 if num == 0 else math.inf
    return num / den
