"""A PNG of an experiment: per workload, each variant's gain in tokens/s, TTFT and TPOT with its quartiles.

matplotlib is imported here only (``pip install 'gpuprobe[report]'``).
"""

from __future__ import annotations

import io
import os

from gpuprobe._files import write_file_atomic

from .result import TryResult

__all__ = ["plot"]

_FIGURES = (("tokens_per_s", "tokens/s"), ("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
_COLORS = {"faster": "#2e7d32", "slower": "#c62828"}


def plot(result: TryResult, path: str | os.PathLike[str]) -> None:
    """Save the PNG at ``path`` (written atomically): one panel per workload, a group of bars per variant.

    Raises:
        MissingDependencyError: matplotlib is not installed (the ``report`` extra).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from gpuprobe.errors import missing

        raise missing("matplotlib", "report") from exc
    loads = result.workloads
    rows = max(1, len(loads))
    tallest = max([len(w.variants) for w in loads] + [1])
    fig = Figure(figsize=(10, 1.2 + rows * (0.9 + 0.45 * tallest)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    for ax, w in zip(axes, loads):
        names = [v.name for v in w.variants if v.error is None]
        height = 0.8 / len(_FIGURES)
        for k, (figure, label) in enumerate(_FIGURES):
            for i, v in enumerate(v for v in w.variants if v.error is None):
                c = v.vs_baseline.get(figure)
                if c is None:
                    continue
                y = i + (k - 1) * height
                color = _COLORS.get(c.verdict, "#9e9e9e") if figure == "tokens_per_s" else None
                ax.barh(y, c.ratio.median, height=height * 0.9, color=color, alpha=1.0 if k == 0 else 0.45,
                        xerr=[[c.ratio.median - c.ratio.q1], [c.ratio.q3 - c.ratio.median]], capsize=2,
                        label=label if i == 0 else None)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("gain over the baseline (× per round; > 1 is better; bars: median, whiskers: quartiles)")
        ax.set_title(f"{w.label}: {w.rounds} rounds", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"gpuprobe try: {result.model} on {result.machine.name} ({result.machine.clock} clock)", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    write_file_atomic(path, buf.getvalue())
