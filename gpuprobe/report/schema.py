"""The report's schema: a tree of dataclasses holding plain JSON values.

Every time is an integer number of nanoseconds (fields end in ``_ns``); a share is a fraction of
1; a GPU figure is ``None`` when the trace holds no GPU activity records, so that a capture that
lost its GPU side never reads as an idle GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "SECTIONS",
    "SEVERITIES",
    "Finding",
    "IdleRow",
    "IdleSection",
    "FlopsRow",
    "FlopsCategory",
    "FlopsSection",
    "CommStepRow",
    "CommunicationSection",
    "RankRow",
    "RankStepRow",
    "StragglerRow",
    "SkewRow",
    "RanksSection",
    "Report",
    "Summary",
    "KernelStat",
    "KernelsSection",
    "CategoryStat",
    "CategoriesSection",
    "FamilyStat",
    "FamiliesSection",
    "ApiStat",
    "LaunchesSection",
    "MemOpStat",
    "MemorySection",
    "RangeStat",
    "RangesSection",
    "StepRow",
    "StepsSection",
    "SmallOpsSection",
    "TimelineRow",
    "TimelineSection",
    "CpuOpStat",
    "CpuOpsSection",
]

#: Section names, in report order (``summary`` is always present; ``findings`` come first).
SECTIONS: tuple[str, ...] = (
    "findings",
    "summary",
    "ranks",
    "kernels",
    "categories",
    "families",
    "non_gemm",
    "attention",
    "launches",
    "memory",
    "ranges",
    "steps",
    "small_ops",
    "timeline",
    "cpu_ops",
    "idle",
    "flops",
    "communication",
)
#: Finding severities, mildest first.
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")


@dataclasses.dataclass
class Finding:
    """Something wrong (or worth knowing), the numbers that show it, and the usual remedy.

    Attributes:
        id: The rule that found it (fixed, e.g. ``host_sync``); see ``docs/diagnosis.md``.
        severity: ``info``, ``warning`` or ``critical``.
        title: One line for people.
        evidence: Numbers and where they come from; ``at_stake_ns`` is the estimated time at
            stake, the order of findings in a report.
        remedy: What usually fixes it.
    """

    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    remedy: str


@dataclasses.dataclass
class Summary:
    """What the trace holds, and the warnings a reader must see first."""

    path: str
    source: str
    devices: list[str]
    base_time_ns: int | None
    span_ns: int
    events: dict[str, int]
    skipped_events: int
    kernel_count: int
    kernel_ns: int | None
    gpu_op_count: int
    gpu_busy_ns: int | None
    gpu_busy_share: float | None
    launch_count: int
    launch_api_ns: int
    step_count: int
    warnings: list[str]


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


@dataclasses.dataclass
class MemOpStat:
    """Copies or sets of one direction; bandwidth is bytes over summed duration (GB/s)."""

    kind: str
    direction: str
    count: int
    bytes: int
    total_ns: int
    bandwidth_gbps: float | None


@dataclasses.dataclass
class MemorySection:
    """Memory operations by direction."""

    total_bytes: int
    total_ns: int
    rows: list[MemOpStat]


@dataclasses.dataclass
class RangeStat:
    """One range path (``decode_step/forward``) over all its occurrences.

    ``gpu_busy_ns`` sums, over occurrences, the union of the intervals of the GPU work launched
    inside the occurrence (through launch correlation); ``gpu_span_ns`` sums first start to last end.
    """

    path: str
    name: str
    depth: int
    count: int
    cpu_ns: int
    gpu_busy_ns: int | None
    kernel_ns: int | None
    gpu_span_ns: int | None
    launches: int
    gpu_ops: int


@dataclasses.dataclass
class RangesSection:
    """GPU time per CPU-side range, nested ranges as paths."""

    distinct: int
    rows: list[RangeStat]


@dataclasses.dataclass
class StepRow:
    """One step: a range matching the step pattern (outermost match only)."""

    index: int
    name: str
    phase: str
    start_ns: int
    cpu_ns: int
    gpu_busy_ns: int | None
    gpu_span_ns: int | None
    kernel_ns: int | None
    kernels: int
    launches: int
    launch_api_ns: int
    sync_ns: int
    memcpy_bytes: int
    categories: dict[str, int]


@dataclasses.dataclass
class StepsSection:
    """Per-step table for generation; ``start_ns`` is relative to the trace start."""

    pattern: str
    count: int
    cpu_median_ns: int | None
    cpu_p10_ns: int | None
    cpu_p90_ns: int | None
    gpu_busy_median_ns: int | None
    gpu_busy_p10_ns: int | None
    gpu_busy_p90_ns: int | None
    launches_median: float | None
    rows: list[StepRow]


@dataclasses.dataclass
class SmallOpsSection:
    """Kernels shorter on average than ``threshold_ns``: frequent ones leave the GPU waiting on launches."""

    threshold_ns: int
    count: int
    count_share: float
    total_ns: int
    time_share: float
    rows: list[KernelStat]


@dataclasses.dataclass
class TimelineRow:
    """One long event; ``start_ns`` is relative to the trace start."""

    kind: str
    name: str
    start_ns: int
    dur_ns: int
    where: str


@dataclasses.dataclass
class TimelineSection:
    """The longest GPU operations and CPU events, in time order."""

    rows: list[TimelineRow]


@dataclasses.dataclass
class CpuOpStat:
    """CPU operators by name (inclusive time)."""

    name: str
    count: int
    total_ns: int
    mean_ns: int
    max_ns: int


@dataclasses.dataclass
class CpuOpsSection:
    """Top CPU operators by inclusive time."""

    count: int
    rows: list[CpuOpStat]


@dataclasses.dataclass
class IdleRow:
    """GPU time of one step window: busy, and idle split by what the host was doing.

    ``window_ns`` runs from the step's start (or its first GPU operation, if earlier) to its end
    (or its last GPU operation's end, if later); ``index`` is -1 for a trace without steps.
    """

    index: int
    window_ns: int
    busy_ns: int
    idle_launch_ns: int
    idle_sync_ns: int
    idle_other_ns: int


@dataclasses.dataclass
class IdleSection:
    """Where the GPU idles: while the host launches the next operation, while it waits in a sync,
    or otherwise (launched, not started yet). ``scope`` is ``steps`` or ``trace``."""

    scope: str
    window_ns: int
    busy_ns: int
    idle_launch_ns: int
    idle_sync_ns: int
    idle_other_ns: int
    rows: list[IdleRow]


@dataclasses.dataclass
class FlopsRow:
    """FLOPs of the CPU operators of one name that record a count (``with_flops=True``).

    ``time_ns`` is the GPU time of the work they launched (``clock`` ``gpu``), or their CPU time
    on a CPU trace (``clock`` ``cpu``); ``flops_per_s`` is ``flops`` over it.
    """

    operator: str
    category: str
    count: int
    flops: int
    time_ns: int
    flops_per_s: float | None


@dataclasses.dataclass
class FlopsCategory:
    """Achieved FLOP/s of one category."""

    category: str
    flops: int
    time_ns: int
    flops_per_s: float | None


@dataclasses.dataclass
class FlopsSection:
    """Achieved FLOP/s by category and operator."""

    clock: str
    total_flops: int
    categories: list[FlopsCategory]
    rows: list[FlopsRow]


@dataclasses.dataclass
class CommStepRow:
    """Communication of one step (``index`` as in the steps section)."""

    index: int
    communication_ns: int
    overlap_ns: int
    exposed_ns: int


@dataclasses.dataclass
class CommunicationSection:
    """Communication kernels (NCCL, RCCL, custom all-reduce, ...) and how much compute hides them.

    ``communication_ns`` sums their durations; ``overlap_ns`` is, per device, the union of their
    intervals intersected with the union of the other kernels' intervals, summed over devices;
    ``exposed_ns`` is the union of communication minus the overlap: time only communication ran.
    """

    kernel_ns: int
    collectives: int
    communication_ns: int
    overlap_ns: int
    exposed_ns: int
    rows: list[CommStepRow]


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


@dataclasses.dataclass
class Report:
    """Everything :func:`gpuprobe.report.analyze` found; sections not asked for are ``None``.

    Example:
        >>> from gpuprobe.report import analyze
        >>> report = analyze("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> report.summary.kernel_count  # doctest: +SKIP
        2
    """

    summary: Summary
    findings: list[Finding] | None = None
    ranks: RanksSection | None = None
    kernels: KernelsSection | None = None
    categories: CategoriesSection | None = None
    families: FamiliesSection | None = None
    non_gemm: KernelsSection | None = None
    attention: KernelsSection | None = None
    launches: LaunchesSection | None = None
    memory: MemorySection | None = None
    ranges: RangesSection | None = None
    steps: StepsSection | None = None
    small_ops: SmallOpsSection | None = None
    timeline: TimelineSection | None = None
    cpu_ops: CpuOpsSection | None = None
    idle: IdleSection | None = None
    flops: FlopsSection | None = None
    communication: CommunicationSection | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-serializable values (sections left out when ``None``).

        Example:
            >>> import json
            >>> from gpuprobe.report import analyze
            >>> json.dumps(analyze("tests/data/kineto_min.json").to_dict())  # doctest: +SKIP
        """
        out: dict[str, Any] = {"schema": "gpuprobe.report/1"}
        for name in SECTIONS:
            value = getattr(self, name)
            if value is None:
                continue
            out[name] = [dataclasses.asdict(f) for f in value] if name == "findings" else dataclasses.asdict(value)
        return out
