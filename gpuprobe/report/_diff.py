"""Compare two traces section by section, per step, per token or in total."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpuprobe.errors import ConfigError
from gpuprobe.report._analysis import analyze
from gpuprobe.report._findings import order, parse_thresholds
from gpuprobe.report.model import Finding, Report

__all__ = ["DiffRow", "DiffReport", "diff", "NORMALIZE"]

#: Normalisations of :func:`diff`.
NORMALIZE: tuple[str, ...] = ("step", "token", "none")
_DIFF_SECTIONS = ("findings", "categories", "families", "ranges", "memory", "steps", "cpu_ops", "launches")
_ALL = 1_000_000  # rows kept per section while comparing; the diff itself shows ``top``


@dataclasses.dataclass
class DiffRow:
    """One compared value.

    ``a`` and ``b`` are normalised (per step, per token, or totals); ``delta = b - a`` and
    ``ratio = b / a``. ``*_median`` and ``*_spread`` (p90 - p10) are across steps, where the
    section has per-step values.
    """

    key: str
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    ratio: float | None
    a_median: float | None = None
    a_spread: float | None = None
    b_median: float | None = None
    b_spread: float | None = None


@dataclasses.dataclass
class DiffReport:
    """Two traces side by side."""

    a_path: str
    b_path: str
    normalize: str
    a_units: float
    b_units: float
    warnings: list[str]
    overview: list[DiffRow]
    categories: list[DiffRow]
    families: list[DiffRow]
    ranges: list[DiffRow]
    memory: list[DiffRow]
    cpu_ops: list[DiffRow]
    findings: list[Finding] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable values; ``findings`` first.

        Example:
            >>> import json
            >>> json.dumps(diff("a.json", "b.json").to_dict())  # doctest: +SKIP
        """
        body = dataclasses.asdict(self)
        findings = body.pop("findings")
        out: dict[str, Any] = {"schema": "gpuprobe.diff/1"}
        if findings is not None:
            out["findings"] = findings
        out.update(body)
        return out


def _row(key: str, metric: str, a: float | None, b: float | None, ua: float, ub: float, **extra: Any) -> DiffRow:
    na = a / ua if a is not None else None
    nb = b / ub if b is not None else None
    delta = nb - na if na is not None and nb is not None else None
    ratio = nb / na if na and nb is not None else None
    return DiffRow(key=key, metric=metric, a=na, b=nb, delta=delta, ratio=ratio, **extra)


def _spread(p10: int | None, p90: int | None) -> float | None:
    return float(p90 - p10) if p10 is not None and p90 is not None else None


def _by_delta(rows: list[DiffRow], top: int) -> list[DiffRow]:
    rows.sort(key=lambda r: (-abs(r.delta) if r.delta is not None else 0.0, r.key, r.metric))
    return rows[:top]


def _units(report: Report, normalize: str, tokens: int | None, label: str, warnings: list[str]) -> float:
    if normalize == "none":
        return 1.0
    if normalize == "token" and tokens is not None:
        if tokens <= 0:
            raise ConfigError(f"tokens for {label} must be positive, not {tokens}")
        return float(tokens)
    steps = report.steps.count if report.steps is not None else 0
    if not steps:
        warnings.append(f"{label} has no step ranges: its values are totals, not per {normalize}")
        return 1.0
    if normalize == "token":
        warnings.append(f"{label}: tokens not given, counted as one per step")
    return float(steps)


def diff(
    a: str | os.PathLike[str] | Report,
    b: str | os.PathLike[str] | Report,
    *,
    normalize: str = "step",
    tokens_a: int | None = None,
    tokens_b: int | None = None,
    top: int = 20,
    step_pattern: str | None = None,
    engine: str = "stdlib",
    progress: Callable[[int, int], None] | None = None,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    jobs: int | None = None,
) -> DiffReport:
    """Compare two traces: overview, categories, kernel families, ranges, memory, CPU operators.

    Kernel families merge tile-shape variants (``nvjet_tst_64x8_...`` and ``nvjet_tst_128x16_...``),
    so a library choosing another tile for the same GEMM does not read as two changes.

    Args:
        a: The baseline trace (or a report made with enough rows).
        b: The trace to compare with it.
        normalize: ``step`` (divide by each trace's step count), ``token`` (by ``tokens_a`` and
            ``tokens_b``, one token per step if not given) or ``none`` (totals).
        tokens_a: Tokens generated in trace A.
        tokens_b: Tokens generated in trace B.
        top: Rows per section, largest absolute change first.
        step_pattern: As in :func:`gpuprobe.report.analyze`.
        engine: As in :func:`gpuprobe.report.analyze`.
        progress: As in :func:`gpuprobe.report.analyze`.
        thresholds: As in :func:`gpuprobe.report.analyze`; the ``regression.*`` ones decide which
            categories and families have regressed.
        jobs: For a directory of rank traces (``a`` or ``b``): worker processes at most.

    Returns:
        The :class:`DiffReport`; its ``findings`` are the regressions and the findings of B that A
        does not have.

    Raises:
        ReportInputError: A trace cannot be read.
        ConfigError: An unknown normalisation, tokens that are not positive, or a bad step pattern or
            engine (a ``ValueError``).

    Example:
        >>> d = diff("base.json.gz", "new.json.gz", normalize="token", tokens_a=64, tokens_b=64)  # doctest: +SKIP
        >>> [r.key for r in d.categories][:2]  # doctest: +SKIP
        ['gemm', 'attention']
    """
    if normalize not in NORMALIZE:
        raise ConfigError(f"normalize must be one of {', '.join(NORMALIZE)}, not {normalize!r}")
    limits = parse_thresholds(thresholds if not isinstance(thresholds, str) else [thresholds])

    def get(x: str | os.PathLike[str] | Report) -> Report:
        if isinstance(x, Report):
            return x
        from gpuprobe.report._ranks import analyze_ranks, several_ranks

        if several_ranks(x):  # the ranks of one run (a directory, an nsys export of several processes): merged
            return analyze_ranks(
                [x], top=_ALL, step_pattern=step_pattern, engine=engine, jobs=jobs, thresholds=limits
            )[0]
        return analyze(
            x,
            top=_ALL,
            sections=_DIFF_SECTIONS,
            step_pattern=step_pattern,
            engine=engine,
            progress=progress,
            thresholds=limits,
        )

    ra, rb = get(a), get(b)
    warnings = [f"A: {w}" for w in ra.summary.warnings] + [f"B: {w}" for w in rb.summary.warnings]
    ua = _units(ra, normalize, tokens_a, "A", warnings)
    ub = _units(rb, normalize, tokens_b, "B", warnings)
    categories = _categories(ra, rb, ua, ub)
    families = _families(ra, rb, ua, ub)
    overview = _overview(ra, rb, ua, ub)
    findings = _regressions(overview, categories, families, ub, limits) + _new_findings(ra, rb)
    return DiffReport(
        a_path=ra.summary.path,
        b_path=rb.summary.path,
        normalize=normalize,
        a_units=ua,
        b_units=ub,
        warnings=warnings,
        overview=overview,
        categories=categories,
        families=_by_delta(families, top),
        ranges=_by_delta(_ranges(ra, rb, ua, ub), top),
        memory=_memory(ra, rb, ua, ub),
        cpu_ops=_by_delta(_cpu_ops(ra, rb, ua, ub), top),
        findings=order(findings),
    )


_REGRESSION_KEYS = ("GPU busy", "kernel time", "launch API time", "CPU time in steps", "sync time")


def _regressions(
    overview: list[DiffRow], categories: list[DiffRow], families: list[DiffRow], ub: float, t: dict[str, float]
) -> list[Finding]:
    """One finding per overview time, category or family that got slower beyond the thresholds."""
    out: list[Finding] = []
    candidates = [("overview", r) for r in overview if r.key in _REGRESSION_KEYS]
    candidates += [("categories", r) for r in categories]
    candidates += [("families", r) for r in sorted(families, key=lambda r: -(r.delta or 0.0))[:5]]
    for section, r in candidates:
        if r.metric != "ns" or r.a is None or r.b is None or r.delta is None:
            continue
        ratio = r.ratio if r.ratio is not None else float("inf")
        if ratio < t["regression.ratio"] or r.delta < t["regression.min_ns"]:
            continue
        ratio_text = f"{ratio:.2f}x" if r.ratio is not None else "new"
        out.append(
            Finding(
                id="regression",
                severity="critical" if ratio >= t["regression.critical_ratio"] else "warning",
                title=f"{r.key} ({section}) got slower: {r.a / 1e3:.1f} → {r.b / 1e3:.1f} µs per unit ({ratio_text})",
                evidence={
                    "at_stake_ns": int(r.delta * ub),
                    "section": section,
                    "key": r.key,
                    "a_ns": r.a,
                    "b_ns": r.b,
                    "delta_ns": r.delta,
                    "ratio": r.ratio,
                },
                remedy="Compare the two traces' kernels and ranges for this entry (the sections below); "
                "a new kernel family or more launches per step usually explains it.",
            )
        )
    return out


def _new_findings(ra: Report, rb: Report) -> list[Finding]:
    """B's findings whose rule found nothing in A."""
    seen = {f.id for f in ra.findings or []}
    return [
        dataclasses.replace(f, title=f"New in B: {f.title}", evidence={**f.evidence, "new_in": "B"})
        for f in rb.findings or []
        if f.id not in seen
    ]


def _overview(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    sa, sb = ra.summary, rb.summary
    rows = []
    for key, metric, va, vb in (
        ("steps", "count", sa.step_count, sb.step_count),
        ("GPU busy", "ns", sa.gpu_busy_ns, sb.gpu_busy_ns),
        ("kernel time", "ns", sa.kernel_ns, sb.kernel_ns),
        ("kernels", "kernels", sa.kernel_count, sb.kernel_count),
        ("launches", "launches", sa.launch_count, sb.launch_count),
        ("launch API time", "ns", sa.launch_api_ns, sb.launch_api_ns),
    ):
        if key == "steps":
            rows.append(_row(key, metric, va, vb, 1.0, 1.0))
        else:
            rows.append(_row(key, metric, va, vb, ua, ub))
    pa, pb = ra.steps, rb.steps
    if pa is not None and pb is not None and (pa.rows or pb.rows):
        rows.append(
            _row(
                "CPU time in steps",
                "ns",
                sum(r.cpu_ns for r in pa.rows),
                sum(r.cpu_ns for r in pb.rows),
                ua,
                ub,
                a_median=pa.cpu_median_ns,
                a_spread=_spread(pa.cpu_p10_ns, pa.cpu_p90_ns),
                b_median=pb.cpu_median_ns,
                b_spread=_spread(pb.cpu_p10_ns, pb.cpu_p90_ns),
            )
        )
        if sa.gpu_busy_ns is not None or sb.gpu_busy_ns is not None:
            rows.append(
                _row(
                    "GPU busy in steps",
                    "ns",
                    _sum_or_none(r.gpu_busy_ns for r in pa.rows),
                    _sum_or_none(r.gpu_busy_ns for r in pb.rows),
                    ua,
                    ub,
                    a_median=pa.gpu_busy_median_ns,
                    a_spread=_spread(pa.gpu_busy_p10_ns, pa.gpu_busy_p90_ns),
                    b_median=pb.gpu_busy_median_ns,
                    b_spread=_spread(pb.gpu_busy_p10_ns, pb.gpu_busy_p90_ns),
                )
            )
    if ra.launches is not None and rb.launches is not None:
        rows.append(_row("sync time", "ns", ra.launches.sync_ns, rb.launches.sync_ns, ua, ub))
    return rows


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _categories(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    ca = {r.category: r for r in (ra.categories.rows if ra.categories else [])}
    cb = {r.category: r for r in (rb.categories.rows if rb.categories else [])}
    rows = []
    for cat in sorted(set(ca) | set(cb), key=lambda c: -max(_total(ca.get(c)), _total(cb.get(c)))):
        x, y = ca.get(cat), cb.get(cat)
        rows.append(
            _row(
                cat,
                "ns",
                _total(x),
                _total(y),
                ua,
                ub,
                a_median=_med(x),
                a_spread=_spr(x),
                b_median=_med(y),
                b_spread=_spr(y),
            )
        )
    return rows


def _total(stat: Any) -> int:
    return stat.total_ns if stat is not None else 0


def _med(stat: Any) -> float | None:
    return float(stat.step_median_ns) if stat is not None and stat.step_median_ns is not None else None


def _spr(stat: Any) -> float | None:
    return _spread(stat.step_p10_ns, stat.step_p90_ns) if stat is not None else None


def _families(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    fa = {r.family: r for r in (ra.families.rows if ra.families else [])}
    fb = {r.family: r for r in (rb.families.rows if rb.families else [])}
    return [
        _row(
            fam,
            "ns",
            _total(fa.get(fam)),
            _total(fb.get(fam)),
            ua,
            ub,
            a_median=_med(fa.get(fam)),
            a_spread=_spr(fa.get(fam)),
            b_median=_med(fb.get(fam)),
            b_spread=_spr(fb.get(fam)),
        )
        for fam in set(fa) | set(fb)
    ]


def _ranges(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    pa = {r.path: r for r in (ra.ranges.rows if ra.ranges else [])}
    pb = {r.path: r for r in (rb.ranges.rows if rb.ranges else [])}
    rows = []
    for path in set(pa) | set(pb):
        x, y = pa.get(path), pb.get(path)
        rows.append(_row(path, "cpu_ns", x.cpu_ns if x else 0, y.cpu_ns if y else 0, ua, ub))
        gx = x.gpu_busy_ns if x else 0
        gy = y.gpu_busy_ns if y else 0
        if gx is not None or gy is not None:
            rows.append(_row(path, "gpu_busy_ns", gx, gy, ua, ub))
    return rows


def _memory(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    ma = {(r.kind, r.direction): r for r in (ra.memory.rows if ra.memory else [])}
    mb = {(r.kind, r.direction): r for r in (rb.memory.rows if rb.memory else [])}
    rows = []
    for key in sorted(set(ma) | set(mb)):
        x, y = ma.get(key), mb.get(key)
        label = f"{key[0]} {key[1]}"
        rows.append(_row(label, "bytes", x.bytes if x else 0, y.bytes if y else 0, ua, ub))
        rows.append(_row(label, "ns", x.total_ns if x else 0, y.total_ns if y else 0, ua, ub))
    return rows


def _cpu_ops(ra: Report, rb: Report, ua: float, ub: float) -> list[DiffRow]:
    oa = {r.name: r for r in (ra.cpu_ops.rows if ra.cpu_ops else [])}
    ob = {r.name: r for r in (rb.cpu_ops.rows if rb.cpu_ops else [])}
    return [
        _row(name, "ns", oa[name].total_ns if name in oa else 0, ob[name].total_ns if name in ob else 0, ua, ub)
        for name in set(oa) | set(ob)
    ]
