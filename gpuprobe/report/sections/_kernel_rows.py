"""Rows of kernels by name, shared by the kernels, non_gemm, attention and small_ops sections: the
row type, its columns, and how rows are computed and merged across ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpuprobe._kernel_names import CATEGORIES, categorize_kernel, short_kernel_name
from gpuprobe.report._section import Context, KernelGroup, MergeContext, Section, group_by, median_int, share
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["KernelStat", "KernelsSection", "KERNEL_COLUMNS", "kernel_stat", "kernels_of", "kernel_section",
           "merge_rows", "merge_kernels"]


@dataclasses.dataclass
class KernelStat:
    """Aggregate of the kernels of one name.

    ``median_ns`` is exact: every duration is kept (8 bytes each) for the correlation join anyway,
    so the median is the mean of the two middle durations, rounded down, not an estimate.
    """

    name: str
    short_name: str
    category: str
    count: int
    total_ns: int
    mean_ns: int
    median_ns: int
    min_ns: int
    max_ns: int
    share: float


@dataclasses.dataclass
class KernelsSection:
    """Top kernels by total time; ``share`` is of all kernel time."""

    total_ns: int
    count: int
    distinct: int
    rows: list[KernelStat]


_NS = Unit.NS
KERNEL_COLUMNS = [
    Column("kernel", "short_name", Unit.NAME), Column("category", "category"), Column("count", "count", Unit.INT),
    Column("total", "total_ns", _NS), Column("mean", "mean_ns", _NS), Column("median", "median_ns", _NS),
    Column("min", "min_ns", _NS), Column("max", "max_ns", _NS), Column("share", "share", Unit.SHARE),
    Column("name", "name", Unit.NAME, csv_only=True),
]


def kernel_stat(ctx: Context, g: KernelGroup, whole: int) -> KernelStat:
    """The row of one group of kernels; ``share`` of ``whole``."""
    name = ctx.gpu_names[g.name_id]
    return KernelStat(
        name=name,
        short_name=short_kernel_name(name),
        category=categorize_kernel(name),
        count=g.count,
        total_ns=g.total_ns,
        mean_ns=g.total_ns // g.count,
        median_ns=g.median_ns,
        min_ns=g.min_ns,
        max_ns=g.max_ns,
        share=share(g.total_ns, whole),
    )


def kernels_of(ctx: Context, keep: Callable[[str], bool]) -> KernelsSection:
    """The kernels whose category ``keep`` accepts, by total time (``top`` rows)."""
    groups = ctx.kernel_groups
    whole = sum(g.total_ns for g in groups)
    chosen = [g for g in groups if keep(CATEGORIES[ctx.cat_of_name[g.name_id]])]
    chosen.sort(key=lambda g: (-g.total_ns, ctx.gpu_names[g.name_id]))
    return KernelsSection(
        total_ns=sum(g.total_ns for g in chosen),
        count=sum(g.count for g in chosen),
        distinct=len(chosen),
        rows=[kernel_stat(ctx, g, whole) for g in chosen[: ctx.options.top]],
    )


def merge_rows(parts: list[KernelsSection], top: int, whole: int) -> tuple[list[KernelStat], int, int, int]:
    """Rows of several ranks by kernel name: the ``top`` rows, and the count, time and names of all."""
    merged = []
    for name, group in group_by((r for part in parts for r in part.rows), lambda r: r.name).items():
        count = sum(g.count for g in group)
        total = sum(g.total_ns for g in group)
        merged.append(
            KernelStat(
                name=name,
                short_name=group[0].short_name,
                category=group[0].category,
                count=count,
                total_ns=total,
                mean_ns=total // count if count else 0,
                median_ns=median_int([g.median_ns for g in group]),  # the median of the ranks' medians
                min_ns=min(g.min_ns for g in group),
                max_ns=max(g.max_ns for g in group),
                share=total / whole if whole else 0.0,
            )
        )
    merged.sort(key=lambda r: (-r.total_ns, r.name))
    return merged[:top], sum(r.count for r in merged), sum(r.total_ns for r in merged), len(merged)


def merge_kernels(mctx: MergeContext, section: str) -> KernelsSection | None:
    """A kernels section across ranks (``share`` of every rank's GPU time)."""
    if not mctx.any_has(section):
        return None
    rows, count, total, distinct = merge_rows(mctx.parts(section), mctx.top, mctx.gpu_time)
    return KernelsSection(total_ns=total, count=count, distinct=distinct, rows=rows)




def kernel_section(
    name: str, title: str, keep: Callable[[str], bool], line: Callable[[KernelsSection], str]
) -> Section:
    """A section of the kernels whose category ``keep`` accepts, shown under ``title`` and ``line``."""

    def compute(ctx: Context) -> KernelsSection:
        return kernels_of(ctx, keep)

    def tables(data: KernelsSection, markdown: bool) -> list[Table]:
        return [Table(name, title, KERNEL_COLUMNS, data.rows, [line(data)])]

    def merge(mctx: MergeContext) -> KernelsSection | None:
        return merge_kernels(mctx, name)

    return Section(name, tables, compute=compute, merge=merge)
