"""Nsight Compute exports turned into a report: per kernel, per family, per gpuprobe range.

Every kernel (and family, and range) gets a classification with its evidence, from the speed of
light and occupancy figures ncu measured: ``memory-bound``, ``compute-bound``, ``latency-bound``,
``under-occupied``, ``tail-effect`` (thresholds: :data:`NCU_THRESHOLDS`, documented in
docs/report.md). ncu's own rule results become findings, ordered by the time they estimate saved.
The same names and categories as the timeline report (:mod:`gpuprobe._kernel_names`) let a report
of a kineto or nsys trace put each family's share of GPU time beside its efficiency from ncu.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gpuprobe._kernel_names import categorize_kernel, kernel_family, short_kernel_name
from gpuprobe._ncu_args import COMPONENT_RANGES, STEP_RANGES
from gpuprobe._nvtx import DOMAIN
from gpuprobe.errors import ConfigError
from gpuprobe.report._findings import threshold_number, threshold_pairs
from gpuprobe.report._ncu import METRICS, NcuExport, NcuKernel, NcuRule, read_ncu
from gpuprobe.report.schema import SEVERITIES, FamiliesSection, Finding

__all__ = [
    "NCU_THRESHOLDS",
    "NcuRow",
    "NcuJoinRow",
    "NcuReport",
    "NcuDiffRow",
    "NcuDiff",
    "analyze_ncu",
    "join_timeline",
    "diff_ncu",
    "parse_ncu_thresholds",
    "classify",
]



class NcuThreshold(NamedTuple):
    """A classification threshold: its default and what it means (docs/report.md lists them)."""

    default: float
    meaning: str


#: The classification thresholds; ``--threshold ncu.NAME=VALUE`` overrides one.
NCU_THRESHOLDS: dict[str, NcuThreshold] = {
    "ncu.sol_high_pct": NcuThreshold(
        60.0,
        "speed of light (SM or memory, % of peak) at or above which a unit counts as highly used; below it "
        "on both, the kernel is latency-bound (ncu's SOLBottleneck rule: 'below 60.0% of peak typically "
        "indicate latency issues')",
    ),
    "ncu.theoretical_occupancy_low_pct": NcuThreshold(
        50.0, "theoretical occupancy (%) below which a kernel is under-occupied; the limiter says what caps it"
    ),
    "ncu.achieved_occupancy_ratio": NcuThreshold(
        0.8, "achieved / theoretical occupancy below which a kernel is under-occupied (imbalance, short blocks)"
    ),
    "ncu.tail_idle_share": NcuThreshold(
        0.2,
        "share of the SMs' block slots left idle by the last, partial wave (waves >= 1) at or above which a "
        "kernel has a tail effect",
    ),
}

_PCT_KEYS = ("sm_sol_pct", "memory_sol_pct", "dram_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct",
             "tensor_pct")
_LAUNCH_KEYS = ("registers_per_thread", "block_size", "grid_size", "waves_per_sm")
_LIMITS = (
    ("registers", "block_limit_registers"),
    ("shared memory", "block_limit_shared_mem"),
    ("warps", "block_limit_warps"),
    ("blocks", "block_limit_blocks"),
)
_IDS_SHOWN = 20
_NUMBERS = re.compile(r"(?<![A-Za-z])\d[\d.,]*")  # figures, not the 1 of "L1 Slices"
_SEVERITY = {"ERR": "critical", "WRN": "warning", "OPT": "warning", "INF": "info"}


def parse_ncu_thresholds(items: Mapping[str, float] | Sequence[str] | None) -> dict[str, float]:
    """Validate ``ncu.*`` threshold overrides (``["ncu.sol_high_pct=70"]``); others are left alone.

    Raises:
        ConfigError: An unknown ``ncu.`` name or a value that is not a number.

    Example:
        >>> parse_ncu_thresholds(["ncu.sol_high_pct=70"])["ncu.sol_high_pct"]
        70.0
    """
    out = {name: t.default for name, t in NCU_THRESHOLDS.items()}
    for name, value in threshold_pairs(items):
        if not name.startswith("ncu."):
            continue
        if name not in NCU_THRESHOLDS:
            raise ConfigError(f"unknown threshold {name!r}; Nsight Compute thresholds: {', '.join(NCU_THRESHOLDS)}")
        out[name] = threshold_number(name, value)
    return out


@dataclasses.dataclass
class NcuRow:
    """Kernels of one name, one family or one gpuprobe range, as ncu measured them.

    Percent figures are duration-weighted means over the launches that have them (0-100); launch
    figures (registers, block and grid size, waves, the limiter) are those of the longest launch.
    ``None``: the export does not hold that figure.
    """

    name: str
    category: str
    launches: int
    duration_ns: int | None
    share: float | None
    sm_sol_pct: float | None
    memory_sol_pct: float | None
    dram_pct: float | None
    achieved_occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    limiter: str | None
    registers_per_thread: float | None
    block_size: float | None
    grid_size: float | None
    waves_per_sm: float | None
    tensor_pct: float | None
    classes: list[str]
    evidence: dict[str, str]
    family: str | None = None
    short_name: str | None = None


@dataclasses.dataclass
class NcuJoinRow:
    """One kernel family: its share of GPU time in a timeline beside its efficiency from ncu."""

    family: str
    category: str
    timeline_ns: int | None
    timeline_share: float | None
    timeline_count: int | None
    ncu_launches: int
    sm_sol_pct: float | None
    memory_sol_pct: float | None
    achieved_occupancy_pct: float | None
    classes: list[str]


@dataclasses.dataclass
class NcuReport:
    """What an Nsight Compute export says, per kernel, family and gpuprobe range.

    Example:
        >>> report = analyze_ncu("tests/data/ncu/esmm_sgemm_a10g_details.csv")  # doctest: +SKIP
        >>> report.families[0].family  # doctest: +SKIP
    """

    path: str
    page: str
    launches: int
    duration_ns: int | None
    has_nvtx: bool
    metrics_present: list[str]
    metrics_absent: list[str]
    warnings: list[str]
    thresholds: dict[str, float]
    findings: list[Finding]
    kernels: list[NcuRow]
    families: list[NcuRow]
    steps: list[NcuRow]
    components: list[NcuRow]
    processors: list[NcuRow]
    timeline: list[NcuJoinRow] | None = None
    timeline_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``findings`` first."""
        body = dataclasses.asdict(self)
        del body["findings"]
        out: dict[str, Any] = {"schema": "gpuprobe.ncu/1", "findings": [f.to_dict() for f in self.findings]}
        out.update(body)
        return out


@dataclasses.dataclass
class NcuDiffRow:
    """One kernel family in two ncu exports (A: baseline, B: the change); delta = B - A."""

    family: str
    category: str
    a_launches: int
    b_launches: int
    a_duration_ns: int | None
    b_duration_ns: int | None
    delta_ns: int | None
    ratio: float | None
    a_sm_sol_pct: float | None
    b_sm_sol_pct: float | None
    a_memory_sol_pct: float | None
    b_memory_sol_pct: float | None
    a_achieved_occupancy_pct: float | None
    b_achieved_occupancy_pct: float | None
    a_classes: list[str]
    b_classes: list[str]


@dataclasses.dataclass
class NcuDiff:
    """Two ncu exports compared per kernel family."""

    a_path: str
    b_path: str
    a_duration_ns: int | None
    b_duration_ns: int | None
    warnings: list[str]
    families: list[NcuDiffRow]
    findings: list[Finding] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        body = dataclasses.asdict(self)
        if self.findings is not None:
            body["findings"] = [f.to_dict() for f in self.findings]
        return {"schema": "gpuprobe.ncu-diff/1", **body}


# ---------------------------------------------------------------------------- classification


def _pct(value: float | None) -> str:
    return "absent" if value is None else f"{value:.1f} %"


def classify(figures: Mapping[str, float | None], thresholds: Mapping[str, float]) -> tuple[list[str], dict[str, str]]:
    """Classify one kernel (or a weighted group) from its ncu figures.

    Args:
        figures: ``sm_sol_pct``, ``memory_sol_pct``, ``achieved_occupancy_pct``,
            ``theoretical_occupancy_pct``, ``waves_per_sm``, ``limiter`` (missing or None: absent).
        thresholds: :data:`NCU_THRESHOLDS` values (see :func:`parse_ncu_thresholds`).

    Returns:
        The classes (``memory-bound``, ``compute-bound``, ``latency-bound``, ``under-occupied``,
        ``tail-effect``) and, for each, the evidence in words.

    Example:
        >>> classify({"sm_sol_pct": 20.0, "memory_sol_pct": 85.0}, parse_ncu_thresholds(None))[0]
        ['memory-bound']
    """
    high = thresholds["ncu.sol_high_pct"]
    classes: list[str] = []
    evidence: dict[str, str] = {}
    sm = figures.get("sm_sol_pct")
    mem = figures.get("memory_sol_pct")
    if sm is not None and mem is not None:
        if max(sm, mem) < high:
            classes.append("latency-bound")
            evidence["latency-bound"] = f"SM {_pct(sm)} and memory {_pct(mem)} of peak, both below {high:g} %"
        elif mem >= sm:
            classes.append("memory-bound")
            evidence["memory-bound"] = f"memory {_pct(mem)} of peak >= {high:g} %, above SM {_pct(sm)}"
        else:
            classes.append("compute-bound")
            evidence["compute-bound"] = f"SM {_pct(sm)} of peak >= {high:g} %, above memory {_pct(mem)}"
    elif sm is not None or mem is not None:
        known, value = ("SM", sm) if sm is not None else ("memory", mem)
        if value is not None and value >= high:
            label = "compute-bound" if known == "SM" else "memory-bound"
            classes.append(label)
            evidence[label] = f"{known} {_pct(value)} of peak >= {high:g} % (the other speed of light is absent)"
    theo = figures.get("theoretical_occupancy_pct")
    ach = figures.get("achieved_occupancy_pct")
    waves = figures.get("waves_per_sm")
    limiter = figures.get("limiter")
    reasons = []
    if theo is not None and theo < thresholds["ncu.theoretical_occupancy_low_pct"]:
        reasons.append(
            f"theoretical occupancy {_pct(theo)} < {thresholds['ncu.theoretical_occupancy_low_pct']:g} %"
            + (f", limited by {limiter}" if limiter else "")
        )
    ratio = thresholds["ncu.achieved_occupancy_ratio"]
    if theo and ach is not None and ach < ratio * theo:
        reasons.append(f"achieved occupancy {_pct(ach)} < {ratio:g} x theoretical {_pct(theo)}")
    if waves is not None and 0 < waves < 1:
        reasons.append(f"the grid fills {waves * 100:.0f} % of one wave across the SMs")
    if reasons:
        classes.append("under-occupied")
        evidence["under-occupied"] = "; ".join(reasons)
    if waves is not None and waves >= 1:
        full = math.ceil(waves - 1e-9)
        idle = (full - waves) / full
        if idle >= thresholds["ncu.tail_idle_share"]:
            classes.append("tail-effect")
            evidence["tail-effect"] = (
                f"{waves:g} waves per SM: the last, partial wave leaves {idle * 100:.0f} % of the block slots of "
                f"{full} waves idle"
            )
    return classes, evidence


def _limiter(metrics: Mapping[str, float]) -> str | None:
    limits = [(metrics[key], word) for word, key in _LIMITS if key in metrics]
    if not limits:
        return None
    lowest = min(value for value, _ in limits)
    return ", ".join(word for value, word in limits if value == lowest)


# ---------------------------------------------------------------------------- aggregation


def _row(name: str, category: str, kernels: list[NcuKernel], total_ns: int | None,
         thresholds: Mapping[str, float], **extra: Any) -> NcuRow:
    durations = [k.metrics.get("duration_ns") for k in kernels]
    known = [d for d in durations if d is not None]
    duration = int(round(sum(known))) if known else None
    weighted: dict[str, float | None] = {}
    for key in _PCT_KEYS:
        pairs = [(k.metrics[key], k.metrics.get("duration_ns")) for k in kernels if key in k.metrics]
        if not pairs:
            weighted[key] = None
        elif all(w for _, w in pairs):
            weighted[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)  # type: ignore[operator]
        else:
            weighted[key] = sum(v for v, _ in pairs) / len(pairs)
    longest = max(kernels, key=lambda k: k.metrics.get("duration_ns", -1.0))
    launch = {key: longest.metrics.get(key) for key in _LAUNCH_KEYS}
    limiter = _limiter(longest.metrics)
    classes, evidence = classify({**weighted, **launch, "limiter": limiter}, thresholds)  # type: ignore[dict-item]
    return NcuRow(
        name=name,
        category=category,
        launches=len(kernels),
        duration_ns=duration,
        share=(duration / total_ns) if duration is not None and total_ns else None,
        sm_sol_pct=weighted["sm_sol_pct"],
        memory_sol_pct=weighted["memory_sol_pct"],
        dram_pct=weighted["dram_pct"],
        achieved_occupancy_pct=weighted["achieved_occupancy_pct"],
        theoretical_occupancy_pct=weighted["theoretical_occupancy_pct"],
        limiter=limiter,
        registers_per_thread=launch["registers_per_thread"],
        block_size=launch["block_size"],
        grid_size=launch["grid_size"],
        waves_per_sm=launch["waves_per_sm"],
        tensor_pct=weighted["tensor_pct"],
        classes=classes,
        evidence=evidence,
        **extra,
    )


def _grouped(groups: dict[str, list[NcuKernel]], total_ns: int | None, thresholds: Mapping[str, float],
             category: Any, **extra: Any) -> list[NcuRow]:
    rows = [_row(key, category(key, ks), ks, total_ns, thresholds, **extra.get(key, {})) for key, ks in groups.items()]
    rows.sort(key=lambda r: (-(r.duration_ns or 0), -r.launches, r.name))
    return rows


def _add(groups: dict[str, list[NcuKernel]], key: str, kernel: NcuKernel) -> None:
    groups.setdefault(key, []).append(kernel)


def _ranges(kernel: NcuKernel) -> tuple[str | None, str | None, str | None]:
    """(step kind, step index, the range directly inside the step) of a kernel's gpuprobe stack."""
    stack = [r for r in kernel.nvtx if r.domain == DOMAIN]
    for i, rng in enumerate(stack):
        if rng.name in STEP_RANGES:
            child = stack[i + 1].name if i + 1 < len(stack) else None
            return rng.name, rng.payload, child
    return None, None, None


def _rule_findings(kernels: Iterable[NcuKernel]) -> list[Finding]:
    # one finding per kernel name and rule message: the launches of a kernel repeat a message with
    # other numbers, while one rule (WorkloadImbalance: SMs, SMSPs, L1, L2) can give several messages
    merged: dict[tuple[str, str, str, str], list[tuple[NcuKernel, NcuRule]]] = {}
    for kernel in kernels:
        for rule in kernel.rules:
            shape = _NUMBERS.sub("#", rule.description)
            merged.setdefault((kernel.name, rule.section, rule.name, shape), []).append((kernel, rule))
    findings = []
    for (name, section, rule_name, _), hits in merged.items():
        saved = [
            (k.metrics.get("duration_ns") or 0.0) * r.speedup_pct / 100 for k, r in hits if r.speedup_pct is not None
        ]
        _, best = max(hits, key=lambda h: -1.0 if h[1].speedup_pct is None else h[1].speedup_pct)
        first, _, rest = best.description.partition(". ")
        severity = max((_SEVERITY.get(r.type, "info") for _, r in hits), key=SEVERITIES.index)
        evidence: dict[str, Any] = {
            "kernel": name,
            "family": kernel_family(name),
            "kernel_ids": sorted({k.id for k, _ in hits})[:_IDS_SHOWN],  # the first few; "launches" counts all
            "launches": len(hits),
            "section": section,
            "rule": rule_name,
            "rule_type": best.type,
            "estimated_speedup_pct": best.speedup_pct,
            "speedup_type": best.speedup_type,
            "duration_ns": int(sum(k.metrics.get("duration_ns") or 0 for k, _ in hits)),
            "at_stake_ns": int(round(sum(saved))),
            "description": best.description,
        }
        findings.append(Finding(
            id=f"ncu.{rule_name}",
            severity=severity,
            title=f"{short_kernel_name(name)}: {first.rstrip('.')}.",
            evidence=evidence,
            remedy=rest.strip() or f"see the {section} section of the Nsight Compute report",
        ))
    findings.sort(key=lambda f: (-f.evidence["at_stake_ns"], -(f.evidence["estimated_speedup_pct"] or 0), f.title))
    return findings


def _read_all(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> NcuExport:
    if isinstance(source, (str, os.PathLike)):
        return read_ncu(source)
    exports = [read_ncu(path) for path in source]
    if len(exports) == 1:
        return exports[0]
    return NcuExport(
        path=", ".join(e.path for e in exports),
        page="/".join(sorted({e.page for e in exports})),
        kernels=[k for e in exports for k in e.kernels],
        has_nvtx=any(e.has_nvtx for e in exports),
        warnings=[f"{e.path}: {w}" for e in exports for w in e.warnings],
    )


def analyze_ncu(
    source: str | os.PathLike[str] | NcuExport | Sequence[str | os.PathLike[str]],
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
) -> NcuReport:
    """Report on an Nsight Compute export (or several, taken together: one kernel per file, ...).

    Args:
        source: A raw or details CSV export or a ``.ncu-rep`` (or an export already read), or a
            list of them.
        thresholds: Overrides of :data:`NCU_THRESHOLDS` (``["ncu.sol_high_pct=70"]``).

    Returns:
        The report: kernels, families, gpuprobe steps, components and logits processors, findings.

    Raises:
        ReportInputError: The file cannot be read as an ncu export.
        ConfigError: A bad threshold.

    Example:
        >>> report = analyze_ncu("tests/data/ncu/microgpusim_vectoradd_gtx1080_raw.csv")  # doctest: +SKIP
        >>> report.kernels[0].classes  # doctest: +SKIP
        ['latency-bound', 'under-occupied']
    """
    limits = parse_ncu_thresholds(thresholds)
    export = source if isinstance(source, NcuExport) else _read_all(source)
    kernels = export.kernels
    known = [k.metrics["duration_ns"] for k in kernels if "duration_ns" in k.metrics]
    total = int(round(sum(known))) if known else None
    by_name: dict[str, list[NcuKernel]] = {}
    by_family: dict[str, list[NcuKernel]] = {}
    steps: dict[str, list[NcuKernel]] = {}
    components: dict[str, list[NcuKernel]] = {}
    processors: dict[str, list[NcuKernel]] = {}
    step_indices: dict[str, set[str]] = {}
    for kernel in kernels:
        _add(by_name, kernel.name, kernel)
        _add(by_family, kernel_family(kernel.name), kernel)
        step, index, child = _ranges(kernel)
        if step is None:
            continue
        _add(steps, step, kernel)
        step_indices.setdefault(step, set()).add(index or "")
        component = child or "other"  # in the step, in no range inside it: the step's component="other"
        _add(components, component, kernel)
        if child is not None and child not in COMPONENT_RANGES:
            _add(processors, child, kernel)

    def by_kernel(key: str, ks: list[NcuKernel]) -> str:
        return categorize_kernel(ks[0].name)

    def mixed(key: str, ks: list[NcuKernel]) -> str:
        cats = {categorize_kernel(k.name) for k in ks}
        return cats.pop() if len(cats) == 1 else "mixed"

    kernel_rows = _grouped(
        by_name, total, limits, by_kernel,
        **{name: {"family": kernel_family(name), "short_name": short_kernel_name(name)} for name in by_name},
    )
    family_rows = _grouped(by_family, total, limits, lambda family, ks: categorize_kernel(family))  # as the timeline
    step_rows = _grouped(steps, total, limits, mixed)
    warnings = list(export.warnings)
    if export.has_nvtx and not steps:
        elsewhere = sorted({r.domain for k in kernels for r in k.nvtx if r.name in STEP_RANGES and r.domain != DOMAIN})
        warnings.append(
            "the export has an NVTX column but no kernel ran inside a gpuprobe prefill or decode range "
            f"(domain {DOMAIN!r}): no per-step grouping"
            + (f"; such ranges are in {', '.join(map(repr, elsewhere))}: gpuprobe wrote them through "
               "torch.cuda.nvtx, which has no domains (install the nvtx package)" if elsewhere else "")
        )
    for row in step_rows:
        indices = sorted(i for i in step_indices.get(row.name, set()) if i)
        if indices:
            row.evidence["steps"] = ", ".join(indices[:20]) + (" ..." if len(indices) > 20 else "")
    present = [m.key for m in METRICS if any(m.key in k.metrics for k in kernels)]
    return NcuReport(
        path=export.path,
        page=export.page,
        launches=len(kernels),
        duration_ns=total,
        has_nvtx=export.has_nvtx,
        metrics_present=present,
        metrics_absent=[m.key for m in METRICS if m.key not in present],
        warnings=warnings,
        thresholds=limits,
        findings=_rule_findings(kernels),
        kernels=kernel_rows,
        families=family_rows,
        steps=step_rows,
        components=_grouped(components, total, limits, mixed),
        processors=_grouped(processors, total, limits, mixed),
    )


# ---------------------------------------------------------------------------- timeline and diff


def join_timeline(report: NcuReport, families: FamiliesSection | None, timeline_path: str) -> NcuReport:
    """Put each family's share of GPU time in a timeline beside its efficiency from ncu.

    Args:
        report: The ncu report.
        families: The families section of the timeline's report (all rows).
        timeline_path: The timeline file, for the output.

    Returns:
        The report with ``timeline`` rows: the timeline's families by time, then the families ncu
        profiled that the timeline lacks.
    """
    ncu = {row.name: row for row in report.families}
    timeline = {fam.family: fam for fam in (families.rows if families is not None else [])}
    order = list(timeline) + [name for name in ncu if name not in timeline]
    rows = []
    for name in order:
        fam, hit = timeline.get(name), ncu.get(name)
        rows.append(NcuJoinRow(
            family=name,
            category=fam.category if fam else hit.category,  # type: ignore[union-attr]
            timeline_ns=fam.total_ns if fam else None,
            timeline_share=fam.share if fam else None,
            timeline_count=fam.count if fam else None,
            ncu_launches=hit.launches if hit else 0,
            sm_sol_pct=hit.sm_sol_pct if hit else None,
            memory_sol_pct=hit.memory_sol_pct if hit else None,
            achieved_occupancy_pct=hit.achieved_occupancy_pct if hit else None,
            classes=hit.classes if hit else [],
        ))
    warnings = list(report.warnings)
    if rows and not any(r.ncu_launches and r.timeline_ns is not None for r in rows):
        warnings.append(f"no kernel family of {report.path} appears in {timeline_path}: are they of the same program?")
    return dataclasses.replace(report, timeline=rows, timeline_path=timeline_path, warnings=warnings)


def diff_ncu(
    a: str | os.PathLike[str] | NcuReport,
    b: str | os.PathLike[str] | NcuReport,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
) -> NcuDiff:
    """Compare two ncu exports (baseline A, change B) per kernel family.

    Example:
        >>> d = diff_ncu("before.csv", "after.csv")  # doctest: +SKIP
        >>> d.families[0].delta_ns  # doctest: +SKIP
    """
    ra = a if isinstance(a, NcuReport) else analyze_ncu(a, thresholds)
    rb = b if isinstance(b, NcuReport) else analyze_ncu(b, thresholds)
    fa = {r.name: r for r in ra.families}
    fb = {r.name: r for r in rb.families}
    rows = []
    for family in list(fa) + [f for f in fb if f not in fa]:
        x, y = fa.get(family), fb.get(family)
        da = x.duration_ns if x else None
        db = y.duration_ns if y else None
        rows.append(NcuDiffRow(
            family=family,
            category=(x or y).category,  # type: ignore[union-attr]
            a_launches=x.launches if x else 0,
            b_launches=y.launches if y else 0,
            a_duration_ns=da,
            b_duration_ns=db,
            delta_ns=(db or 0) - (da or 0) if (da is not None or db is not None) else None,
            ratio=db / da if da and db is not None else None,
            a_sm_sol_pct=x.sm_sol_pct if x else None,
            b_sm_sol_pct=y.sm_sol_pct if y else None,
            a_memory_sol_pct=x.memory_sol_pct if x else None,
            b_memory_sol_pct=y.memory_sol_pct if y else None,
            a_achieved_occupancy_pct=x.achieved_occupancy_pct if x else None,
            b_achieved_occupancy_pct=y.achieved_occupancy_pct if y else None,
            a_classes=x.classes if x else [],
            b_classes=y.classes if y else [],
        ))
    rows.sort(key=lambda r: (-abs(r.delta_ns or 0), r.family))
    warnings = [f"A: {w}" for w in ra.warnings] + [f"B: {w}" for w in rb.warnings]
    if ra.launches != rb.launches:
        warnings.append(f"A holds {ra.launches} kernel launches, B {rb.launches}: totals compare different work")
    return NcuDiff(a_path=ra.path, b_path=rb.path, a_duration_ns=ra.duration_ns, b_duration_ns=rb.duration_ns,
                   warnings=warnings, families=rows)

