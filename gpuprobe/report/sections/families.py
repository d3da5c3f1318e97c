"""The families section: the top kernel families by total time (tile-shape variants of a kernel
together), with each family's time per step."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import categorize_kernel
from gpuprobe.report._section import Context, DiffRow, MergeContext, Section, Spread, diff_of_totals, group_by, share
from gpuprobe.report._tables import STEP_SPREAD_COLUMNS, Column, Table, Unit

__all__ = ["FamilyStat", "FamiliesSection", "SECTION"]


@dataclasses.dataclass
class FamilyStat:
    """Kernels of one family (tile-shape variants together)."""

    family: str
    category: str
    variants: int
    count: int
    total_ns: int
    share: float
    step_median_ns: int | None
    step_p10_ns: int | None
    step_p90_ns: int | None


@dataclasses.dataclass
class FamiliesSection:
    """Top kernel families by total time."""

    total_ns: int
    rows: list[FamilyStat]


class _FamilyTotals:
    """Totals of the kernel names of one family."""

    __slots__ = ("variants", "count", "total_ns")

    def __init__(self) -> None:
        self.variants = 0
        self.count = 0
        self.total_ns = 0


def _spreads(ctx: Context) -> dict[int, Spread]:
    if not ctx.steps or not ctx.gpu_known:
        return {}
    return ctx.cols.family_spreads([s.op_windows for s in ctx.steps], ctx.fam_of_name, len(ctx.fam_names))


def compute(ctx: Context) -> FamiliesSection:
    groups = ctx.kernel_groups
    spreads = _spreads(ctx)
    whole = sum(g.total_ns for g in groups)
    totals: dict[int, _FamilyTotals] = {}
    for g in groups:
        fam = ctx.fam_of_name[g.name_id]
        t = totals.get(fam)
        if t is None:
            t = totals[fam] = _FamilyTotals()
        t.variants += 1
        t.count += g.count
        t.total_ns += g.total_ns
    order = sorted(totals, key=lambda f: (-totals[f].total_ns, ctx.fam_names[f]))[: ctx.options.top]
    rows = []
    for f in order:
        t = totals[f]
        spread = spreads.get(f)
        name = ctx.fam_names[f]
        rows.append(
            FamilyStat(
                family=name,
                category=categorize_kernel(name),
                variants=t.variants,
                count=t.count,
                total_ns=t.total_ns,
                share=share(t.total_ns, whole),
                step_median_ns=spread.median if spread else None,
                step_p10_ns=spread.p10 if spread else None,
                step_p90_ns=spread.p90 if spread else None,
            )
        )
    return FamiliesSection(total_ns=whole, rows=rows)


def tables(f: FamiliesSection, markdown: bool) -> list[Table]:
    columns = [Column("family", "family", Unit.NAME), Column("category", "category"),
               Column("variants", "variants", Unit.INT), Column("count", "count", Unit.INT),
               Column("total", "total_ns", Unit.NS), Column("share", "share", Unit.SHARE), *STEP_SPREAD_COLUMNS]
    return [Table("families", "Kernel families (tile-shape variants together)", columns, f.rows)]


def merge(mctx: MergeContext) -> FamiliesSection | None:
    """Families summed over ranks (variants: the most any rank has)."""
    fams = [f for part in mctx.parts("families") for f in part.rows]
    if not fams:
        return None
    cat_total = mctx.gpu_time
    rows = []
    for name, group in group_by(fams, lambda f: f.family).items():
        total = sum(g.total_ns for g in group)
        rows.append(FamilyStat(family=name, category=group[0].category, variants=max(g.variants for g in group),
                               count=sum(g.count for g in group), total_ns=total,
                               share=total / cat_total if cat_total else 0.0, step_median_ns=None,
                               step_p10_ns=None, step_p90_ns=None))
    rows.sort(key=lambda r: (-r.total_ns, r.family))
    return FamiliesSection(total_ns=cat_total, rows=rows[: mctx.top])


def diff(a: FamiliesSection | None, b: FamiliesSection | None, ua: float, ub: float) -> list[DiffRow]:
    """Each family's time in A and B."""
    fa = {r.family: r for r in (a.rows if a else [])}
    fb = {r.family: r for r in (b.rows if b else [])}
    return [diff_of_totals(fam, fa.get(fam), fb.get(fam), ua, ub) for fam in set(fa) | set(fb)]


SECTION = Section("families", tables, compute=compute, merge=merge, diff=diff, diff_title="Kernel families",
                  diff_cut=True)
