"""The categories section: GPU time by category (kernels by name, copies and sets by kind), with each
category's time per step."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import CATEGORIES
from gpuprobe.report._section import (
    Context,
    DiffRow,
    MergeContext,
    Section,
    diff_of_totals,
    group_by,
    share,
    step_spread,
)
from gpuprobe.report._tables import STEP_SPREAD_COLUMNS, Column, Table, Unit

__all__ = ["CategoryStat", "CategoriesSection", "SECTION"]


@dataclasses.dataclass
class CategoryStat:
    """GPU time of one category; the ``step_*`` figures are per step, across steps."""

    category: str
    count: int
    total_ns: int
    share: float
    step_median_ns: int | None
    step_p10_ns: int | None
    step_p90_ns: int | None


@dataclasses.dataclass
class CategoriesSection:
    """GPU time by category (kernels by name, copies and sets by kind)."""

    total_ns: int
    other_share: float
    rows: list[CategoryStat]


def compute(ctx: Context) -> CategoriesSection:
    steps = ctx.section("steps")
    counts, totals = ctx.cols.category_stats(len(CATEGORIES))
    whole = sum(totals)
    rows = []
    for i, cat in enumerate(CATEGORIES):
        if not counts[i]:
            continue
        spread = None
        if steps.rows and ctx.gpu_known:
            spread = step_spread([r.categories.get(cat, 0) for r in steps.rows])
        rows.append(
            CategoryStat(
                category=cat,
                count=counts[i],
                total_ns=totals[i],
                share=share(totals[i], whole),
                step_median_ns=spread.median if spread else None,
                step_p10_ns=spread.p10 if spread else None,
                step_p90_ns=spread.p90 if spread else None,
            )
        )
    rows.sort(key=lambda r: (-r.total_ns, r.category))
    other = next((r.total_ns for r in rows if r.category == "other"), 0)
    return CategoriesSection(total_ns=whole, other_share=share(other, whole), rows=rows)


def tables(c: CategoriesSection, markdown: bool) -> list[Table]:
    columns = [Column("category", "category"), Column("count", "count", Unit.INT), Column("total", "total_ns", Unit.NS),
               Column("share", "share", Unit.SHARE), *STEP_SPREAD_COLUMNS]
    return [Table("categories", "GPU time by category", columns, c.rows,
                  [f"'other' holds {c.other_share * 100:.1f} % of GPU time"])]


def merge(mctx: MergeContext) -> CategoriesSection | None:
    """Categories summed over ranks (no per-step figures: the ranks' steps are not one run's)."""
    if not mctx.any_has("categories"):
        return None
    cat_total = mctx.gpu_time
    rows = []
    cats = [c for part in mctx.parts("categories") for c in part.rows]
    for name, group in group_by(cats, lambda c: c.category).items():
        total = sum(g.total_ns for g in group)
        rows.append(CategoryStat(category=name, count=sum(g.count for g in group), total_ns=total,
                                 share=total / cat_total if cat_total else 0.0, step_median_ns=None,
                                 step_p10_ns=None, step_p90_ns=None))
    rows.sort(key=lambda r: (-r.total_ns, r.category))
    other = next((r.total_ns for r in rows if r.category == "other"), 0)
    return CategoriesSection(total_ns=cat_total, other_share=other / cat_total if cat_total else 0.0, rows=rows)


def diff(a: CategoriesSection | None, b: CategoriesSection | None, ua: float, ub: float) -> list[DiffRow]:
    """Each category's time in A and B, the largest first."""
    ca = {r.category: r for r in (a.rows if a else [])}
    cb = {r.category: r for r in (b.rows if b else [])}
    order = sorted(set(ca) | set(cb), key=lambda c: -max(_total(ca.get(c)), _total(cb.get(c))))
    return [diff_of_totals(cat, ca.get(cat), cb.get(cat), ua, ub) for cat in order]


def _total(stat: CategoryStat | None) -> int:
    return stat.total_ns if stat is not None else 0


SECTION = Section("categories", tables, compute=compute, merge=merge, diff=diff, diff_title="GPU time by category")
