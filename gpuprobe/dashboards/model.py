"""The dashboard model: dashboards of rows of panels of queries, independent of how they are rendered."""

from __future__ import annotations

import dataclasses

__all__ = ["GPU_ONLY", "Target", "Panel", "Row", "Dashboard"]

GPU_ONLY = "GPU only."
"""How the description of a panel that needs a GPU begins (device clock, CUDA allocator)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One query of a panel: PromQL (with Grafana variables) and the legend of its series.

    Example:
        >>> Target("sum(gpuprobe_generate_active)", "in flight").legend
        'in flight'
    """

    expr: str
    legend: str


@dataclasses.dataclass(frozen=True)
class Panel:
    """One Grafana time-series panel.

    Attributes:
        title: shown on the panel.
        description: shown in the panel's info tooltip (starts with :data:`GPU_ONLY` if ``gpu_only``).
        targets: the queries.
        unit: a Grafana unit id (``s``, ``bytes``, ``percentunit``, ``suffix: tok/s``, ...).
        stack: stack the series (parts of a whole).
        gpu_only: its series exist only on a CUDA device.

    Example:
        >>> Panel("Batch size", "Mean sequences per call.", ()).unit
        'short'
    """

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    stack: bool = False
    gpu_only: bool = False


@dataclasses.dataclass(frozen=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """A dashboard: rows of panels and the template variables ``model``, ``rank`` and ``instance``.

    Example:
        >>> p = Panel("p", "d", ())
        >>> [x.title for x in Dashboard("u", "t", "d", (Row("a", (p,)), Row("b", (p,)))).panels]
        ['p', 'p']
    """

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]

    @property
    def panels(self) -> list[Panel]:
        """Every panel, row by row."""
        return [p for row in self.rows for p in row.panels]
