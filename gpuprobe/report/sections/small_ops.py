"""The small_ops section: kernels shorter on average than a threshold; frequent ones leave the GPU
waiting on launches."""

from __future__ import annotations

import dataclasses

from gpuprobe.report._section import Context, MergeContext, Section, share
from gpuprobe.report._tables import Table, format_ns
from gpuprobe.report.sections._kernel_rows import KERNEL_COLUMNS, KernelStat, kernel_stat, merge_rows

__all__ = ["SmallOpsSection", "SECTION"]


@dataclasses.dataclass
class SmallOpsSection:
    """Kernels shorter on average than ``threshold_ns``: frequent ones leave the GPU waiting on launches."""

    threshold_ns: int
    count: int
    count_share: float
    total_ns: int
    time_share: float
    rows: list[KernelStat]


def compute(ctx: Context) -> SmallOpsSection:
    groups = ctx.kernel_groups
    threshold = ctx.options.small_ns
    whole_ns = sum(g.total_ns for g in groups)
    whole_n = sum(g.count for g in groups)
    small = [g for g in groups if g.total_ns < g.count * threshold]
    small.sort(key=lambda g: (-g.count, -g.total_ns, ctx.gpu_names[g.name_id]))
    n = sum(g.count for g in small)
    t = sum(g.total_ns for g in small)
    return SmallOpsSection(
        threshold_ns=threshold,
        count=n,
        count_share=share(n, whole_n),
        total_ns=t,
        time_share=share(t, whole_ns),
        rows=[kernel_stat(ctx, g, whole_ns) for g in small[: ctx.options.top]],
    )


def tables(so: SmallOpsSection, markdown: bool) -> list[Table]:
    line = (f"{so.count:,} small kernels: {so.count_share * 100:.1f} % of kernels, {format_ns(so.total_ns)} "
            f"= {so.time_share * 100:.1f} % of kernel time")
    return [Table("small_ops", f"Small frequent kernels (mean < {format_ns(so.threshold_ns)})", KERNEL_COLUMNS,
                  so.rows, [line])]


def merge(mctx: MergeContext) -> SmallOpsSection | None:
    smalls = mctx.parts("small_ops")
    if not smalls:
        return None
    whole = mctx.gpu_time
    rows, count, total, _ = merge_rows(smalls, mctx.top, whole)
    all_kernels = sum(rep.summary.kernel_count for rep in mctx.reports)
    return SmallOpsSection(threshold_ns=smalls[0].threshold_ns, count=count,
                           count_share=count / all_kernels if all_kernels else 0.0, total_ns=total,
                           time_share=total / whole if whole else 0.0, rows=rows)


SECTION = Section("small_ops", tables, compute=compute, merge=merge)
