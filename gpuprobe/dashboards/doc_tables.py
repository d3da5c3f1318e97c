"""The Markdown tables of docs/grafana.md, generated from the metric specs and the dashboards."""

from __future__ import annotations

from .._metrics import SPECS
from .model import GPU_ONLY
from .panels import dashboards
from .series import model_label, series, series_parts

__all__ = ["mapping_table", "gpu_panels_table"]


def mapping_table() -> str:
    """Markdown table: OpenTelemetry name → Prometheus series (and the label naming the model).

    Example:
        >>> mapping_table().splitlines()[0]
        '| OpenTelemetry name | unit | Prometheus series | model label |'
    """
    lines = ["| OpenTelemetry name | unit | Prometheus series | model label |", "|---|---|---|---|"]
    for name, spec in SPECS.items():
        names = ", ".join(f"`{series(name, p)}`" for p in series_parts(name))
        model = model_label(name)
        lines.append(f"| `{name}` | `{spec.unit}` | {names} | {f'`{model}`' if model else '—'} |")
    return "\n".join(lines) + "\n"


def gpu_panels_table() -> str:
    """Markdown table of the panels that need a GPU.

    Example:
        >>> gpu_panels_table().splitlines()[2].split(" | ")[1]
        'Step time by phase (device clock)'
    """
    lines = ["| dashboard | panel | why |", "|---|---|---|"]
    for board in dashboards():
        for panel in board.panels:
            if panel.gpu_only:
                why = panel.description[len(GPU_ONLY):].strip().split(".")[0]
                lines.append(f"| {board.title} | {panel.title} | {why} |")
    return "\n".join(lines) + "\n"
