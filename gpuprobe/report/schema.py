"""The report's schema: a tree of dataclasses holding plain JSON values.

Every time is an integer number of nanoseconds (fields end in ``_ns``); a share is a fraction of
1; a GPU figure is ``None`` when the trace holds no GPU activity records, so that a capture that
lost its GPU side never reads as an idle GPU.

Each section's dataclasses are declared by its module in :mod:`gpuprobe.report.sections`; this
module gathers them under one name, with the :class:`Report` that holds a section per field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuprobe.report.sections import SECTIONS
from gpuprobe.report.sections.categories import CategoriesSection, CategoryStat
from gpuprobe.report.sections.communication import CommStepRow, CommunicationSection
from gpuprobe.report.sections.cpu_ops import CpuOpsSection, CpuOpStat
from gpuprobe.report.sections.families import FamiliesSection, FamilyStat
from gpuprobe.report.sections.findings import SEVERITIES, Finding
from gpuprobe.report.sections.flops import FlopsCategory, FlopsRow, FlopsSection
from gpuprobe.report.sections.idle import IdleRow, IdleSection
from gpuprobe.report.sections.kernels import KernelsSection, KernelStat
from gpuprobe.report.sections.launches import ApiStat, LaunchesSection
from gpuprobe.report.sections.memory import MemOpStat, MemorySection
from gpuprobe.report.sections.ranges import RangesSection, RangeStat
from gpuprobe.report.sections.ranks import RankRow, RanksSection, RankStepRow, SkewRow, StragglerRow
from gpuprobe.report.sections.small_ops import SmallOpsSection
from gpuprobe.report.sections.steps import StepRow, StepsSection
from gpuprobe.report.sections.streams import StreamRow, StreamsSection
from gpuprobe.report.sections.summary import Summary
from gpuprobe.report.sections.timeline import TimelineRow, TimelineSection

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
    "StreamRow",
    "StreamsSection",
]


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
    streams: StreamsSection | None = None

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
            out[name] = [f.to_dict() for f in value] if name == "findings" else dataclasses.asdict(value)
        return out
