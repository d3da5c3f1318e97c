"""The ranks section of a report across ranks: each rank's communication, overlap and steps, the
stragglers of each step, and the skew of collectives across ranks. Only a merge makes it."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from gpuprobe.report._section import MergeContext, RankPart, Section, median_int
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["RankRow", "RankStepRow", "StragglerRow", "SkewRow", "RanksSection", "SECTION"]


@dataclasses.dataclass
class RankRow:
    """One rank of a multi-rank report (communication figures as in :class:`CommunicationSection`)."""

    rank: int
    path: str
    kernel_ns: int | None
    communication_ns: int
    overlap_ns: int
    exposed_communication_ns: int
    busy_ns: int | None
    span_ns: int
    launches: int
    steps: int
    step_median_ns: int | None


@dataclasses.dataclass
class RankStepRow:
    """One step of one rank."""

    rank: int
    index: int
    cpu_ns: int
    gpu_busy_ns: int | None
    communication_ns: int
    overlap_ns: int
    exposed_communication_ns: int


@dataclasses.dataclass
class StragglerRow:
    """One step: its slowest rank against the median rank, and the category that explains most of the gap."""

    index: int
    slowest_rank: int
    slowest_ns: int
    median_ns: int
    excess_ns: int
    category: str | None
    category_excess_ns: int


@dataclasses.dataclass
class SkewRow:
    """One collective family: how far apart the ranks start the same collective, and who is last."""

    family: str
    occurrences: int
    median_skew_ns: int
    max_skew_ns: int
    last_rank: int
    last_rank_share: float


@dataclasses.dataclass
class RanksSection:
    """Several ranks of one run; ``source`` says where the ranks come from (``distributedInfo.rank``,
    ``RANK in the environment nsys recorded``, or ``file order``)."""

    source: str
    count: int
    rows: list[RankRow]
    steps: list[RankStepRow]
    stragglers: list[StragglerRow]
    skew: list[SkewRow]


def tables(rk: RanksSection, markdown: bool) -> list[Table]:
    """The ranks; the stragglers and the collective skew where there are some."""
    exposed = sum(r.exposed_communication_ns for r in rk.rows)
    comm = sum(r.communication_ns for r in rk.rows)
    tables = [Table(
        "ranks", f"Ranks ({rk.count}, numbered by {rk.source})", _RANK_COLUMNS, rk.rows,
        [f"communication {format_ns(comm)} in all, of which exposed (no other kernel running) {format_ns(exposed)}"],
    )]
    if rk.stragglers:
        title = "Stragglers: the slowest rank of each step"
        tables.append(Table("stragglers", title, _STRAGGLER_COLUMNS, rk.stragglers))
    if rk.skew:
        tables.append(Table(
            "skew", "Collective skew: how far apart the ranks start the same collective", _SKEW_COLUMNS, rk.skew,
            ["on the traces' own clocks: meaningful for ranks of one node, or with synchronized clocks"],
        ))
    return tables


_NS = Unit.NS
_RANK_COLUMNS = [
    Column("rank", "rank", Unit.INT), Column("kernels", "kernel_ns", _NS),
    Column("communication", "communication_ns", _NS), Column("overlapped", "overlap_ns", _NS),
    Column("exposed", "exposed_communication_ns", _NS),
    Column("GPU busy", "busy_ns", _NS), Column("span", "span_ns", _NS), Column("launches", "launches", Unit.INT),
    Column("steps", "steps", Unit.INT), Column("step (median)", "step_median_ns", _NS),
    Column("path", "path", Unit.NAME, csv_only=True),
]
_STRAGGLER_COLUMNS = [
    Column("step", "index", Unit.INT), Column("slowest rank", "slowest_rank", Unit.INT),
    Column("its step", "slowest_ns", _NS), Column("median rank", "median_ns", _NS), Column("excess", "excess_ns", _NS),
    Column("explained by", "category"), Column("category excess", "category_excess_ns", _NS),
]
_SKEW_COLUMNS = [
    Column("collective", "family", Unit.NAME), Column("count", "occurrences", Unit.INT),
    Column("median skew", "median_skew_ns", _NS), Column("max skew", "max_skew_ns", _NS),
    Column("last rank", "last_rank", Unit.INT), Column("last, share", "last_rank_share", Unit.SHARE),
]


def merge(mctx: MergeContext) -> RanksSection:
    """The ranks side by side: per rank, per step of each rank, stragglers and collective skew."""
    results, source = mctx.results, mctx.source
    rows = []
    step_rows = []
    for r in results:
        rep = r.report
        comm = rep.communication
        steps = rep.steps.rows if rep.steps is not None else []
        rows.append(RankRow(
            rank=r.rank,  # type: ignore[arg-type]
            path=r.path,
            kernel_ns=rep.summary.kernel_ns,
            communication_ns=comm.communication_ns if comm is not None else 0,
            overlap_ns=comm.overlap_ns if comm is not None else 0,
            exposed_communication_ns=comm.exposed_ns if comm is not None else 0,
            busy_ns=rep.summary.gpu_busy_ns,
            span_ns=rep.summary.span_ns,
            launches=rep.summary.launch_count,
            steps=len(steps),
            step_median_ns=median_int([s.cpu_ns for s in steps]) if steps else None,
        ))
        comm_rows = {c.index: c for c in comm.rows} if comm is not None else {}
        for s in steps:
            c = comm_rows.get(s.index)
            step_rows.append(RankStepRow(
                rank=r.rank,  # type: ignore[arg-type]
                index=s.index,
                cpu_ns=s.cpu_ns,
                gpu_busy_ns=s.gpu_busy_ns,
                communication_ns=c.communication_ns if c else 0,
                overlap_ns=c.overlap_ns if c else 0,
                exposed_communication_ns=c.exposed_ns if c else 0,
            ))
    return RanksSection(source=source, count=len(results), rows=rows, steps=step_rows,
                        stragglers=_stragglers(results), skew=_skew(results))


def _stragglers(results: list[RankPart]) -> list[StragglerRow]:
    """Per step: the slowest rank against the median, and the category that explains the gap."""
    by_index: dict[int, list[tuple[int, Any]]] = {}
    for r in results:
        for s in (r.report.steps.rows if r.report.steps is not None else []):
            by_index.setdefault(s.index, []).append((r.rank, s))  # type: ignore[arg-type]
    out = []
    for index in sorted(by_index):
        group = by_index[index]
        if len(group) < 2:
            continue
        times = [s.cpu_ns for _, s in group]
        median = statistics.median(times)
        rank, slow = max(group, key=lambda rs: (rs[1].cpu_ns, -rs[0]))
        category, excess = None, 0
        cats = {c for _, s in group for c in s.categories}
        for c in sorted(cats):
            gap = slow.categories.get(c, 0) - statistics.median([s.categories.get(c, 0) for _, s in group])
            if gap > excess:
                category, excess = c, int(gap)
        out.append(StragglerRow(index=index, slowest_rank=rank, slowest_ns=slow.cpu_ns, median_ns=int(round(median)),
                                excess_ns=int(round(slow.cpu_ns - median)), category=category,
                                category_excess_ns=excess))
    return out


def _skew(results: list[RankPart]) -> list[SkewRow]:
    """Per collective family: how far apart the ranks start the same collective (the k-th of the family
    on each rank), on the traces' clocks (one node, or synchronized clocks)."""
    families = sorted({f for r in results for f in r.collectives})
    out = []
    for fam in families:
        lists = [(r.rank, r.collectives.get(fam, [])) for r in results]
        n = min(len(starts) for _, starts in lists)
        if n == 0 or len(lists) < 2:
            continue
        skews = []
        last: dict[int, int] = {}
        for k in range(n):
            starts = [(starts[k], rank) for rank, starts in lists]
            skews.append(max(starts)[0] - min(starts)[0])
            late = max(starts)[1]
            last[late] = last.get(late, 0) + 1
        worst = max(last.items(), key=lambda kv: (kv[1], -kv[0]))
        out.append(SkewRow(family=fam, occurrences=n, median_skew_ns=median_int(skews), max_skew_ns=max(skews),
                           last_rank=worst[0], last_rank_share=worst[1] / n))
    out.sort(key=lambda r: (-r.median_skew_ns, r.family))
    return out



SECTION = Section("ranks", tables, merge=merge)
