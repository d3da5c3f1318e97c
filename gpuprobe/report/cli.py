"""Command line: ``gpuprobe report TRACE`` and ``gpuprobe diff A B``.

Exit status:

- 0: success.
- 2: bad input or arguments: a trace that cannot be read, a bad option, an output that cannot be
  written, a missing optional dependency. One line on stderr names the file or option and the
  problem, never a traceback.
- 1: an internal error of gpuprobe (any other exception): a short message asks for a bug report
  with the command line and versions; ``--debug`` adds the traceback.
- 3: ``--fail-on SEVERITY`` and a finding of that severity or worse that asks something of the user
  is present (not one whose ``asks_nothing`` is true, such as an expected pattern; the report is
  still written).
- 130: interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from gpuprobe._files import write_file_atomic
from gpuprobe.errors import ConfigError, MissingDependencyError
from gpuprobe.report._analysis import analyze
from gpuprobe.report._diff import NORMALIZE, diff
from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._executors import EXECUTOR_HELP, is_local, open_executor
from gpuprobe.report._findings import THRESHOLDS, at_least
from gpuprobe.report._ranks import analyze_ranks, several_ranks
from gpuprobe.report._render import FORMATS, plot, render_report
from gpuprobe.report.loaders import ENGINES, ncu_format
from gpuprobe.report.schema import SECTIONS, SEVERITIES

__all__ = ["main_report", "main_diff"]

EXIT_OK = 0
#: An exception gpuprobe did not expect: a bug to report.
EXIT_INTERNAL_ERROR = 1
#: The trace, an option or the output path is wrong (argparse's own status for bad arguments).
EXIT_BAD_INPUT = 2
#: ``--fail-on``: a finding at least that severe is present.
EXIT_FINDINGS = 3
EXIT_INTERRUPTED = 130
#: ``--ncu``: families read for the join when the report's own table is cut at ``--top``.
_EVERY_ROW = 1_000_000


class _CannotWrite(Exception):
    """An output file (``--output``, ``--plot``) cannot be written; the message says why."""


class _Progress:
    """A one-line progress indicator on stderr, redrawn at most ten times a second."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = label
        self.stream = stream
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.1:
            return
        self.last = now
        pct = f"{100 * done / total:5.1f} %" if total else ""
        self.stream.write(f"\rreading {self.label}: {pct} ({done / 1e6:,.0f} of {total / 1e6:,.0f} MB)")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the option and the problem) instead of the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _small_us(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of microseconds, 0 or more, not {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def _sections(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    for name in names:
        if name not in SECTIONS:
            raise argparse.ArgumentTypeError(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
    return names


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    parser.add_argument("--output", "-o", metavar="PATH", help="write here (atomically) instead of stdout")
    parser.add_argument("--top", type=_positive_int, default=20, metavar="N", help="rows per table (default: 20)")
    parser.add_argument(
        "--step-pattern",
        metavar="REGEX",
        help="regular expression for step range names (default: gpuprobe.step, decode, prefill, step; "
        "else ProfilerStep#N)",
    )
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help="JSON reader (default: auto, msgspec when installed, else stdlib; all give the same events)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show reading progress on stderr (default: when stderr is a terminal)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a finding threshold, e.g. host_sync.per_step=2 (repeatable; names in docs/diagnosis.md: "
        + ", ".join(THRESHOLDS)
        + ")",
    )
    parser.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        metavar="SEVERITY",
        help=f"exit with status {EXIT_FINDINGS} when a finding this severe or worse is present "
        f"({', '.join(SEVERITIES)}; for CI gates)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        metavar="N",
        help="several ranks: read by at most N worker processes, each reading one trace after another (ranks of "
        "less than 16 MB of text in all are read in this process); one plain JSON trace of 256 MB or more: read "
        "by two processes at once when N is 2 or more (default: the CPU count)",
    )
    parser.add_argument("--executor", metavar="WHERE", default=None, help=EXECUTOR_HELP)
    parser.add_argument(
        "--debug", action="store_true", help="on an internal error, show the traceback (for a bug report)"
    )


def _fail(prog: str, message: str) -> int:
    sys.stderr.write(f"{prog}: error: {' '.join(message.split())}\n")
    return EXIT_BAD_INPUT


def _version(distribution: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _internal_error(prog: str, argv: list[str], exc: Exception, debug: bool) -> int:
    # why: imported here, not at the top: importlib.metadata alone adds 16 ms to every run's start
    import platform
    import traceback

    from gpuprobe import __version__

    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    detail = " ".join(str(exc).split())
    lines = [
        f"{prog}: internal error in gpuprobe: {type(exc).__name__}" + (f": {detail}" if detail else ""),
        "This is a bug in gpuprobe, not a problem with your input. Please report it with this command line "
        "and these versions:",
        f"  command: {' '.join([prog, shlex.join(argv)])}",
        f"  versions: gpuprobe {__version__}, torch {_version('torch')}, Python {platform.python_version()}",
    ]
    if not debug:
        lines.append("  (run it again with --debug to see the traceback)")
    sys.stderr.write("\n".join(lines) + "\n")
    return EXIT_INTERNAL_ERROR


def _progress(args: argparse.Namespace, label: str) -> _Progress | None:
    wanted = args.progress if args.progress is not None else sys.stderr.isatty()
    return _Progress(label, sys.stderr) if wanted else None


def _write(path: str, write: Callable[[str], Any]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise _CannotWrite(f"{path}: cannot write: {exc.strerror or exc}") from None


def _emit(text: str, output: str | None) -> None:
    if output:
        _write(output, lambda path: write_file_atomic(path, text))
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (| head): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _run(prog: str, argv: list[str], debug: bool, work: Callable[[], int]) -> int:
    try:
        return work()
    except (ReportInputError, ConfigError, MissingDependencyError, _CannotWrite) as exc:
        # the trace, an option (a bad step pattern, tokens), the environment, or an output path
        return _fail(prog, str(exc))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # anything else is a bug of gpuprobe, and is reported as one
        return _internal_error(prog, argv, exc, debug)


def _gate(fail_on: str | None, findings: list[Any]) -> int:
    worst = at_least(findings, fail_on) if fail_on else []
    if worst:  # a finding that asks nothing of the user (an expected pattern) never fails the gate
        sys.stderr.write(
            f"gpuprobe: {len(worst)} finding(s) at or above {fail_on}: {', '.join(sorted({f.id for f in worst}))}\n"
        )
        return EXIT_FINDINGS
    return EXIT_OK


def main_report(argv: list[str]) -> int:
    """Run ``gpuprobe report``.

    Args:
        argv: Arguments after ``report``.

    Returns:
        The exit status.

    Example:
        >>> main_report(["tests/data/kineto_min.json", "--format", "md", "--sections", "kernels"])  # doctest: +SKIP
        0
    """
    parser = _Parser(
        prog="gpuprobe report",
        description="Report on a PyTorch profiler trace (.json, .json.gz), an Nsight Systems SQLite export or an "
        "Nsight Compute export (CSV of --page raw or details, .ncu-rep).",
    )
    parser.add_argument(
        "trace",
        nargs="+",
        help="trace file; several files, or a directory of them, are the ranks of one run (merged, with a ranks "
        "section)",
    )
    parser.add_argument(
        "--sections",
        type=_sections,
        action="extend",
        metavar="LIST",
        help=f"comma-separated sections to show (default: all): {', '.join(SECTIONS)}",
    )
    parser.add_argument("--plot", metavar="PATH.png", help="also save a PNG: categories and per-step timeline")
    parser.add_argument(
        "--ncu",
        action="append",
        metavar="EXPORT",
        help="an Nsight Compute export (CSV or .ncu-rep) of the same program: each kernel family's share of "
        "GPU time beside its efficiency from ncu (repeatable)",
    )
    parser.add_argument(
        "--by-rank",
        action="store_true",
        help="several ranks: after the merged report, every rank's own report (default: merged only)",
    )
    parser.add_argument(
        "--small-us",
        type=_small_us,
        default=5.0,
        metavar="US",
        help="kernels with a mean below this are small operations (default: 5)",
    )
    _common(parser)
    args = parser.parse_args(argv)
    prog = parser.prog

    def work() -> int:
        shown = list(args.sections or [])
        computed = shown + [s for s in ("categories", "steps") if args.plot and shown and s not in shown]
        if args.fail_on and shown and "findings" not in computed:
            computed.append("findings")  # the gate reads them, shown or not
        if args.ncu and shown and "families" not in computed:
            computed.append("families")  # the join reads them, shown or not
        ncu = [bool(ncu_format(path)) for path in args.trace]
        if all(ncu):
            return _ncu(args, shown)
        if any(ncu):
            raise ConfigError("Nsight Compute exports and timeline traces together: join them with --ncu instead")
        if len(args.trace) > 1 or several_ranks(args.trace[0]):
            if args.ncu:
                raise ConfigError("--ncu joins one trace, not several ranks")
            return _ranks(args, shown)
        if args.by_rank:
            raise ConfigError("--by-rank needs several traces (files, or a directory of them)")
        if not is_local(args.executor):
            raise ConfigError("--executor runs the ranks of several traces (files, or a directory of them), not one")
        progress = _progress(args, os.path.basename(args.trace[0]))
        try:
            report = analyze(
                args.trace[0],
                top=args.top,
                sections=computed,
                step_pattern=args.step_pattern,
                small_us=args.small_us,
                engine=args.engine,
                progress=progress,
                thresholds=[t for t in args.threshold if not t.startswith("ncu.")],
                jobs=args.jobs,
            )
        finally:
            if progress is not None:
                progress.close()
        if args.plot:
            _write(args.plot, lambda path: plot(report, path))
        findings = report.findings or []
        families = report.families
        if shown:
            hidden: dict[str, Any] = {s: None for s in SECTIONS if s != "summary" and s not in shown}
            report = dataclasses.replace(report, **hidden)
        if args.ncu:
            return _ncu(args, shown, report, families, findings)
        _emit(render_report(report, args.format, top=args.top), args.output)
        return _gate(args.fail_on, findings)

    return _run(prog, argv, args.debug, work)


def _ncu(args: argparse.Namespace, shown: list[str], timeline: Any = None, families: Any = None,
         findings: list[Any] | None = None) -> int:
    """An Nsight Compute export alone, or (``--ncu``) joined with a timeline's report."""
    from gpuprobe.report._ncu_analysis import analyze_ncu, join_timeline
    from gpuprobe.report._ncu_render import render_ncu

    if timeline is None:
        if shown or args.plot or args.ncu:
            raise ConfigError("--sections, --plot and --ncu apply to timeline traces, not to an Nsight Compute export")
        report = analyze_ncu(args.trace, thresholds=args.threshold)
        _emit(render_ncu(report, args.format, top=args.top), args.output)
        return _gate(args.fail_on, report.findings)
    if families is not None and len(families.rows) >= args.top:  # maybe cut at --top: every family for the join
        families = analyze(args.trace[0], top=_EVERY_ROW, sections=["families"], step_pattern=args.step_pattern,
                           engine=args.engine).families
    report = join_timeline(analyze_ncu(args.ncu, thresholds=args.threshold), families, timeline.summary.path)
    if args.format == "json":
        text = json.dumps({**timeline.to_dict(), "ncu": report.to_dict()}, indent=1) + "\n"
    else:
        text = render_report(timeline, args.format, top=args.top) + "\n" + render_ncu(report, args.format, top=args.top)
    _emit(text, args.output)
    return _gate(args.fail_on, (findings or []) + report.findings)


class _RankProgress(_Progress):
    """``ranks: 3 of 8 read`` on stderr."""

    def __call__(self, done: int, total: int) -> None:
        self.stream.write(f"\rranks: {done} of {total} read")
        self.stream.flush()
        self.drawn = True


def _ranks(args: argparse.Namespace, shown: list[str]) -> int:
    wanted = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = _RankProgress("ranks", sys.stderr) if wanted else None
    try:
        with open_executor(args.executor) as executor:
            merged, results = analyze_ranks(
                args.trace,
                top=args.top,
                step_pattern=args.step_pattern,
                small_us=args.small_us,
                engine=args.engine,
                jobs=args.jobs,
                thresholds=args.threshold,
                progress=progress,
                executor=executor,
                sections=shown,
            )
    finally:
        if progress is not None:
            progress.close()
    if args.plot:
        _write(args.plot, lambda path: plot(merged, path))
    findings = merged.findings or []

    def visible(report: Any) -> Any:
        if not shown:
            return report
        return dataclasses.replace(report, **{s: None for s in SECTIONS if s != "summary" and s not in shown})

    if not args.by_rank:
        _emit(render_report(visible(merged), args.format, top=args.top), args.output)
        return _gate(args.fail_on, findings)
    if args.format == "json":
        body = {
            "schema": "gpuprobe.report.ranks/1",
            "merged": visible(merged).to_dict(),
            "ranks": [{"rank": r.rank, "path": r.path, "report": visible(r.report).to_dict()} for r in results],
        }
        text = json.dumps(body, indent=1) + "\n"
    else:
        parts = [render_report(visible(merged), args.format, top=args.top)]
        for r in results:
            title = f"Rank {r.rank}: {r.path}"
            if args.format == "md":
                parts.append(f"# {title}\n\n" + render_report(visible(r.report), "md", top=args.top))
            elif args.format == "text":
                text = render_report(visible(r.report), "text", top=args.top)
                parts.append(f"{title}\n{'#' * len(title)}\n\n" + text)
            else:  # csv: each rank's tables, the section column says whose
                rows = render_report(visible(r.report), "csv", top=args.top).splitlines()
                parts.append("\n".join(
                    line if not line or line.startswith("section,") else f"rank{r.rank}:{line}" for line in rows
                ) + "\n")
        text = "\n".join(parts)
    _emit(text, args.output)
    return _gate(args.fail_on, findings)


def main_diff(argv: list[str]) -> int:
    """Run ``gpuprobe diff``.

    Args:
        argv: Arguments after ``diff``.

    Returns:
        The exit status.

    Example:
        >>> main_diff(["a.json.gz", "b.json.gz", "--normalize", "token",  # doctest: +SKIP
        ...            "--tokens-a", "64", "--tokens-b", "64"])
        0
    """
    parser = _Parser(
        prog="gpuprobe diff",
        description="Compare two traces by category, kernel family, range, memory operations and CPU operators.",
    )
    parser.add_argument("a", help="baseline trace (or a directory of rank traces)")
    parser.add_argument("b", help="trace to compare (or a directory of rank traces)")
    parser.add_argument(
        "--normalize",
        choices=NORMALIZE,
        default="step",
        help="divide by steps (default), by generated tokens, or compare totals",
    )
    parser.add_argument("--tokens-a", type=_positive_int, metavar="N", help="tokens generated in A")
    parser.add_argument("--tokens-b", type=_positive_int, metavar="N", help="tokens generated in B")
    _common(parser)
    args = parser.parse_args(argv)
    prog = parser.prog

    def work() -> int:
        ncu = [bool(ncu_format(p)) for p in (args.a, args.b)]
        if all(ncu):
            from gpuprobe.report._ncu_analysis import diff_ncu
            from gpuprobe.report._ncu_render import render_ncu

            _emit(render_ncu(diff_ncu(args.a, args.b, thresholds=args.threshold), args.format, top=args.top),
                  args.output)
            return EXIT_OK
        if any(ncu):
            raise ConfigError("one Nsight Compute export and one timeline trace: diff compares two of a kind")
        if not is_local(args.executor) and not (several_ranks(args.a) or several_ranks(args.b)):
            raise ConfigError("--executor runs the ranks of several traces (a directory of them), not one")
        progress = _progress(args, "traces")
        try:
            with open_executor(args.executor) as executor:
                result = diff(
                    args.a,
                    args.b,
                    normalize=args.normalize,
                    tokens_a=args.tokens_a,
                    tokens_b=args.tokens_b,
                    top=args.top,
                    step_pattern=args.step_pattern,
                    engine=args.engine,
                    progress=progress,
                    thresholds=args.threshold,
                    jobs=args.jobs,
                    executor=executor,
                )
        finally:
            if progress is not None:
                progress.close()
        _emit(render_report(result, args.format, top=args.top), args.output)
        return _gate(args.fail_on, result.findings or [])

    return _run(prog, argv, args.debug, work)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main_report(sys.argv[1:]))
