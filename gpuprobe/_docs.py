r"""The tables of docs/metrics.md, generated from the metric specs, so the reference never drifts from the code.

The prose of the reference is written in docs/metrics.md itself; each table the specs decide lies between
two marker lines there, ``<!-- NAME table: generated, do not edit -->`` and ``<!-- end NAME table -->``
(one of :data:`TABLES`). ``python -m gpuprobe._docs`` rewrites those tables in place and nothing else
(``--check``: says whether they are current, writing nothing); a test checks the file is current.

Example:
    >>> stale = "<!-- {0} table: generated, do not edit -->\nstale row\n<!-- end {0} table -->\n"
    >>> text = "Intro.\n" + "".join(stale.format(name) for name in TABLES) + "End.\n"
    >>> filled = fill_tables(text)
    >>> filled.splitlines()[2]
    '| name | instrument | unit | attributes | Prometheus name | description |'
    >>> "stale row" in filled, filled.startswith("Intro.\n"), filled.endswith("End.\n"), fill_tables(filled) == filled
    (False, True, True, True)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ._files import write_file_atomic
from ._metrics import SPECS, MetricSpec, prometheus_name

# GPU health gauges (NVML) → the dcgm-exporter field that carries the same reading, and how they differ.
DCGM = {
    "gpuprobe.gpu.utilization": ("DCGM_FI_DEV_GPU_UTIL", "dcgm: percent 0–100; here a fraction 0–1"),
    "gpuprobe.gpu.memory.used": ("DCGM_FI_DEV_FB_USED", "dcgm: MiB; here bytes"),
    "gpuprobe.gpu.memory.total": ("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (+ DCGM_FI_DEV_FB_RESERVED)",
                                  "dcgm: MiB; here bytes, NVML's total"),
    "gpuprobe.gpu.clock.sm": ("DCGM_FI_DEV_SM_CLOCK", "dcgm: MHz; here Hz"),
    "gpuprobe.gpu.power": ("DCGM_FI_DEV_POWER_USAGE", "both watts"),
    "gpuprobe.gpu.power.limit": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "both watts"),
    "gpuprobe.gpu.temperature": ("DCGM_FI_DEV_GPU_TEMP", "both °C"),
    "gpuprobe.gpu.throttle": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS (formerly DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
                              "dcgm: the bitmask; here one 0/1 series per reason"),
    "gpuprobe.gpu.sm.activity": ("DCGM_FI_PROF_SM_ACTIVE", "both 0–1 (here from NVML's GPM: SM utilization ÷ 100)"),
    "gpuprobe.gpu.tensor.activity": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                     "both 0–1 (here from NVML's GPM: any-tensor utilization ÷ 100)"),
}

# The histograms whose buckets carry exemplars while traces are on (docs/tracing.md, "Exemplars"): metric →
# (its series that carry them, the span each bucket names and the value it names it with). A test holds the
# metrics to those a real run's exposition shows exemplars on.
EXEMPLARS = {
    "gen_ai.server.time_to_first_token": ('`clock="host"`', "the request's span, with its time to first token"),
    "gen_ai.server.request.duration": ("every series (a failed request's, under its `error.type`, too)",
                                       "the request's span, with its duration"),
    "gpuprobe.inter_token.duration": ('`clock="host"`', "the request's span, with its longest gap between two "
                                                        "tokens"),
    "gpuprobe.request.queue.duration": ("every series (continuous batching)", "the request's span, with its time "
                                                                              "in the queue"),
    "gpuprobe.step.duration": ('`clock="host"`: `phase="decode"` of `generate()`; every phase of continuous '
                               "batching", "`generate()`: the request's span, with its longest token gap (its "
                               "slowest decode step, from token to token); continuous batching: the `scheduler "
                               "step` span of a step that is one, with its host time"),
}

_SUFFIX = {"histogram": "_bucket / _sum / _count", "counter": "_total", "updown": "", "gauge": ""}
_EMITTED = {"always": "always", "default": "unless opted in", "latest": "opted in (`gen_ai_latest_experimental`)"}


def attributes(spec: MetricSpec) -> str:
    """The attributes column of a metric's row: each attribute with its note, then the user's own where it
    takes them.

    Example:
        >>> from gpuprobe._metrics import SPECS
        >>> attributes(SPECS["gpuprobe.probe.duration"])
        'probe, kind, clock (host/device), your attrs'
    """
    return ", ".join([a.described for a in spec.attributes] + (["your attrs"] if spec.user_attributes else []))


def metrics_table() -> list[str]:
    """Every metric: its instrument, unit, attributes, Prometheus name and description."""
    lines = ["| name | instrument | unit | attributes | Prometheus name | description |", "|---|---|---|---|---|---|"]
    for name, spec in SPECS.items():
        prom = prometheus_name(spec)
        suffix = _SUFFIX[spec.instrument]
        shown = f"`{prom}`" + (f" ({suffix})" if suffix else "")
        inst = {"updown": "up-down counter"}.get(spec.instrument, spec.instrument)
        lines.append(f"| `{name}` | {inst} | `{spec.unit}` | {attributes(spec)} | {shown} | {spec.description} |")
    return lines


def buckets_table() -> list[str]:
    """The bucket bounds of every histogram."""
    return ["| name | bucket bounds |", "|---|---|"] + [
        f"| `{name}` | {' '.join(f'{b:g}' for b in spec.buckets)} |" for name, spec in SPECS.items() if spec.buckets]


def conventions_table() -> list[str]:
    """The GenAI convention version each name follows, and when it is emitted."""
    return ["| name | convention version | emitted | note |", "|---|---|---|---|"] + [
        f"| `{name}` | {spec.convention.version} | {_EMITTED[spec.convention.emitted]} | {spec.convention.note or '—'} |"
        for name, spec in SPECS.items() if spec.convention is not None]


def exemplars_table() -> list[str]:
    """The histograms whose buckets carry exemplars (:data:`EXEMPLARS`)."""
    return ["| metric | series | a bucket's exemplar |", "|---|---|---|"] + [
        f"| `{name}` | {series} | {what} |" for name, (series, what) in EXEMPLARS.items()]


def dcgm_table() -> list[str]:
    """The dcgm-exporter field of each GPU health gauge (:data:`DCGM`)."""
    return ["| gpuprobe | dcgm-exporter field | units |", "|---|---|---|"] + [
        f"| `{SPECS[name].name}` | `{field}` | {note} |" for name, (field, note) in DCGM.items()]


#: The generated tables of docs/metrics.md, by the name their markers give them.
TABLES: dict[str, Callable[[], list[str]]] = {
    "metrics": metrics_table,
    "buckets": buckets_table,
    "conventions": conventions_table,
    "exemplars": exemplars_table,
    "dcgm": dcgm_table,
}
_BEGIN = re.compile(r"^<!-- (\S+) table: generated, do not edit -->$")
_END = "<!-- end {} table -->"


def fill_tables(text: str) -> str:
    """``text`` (docs/metrics.md) with each generated table between its markers written anew; every other
    line as it is.

    Raises:
        ValueError: A marker names a table that is not in :data:`TABLES`, a table's end marker is missing,
            or a table of :data:`TABLES` has no markers.
    """
    lines = text.split("\n")
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(lines):
        out.append(lines[i])
        found = _BEGIN.match(lines[i])
        i += 1
        if found is None:
            continue
        name = found.group(1)
        if name not in TABLES:
            raise ValueError(f"line {i}: no generated table is named {name!r} (the tables: {', '.join(TABLES)})")
        end = _END.format(name)
        try:
            i = lines.index(end, i)
        except ValueError:
            raise ValueError(f"line {i}: the {name} table has no end marker {end!r}") from None
        out.extend(TABLES[name]())
        seen.add(name)
    missing = [name for name in TABLES if name not in seen]
    if missing:
        raise ValueError(f"no markers for the {', '.join(missing)} table{'s' if len(missing) > 1 else ''}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuprobe._docs [PATH] [--check]``: rewrite the generated tables of the metrics reference."""
    parser = argparse.ArgumentParser(prog="python -m gpuprobe._docs",
                                     description="rewrite the generated tables of docs/metrics.md, and nothing else")
    parser.add_argument("path", nargs="?", default=str(Path(__file__).resolve().parents[1] / "docs" / "metrics.md"),
                        help="the metrics reference (default: docs/metrics.md beside this gpuprobe)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is not current")
    args = parser.parse_args(argv)
    try:
        text = Path(args.path).read_text(encoding="utf-8")
        filled = fill_tables(text)
    except (OSError, ValueError) as exc:
        print(f"gpuprobe._docs: {args.path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if filled != text:
            print(f"{args.path} is not current: run python -m gpuprobe._docs", file=sys.stderr)
            return 1
        return 0
    if filled != text:
        write_file_atomic(args.path, filled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
