"""Quantiles, medians and spreads of some values: the one place gpuprobe computes them (a leaf, stdlib only).

Read by the report (per-step spreads, the evidence of its findings) and by ``gpuprobe try`` (medians of
rounds with their quartiles). A quantile interpolates linearly between the two nearest values (numpy's
default method, ``numpy.percentile``); the median is the middle value, or the mean of the two middle
ones (``statistics.median``).

Example:
    >>> quantile([1, 2, 3, 4], 0.5), median([3, 1, 2]), median([])
    (2.5, 2, None)
    >>> s = spread([4, 1, 3, 2]); (s.median, s.min, s.max, s.q1, s.q3, s.n)
    (2.5, 1, 4, 1.75, 3.25, 4)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["quantile", "median", "Spread", "spread"]


def quantile(sorted_values: Sequence[Any], q: float) -> float:
    """The ``q`` quantile (0 to 1) of values sorted ascending, interpolated linearly (numpy's default method).

    Whole numbers (numpy's too) are read as Python ints, so that the difference of two never overflows and
    nanoseconds below 2**53 (104 days) interpolate to the exact float; a fraction stays one (truncating a
    per-token figure first moved a per-token median by more than 1 ns).

    Raises:
        IndexError: no values.

    Example:
        >>> quantile([1, 2, 3, 4], 0.5), quantile([10, 20], 0.9), quantile([7], 0.25)
        (2.5, 19.0, 7.0)
    """
    n = len(sorted_values)
    if not n:
        raise IndexError("quantile() of no values")
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a, b = sorted_values[lo], sorted_values[hi]
    a = a if isinstance(a, float) else int(a)
    b = b if isinstance(b, float) else int(b)
    return a + (b - a) * (pos - lo)


def median(values: Iterable[Any]) -> Any:
    """The middle value of ``values`` (any order), or the mean of the two middle ones; None if there are none.

    The middle value is returned as it is (an int stays an int), as ``statistics.median`` does.

    Example:
        >>> median([5, 1, 3]), median([4, 1, 3, 2]), median([]) is None
        (3, 2.5, True)
    """
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# Why a class with __slots__ and not a dataclass: a frozen dataclass of these fields costs 1 to 2.5 ms to
# define at import (measured here), and every `gpuprobe report` run imports this module.
class Spread:
    """The median of some values and how far they spread: the extremes, the quartiles and the 10th and 90th
    percentiles (:func:`spread`); built with keywords.

    Attributes:
        median: The middle value, or the mean of the two middle ones.
        min: The smallest value.
        max: The largest value.
        q1: The first quartile (the 25th percentile).
        q3: The third quartile (the 75th percentile).
        n: How many values.
        p10: The 10th percentile.
        p90: The 90th percentile.

    Example:
        >>> spread([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]).rounded().p90
        90
    """

    __slots__ = ("median", "min", "max", "q1", "q3", "n", "p10", "p90")

    def __init__(self, *, median: Any, min: Any, max: Any, q1: Any, q3: Any, n: int, p10: Any, p90: Any) -> None:
        self.median = median
        self.min = min
        self.max = max
        self.q1 = q1
        self.q3 = q3
        self.n = n
        self.p10 = p10
        self.p90 = p90

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spread):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable

    def __repr__(self) -> str:
        return "Spread(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__) + ")"

    @property
    def relative_range(self) -> float:
        """(max − min) ÷ median; 0 for a zero median."""
        return (self.max - self.min) / abs(self.median) if self.median else 0.0

    def rounded(self) -> Spread:
        """The same spread in whole numbers (each figure rounded half to even)."""
        return Spread(median=int(round(self.median)), min=int(round(self.min)), max=int(round(self.max)),
                      q1=int(round(self.q1)), q3=int(round(self.q3)), n=self.n, p10=int(round(self.p10)),
                      p90=int(round(self.p90)))

    def to_dict(self) -> dict[str, float]:
        """The median, extremes, quartiles and count (what ``gpuprobe try`` writes of a figure)."""
        return {"median": self.median, "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3, "n": self.n}


def spread(values: Iterable[Any], *, ordered: bool = False) -> Spread:
    """The :class:`Spread` of ``values`` (``ordered``: a sequence sorted ascending already, a numpy array too,
    not sorted again).

    Raises:
        ValueError: no values.

    Example:
        >>> s = spread([9.0, 1.0, 5.0, 3.0, 7.0]); (s.median, s.q1, s.q3, s.p10)
        (5.0, 3.0, 7.0, 1.8)
    """
    values = values if ordered else sorted(values)  # type: ignore[assignment]
    n = len(values)  # type: ignore[arg-type]
    if not n:
        raise ValueError("spread() of no values")
    mid = n // 2
    middle = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2
    return Spread(median=middle, min=values[0], max=values[-1], q1=quantile(values, 0.25),
                  q3=quantile(values, 0.75), n=n, p10=quantile(values, 0.1), p90=quantile(values, 0.9))
