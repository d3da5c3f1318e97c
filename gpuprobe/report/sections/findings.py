"""The findings section: what is wrong (or worth knowing), the numbers that show it and the usual
remedy. The rules that find them are :mod:`gpuprobe.report._findings`; the builder runs them once every
other section is computed."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from gpuprobe.report._section import MergeContext, Section, group_by
from gpuprobe.report._tables import Column, Table, format_ns

__all__ = ["SEVERITIES", "Finding", "findings_table", "SECTION"]

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
        remedy: What usually fixes it, one paragraph or several items one a line (the text report lists
            them); a finding that a ``gpuprobe try`` variant measures ends with that command
            (:func:`gpuprobe._remedies.remedy_line`).
        asks_nothing: The finding asks nothing of the user (an expected pattern, "nothing to do"): it
            informs, and ``--fail-on`` never counts it. In JSON the key is present only when true.
    """

    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    remedy: str
    asks_nothing: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``asks_nothing`` only when true (a finding that asks something reads as before)."""
        out = dataclasses.asdict(self)
        if not self.asks_nothing:
            del out["asks_nothing"]
        return out


def _scalar_evidence(evidence: dict[str, Any], prefix: str = "") -> str:
    """The evidence's scalars as ``key=value``, one level of objects down (``by_api.cudaStreamSynchronize=8``).

    A time (a key ending in ``_ns``) is shown in human units under its name without ``_ns``
    (``at_stake=1.074 ms`` for ``at_stake_ns``): the name says what the value is in.
    """
    parts = []
    for key, value in evidence.items():
        if isinstance(value, dict) and not prefix:  # one level down: by_api.cudaStreamSynchronize=8
            inner = _scalar_evidence(value, f"{key}.")
            if inner:
                parts.append(inner)
            continue
        if isinstance(value, (dict, list)) or value is None:
            continue
        key = prefix + key
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key.endswith("_ns"):
            key, text = key.removesuffix("_ns"), format_ns(value)
        elif isinstance(value, float):
            text = f"{value:.3g}"
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return ", ".join(parts)


_REMEDY_WIDTH = 100  # characters of a remedy line in the text report, its indent included


def _remedy_lines(remedy: str, markdown: bool) -> list[str]:
    """A remedy of one paragraph on one line; one of several items (one a line in ``remedy``) as a list."""
    items = [item for item in remedy.split("\n") if item]
    if len(items) <= 1:
        return [f"  - remedy: {remedy}" if markdown else f"   remedy: {remedy}"]
    if markdown:
        return ["  - remedy:"] + [f"    - {item}" for item in items]
    lines = ["   remedy:"]
    for item in items:
        lines.extend(textwrap.wrap(item, _REMEDY_WIDTH, initial_indent="     - ", subsequent_indent="       ",
                                   break_long_words=False, break_on_hyphens=False))
    return lines


def _offender_lines(evidence: dict[str, Any]) -> list[str]:
    rows = evidence.get("top_offenders") or (evidence.get("would_sync_on_gpu") or {}).get("top_offenders") or []
    return [
        f"     {r['calls']:,} x {r['operator']} in {r['range']}"
        + (f" ({r['per_step']:g} per step)" if r.get("per_step") is not None else "")
        + (f": {r.get('function') or r['role'].replace('_', ' ')}" if r.get("role") else "")
        for r in rows
    ]


def findings_table(findings: list[Any], markdown: bool) -> Table:
    """The findings as lines (text, Markdown) and as a table of one row each (CSV)."""
    lines: list[str] = []
    for n, f in enumerate(findings, 1):
        if markdown:
            lines.append(f"- **{f.severity}** `{f.id}`: {f.title}")
            lines.append(f"  - evidence: {_scalar_evidence(f.evidence)}")
            lines.extend("  - " + line.strip() for line in _offender_lines(f.evidence))
        else:
            lines.append(f"{n}. [{f.severity}] {f.id}: {f.title}")
            lines.append(f"   evidence: {_scalar_evidence(f.evidence)}")
            lines.extend(_offender_lines(f.evidence))
        lines.extend(_remedy_lines(f.remedy, markdown))
    rows = [
        {
            "id": f.id,
            "severity": f.severity,
            "title": f.title,
            "at_stake_ns": f.evidence.get("at_stake_ns", 0),
            "remedy": f.remedy,
            "evidence": json.dumps(f.evidence, sort_keys=True),
        }
        for f in findings
    ]
    columns = [
        Column(key, key, csv_only=True)
        for key in ("id", "severity", "title", "at_stake_ns", "remedy", "evidence")
    ]
    return Table("findings", "Findings", columns, rows, lines, listed=True)


def tables(findings: list[Finding], markdown: bool) -> list[Table]:
    return [findings_table(findings, markdown)]


def merge(mctx: MergeContext) -> list[Finding]:
    """One finding per rule across ranks: the worst rank's, with the ranks that show it (not ordered)."""
    out = []
    by_id = group_by([(r.rank, f) for r in mctx.results for f in (r.report.findings or [])], lambda rf: rf[1].id)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    for rule, group in by_id.items():
        worst_rank, worst = max(group, key=lambda rf: (rank[rf[1].severity], rf[1].evidence.get("at_stake_ns", 0)))
        ranks = sorted(r for r, _ in group)
        evidence = {**worst.evidence, "at_stake_ns": sum(f.evidence.get("at_stake_ns", 0) for _, f in group),
                    "ranks": ranks, "worst_rank": worst_rank}
        title = f"{worst.title} (rank {worst_rank}; on {len(ranks)} of {len(mctx.results)} ranks)"
        out.append(Finding(id=rule, severity=worst.severity, title=title, evidence=evidence, remedy=worst.remedy,
                           asks_nothing=worst.asks_nothing))
    return out


SECTION = Section("findings", tables, merge=merge)
