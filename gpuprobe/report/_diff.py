"""Compare two traces section by section, per step, per token or in total."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gpuprobe.errors import ConfigError
from gpuprobe.report._analysis import analyze
from gpuprobe.report._columns import spread_of
from gpuprobe.report._findings import order, parse_thresholds
from gpuprobe.report._section import DiffRow, diff_row, known_sum, spread_width
from gpuprobe.report._tables import Column, Table, Unit, format_ns
from gpuprobe.report.schema import Finding, RangesSection, RangeStat, Report
from gpuprobe.report.sections import BY_NAME, GPU_ONLY, REGISTRY
from gpuprobe.report.sections.findings import findings_table

__all__ = ["DiffRow", "DiffReport", "VerdictRow", "diff", "NORMALIZE", "VERDICTS"]

#: Normalisations of :func:`diff`.
NORMALIZE: tuple[str, ...] = ("step", "token", "none")
#: What the values of a diff are, by normalization (and the words after each verdict figure's name).
_UNIT_WORDS = {"step": "per step", "token": "per token", "none": "in all"}
#: The verdicts of a diff (:attr:`DiffReport.verdict`).
VERDICTS: tuple[str, ...] = ("better", "worse", "mixed", "unchanged", "unknown")
_DIFF_SECTIONS = ("findings", "categories", "families", "ranges", "memory", "steps", "cpu_ops", "launches", "idle")
_ALL = 1_000_000  # rows kept per section while comparing; the diff itself shows ``top``


@dataclasses.dataclass
class DiffReport:
    """Two traces side by side.

    ``verdict`` (one of :data:`VERDICTS`) weighs the per-step figures of ``verdict_rows``; the
    findings open with it.
    """

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
    verdict: str = "unknown"
    verdict_rows: list[VerdictRow] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable values; ``findings`` first.

        Example:
            >>> import json
            >>> json.dumps(diff("a.json", "b.json").to_dict())  # doctest: +SKIP
        """
        body = dataclasses.asdict(self)
        del body["findings"]
        out: dict[str, Any] = {"schema": "gpuprobe.diff/1"}
        if self.findings is not None:
            out["findings"] = [f.to_dict() for f in self.findings]
        out.update(body)
        return out

    def tables(self, markdown: bool = False) -> list[Table]:
        """The verdict, the findings, what was compared, the overview and each compared section."""
        unit_word = _UNIT_WORDS[self.normalize]
        count = self.normalize if self.normalize != "none" else "trace"
        tables = [Table("verdict", f"Verdict: {self.verdict}", _VERDICT_COLUMNS, self.verdict_rows)]
        tables += [findings_table(self.findings, markdown)] if self.findings is not None else []
        lines = [f"warning: {w}" for w in self.warnings] + [
            f"A: {self.a_path} ({self.a_units:g} {count}s)",
            f"B: {self.b_path} ({self.b_units:g} {count}s)",
            f"values are {unit_word}; delta = B - A; ratio = B / A; median and p10-p90 are across steps "
            "(- where a section keeps no per-step values)",
        ]
        compared = [f.name for f in dataclasses.fields(self) if f.name in BY_NAME and BY_NAME[f.name].diff]
        if not _gpu_activity(self.overview):  # neither trace has any: their GPU sections would be "(none)" each
            compared = [name for name in compared if name not in GPU_ONLY]
            lines.append("no GPU activity in A or B: the GPU sections are left out")
        tables.append(Table("summary", "Diff", [], [], lines))
        for name, title in [("overview", "Overview")] + [(name, BY_NAME[name].diff_title) for name in compared]:
            tables.append(Table(name, title, _DIFF_COLUMNS, getattr(self, name)))
        return tables


_BY = Unit.BY_METRIC
#: The verdict first: per-step medians of A and B, their spreads, and the judgement of each.
_VERDICT_COLUMNS = [
    Column("figure", "figure", Unit.NAME), Column("metric", "metric"), Column("A median", "a", _BY),
    Column("B median", "b", _BY), Column("A p10-p90", "a_spread", _BY), Column("B p10-p90", "b_spread", _BY),
    Column("change", "change", Unit.SHARE), Column("judgement", "judgement"),
]
_DIFF_COLUMNS = [
    Column("name", "key", Unit.NAME), Column("metric", "metric"), Column("A", "a", _BY), Column("B", "b", _BY),
    Column("delta", "delta", _BY), Column("ratio", "ratio", Unit.RATIO), Column("A median", "a_median", _BY),
    Column("A p10-p90", "a_spread", _BY), Column("B median", "b_median", _BY), Column("B p10-p90", "b_spread", _BY),
]


def _gpu_activity(overview: list[DiffRow]) -> bool:
    """Whether A or B holds GPU activity: GPU operations (a known GPU busy time) or launches."""
    return any(
        (r.key == "GPU busy" and (r.a is not None or r.b is not None)) or (r.key == "launches" and (r.a or r.b))
        for r in overview
    )


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
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    jobs: int | None = None,
    executor: concurrent.futures.Executor | None = None,
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
        executor: For a directory of rank traces: run each rank as a task of this executor instead
            (see :func:`gpuprobe.report.analyze_ranks`).

    Returns:
        The :class:`DiffReport`; its ``findings`` open with the verdict (better, worse, mixed or
        unchanged per step), then a fusion (new kernel families that removed ones pay for), the
        like-for-like regressions beyond the spread of their own steps, new work no fusion explains,
        the findings of B that A does not have, and the ranges inside the steps that only A or only B
        runs (a logits processor removed or added), with their time per unit.

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
                [x], top=_ALL, step_pattern=step_pattern, engine=engine, jobs=jobs, thresholds=limits, executor=executor
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
    compared = {s.name: s.diff(getattr(ra, s.name), getattr(rb, s.name), ua, ub) for s in REGISTRY if s.diff}
    categories, families, ranges = compared["categories"], compared["families"], compared["ranges"]
    overview = _overview(ra, rb, ua, ub)
    kinds = {r.family: r.category for rep in (ra, rb) for r in (rep.families.rows if rep.families else [])}
    overall, verdict_rows = _verdict(ra, rb, limits, normalize, (ua, ub))
    # totals in a trace without steps: a warning says so
    unit = _UNIT_WORDS[normalize]
    fusion, explained = _fusion(families, ranges, kinds, unit, limits)
    findings = _regressions(overview, categories, families, ub, limits, explained) + _new_findings(ra, rb)
    findings += [f for f in (fusion, _new_work(families, explained, ub, limits)) if f is not None]
    findings += _range_changes(ra.ranges, rb.ranges, (ua, ub), overview, unit, limits)
    return DiffReport(
        a_path=ra.summary.path,
        b_path=rb.summary.path,
        normalize=normalize,
        a_units=ua,
        b_units=ub,
        warnings=warnings,
        overview=overview,
        findings=[_verdict_finding(overall, verdict_rows, limits, normalize, findings)] + order(findings),
        verdict=overall,
        verdict_rows=verdict_rows,
        # the largest changes first, where the section says so: after the findings read them all
        **{name: _by_delta(rows, top) if BY_NAME[name].diff_cut else rows for name, rows in compared.items()},
    )


_REGRESSION_KEYS = ("GPU busy", "kernel time", "launch API time", "CPU time in steps", "sync time")
#: Categories of kernels that a compiler fuses (into Triton kernels, or fused library kernels).
_FUSABLE = frozenset({"triton", "softmax", "norm", "copy", "reduction", "index", "elementwise", "other"})


@dataclasses.dataclass
class VerdictRow:
    """One figure of the verdict: its per-step median in A and B and the spread across steps.

    ``change`` is ``(b - a) / a``; ``judgement`` is ``better``, ``worse`` or ``same`` (a change
    within the larger p10-p90 spread of the two, or below ``verdict.min_change``).
    """

    figure: str
    metric: str
    a: float | None
    b: float | None
    a_spread: float | None
    b_spread: float | None
    change: float | None
    judgement: str


def _spread_of(values: list[float]) -> tuple[float | None, float | None]:
    """Median and p90 - p10 of some values (``None``, ``None`` if there are none)."""
    if not values:
        return None, None
    s = spread_of(sorted(values))
    return float(s.median), float(s.p90 - s.p10)


def _step_figures(r: Report, scale: float, normalize: str) -> dict[str, tuple[str, float | None, float | None]]:
    """Per-step figures a user cares about, per unit of ``normalize``: ``name -> (metric, median, p90 - p10)``.

    Each step's value is multiplied by ``scale`` (the trace's steps ÷ its units: 1 per step, steps ÷ tokens
    per token, the step count in all), so the verdict weighs what the diff's tables show.
    """
    rows = r.steps.rows if r.steps is not None else []
    out: dict[str, tuple[str, float | None, float | None]] = {}
    if not rows:
        return out
    unit = _UNIT_WORDS[normalize]

    def figure(values: list[float]) -> tuple[float | None, float | None]:
        return _spread_of([v * scale for v in values])

    busy = [row.gpu_busy_ns for row in rows if row.gpu_busy_ns is not None]
    if busy:
        out[f"GPU busy {unit}"] = ("ns", *figure([float(v) for v in busy]))
    out[f"CPU time {unit}"] = ("ns", *figure([float(row.cpu_ns) for row in rows]))
    out[f"launches {unit}"] = ("launches", *figure([float(row.launches) for row in rows]))
    if r.idle is not None and r.idle.scope == "steps" and r.idle.rows:
        name = "step wall time" if normalize == "step" else f"wall time {unit}"
        out[name] = ("ns", *figure([float(row.window_ns) for row in r.idle.rows]))
    return out


def _verdict(
    ra: Report, rb: Report, t: dict[str, float], normalize: str = "step", units: tuple[float, float] = (0.0, 0.0)
) -> tuple[str, list[VerdictRow]]:
    """Better, worse, mixed or unchanged, per unit of ``normalize``, on GPU busy, CPU time, launches and wall
    time; ``units`` are A's and B's (steps, tokens, or 1 in all: the diff's divisors)."""
    def scale(r: Report, units: float) -> float:
        steps = r.steps.count if r.steps is not None else 0
        return steps / units if normalize != "step" and steps and units else 1.0

    fa = _step_figures(ra, scale(ra, units[0]), normalize)
    fb = _step_figures(rb, scale(rb, units[1]), normalize)
    rows = []
    for figure in [f for f in fa if f in fb]:
        metric, a, a_spread = fa[figure]
        _, b, b_spread = fb[figure]
        if not a and not b:
            continue  # launches of two CPU traces: nothing to weigh
        change = (b - a) / a if a and b is not None else None
        noise = max(a_spread or 0.0, b_spread or 0.0)
        judgement = "same"
        big = change is None or abs(change) >= t["verdict.min_change"]
        if a is not None and b is not None and abs(b - a) > noise and big:
            judgement = "better" if b < a else "worse"
        rows.append(VerdictRow(figure, metric, a, b, a_spread, b_spread, change, judgement))
    seen = {r.judgement for r in rows}
    if not rows:
        overall = "unknown"
    elif seen <= {"same"}:
        overall = "unchanged"
    elif "better" in seen and "worse" in seen:
        overall = "mixed"
    else:
        overall = "better" if "better" in seen else "worse"
    return overall, rows


def _figure_text(r: VerdictRow, unit: str = "per step") -> str:
    def fmt(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:g}" if r.metric != "ns" else (f"{v / 1e6:.2f} ms" if v >= 1e6 else f"{v / 1e3:.0f} µs")

    pct = f" ({r.change * 100:+.0f} %)" if r.change is not None else ""
    return f"{r.figure.replace(' ' + unit, '')} {fmt(r.a)} → {fmt(r.b)}{pct}"


def _verdict_finding(
    overall: str, rows: list[VerdictRow], t: dict[str, float], normalize: str = "step", below: Sequence[Finding] = ()
) -> Finding:
    """The verdict as the diff's first finding; ``below``: the findings that follow it."""
    unit = _UNIT_WORDS[normalize]
    words = {
        "better": "B is better",
        "worse": "B is worse",
        "mixed": "mixed: B is better on some figures and worse on others",
        "unchanged": "no change beyond the run-to-run spread of the steps",
        "unknown": "no per-step figures to compare (no step ranges in A or B)",
    }
    changed = [r for r in rows if r.judgement != "same"]
    worse = [r for r in rows if r.judgement == "worse"]
    severity = "info"
    if overall == "mixed":
        severity = "warning"
    elif overall == "worse":
        big = any(r.change is not None and 1 + r.change >= t["regression.critical_ratio"] for r in worse)
        severity = "critical" if big else "warning"
    details = ", ".join(_figure_text(r, unit) for r in (changed or rows))
    return Finding(
        id="verdict",
        severity=severity,
        title=f"Verdict {unit}: {words[overall]}" + (f": {details}" if details else ""),
        evidence={
            "at_stake_ns": 0,
            "verdict": overall,
            "figures": [dataclasses.asdict(r) for r in rows],
        },
        remedy={
            "better": "Nothing to undo; the findings below say what remains."
            if any(not f.asks_nothing for f in below)
            else "Nothing to undo; the findings below say what changed."
            if below
            else "Nothing to undo.",
            "worse": "Read the regressions below and the kernel families and ranges that changed.",
            "mixed": "Weigh the figures: the step time (CPU time per step, step wall time) is what a user waits for.",
        }.get(overall, "Nothing to do."),
        asks_nothing=severity == "info",  # better, unchanged or unknown: nothing to undo
    )


def _fusion(
    families: list[DiffRow], ranges: list[DiffRow], kinds: dict[str, str], unit: str, t: dict[str, float]
) -> tuple[Finding | None, set[str]]:
    """New fused kernel families (Triton's, or named ``fused``) whose time removed or shrunk families of
    fusable categories cover: a fusion.

    Returns:
        The finding (or ``None``) and the family keys it explains.
    """
    # a compiler's kernels: Triton's, or named after a fusion (fused_add_rms_norm, ..._fused_...)
    new = [r for r in families if not r.a and r.b and (kinds.get(r.key) == "triton" or "fused" in r.key.lower())]
    if not new:
        return None, set()
    new_ns = sum(r.b or 0.0 for r in new)
    shrunk = [r for r in families if r.a and (r.b or 0.0) < r.a and kinds.get(r.key) in _FUSABLE]
    removed_ns = sum(r.a - (r.b or 0.0) for r in shrunk if r.a is not None)
    if removed_ns < t["fusion.cover"] * new_ns:
        return None, set()
    by_cat: dict[str, float] = {}
    for r in shrunk:
        cat = kinds[r.key]
        by_cat[cat] = by_cat.get(cat, 0.0) + (r.a or 0.0) - (r.b or 0.0)
    new_cats = sorted({kinds[r.key] for r in new})
    replaced = sorted(by_cat.items(), key=lambda kv: -kv[1])
    moved = sorted(
        (r for r in ranges if r.metric == "gpu_busy_ns" and r.delta is not None and r.a and r.b),
        key=lambda r: r.delta or 0.0,
    )[:3]
    cat_text = " + ".join(c for c, _ in replaced[:3])
    finding = Finding(
        id="fusion",
        severity="info",
        title=f"Fusion: {len(new)} new kernel famil{'y' if len(new) == 1 else 'ies'} ({', '.join(new_cats)}, "
        f"{new_ns / 1e3:.1f} µs {unit}) replace {removed_ns / 1e3:.1f} µs {unit} of {cat_text} kernels: "
        f"{(new_ns - removed_ns) / 1e3:+.1f} µs {unit}",
        evidence={
            "at_stake_ns": 0,
            "new_families": [{"family": r.key, "category": kinds[r.key], "b_ns": r.b} for r in new],
            "new_ns": new_ns,
            "removed_ns": removed_ns,
            "replaced_by_category": {c: v for c, v in replaced},
            "ranges_gpu_busy": [{"range": r.key, "a_ns": r.a, "b_ns": r.b, "delta_ns": r.delta} for r in moved],
        },
        remedy="Nothing to do: the compiler fused elementwise and copy work into fewer kernels; a new family that "
        "replaces removed ones is not a regression.",
        asks_nothing=True,
    )
    return finding, {r.key for r in new}


def _like_for_like_slower(r: DiffRow, t: dict[str, float]) -> float | None:
    """The ratio if ``r`` got slower like for like beyond thresholds and its steps' own spread; else ``None``."""
    if r.metric != "ns" or not r.a or r.b is None or r.delta is None:
        return None  # absent in A: new work, not a like-for-like regression
    ratio = r.ratio if r.ratio is not None else float("inf")
    if ratio < t["regression.ratio"] or r.delta < t["regression.min_ns"]:
        return None
    if r.a_median is not None and r.b_median is not None:
        noise = max(r.a_spread or 0.0, r.b_spread or 0.0)
        if r.b_median - r.a_median <= noise:
            return None  # within the run-to-run spread of its own steps
    return ratio


def _regressions(
    overview: list[DiffRow],
    categories: list[DiffRow],
    families: list[DiffRow],
    ub: float,
    t: dict[str, float],
    explained: Collection[str] = (),
) -> list[Finding]:
    """One finding per overview time, category or family present in A and B that got slower beyond
    the thresholds and beyond the spread of its own steps (entries a fusion explains left out)."""
    out: list[Finding] = []
    candidates = [("overview", r) for r in overview if r.key in _REGRESSION_KEYS]
    candidates += [("categories", r) for r in categories if r.key not in explained]
    candidates += [
        ("families", r) for r in sorted(families, key=lambda r: -(r.delta or 0.0))[:5] if r.key not in explained
    ]
    for section, r in candidates:
        ratio = _like_for_like_slower(r, t)
        if ratio is None or r.a is None or r.b is None or r.delta is None:
            continue
        out.append(
            Finding(
                id="regression",
                severity="critical" if ratio >= t["regression.critical_ratio"] else "warning",
                title=f"{r.key} ({section}) got slower: {r.a / 1e3:.1f} → {r.b / 1e3:.1f} µs per unit "
                f"({ratio:.2f}x)",
                evidence={
                    "at_stake_ns": int(r.delta * ub),
                    "section": section,
                    "key": r.key,
                    "a_ns": r.a,
                    "b_ns": r.b,
                    "delta_ns": r.delta,
                    "ratio": r.ratio,
                    "a_median_ns": r.a_median,
                    "b_median_ns": r.b_median,
                    "spread_ns": max(r.a_spread or 0.0, r.b_spread or 0.0)
                    if r.a_spread is not None or r.b_spread is not None
                    else None,
                },
                remedy="Compare the two traces' kernels and ranges for this entry (the sections below); "
                "a new kernel family or more launches per step usually explains it.",
            )
        )
    return out


def _new_work(families: list[DiffRow], explained: set[str], ub: float, t: dict[str, float]) -> Finding | None:
    """Kernel families only B has, that no fusion explains."""
    new = [r for r in families if not r.a and r.b and r.key not in explained and r.b >= t["regression.min_ns"]]
    if not new:
        return None
    new.sort(key=lambda r: -(r.b or 0.0))
    total = sum(r.b or 0.0 for r in new)
    names = ", ".join(f"{r.key} {(r.b or 0.0) / 1e3:.1f} µs" for r in new[:3])
    return Finding(
        id="new_work",
        severity="warning",
        title=f"{len(new)} kernel famil{'y' if len(new) == 1 else 'ies'} only in B, not offset by removed work: "
        f"{names} per unit",
        evidence={"at_stake_ns": int(total * ub), "families": [{"family": r.key, "b_ns": r.b} for r in new[:10]]},
        remedy="Find what launches them (the ranges section of B's report): a new code path, a changed "
        "library choice, or work moved from the host.",
    )


_RANGE_CHANGES_SHOWN = 5  # removed (and added) ranges made findings, the largest first; the Ranges table lists all


def _range_changes(
    a: RangesSection | None,
    b: RangesSection | None,
    units: tuple[float, float],
    overview: list[DiffRow],
    unit: str,
    t: dict[str, float],
) -> list[Finding]:
    """A range one trace runs and the other does not, inside a range both run (a logits processor removed
    from the steps, or added): one finding each, with its CPU time (and GPU busy time) per unit.

    Ranges of ``regression.min_ns`` or more per unit, at most :data:`_RANGE_CHANGES_SHOWN` each way. A range
    nested in one that changed too is its part, not a finding of its own; a range absent from a trace whose
    ranges table was cut counts as absent only when it is longer than every range that table kept.
    """
    steps = next((r for r in overview if r.key == "CPU time in steps"), None)
    found: list[Finding] = []
    for change, here, there, per in (("removed", a, b, units[0]), ("added", b, a, units[1])):
        if here is None or there is None:
            continue
        mine = {r.path: r for r in here.rows}
        theirs = {r.path: r for r in there.rows}
        cut = there.distinct > len(there.rows)
        floor = min((r.cpu_ns for r in there.rows), default=0) / (units[1] if change == "removed" else units[0])
        changed = []
        for path, row in mine.items():
            parent = path.rpartition("/")[0]
            if path in theirs or not parent or parent not in theirs:
                continue
            ns = row.cpu_ns / per
            if ns < t["regression.min_ns"] or (cut and ns <= floor):
                continue
            changed.append((ns, row))
        changed.sort(key=lambda item: (-item[0], item[1].path))
        for ns, row in changed[:_RANGE_CHANGES_SHOWN]:
            found.append(_range_change(change, row, ns, per, units, steps, unit))
    return found


def _range_change(
    change: str, row: RangeStat, ns: float, per: float, units: tuple[float, float], steps: DiffRow | None, unit: str
) -> Finding:
    """The finding of one range that only A (``removed``) or only B (``added``) runs."""
    sign = "-" if change == "removed" else "+"
    gpu = row.gpu_busy_ns / per if row.gpu_busy_ns is not None else None
    gpu_text = f" and {sign}{format_ns(gpu)} of GPU busy time" if gpu else ""
    steps_text = (
        f"; the steps' CPU time went {format_ns(steps.a)} → {format_ns(steps.b)} {unit}"
        if steps is not None and steps.a is not None and steps.b is not None
        else ""
    )
    removed = change == "removed"
    return Finding(
        id=f"{change}_range",
        severity="info" if removed else "warning",
        title=f"{row.name} {change} (in {'A' if removed else 'B'} only): {sign}{format_ns(ns)} of CPU time {unit}"
        f"{gpu_text}{steps_text}",
        evidence={
            "at_stake_ns": 0 if removed else int(ns * units[1]),
            "path": row.path,
            "cpu_ns": ns,
            "gpu_busy_ns": gpu,
            "calls": row.count,
            "steps_cpu_a_ns": steps.a if steps is not None else None,
            "steps_cpu_b_ns": steps.b if steps is not None else None,
        },
        remedy="Nothing to undo: B runs without it (the verdict says whether the steps got faster beyond their "
        "spread)."
        if removed
        else "B runs it and A does not: keep it if B needs it; gpuprobe report B lists its operators and syncs, "
        "the Ranges table below shows its time.",
        asks_nothing=removed,
    )


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
            rows.append(diff_row(key, metric, va, vb, 1.0, 1.0))
        else:
            rows.append(diff_row(key, metric, va, vb, ua, ub))
    pa, pb = ra.steps, rb.steps
    if pa is not None and pb is not None and (pa.rows or pb.rows):
        rows.append(
            diff_row(
                "CPU time in steps",
                "ns",
                sum(r.cpu_ns for r in pa.rows),
                sum(r.cpu_ns for r in pb.rows),
                ua,
                ub,
                a_median=pa.cpu_median_ns,
                a_spread=spread_width(pa.cpu_p10_ns, pa.cpu_p90_ns),
                b_median=pb.cpu_median_ns,
                b_spread=spread_width(pb.cpu_p10_ns, pb.cpu_p90_ns),
            )
        )
        if sa.gpu_busy_ns is not None or sb.gpu_busy_ns is not None:
            rows.append(
                diff_row(
                    "GPU busy in steps",
                    "ns",
                    known_sum(r.gpu_busy_ns for r in pa.rows),
                    known_sum(r.gpu_busy_ns for r in pb.rows),
                    ua,
                    ub,
                    a_median=pa.gpu_busy_median_ns,
                    a_spread=spread_width(pa.gpu_busy_p10_ns, pa.gpu_busy_p90_ns),
                    b_median=pb.gpu_busy_median_ns,
                    b_spread=spread_width(pb.gpu_busy_p10_ns, pb.gpu_busy_p90_ns),
                )
            )
    if ra.launches is not None and rb.launches is not None:
        rows.append(diff_row("sync time", "ns", ra.launches.sync_ns, rb.launches.sync_ns, ua, ub))
    return rows
