"""Reports across ranks: one trace per rank, analysed in parallel, then merged from the per-rank
reports alone.

Each rank's trace is read in one streaming pass, as a single-trace report does, and gives the report
and the start of each collective; nothing else of a trace leaves its reader, so memory is bounded per
reader and the merge is cheap. Where the ranks are read (:func:`analyze_ranks`): all in this process when
their text is small in all (:data:`IN_PROCESS_BYTES`), else by a pool of at most ``jobs`` worker
processes, each reading one rank after another. The merged report sums the ranks (per step, per kernel,
per category, ...), adds a ``ranks`` section (per-rank communication, overlap, stragglers, the skew of
collectives across ranks) and the findings that only several ranks show.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuprobe._stats import median
from gpuprobe.errors import ConfigError
from gpuprobe.report._analysis import build_report, small_ns_of
from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._executors import IsolatedProcessPool, WorkerFailed, usable_cpus
from gpuprobe.report._findings import order, parse_thresholds
from gpuprobe.report._scan import TraceScan
from gpuprobe.report._section import MergeContext, Options
from gpuprobe.report.loaders import gpu_processes, load
from gpuprobe.report.schema import Finding, RanksSection, Report
from gpuprobe.report.sections import BY_NAME, DEFAULT_SECTIONS, REGISTRY
from gpuprobe.report.sections.communication import collective_starts

__all__ = ["RankResult", "analyze_ranks", "rank_files", "rank_units", "several_ranks", "rank_task", "text_bytes",
           "TRACE_SUFFIXES", "IN_PROCESS_BYTES", "RECYCLE_BYTES"]

#: File names a directory of traces is read for.
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
_ALL = 1_000_000  # rows kept per section in each rank's report: the merge needs them all
#: Ranks of fewer bytes of text than this in all (:func:`text_bytes`) are read in this process, one after
#: another. Why: a worker process costs about 0.3 s of CPU to start (gpuprobe's imports), which reading
#: side by side saves only past about 10 MB on two CPUs (16 ranks of 1 MB: 1.0 s of CPU here, 1.6 s
#: through two workers; 1,000 ranks of 12 KB: 1.7 s here, where one fresh process per rank cost 0.37 s
#: of CPU each).
IN_PROCESS_BYTES = 16 << 20
#: A worker process that has read a trace of this many bytes of text or more exits after it (a fresh one
#: takes its place), so that the memory of a large trace goes back to the system once it is read.
RECYCLE_BYTES = 64 << 20


@dataclasses.dataclass
class RankResult:
    """What one worker returns: the rank's report, and the start of each of its collectives."""

    rank: int  # from the trace (see rank_source); -1 until the file order gives one
    path: str
    report: Report
    collectives: dict[str, list[int]]
    rank_source: str | None = None  # "distributedInfo.rank" (kineto), "RANK" (nsys's environment), None


def rank_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The trace files named: a directory stands for its trace files (sorted by name).

    Raises:
        ReportInputError: A path that does not exist, or a directory without traces.

    Example:
        >>> [p.name for p in rank_files(["tests/data/kineto/param_dlrm_8rank"])][:2]  # doctest: +SKIP
        ['rank-0.json.gz', 'rank-1.json.gz']
    """
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise ReportInputError(str(path), f"no trace files ({', '.join(TRACE_SUFFIXES)}) in this directory")
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            raise ReportInputError(str(path), "no such file or directory")
    return out


def rank_units(files: Sequence[str | os.PathLike[str]]) -> list[tuple[str, int | None]]:
    """The ranks in ``files``: ``(path, None)`` per trace, or ``(path, process id)`` for each process
    that ran kernels in an Nsight Systems export that holds several (``nsys profile torchrun ...``)."""
    out: list[tuple[str, int | None]] = []
    for f in files:
        processes = gpu_processes(f)
        if len(processes) > 1:
            out.extend((os.fspath(f), p) for p in processes)
        else:
            out.append((os.fspath(f), None))
    return out


def several_ranks(path: str | os.PathLike[str]) -> bool:
    """Whether one path holds several ranks: a directory, or an nsys export of several processes."""
    return os.path.isdir(path) or len(gpu_processes(path)) > 1


def _work(path: str, process: int | None, options: Options, engine: str, longest: int) -> RankResult:
    """One rank, in a worker process: the report and the collectives' starts.

    Every table keeps all its rows (the merge needs them), except the timeline: ``longest`` events.
    """
    trace = load(path, engine=engine, process=process)
    scan = TraceScan(correlation_by_process=trace.info.correlation_by_process, keep_longest=longest)
    # why: the merge keeps the `longest` events of all ranks; listing every GPU operation of the rank
    # (150,000 on a 200 MB trace) cost 0.5 s of its ~7 s
    options = dataclasses.replace(options, timeline_top=longest)
    trace.feed(scan)
    report = build_report(scan, options, trace.path, trace.info)
    gpu_names = list(scan.gpu_names)
    from gpuprobe._kernel_names import categorize_kernel

    comm = {i for i, n in enumerate(gpu_names) if categorize_kernel(n) == "communication"}
    rank = trace.info.rank if trace.info.rank is not None else -1
    shown = trace.path if process is None else f"{trace.path} (process {process})"
    return RankResult(rank=rank, path=shown, report=report, collectives=collective_starts(scan, gpu_names, comm),
                      rank_source=trace.info.rank_source)


_RANK_SOURCES = {"distributedInfo.rank": "distributedInfo.rank", "RANK": "RANK in the environment nsys recorded"}


def analyze_ranks(
    paths: Sequence[str | os.PathLike[str]],
    *,
    top: int = 20,
    step_pattern: str | None = None,
    small_us: float = 5.0,
    engine: str = "auto",
    jobs: int | None = None,
    thresholds: Any = None,
    progress: Callable[[int, int], None] | None = None,
    executor: concurrent.futures.Executor | None = None,
    sections: Sequence[str] = (),
) -> tuple[Report, list[RankResult]]:
    """Analyse the traces of several ranks of one run, in parallel, and merge them.

    Each rank is an independent task. By default the tasks run in a pool of local worker processes,
    each reading one rank after another (or all in this process, when the ranks hold less than
    :data:`IN_PROCESS_BYTES` of text in all: the same report either way); pass an
    ``executor`` you already have (a ``concurrent.futures.Executor``: a ``ProcessPoolExecutor``, Dask's
    ``client.get_executor()``, Ray's ``RayExecutor``) to run them there instead. Its workers must import
    the same gpuprobe and read the trace paths as given; only each rank's report travels back.

    Args:
        paths: Trace files, or directories of them.
        top: Rows per table of the merged report.
        step_pattern: As in :func:`gpuprobe.report.analyze`.
        small_us: As in :func:`gpuprobe.report.analyze`.
        engine: As in :func:`gpuprobe.report.analyze`.
        jobs: Worker processes at most (default: the CPUs this process may use); 1 reads the traces
            one by one in this process.
        thresholds: As in :func:`gpuprobe.report.analyze`.
        sections: Sections computed besides the default ones (those shown only when asked for, such
            as ``streams``); every rank computes the default sections, which the merge reads.
        progress: Called with ``(ranks done, ranks)``.
        executor: Run each rank as a task of this executor instead of a local worker process (then
            ``jobs`` does not apply). gpuprobe neither starts nor shuts it down.

    Returns:
        The merged report, and each rank's result in rank order.

    Raises:
        ReportInputError: A trace cannot be read (its path is in the message).
        ConfigError: Bad options, or two traces that claim the same rank.

    Example:
        >>> from concurrent.futures import ProcessPoolExecutor
        >>> with ProcessPoolExecutor(4) as pool:  # doctest: +SKIP
        ...     merged, ranks = analyze_ranks(["traces/"], executor=pool)
    """
    files = rank_files(paths)
    if jobs is not None and jobs < 1:
        raise ConfigError(f"jobs must be at least 1, not {jobs}")
    if executor is not None and jobs is not None:
        raise ConfigError("jobs and executor exclude each other: the executor decides how many ranks run at once")
    if executor is not None and not isinstance(executor, concurrent.futures.Executor):
        raise ConfigError(f"executor must be a concurrent.futures.Executor, not {type(executor).__name__}")
    limits = parse_thresholds(thresholds if not isinstance(thresholds, str) else [thresholds])
    unknown = [s for s in sections if s not in BY_NAME]
    if unknown:
        raise ConfigError(f"unknown section {unknown[0]!r}; choose from {', '.join(BY_NAME)}")
    extra = tuple(s for s in sections if s not in DEFAULT_SECTIONS)
    options = Options(top=_ALL, step_pattern=step_pattern, small_ns=small_ns_of(small_us), thresholds=limits,
                      sections=DEFAULT_SECTIONS + extra if extra else ())
    units = rank_units(files)
    if executor is not None:
        results = _run_on(executor, units, options, engine, progress, top)
    else:
        results = _run_all(units, options, engine, jobs or usable_cpus(), progress, top)
    sources = sorted({r.rank_source for r in results if r.rank_source is not None})
    source = " and ".join(_RANK_SOURCES.get(s, s) for s in sources)
    ranks = [r.rank for r in results]
    if any(r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
        if all(r >= 0 for r in ranks):
            dup = sorted({r for r in ranks if ranks.count(r) > 1})
            raise ConfigError(f"several traces claim rank {dup[0]}: {', '.join(r.path for r in results if r.rank == dup[0])}")
        source = "file order" if len(units) == len(files) else "file and process order"
        for i, r in enumerate(results):
            r.rank = i
    results.sort(key=lambda r: r.rank)
    return merge(results, source, top, limits), results


def _run_all(
    units: list[tuple[str, int | None]],
    options: Options,
    engine: str,
    jobs: int,
    progress: Callable[[int, int], None] | None,
    longest: int,
) -> list[RankResult]:
    """Every rank, in ``units`` order: here one after another when that is as fast (one job, one rank, or
    less than :data:`IN_PROCESS_BYTES` of text in all), else by a pool of isolated worker processes, each
    reading ranks one after another, the largest first (so that one of them does not start last and run
    alone); a worker that read :data:`RECYCLE_BYTES` of text or more is replaced by a fresh one."""
    total = len(units)
    sizes = [] if jobs == 1 or total == 1 else [text_bytes(path) for path, _ in units]
    if not sizes or sum(sizes) < IN_PROCESS_BYTES:
        out = []
        for i, (f, process) in enumerate(units):
            out.append(_work(f, process, options, engine, longest))
            if progress is not None:
                progress(i + 1, total)
        return out
    size_of = {os.path.abspath(path): size for (path, _), size in zip(units, sizes)}

    def retire(path: str, process: int | None, spec: dict[str, Any]) -> bool:
        return size_of.get(path, 0) >= RECYCLE_BYTES

    pool = IsolatedProcessPool(min(jobs, total), retire=retire)
    try:
        results = _run_on(pool, units, options, engine, progress, longest,
                          submit_order=sorted(range(total), key=lambda i: -sizes[i]))
    except BaseException:  # a rank's error, or interrupted (^C): no worker outlives the report
        pool.terminate()
        raise
    pool.shutdown()
    return results


def text_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes of text a trace holds, what reading it costs: a gzip file's uncompressed size (as its
    trailer records it, modulo 4 GiB: the larger of that and the file's), else the file's size; 0 for a
    file that cannot be read (its error is said when it is read)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 18 or f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, os.SEEK_END)
            (isize,) = struct.unpack("<I", f.read(4))
            return max(size, isize)
    except (OSError, ValueError):
        return 0


def _run_on(
    executor: concurrent.futures.Executor,
    units: list[tuple[str, int | None]],
    options: Options,
    engine: str,
    progress: Callable[[int, int], None] | None,
    longest: int,
    submit_order: Sequence[int] | None = None,
) -> list[RankResult]:
    """Each rank as one task of ``executor`` (submitted in ``submit_order``, indexes of ``units``; else in turn);
    results in ``units`` order.

    The tasks get absolute paths (an executor's workers may run elsewhere, in another directory: they
    must see the same files there); the results show the paths as given.
    """
    spec = _task_spec(options, engine, longest)
    futures = {}
    for i in submit_order if submit_order is not None else range(len(units)):
        path, process = units[i]
        futures[executor.submit(rank_task, os.path.abspath(path), process, spec)] = i
    out: list[RankResult | None] = [None] * len(units)
    try:
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            i = futures[future]
            path = units[i][0]
            try:
                outcome = future.result()
            except WorkerFailed as exc:  # one of gpuprobe's own workers ended (killed, out of memory)
                raise RuntimeError(f"the worker for {path} failed: {exc}") from None
            except Exception as exc:  # rank_task returns every error of its own: this is the executor's
                detail = " ".join(str(exc).split())[:300]
                raise ConfigError(
                    f"the executor could not run the rank of {path} ({type(exc).__name__}: {detail}); its workers "
                    "must import gpuprobe and read the trace at the same path"
                ) from None
            out[i] = _as_given(_unpack(path, outcome), os.path.abspath(path), path)
            if progress is not None:
                progress(done, len(units))
    finally:
        for future in futures:
            future.cancel()  # after a failure, the ranks not yet started are not run for nothing
    return [r for r in out if r is not None]


def _as_given(result: RankResult, absolute: str, given: str) -> RankResult:
    """A task's result with the trace's path as the caller gave it (the task read it by its absolute path)."""
    if absolute != given:
        result.path = result.path.replace(absolute, given, 1)
        result.report.summary.path = result.report.summary.path.replace(absolute, given, 1)
    return result


def _task_spec(options: Options, engine: str, longest: int) -> dict[str, Any]:
    """What a rank's task needs besides its trace: plain data, so it travels as JSON or pickle."""
    return {"engine": engine, "top": options.top, "step_pattern": options.step_pattern, "small_ns": options.small_ns,
            "thresholds": dict(options.thresholds or {}), "longest": longest, "sections": list(options.sections)}


def _unpack(path: str, outcome: tuple[str, Any]) -> RankResult:
    """A task's ``(status, payload)`` as its result, or the error it stands for."""
    status, payload = outcome
    if status == "input":
        raise ReportInputError(path, payload)
    if status == "config":
        raise ConfigError(payload)
    if status == "error":
        raise RuntimeError(f"the worker for {path} failed: {payload}")
    return payload  # type: ignore[no-any-return]


def rank_task(path: str, process: int | None, spec: dict[str, Any]) -> tuple[str, Any]:
    """One rank as a task (of a worker process or an executor): ``("ok", RankResult)`` or the error's kind
    and text — plain values, so no exception class needs to unpickle on the caller's side."""
    options = Options(top=spec["top"], step_pattern=spec["step_pattern"], small_ns=spec["small_ns"],
                      thresholds=spec["thresholds"], sections=tuple(spec.get("sections", ())))
    try:
        return ("ok", _work(path, process, options, spec["engine"], spec["longest"]))
    except ReportInputError as exc:
        return ("input", exc.problem)
    except ConfigError as exc:
        return ("config", str(exc))
    except Exception as exc:  # reported by the caller as an internal error
        return ("error", f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------------- merging


def merge(results: list[RankResult], source: str, top: int, limits: dict[str, float]) -> Report:
    """The merged report of several ranks: each section merged by its own ``merge``, a ``ranks``
    section, and the findings of every rank (the worst of each rule) with those only several ranks show."""
    mctx = MergeContext(results, source, top)
    report = Report(**{s.name: s.merge(mctx) for s in REGISTRY if s.merge is not None})
    ranks = report.ranks
    report.findings = order((report.findings or []) + (_rank_findings(ranks, limits) if ranks is not None else []))
    return report


def _rank_findings(ranks: RanksSection, t: dict[str, float]) -> list[Finding]:
    out = []
    rows = [r for r in ranks.rows if r.communication_ns]
    if rows:
        exposed = sum(r.exposed_communication_ns for r in rows)
        busy = sum(r.busy_ns or 0 for r in rows)
        share = exposed / (busy + exposed - sum(r.overlap_ns for r in rows) or 1)
        if share >= t["exposed_communication.share"]:
            out.append(Finding(
                id="exposed_communication",
                severity="critical" if share >= t["exposed_communication.critical_share"] else "warning",
                title=f"Communication is exposed: {exposed / 1e6:.3f} ms across ranks runs with no computation beside it "
                      f"({share * 100:.0f} % of GPU time)",
                evidence={"at_stake_ns": exposed, "exposed_ns": exposed, "share": share,
                          "communication_ns": sum(r.communication_ns for r in rows),
                          "overlap_ns": sum(r.overlap_ns for r in rows),
                          "per_rank": {str(r.rank): r.exposed_communication_ns for r in rows}},
                remedy="Overlap communication with computation: DDP bucketing (bucket_cap_mb) and gradient-as-bucket-view, "
                       "FSDP prefetching, asynchronous collectives issued before the compute that does not need them; "
                       "fewer, larger collectives; check the interconnect (NVLink/xGMI vs PCIe).",
            ))
    timed = [(r.step_median_ns, r) for r in ranks.rows if r.step_median_ns]
    if len(timed) >= 2:
        middle = median([t for t, _ in timed])
        slow_ns, slow = max(timed, key=lambda tr: (tr[0], -tr[1].rank))
        ratio = slow_ns / middle if middle else 1.0
        if ratio >= t["straggler.ratio"]:
            cats: dict[str, int] = {}
            for s in ranks.stragglers:
                if s.slowest_rank == slow.rank and s.category:
                    cats[s.category] = cats.get(s.category, 0) + 1
            out.append(Finding(
                id="straggler",
                severity="warning",
                title=f"Rank {slow.rank} is a straggler: its steps take {ratio:.2f}x the median rank's",
                evidence={"at_stake_ns": int((slow_ns - middle) * slow.steps),
                          "rank": slow.rank, "step_median_ns": slow_ns, "median_of_ranks_ns": int(middle),
                          "ratio": ratio, "explained_by": dict(sorted(cats.items(), key=lambda kv: -kv[1]))},
                remedy="Compare this rank's report with another's (gpuprobe diff): uneven work (data, sequence lengths, "
                       "expert routing), a slower device or link, or host contention on its node.",
            ))
    return out

