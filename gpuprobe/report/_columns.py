"""Column arithmetic behind the report, twice: numpy (fast path) and plain Python (its twin).

Both classes take the columns a :class:`~gpuprobe.report._analysis.Collector` gathered and
answer the same questions (joins, group-bys, windows, unions) with plain Python values, so the
report code above them is shared. The Python twin serves small traces (it needs no numpy, whose
import alone costs 16 MB of RSS) and is the reference the numpy path is tested against.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuprobe.report._analysis import Collector

__all__ = ["NumpyColumns", "PythonColumns", "quantile", "union_of"]

Windows = list[tuple[int, int]]


def quantile(sorted_values: Sequence[Any], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default method).

    Example:
        >>> quantile([1, 2, 3, 4], 0.5), quantile([10, 20], 0.9)
        (2.5, 19.0)
    """
    n = len(sorted_values)
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a = int(sorted_values[lo])
    b = int(sorted_values[hi])
    return a + (b - a) * (pos - lo)


def union_of(pairs: list[tuple[int, int]]) -> int:
    """Length of the union of ``(start, end)`` intervals.

    Example:
        >>> union_of([(0, 10), (5, 12), (20, 25)])
        17
    """
    total = 0
    cover = None
    for start, end in sorted(pairs):
        if cover is None or start >= cover:
            total += end - start
            cover = end
        elif end > cover:
            total += end - cover
            cover = end
    return total


def _order_stats(sorted_values: Any, total: int) -> tuple[int, int | None, int | None, int | None, int | None]:
    n = len(sorted_values)
    if not n:
        return 0, None, None, None, None
    return (
        n,
        total // n,
        int(round(quantile(sorted_values, 0.5))),
        int(round(quantile(sorted_values, 0.9))),
        int(sorted_values[-1]),
    )


class PythonColumns:
    """The report's column arithmetic with lists, ``sorted`` and ``bisect``."""

    def __init__(self, c: Collector, cat_of_name: list[int], memcpy_cat: int, memset_cat: int) -> None:
        self.g_kind = list(c.g_kind)
        self.g_name = list(c.g_name)
        self.g_start = list(c.g_start)
        self.g_dur = list(c.g_dur)
        self.g_end = [s + d for s, d in zip(self.g_start, self.g_dur)]
        self.g_bytes = list(c.g_bytes)
        self.g_dir = list(c.g_dir)
        self.g_where = list(c.g_where)
        special = {1: memcpy_cat, 2: memset_cat}
        self.g_cat = [special.get(k, cat_of_name[n] if k == 0 else 0) for k, n in zip(self.g_kind, self.g_name)]
        self.l_start = list(c.l_start)
        self.l_dur = list(c.l_dur)
        self.l_thread = list(c.l_thread)
        self.n_gpu = len(self.g_kind)
        self.n_launch = len(self.l_start)
        # join: the first launch of each correlation key
        first: dict[int, int] = {}
        for i, key in enumerate(c.l_corr):
            if key >= 0:
                first.setdefault(key, i)
        self.g_launch = [first.get(key, -1) if key >= 0 else -1 for key in c.g_corr]
        matched = sorted(
            (i for i in range(self.n_gpu) if self.g_launch[i] >= 0),
            key=lambda i: (self.l_thread[self.g_launch[i]], self.l_start[self.g_launch[i]]),
        )
        self.m_idx = matched
        self.m_thread = [self.l_thread[self.g_launch[i]] for i in matched]
        self.m_lstart = [self.l_start[self.g_launch[i]] for i in matched]
        self.cum = {
            "kernel_ns": [0, *itertools.accumulate(self.g_dur[i] if self.g_kind[i] == 0 else 0 for i in matched)],
            "kernels": [0, *itertools.accumulate(1 if self.g_kind[i] == 0 else 0 for i in matched)],
            "memcpy_bytes": [
                0,
                *itertools.accumulate(max(self.g_bytes[i], 0) if self.g_kind[i] == 1 else 0 for i in matched),
            ],
        }
        lorder = sorted(range(self.n_launch), key=lambda i: (self.l_thread[i], self.l_start[i]))
        self.ls_thread = [self.l_thread[i] for i in lorder]
        self.ls_start = [self.l_start[i] for i in lorder]
        self.cum["launch_ns"] = [0, *itertools.accumulate(self.l_dur[i] for i in lorder)]
        s_start, s_dur, s_thread = list(c.s_start), list(c.s_dur), list(c.s_thread)
        sorder = sorted(range(len(s_start)), key=lambda i: (s_thread[i], s_start[i]))
        self.ss_thread = [s_thread[i] for i in sorder]
        self.ss_start = [s_start[i] for i in sorder]
        self.cum["sync_ns"] = [0, *itertools.accumulate(s_dur[i] for i in sorder)]
        self.n_sync = len(s_start)
        self.r_name, self.r_start, self.r_dur, self.r_thread = (
            list(c.r_name),
            list(c.r_start),
            list(c.r_dur),
            list(c.r_thread),
        )

    # ------------------------------------------------------------------ totals

    def kernel_count(self) -> int:
        return sum(1 for k in self.g_kind if k == 0)

    def kernel_total(self) -> int:
        return sum(d for k, d in zip(self.g_kind, self.g_dur) if k == 0)

    def gpu_total(self) -> int:
        return sum(self.g_dur)

    def launch_api_total(self) -> int:
        return sum(self.l_dur)

    def union_all(self) -> int:
        return union_of(list(zip(self.g_start, self.g_end)))

    def kernel_groups(self) -> list[tuple[int, int, int, int, int, int]]:
        """(name id, count, total, median, min, max) per kernel name, by name id."""
        by_name: dict[int, list[int]] = {}
        for k, n, d in zip(self.g_kind, self.g_name, self.g_dur):
            if k == 0:
                by_name.setdefault(n, []).append(d)
        out = []
        for name in sorted(by_name):
            durs = sorted(by_name[name])
            count = len(durs)
            median = (durs[(count - 1) // 2] + durs[count // 2]) // 2
            out.append((name, count, sum(durs), median, durs[0], durs[-1]))
        return out

    def category_stats(self, n_cat: int) -> tuple[list[int], list[int]]:
        counts = [0] * n_cat
        totals = [0] * n_cat
        for cat, d in zip(self.g_cat, self.g_dur):
            counts[cat] += 1
            totals[cat] += d
        return counts, totals

    def join_counts(self) -> tuple[int, int]:
        """(GPU operations without a launch, launches linked to a GPU operation)."""
        return sum(1 for x in self.g_launch if x < 0), len({x for x in self.g_launch if x >= 0})

    def delay_stats(self) -> tuple[int, int | None, int | None, int | None, int | None]:
        delays = sorted(self.g_start[i] - self.l_start[self.g_launch[i]] for i in self.m_idx)
        return _order_stats(delays, sum(delays))

    def memory_groups(self) -> list[tuple[int, int, int, int, int]]:
        groups: dict[tuple[int, int], list[int]] = {}
        for k, d, b, dur in zip(self.g_kind, self.g_dir, self.g_bytes, self.g_dur):
            if k:
                g = groups.setdefault((k, d), [0, 0, 0])
                g[0] += 1
                g[1] += max(b, 0)
                g[2] += dur
        return [(k, d, *v) for (k, d), v in sorted(groups.items())]  # type: ignore[misc]

    def top_gpu(self, n: int) -> list[tuple[int, int, int, int, int]]:
        idx = sorted(range(self.n_gpu), key=lambda i: (-self.g_dur[i], i))[:n]
        return [(self.g_kind[i], self.g_name[i], self.g_start[i], self.g_dur[i], self.g_where[i]) for i in idx]

    # ---------------------------------------------------------------- windows

    def threads(self, table: str) -> list[int]:
        return sorted(set({"m": self.m_thread, "l": self.ls_thread, "s": self.ss_thread}[table]))

    def bounds(self, table: str, thread: int) -> tuple[int, int]:
        col = {"m": self.m_thread, "l": self.ls_thread, "s": self.ss_thread}[table]
        return bisect.bisect_left(col, thread), bisect.bisect_right(col, thread)

    def window(self, table: str, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        """Entries of one thread whose (launch) start lies in ``[start, end)``."""
        col = {"m": self.m_lstart, "l": self.ls_start, "s": self.ss_start}[table]
        lo, hi = bounds
        return bisect.bisect_left(col, start, lo, hi), bisect.bisect_left(col, end, lo, hi)

    def total(self, name: str, wins: Windows) -> int:
        cum = self.cum[name]
        return sum(cum[hi] - cum[lo] for lo, hi in wins)

    def _ops(self, wins: Windows) -> list[int]:
        return [self.m_idx[j] for lo, hi in wins for j in range(lo, hi)]

    def busy_span(self, wins: Windows) -> tuple[int, int]:
        ops = self._ops(wins)
        if not ops:
            return 0, 0
        pairs = [(self.g_start[i], self.g_end[i]) for i in ops]
        return union_of(pairs), max(e for _, e in pairs) - min(s for s, _ in pairs)

    def categories(self, wins: Windows, n_cat: int) -> list[int]:
        out = [0] * n_cat
        for i in self._ops(wins):
            out[self.g_cat[i]] += self.g_dur[i]
        return out

    def family_quantiles(
        self, step_wins: list[Windows], fam_of_name: list[int], n_fam: int
    ) -> dict[int, tuple[int, int, int]]:
        """Per family: p10, median and p90 over steps of its GPU time in the step."""
        per_step: list[dict[int, int]] = []
        seen: set[int] = set()
        for wins in step_wins:
            sums: dict[int, int] = {}
            for i in self._ops(wins):
                f = fam_of_name[self.g_name[i]]
                sums[f] = sums.get(f, 0) + self.g_dur[i]
            per_step.append(sums)
            seen.update(f for f, v in sums.items() if v)
        out = {}
        for f in seen:
            values = sorted(s.get(f, 0) for s in per_step)
            out[f] = tuple(int(round(quantile(values, q))) for q in (0.1, 0.5, 0.9))
        return out  # type: ignore[return-value]

    def range_order(self) -> list[int]:
        return sorted(range(len(self.r_start)), key=lambda i: (self.r_thread[i], self.r_start[i], -self.r_dur[i]))


class NumpyColumns:
    """The same arithmetic vectorised with numpy (8 bytes per value, no Python object per value)."""

    _MAX_FAMILY_CELLS = 20_000_000  # steps x families kept for per-step spreads (8 bytes each)

    def __init__(self, c: Collector, cat_of_name: list[int], memcpy_cat: int, memset_cat: int) -> None:
        import numpy as np

        self.np = np
        i64 = np.int64

        def col(arr: Any) -> Any:
            # Zero-copy view of the collector's typed array (its width: see Collector).
            return np.frombuffer(arr, dtype=np.dtype(arr.typecode)) if len(arr) else np.zeros(0, dtype=arr.typecode)

        # Memory: these columns live for the whole report, one entry per GPU operation or launch of
        # traces up to several GB, so only what the sections read is kept, in its narrowest type;
        # per-window values are gathered through m_idx when asked for.
        self.g_kind = col(c.g_kind)
        self.g_name = col(c.g_name)
        self.g_start = col(c.g_start)
        self.g_dur = col(c.g_dur)
        self.g_bytes = col(c.g_bytes)
        self.g_dir = col(c.g_dir)
        self.g_where = col(c.g_where)
        cats = np.array(cat_of_name or [0], dtype=np.int8)
        self.g_cat = cats[self.g_name] if len(self.g_name) else np.zeros(0, dtype=np.int8)
        self.g_cat[self.g_kind == 1] = memcpy_cat
        self.g_cat[self.g_kind == 2] = memset_cat
        self.is_kernel = self.g_kind == 0
        self.l_start = col(c.l_start)
        self.l_dur = col(c.l_dur)
        self.l_thread = col(c.l_thread)
        self.n_gpu = len(self.g_kind)
        self.n_launch = len(self.l_start)
        # join: sort launches by correlation key; a stable sort keeps the first of equal keys first
        g_launch = np.full(self.n_gpu, -1, dtype=i64)
        if self.n_launch and self.n_gpu:
            l_corr = col(c.l_corr)
            g_corr = col(c.g_corr)
            order = np.argsort(l_corr, kind="stable")
            pos = np.searchsorted(l_corr[order], g_corr)
            np.minimum(pos, self.n_launch - 1, out=pos)
            pos = order[pos]  # the first launch with the nearest key at or above each operation's
            hit = (g_corr >= 0) & (l_corr[pos] == g_corr)
            g_launch[hit] = pos[hit]
            del order, pos, hit, l_corr, g_corr
        self.g_launch = g_launch
        matched = np.flatnonzero(g_launch >= 0)
        m_thread = self.l_thread[g_launch[matched]]
        m_lstart = self.l_start[g_launch[matched]]
        order = np.lexsort((matched, m_lstart, m_thread))
        self.m_idx = matched[order]
        self.m_thread = m_thread[order]
        self.m_lstart = m_lstart[order]
        del matched, m_thread, m_lstart, order
        idx = self.m_idx

        def cum(values: Any) -> Any:
            return np.concatenate(([0], np.cumsum(values, dtype=i64)))

        kernel = self.is_kernel[idx]
        self.cum = {
            "kernel_ns": cum(np.where(kernel, self.g_dur[idx], 0)),
            "kernels": cum(kernel),
            "memcpy_bytes": cum(np.where(self.g_kind[idx] == 1, np.maximum(self.g_bytes[idx], 0), 0)),
        }
        del kernel
        lo = np.lexsort((np.arange(self.n_launch), self.l_start, self.l_thread))
        self.ls_thread = self.l_thread[lo]
        self.ls_start = self.l_start[lo]
        self.cum["launch_ns"] = cum(self.l_dur[lo])
        del lo
        s_start, s_thread = col(c.s_start), col(c.s_thread)
        so = np.lexsort((np.arange(len(s_start)), s_start, s_thread))
        self.ss_thread = s_thread[so]
        self.ss_start = s_start[so]
        self.cum["sync_ns"] = cum(col(c.s_dur)[so])
        self.n_sync = len(s_start)
        self.r_name = list(c.r_name)
        self.r_start = list(c.r_start)
        self.r_dur = list(c.r_dur)
        self.r_thread = list(c.r_thread)

    # ------------------------------------------------------------------ totals

    def kernel_count(self) -> int:
        return int(self.is_kernel.sum())

    def kernel_total(self) -> int:
        return int(self.g_dur[self.is_kernel].sum())

    def gpu_total(self) -> int:
        return int(self.g_dur.sum())

    def launch_api_total(self) -> int:
        return int(self.l_dur.sum())

    def _union(self, starts: Any, ends: Any) -> int:
        np = self.np
        if not len(starts):
            return 0
        order = np.argsort(starts, kind="stable")
        cover = ends[order]
        np.maximum.accumulate(cover, out=cover)
        s = starts[order]
        del order
        # Interval i adds what its running end passes beyond both its start and the cover so far
        # (the running end of i - 1). In place: on a whole trace these are its largest temporaries.
        np.maximum(s[1:], cover[:-1], out=s[1:])
        np.subtract(cover, s, out=cover)
        np.maximum(cover, 0, out=cover)
        return int(cover.sum())

    def union_all(self) -> int:
        return self._union(self.g_start, self.g_start + self.g_dur)

    def kernel_groups(self) -> list[tuple[int, int, int, int, int, int]]:
        np = self.np
        names = self.g_name[self.is_kernel]
        durs = self.g_dur[self.is_kernel]
        if not len(names):
            return []
        order = np.lexsort((durs, names))
        names = names[order]
        durs = durs[order]
        starts = np.flatnonzero(np.concatenate(([True], names[1:] != names[:-1])))
        counts = np.diff(np.concatenate((starts, [len(names)])))
        totals = np.add.reduceat(durs, starts)
        median = (durs[starts + (counts - 1) // 2] + durs[starts + counts // 2]) // 2
        return list(
            zip(
                names[starts].tolist(),
                counts.tolist(),
                totals.tolist(),
                median.tolist(),
                durs[starts].tolist(),
                durs[starts + counts - 1].tolist(),
            )
        )

    def category_stats(self, n_cat: int) -> tuple[list[int], list[int]]:
        np = self.np
        counts = np.bincount(self.g_cat, minlength=n_cat)
        totals = np.zeros(n_cat, dtype=np.int64)
        np.add.at(totals, self.g_cat, self.g_dur)  # exact int64 sums (bincount weights are float64)
        return counts.tolist(), totals.tolist()

    def join_counts(self) -> tuple[int, int]:
        linked = self.g_launch[self.g_launch >= 0]
        return int((self.g_launch < 0).sum()), len(self.np.unique(linked))

    def delay_stats(self) -> tuple[int, int | None, int | None, int | None, int | None]:
        delays = self.np.sort(self.g_start[self.m_idx] - self.l_start[self.g_launch[self.m_idx]])
        return _order_stats(delays, int(delays.sum()))

    def memory_groups(self) -> list[tuple[int, int, int, int, int]]:
        np = self.np
        out = []
        for k in (1, 2):
            sel = self.g_kind == k
            if not sel.any():
                continue
            dirs = self.g_dir[sel]
            nbytes = np.maximum(self.g_bytes[sel], 0)
            durs = self.g_dur[sel]
            for d in np.unique(dirs).tolist():
                pick = dirs == d
                out.append((k, d, int(pick.sum()), int(nbytes[pick].sum()), int(durs[pick].sum())))
        return out

    def top_gpu(self, n: int) -> list[tuple[int, int, int, int, int]]:
        np = self.np
        if not self.n_gpu:
            return []
        idx = np.lexsort((np.arange(self.n_gpu), -self.g_dur))[:n]
        return list(
            zip(
                self.g_kind[idx].tolist(),
                self.g_name[idx].tolist(),
                self.g_start[idx].tolist(),
                self.g_dur[idx].tolist(),
                self.g_where[idx].tolist(),
            )
        )

    # ---------------------------------------------------------------- windows

    def threads(self, table: str) -> list[int]:
        col = {"m": self.m_thread, "l": self.ls_thread, "s": self.ss_thread}[table]
        return self.np.unique(col).tolist()

    def bounds(self, table: str, thread: int) -> tuple[int, int]:
        col = {"m": self.m_thread, "l": self.ls_thread, "s": self.ss_thread}[table]
        return int(self.np.searchsorted(col, thread, "left")), int(self.np.searchsorted(col, thread, "right"))

    def window(self, table: str, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        lo, hi = bounds
        if lo == hi:
            return lo, lo
        col = {"m": self.m_lstart, "l": self.ls_start, "s": self.ss_start}[table][lo:hi]
        np = self.np
        return lo + int(np.searchsorted(col, start, "left")), lo + int(np.searchsorted(col, end, "left"))

    def total(self, name: str, wins: Windows) -> int:
        cum = self.cum[name]
        return sum(int(cum[hi] - cum[lo]) for lo, hi in wins)

    def _sel(self, wins: Windows) -> Any:
        if len(wins) == 1:
            return slice(*wins[0])
        return self.np.concatenate([self.np.arange(lo, hi) for lo, hi in wins])

    def busy_span(self, wins: Windows) -> tuple[int, int]:
        if not wins:
            return 0, 0
        idx = self.m_idx[self._sel(wins)]
        starts = self.g_start[idx]
        ends = starts + self.g_dur[idx]
        return self._union(starts, ends), int(ends.max() - starts.min())

    def categories(self, wins: Windows, n_cat: int) -> list[int]:
        if not wins:
            return [0] * n_cat
        idx = self.m_idx[self._sel(wins)]
        out = self.np.zeros(n_cat, dtype=self.np.int64)
        self.np.add.at(out, self.g_cat[idx], self.g_dur[idx])
        return out.tolist()

    def family_quantiles(
        self, step_wins: list[Windows], fam_of_name: list[int], n_fam: int
    ) -> dict[int, tuple[int, int, int]]:
        np = self.np
        if not step_wins or not n_fam:
            return {}
        fam_of = np.array(fam_of_name, dtype=np.int64)
        keep = np.arange(n_fam)
        if len(step_wins) * n_fam > self._MAX_FAMILY_CELLS:
            # why: bound the steps x families matrix; the biggest families are the ones a diff shows
            idx = self.m_idx
            totals = np.bincount(fam_of[self.g_name[idx]], weights=self.g_dur[idx], minlength=n_fam)
            keep = np.argsort(-totals, kind="stable")[: max(1, self._MAX_FAMILY_CELLS // len(step_wins))]
        column = np.full(n_fam, len(keep), dtype=np.int64)
        column[keep] = np.arange(len(keep))
        matrix = np.zeros((len(step_wins), len(keep) + 1), dtype=np.int64)
        for row, wins in enumerate(step_wins):
            if wins:
                idx = self.m_idx[self._sel(wins)]
                np.add.at(matrix[row], column[fam_of[self.g_name[idx]]], self.g_dur[idx])
        out = {}
        present = matrix[:, :-1].any(axis=0)
        for j in np.flatnonzero(present).tolist():
            values = np.sort(matrix[:, j])
            out[int(keep[j])] = tuple(int(round(quantile(values, q))) for q in (0.1, 0.5, 0.9))
        return out  # type: ignore[return-value]

    def range_order(self) -> list[int]:
        np = self.np
        if not self.r_start:
            return []
        start = np.array(self.r_start, dtype=np.int64)
        return np.lexsort(
            (
                np.arange(len(start)),
                -np.array(self.r_dur, dtype=np.int64),
                start,
                np.array(self.r_thread, dtype=np.int64),
            )
        ).tolist()
