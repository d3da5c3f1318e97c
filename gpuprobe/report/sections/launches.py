"""The launches section: API calls that enqueue GPU work, the delay until the work starts, syncs."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import launch_api_kind
from gpuprobe.report._section import Context, MergeContext, Section, group_by, median_int, quantile
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["ApiStat", "LaunchesSection", "SECTION"]


@dataclasses.dataclass
class ApiStat:
    """One CUDA runtime or driver API, by name."""

    name: str
    kind: str
    count: int
    total_ns: int
    mean_ns: int
    max_ns: int


@dataclasses.dataclass
class LaunchesSection:
    """Launch overhead: API calls that enqueue GPU work, and the delay until the work starts."""

    launch_count: int
    api_ns: int
    sync_count: int
    sync_ns: int
    per_step_median: float | None
    delay_count: int
    delay_mean_ns: int | None
    delay_median_ns: int | None
    delay_p90_ns: int | None
    delay_max_ns: int | None
    launches_without_gpu_op: int
    gpu_ops_without_launch: int
    apis: list[ApiStat]


def compute(ctx: Context) -> LaunchesSection:
    cols = ctx.cols
    steps = ctx.section("steps")
    delays = cols.delay_stats()
    join = cols.join_counts()
    apis = sorted(ctx.scan.api_calls.items(), key=lambda item: (-item[1].total_ns, item[0]))[: ctx.options.top]
    per_step = None
    if steps.rows:
        launches = sorted(r.launches for r in steps.rows)
        per_step = quantile(launches, 0.5)
    return LaunchesSection(
        launch_count=cols.n_launches,
        api_ns=cols.launch_api_total(),
        sync_count=cols.n_syncs,
        sync_ns=cols.sync_total(),
        per_step_median=per_step,
        delay_count=delays.count,
        delay_mean_ns=delays.mean_ns,
        delay_median_ns=delays.median_ns,
        delay_p90_ns=delays.p90_ns,
        delay_max_ns=delays.max_ns,
        launches_without_gpu_op=cols.n_launches - join.launches_with_op,
        gpu_ops_without_launch=join.ops_without_launch,
        apis=[
            ApiStat(
                name=name,
                kind=launch_api_kind(name),
                count=stat.count,
                total_ns=stat.total_ns,
                mean_ns=stat.total_ns // stat.count,
                max_ns=stat.max_ns,
            )
            for name, stat in apis
        ],
    )


def tables(la: LaunchesSection, markdown: bool) -> list[Table]:
    columns = [Column("API", "name", Unit.NAME), Column("kind", "kind"), Column("count", "count", Unit.INT),
               Column("total", "total_ns", Unit.NS), Column("mean", "mean_ns", Unit.NS),
               Column("max", "max_ns", Unit.NS)]
    lines = [
        f"{la.launch_count:,} launch calls, {format_ns(la.api_ns)} in the API"
        + (f", {la.per_step_median:.1f} per step (median)" if la.per_step_median is not None else ""),
        f"launch to GPU start: median {format_ns(la.delay_median_ns)}, mean {format_ns(la.delay_mean_ns)}, "
        f"p90 {format_ns(la.delay_p90_ns)}, max {format_ns(la.delay_max_ns)} ({la.delay_count:,} linked)",
        f"sync calls: {la.sync_count:,}, {format_ns(la.sync_ns)}; launches without GPU record: "
        f"{la.launches_without_gpu_op:,}; GPU operations without launch: {la.gpu_ops_without_launch:,}",
    ]
    return [Table("launches", "Launch overhead", columns, la.apis, lines)]


def merge(mctx: MergeContext) -> LaunchesSection | None:
    """Launches summed over ranks; delay quantiles are the median of the ranks' own."""
    ls = mctx.parts("launches")
    if not ls:
        return None
    apis = []
    for name, group in group_by([a for x in ls for a in x.apis], lambda a: a.name).items():
        count, total = sum(g.count for g in group), sum(g.total_ns for g in group)
        apis.append(ApiStat(name=name, kind=group[0].kind, count=count, total_ns=total,
                            mean_ns=total // count if count else 0, max_ns=max(g.max_ns for g in group)))
    apis.sort(key=lambda a: (-a.total_ns, a.name))
    delays = [x for x in ls if x.delay_count]
    dcount = sum(x.delay_count for x in delays)

    def med(field: str) -> int | None:
        vals = [getattr(x, field) for x in delays if getattr(x, field) is not None]
        return median_int(vals) if vals else None

    per_step = [x.per_step_median for x in ls if x.per_step_median is not None]
    return LaunchesSection(
        launch_count=sum(x.launch_count for x in ls),
        api_ns=sum(x.api_ns for x in ls),
        sync_count=sum(x.sync_count for x in ls),
        sync_ns=sum(x.sync_ns for x in ls),
        per_step_median=sum(per_step) if per_step else None,  # all ranks' launches per step, together
        delay_count=dcount,
        delay_mean_ns=sum((x.delay_mean_ns or 0) * x.delay_count for x in delays) // dcount if dcount else None,
        delay_median_ns=med("delay_median_ns"),
        delay_p90_ns=med("delay_p90_ns"),
        delay_max_ns=max((x.delay_max_ns for x in delays if x.delay_max_ns is not None), default=None),
        launches_without_gpu_op=sum(x.launches_without_gpu_op for x in ls),
        gpu_ops_without_launch=sum(x.gpu_ops_without_launch for x in ls),
        apis=apis[: mctx.top],
    )


SECTION = Section("launches", tables, compute=compute, merge=merge)
