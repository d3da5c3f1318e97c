"""gpuprobe's one statistics leaf (``gpuprobe._stats``) against independent references: its quantile is
``numpy.percentile``'s default (linear) method, its median is ``statistics.median``, on random values of
every kind it is given (nanosecond integers past 2**53, floats, numpy integers), and the report and
``gpuprobe try`` read the same functions."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from gpuprobe import _stats
from gpuprobe._stats import Spread, median, quantile, spread

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def _samples(seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    out: list[list[float]] = []
    for n in (1, 2, 3, 4, 7, 10, 101):
        out.append([rng.randrange(0, 10**7) for _ in range(n)])  # nanoseconds of short kernels
        out.append([rng.uniform(-5.0, 5.0) for _ in range(n)])
        out.append([rng.choice((3, 3, 3, 8)) for _ in range(n)])  # ties
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_quantile_is_numpys_linear_percentile(seed: int) -> None:
    for values in _samples(seed):
        ordered = sorted(values)
        for q in QUANTILES:
            expected = float(np.percentile(np.array(values, dtype=np.float64), q * 100))
            assert quantile(ordered, q) == pytest.approx(expected, rel=1e-12, abs=1e-9), (values, q)


@pytest.mark.parametrize("seed", range(5))
def test_the_median_is_statistics_median(seed: int) -> None:
    for values in _samples(seed):
        shuffled = list(values)
        random.Random(seed).shuffle(shuffled)
        expected = statistics.median(values)
        got = median(shuffled)
        assert got == expected and type(got) is type(expected), values
    assert median([]) is None


def test_a_quantile_of_nanoseconds_is_exact_and_numpy_integers_do_not_overflow() -> None:
    base = 10**15 + 1  # 11.6 days in ns: below 2**53, so the interpolated float is exact
    assert quantile([base, base + 3], 0.5) == base + 1.5
    big = np.array([-(2**62), 2**62], dtype=np.int64)  # their difference overflows int64
    assert quantile(big, 0.5) == 0.0
    assert type(quantile(np.array([4, 9], dtype=np.int64), 0.0)) is float


def test_a_spread_holds_the_median_extremes_quartiles_and_outer_percentiles() -> None:
    values = [9.0, 1.0, 5.0, 3.0, 7.0, 2.0]
    s = spread(values)
    ref = np.array(values)
    assert (s.n, s.min, s.max, s.median) == (6, 1.0, 9.0, statistics.median(values))
    for got, q in ((s.q1, 25), (s.q3, 75), (s.p10, 10), (s.p90, 90)):
        assert got == pytest.approx(float(np.percentile(ref, q)))
    assert s.relative_range == pytest.approx((9.0 - 1.0) / statistics.median(values))
    assert s.to_dict() == {"median": s.median, "min": 1.0, "max": 9.0, "q1": s.q1, "q3": s.q3, "n": 6}


def test_a_rounded_spread_is_whole_numbers_rounded_half_to_even() -> None:
    s = spread([1, 2, 3, 4]).rounded()  # median 2.5 -> 2, p10 1.3 -> 1, p90 3.7 -> 4
    assert (s.median, s.p10, s.p90, s.q1, s.q3) == (2, 1, 4, 2, 3)
    assert all(type(getattr(s, f)) is int for f in Spread.__slots__)


def test_a_sorted_numpy_array_is_read_as_it_is() -> None:
    values = np.sort(np.array([50, 10, 40, 20, 30], dtype=np.int64))
    assert spread(values, ordered=True) == spread([10, 20, 30, 40, 50])


def test_a_spread_of_no_values_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        spread([])


def test_the_report_and_gpuprobe_try_read_the_one_leaf() -> None:
    from gpuprobe.experiment import stats as try_stats
    from gpuprobe.report import _columns, _section

    assert try_stats.Spread is _columns.Spread is _section.Spread is _stats.Spread
    assert try_stats.spread is _stats.spread
    assert _columns.quantile is _section.quantile is _stats.quantile
