"""An experiment as text, Markdown or JSON: per workload a ranked table, the winner's code change, what
did not run and why, the notes (what a CPU cannot show, outputs that differ); no verdict where there are
fewer rounds than the verdict rule needs, and what stopped an experiment early.

The baseline row holds the figures themselves (medians, tokens/s with its interquartile range); a
variant's row holds its gain over the baseline per round, median (interquartile range): above 1 is
better (faster, or less memory). The verdict is on tokens/s: ``faster`` or ``slower`` only where the
rounds agree beyond chance and the gain exceeds the spread (:mod:`gpuprobe.experiment.stats`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gpuprobe.errors import ConfigError

from .result import TryResult, VariantResult, WorkloadResult
from .stats import Comparison, Spread

__all__ = ["FORMATS", "render"]

FORMATS = ("text", "markdown", "md", "json")
_HEADER = ("#", "variant", "tokens/s", "TTFT", "TPOT", "memory", "syncs/step", "output", "verdict")


def render(result: TryResult, fmt: str = "text") -> str:
    """Render ``result`` as ``text``, ``markdown`` (or ``md``) or ``json``.

    Raises:
        ConfigError: an unknown format.
    """
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=1) + "\n"
    if fmt in ("markdown", "md"):
        return _document(result, markdown=True)
    if fmt == "text":
        return _document(result, markdown=False)
    raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1e3:.3g} ms" if value < 0.9995 else f"{value:,.3g} s" if value < 999.5 else f"{value:,.0f} s"


def _bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _rate(s: Spread | None) -> str:
    return "—" if s is None else f"{_plain(s.median)} tok/s ({_plain(s.q1)}–{_plain(s.q3)})"


def _plain(value: float) -> str:
    """Four significant digits without an exponent: ``35.97``, ``1,235`` (not ``1.235e+03``)."""
    return f"{value:,.0f}" if value >= 999.95 else f"{value:.4g}"


def _gain(c: Comparison | None) -> str:
    if c is None:
        return "—"
    r = c.ratio
    return f"{r.median:.2f}× ({r.q1:.2f}–{r.q3:.2f})"


def _memory(v: VariantResult) -> str:
    peak = v.figures.get("peak_memory_bytes")
    if peak is not None:
        return f"peak {_bytes(peak.median)}"
    kv = v.figures.get("kv_cache_bytes")
    return f"KV {_bytes(kv.median)}" if kv is not None else "—"


def _count(value: float) -> str:
    """A count per step as people write it: ``2,000``, ``302``, ``1.5``, ``0.25`` (never ``2e+03``).

    Example:
        >>> [_count(x) for x in (2000.0, 302.4, 99.5, 1.5, 0.25, 0.0)]
        ['2,000', '302', '99.5', '1.5', '0.25', '0']
    """
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _syncs(v: VariantResult) -> str:
    return "—" if v.syncs_per_step is None else _count(v.syncs_per_step)


def _rows(w: WorkloadResult) -> list[tuple[str, ...]]:
    b = w.baseline
    rows: list[tuple[str, ...]] = [("", "baseline", _rate(b.figures.get("tokens_per_s")), _ms(_median(b, "ttft_s")),
             _ms(_median(b, "tpot_s")), _memory(b), _syncs(b), "—", "reference")]
    for i, v in enumerate(w.variants, 1):
        if v.error is not None:
            rows.append((str(i), v.name, "—", "—", "—", "—", _syncs(v), "—", f"failed: {v.error}"))
            continue
        rows.append((str(i), v.name, _gain(v.vs_baseline.get("tokens_per_s")), _gain(v.vs_baseline.get("ttft_s")),
                     _gain(v.vs_baseline.get("tpot_s")), _memory(v), _syncs(v),
                     v.output.text if v.output is not None else "not compared", v.verdict or "—"))
    return rows


def _median(v: VariantResult, name: str) -> float | None:
    s = v.figures.get(name)
    return s.median if s is not None else None


def _table(rows: list[tuple[str, ...]], markdown: bool) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(_HEADER) + " |", "|" + "|".join("---:" if h in ("#",) else "---"
                                                               for h in _HEADER) + "|"]
        return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    widths = [max(len(r[i]) for r in [_HEADER, *rows]) for i in range(len(_HEADER))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in [_HEADER, *rows]]


def _winner(w: WorkloadResult, markdown: bool) -> list[str]:
    if w.no_verdict is not None:
        return [w.no_verdict[0].upper() + w.no_verdict[1:] + "."]
    win = w.winner
    if win is None:
        return ["No variant is faster than the baseline here (tokens/s beyond the spread of the rounds)."]
    c = win.vs_baseline["tokens_per_s"]
    what = win.output.text if win.output is not None else "not compared"
    head = (f"Winner: {'**' if markdown else ''}{win.name}{'**' if markdown else ''} ({win.variant.title}): "
            f"{c.ratio.median:.2f}× tokens/s ({c.ratio.q1:.2f}–{c.ratio.q3:.2f} over {win.rounds} rounds), "
            f"output {what}. The change:")
    code = win.variant.code.splitlines()
    if markdown:
        return [head, "", "```python", *code, "```"]
    return [head, *("    " + line for line in code)]


def _workload(w: WorkloadResult, markdown: bool) -> list[str]:
    mode = "sampling; outputs compared greedy" if w.sampling else "greedy"
    title = f"{w.label} ({mode}): {w.rounds} rounds"
    lines = [f"## {title}" if markdown else title, ""]
    lines += _table(_rows(w), markdown)
    lines += [""] + _winner(w, markdown)
    if w.diff_command:
        lines += ["", f"Compare the traces: `{w.diff_command}`" if markdown else f"Compare the traces: {w.diff_command}"]
    traced = [v for v in [w.baseline, *w.variants] if v.trace]
    if traced:
        q = "`" if markdown else ""
        lines += ["", "Traces: " + ", ".join(f"{v.name}: {q}{v.trace}{q}" for v in traced)]
    if w.not_run:
        # one line for everything --variants left out; a line each for the others, with why
        unasked = [n for n in w.not_run if n.reason.startswith("not asked for")]
        rows = [(n.name, n.reason) for n in w.not_run if n not in unasked]
        if unasked:
            rows.append((unasked[0].reason, ", ".join(n.name for n in unasked)))
        lines += ["", "Not run:"]
        lines += [f"- {name}: {why}" if markdown else f"  {name}: {why}" for name, why in rows]
    return lines


def _document(result: TryResult, markdown: bool) -> str:
    f, m = result.facts, result.machine
    head = (f"gpuprobe try: {result.model} ({f.dtype}, attention {f.attention}) on {m.name}, {m.clock} clock; "
            f"{result.elapsed_s:.1f} s of a {result.budget_s:g} s budget")
    lines = [f"# {head}" if markdown else head, ""]
    if result.fault is not None:
        lines += [f"Stopped early: {result.fault.text}. The rounds below were measured before it.", ""]
    lines.append("Figures are medians over the rounds (interquartile range); a variant's are its gains per round "
                 "against the baseline, above 1 is better. The verdict is on tokens/s, and only where the rounds "
                 "agree beyond chance and the gain exceeds their spread.")
    bullet: Callable[[str], str] = (lambda s: f"- {s}") if markdown else (lambda s: f"  - {s}")
    for w in result.workloads:
        lines += [""] + _workload(w, markdown)
    if result.not_run_workloads:
        lines += ["", "Workloads not run:"] + [bullet(f"{n.name}: {n.reason}") for n in result.not_run_workloads]
    if result.notes:
        lines += ["", "Notes:"] + [bullet(n) for n in result.notes]
    return "\n".join(lines) + "\n"
