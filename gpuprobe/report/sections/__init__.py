"""The registry of report sections, in report order.

Each section is one module of this package that declares ``SECTION`` (a
:class:`~gpuprobe.report._section.Section`): its name, how it is computed from one trace, shown as
tables, merged across ranks and, where it applies, compared in a diff. The builder
(:mod:`gpuprobe.report._analysis`), the renderers (:mod:`gpuprobe.report._render`), the rank merge
(:mod:`gpuprobe.report._ranks`) and the diff (:mod:`gpuprobe.report._diff`) loop over
:data:`REGISTRY`; none of them names a section module.

To add a section: a module here (its dataclasses, ``compute``, ``tables``, ``merge``, ``diff``, and
``SECTION``), its line in :data:`REGISTRY` (where it goes in the report) and its field on
:class:`gpuprobe.report.schema.Report` (typed access for rules and diffs; a test keeps the two alike).
"""

from __future__ import annotations

from gpuprobe.report._section import Section
from gpuprobe.report.sections import (
    attention,
    categories,
    communication,
    cpu_ops,
    families,
    findings,
    flops,
    idle,
    kernels,
    launches,
    memory,
    non_gemm,
    ranges,
    ranks,
    small_ops,
    steps,
    streams,
    summary,
    timeline,
)

__all__ = ["REGISTRY", "SECTIONS", "BY_NAME", "DEFAULT_SECTIONS", "GPU_ONLY", "table_order"]

#: Every section, in report order (JSON keys, ``--sections`` and its help); ``findings`` come first.
REGISTRY: tuple[Section, ...] = (
    findings.SECTION,
    summary.SECTION,
    ranks.SECTION,
    kernels.SECTION,
    categories.SECTION,
    families.SECTION,
    non_gemm.SECTION,
    attention.SECTION,
    launches.SECTION,
    memory.SECTION,
    ranges.SECTION,
    steps.SECTION,
    small_ops.SECTION,
    timeline.SECTION,
    cpu_ops.SECTION,
    idle.SECTION,
    flops.SECTION,
    communication.SECTION,
    streams.SECTION,
)
#: Section names, in report order.
SECTIONS: tuple[str, ...] = tuple(s.name for s in REGISTRY)
#: Each section by name.
BY_NAME: dict[str, Section] = {s.name: s for s in REGISTRY}
#: The sections made of GPU records only: a trace without GPU activity has nothing to show in them, and
#: the text and Markdown outputs leave them out (the summary's warning says why; JSON and CSV keep them).
GPU_ONLY: frozenset[str] = frozenset(
    {"kernels", "categories", "families", "non_gemm", "attention", "launches", "memory", "small_ops", "idle",
     "communication", "streams"}
)
#: The sections a report holds when none are named.
DEFAULT_SECTIONS: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.default)


def table_order() -> list[Section]:
    """The sections in the order their tables are shown: report order, ``table_last`` ones at the end."""
    return sorted(REGISTRY, key=lambda s: s.table_last)
