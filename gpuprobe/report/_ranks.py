"""Reports across ranks: one trace per rank, analysed in parallel (one worker process per trace,
at most ``jobs`` at once), then merged from the per-rank reports alone.

Each worker reads its trace in one streaming pass, as a single-trace report does, and returns the
report and the start of each collective; nothing else of a trace leaves its worker, so memory is
bounded per worker and the merge is cheap. The merged report sums the ranks (per step, per kernel,
per category, ...), adds a ``ranks`` section (per-rank communication, overlap, stragglers, the skew
of collectives across ranks) and the findings that only several ranks show.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pickle
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gpuprobe.errors import ConfigError
from gpuprobe.report._analysis import Options, build_report, small_ns_of
from gpuprobe.report._comm import collective_starts
from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._findings import order, parse_thresholds
from gpuprobe.report._scan import TraceScan
from gpuprobe.report.loaders import gpu_processes, load
from gpuprobe.report.schema import (
    SECTIONS,
    SEVERITIES,
    ApiStat,
    CategoriesSection,
    CategoryStat,
    CpuOpsSection,
    CpuOpStat,
    FamiliesSection,
    FamilyStat,
    Finding,
    IdleRow,
    IdleSection,
    KernelsSection,
    KernelStat,
    LaunchesSection,
    MemOpStat,
    MemorySection,
    RangesSection,
    RangeStat,
    RankRow,
    RanksSection,
    RankStepRow,
    Report,
    SkewRow,
    SmallOpsSection,
    StepRow,
    StepsSection,
    StragglerRow,
    Summary,
)

__all__ = ["RankResult", "analyze_ranks", "rank_files", "rank_units", "several_ranks", "rank_task", "worker_main",
           "TRACE_SUFFIXES"]

#: File names a directory of traces is read for.
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
_ALL = 1_000_000  # rows kept per section in each rank's report: the merge needs them all
T = TypeVar("T")


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
    scan.consume(trace.events())
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
) -> tuple[Report, list[RankResult]]:
    """Analyse the traces of several ranks of one run, in parallel, and merge them.

    Each rank is an independent task. By default the tasks run as local worker processes; pass an
    ``executor`` you already have (a ``concurrent.futures.Executor``: a ``ProcessPoolExecutor``, Dask's
    ``client.get_executor()``, Ray's ``RayExecutor``) to run them there instead. Its workers must import
    the same gpuprobe and read the trace paths as given; only each rank's report travels back.

    Args:
        paths: Trace files, or directories of them.
        top: Rows per table of the merged report.
        step_pattern: As in :func:`gpuprobe.report.analyze`.
        small_us: As in :func:`gpuprobe.report.analyze`.
        engine: As in :func:`gpuprobe.report.analyze`.
        jobs: Worker processes at most (default: the CPU count); 1 reads the traces one by one in
            this process.
        thresholds: As in :func:`gpuprobe.report.analyze`.
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
    options = Options(top=_ALL, step_pattern=step_pattern, small_ns=small_ns_of(small_us), thresholds=limits)
    units = rank_units(files)
    if executor is not None:
        results = _run_on(executor, units, options, engine, progress, top)
    else:
        results = _run_all(units, options, engine, jobs or os.cpu_count() or 1, progress, top)
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
    total = len(units)
    if jobs == 1 or total == 1:
        out = []
        for i, (f, process) in enumerate(units):
            out.append(_work(f, process, options, engine, longest))
            if progress is not None:
                progress(i + 1, total)
        return out
    # One child process per trace (see _WORKER), `jobs` at a time: a worker's
    # memory is one trace's and is returned to the system when it exits; unlike a multiprocessing
    # pool, nothing depends on how the caller's __main__ can be re-imported.
    spec = json.dumps(_task_spec(options, engine, longest))
    done = 0
    lock = threading.Lock()
    # the workers import the same gpuprobe as this process, whatever their working directory holds
    root = str(Path(__file__).resolve().parents[2])

    def one(unit: tuple[str, int | None]) -> RankResult:
        nonlocal done
        path, process = unit
        argv = [sys.executable, "-c", _WORKER, root, path, "" if process is None else str(process), spec]
        proc = subprocess.run(argv, capture_output=True)
        try:
            outcome = pickle.loads(proc.stdout)
        except Exception:
            detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            raise RuntimeError(f"the worker for {path} failed: {detail[0]}") from None
        result = _unpack(path, outcome)
        with lock:
            done += 1
            if progress is not None:
                progress(done, total)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(jobs, total)) as pool:
        return list(pool.map(one, units))


def _run_on(
    executor: concurrent.futures.Executor,
    units: list[tuple[str, int | None]],
    options: Options,
    engine: str,
    progress: Callable[[int, int], None] | None,
    longest: int,
) -> list[RankResult]:
    """Each rank as one task of the caller's executor; results in ``units`` order.

    The tasks get absolute paths (an executor's workers may run elsewhere, in another directory: they
    must see the same files there); the results show the paths as given.
    """
    spec = _task_spec(options, engine, longest)
    futures = {
        executor.submit(rank_task, os.path.abspath(path), process, spec): i for i, (path, process) in enumerate(units)
    }
    out: list[RankResult | None] = [None] * len(units)
    try:
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            i = futures[future]
            path = units[i][0]
            try:
                outcome = future.result()
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
            "thresholds": dict(options.thresholds or {}), "longest": longest}


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
                      thresholds=spec["thresholds"])
    try:
        return ("ok", _work(path, process, options, spec["engine"], spec["longest"]))
    except ReportInputError as exc:
        return ("input", exc.problem)
    except ConfigError as exc:
        return ("config", str(exc))
    except Exception as exc:  # reported by the caller as an internal error
        return ("error", f"{type(exc).__name__}: {exc}")


# A worker: gpuprobe imported from where this process has it, one rank read, its result pickled on
# stdout (named gpuprobe.report._ranks.RankResult, never __main__'s).
_WORKER = (
    "import sys; sys.path.insert(0, sys.argv[1]); from gpuprobe.report._ranks import worker_main; "
    "raise SystemExit(worker_main(sys.argv[2:]))"
)


def worker_main(argv: list[str]) -> int:
    """One rank (``argv``: the trace, its process id or "", the options as JSON), its result pickled on stdout."""
    path, process_text, spec_text = argv
    payload = rank_task(path, int(process_text) if process_text else None, json.loads(spec_text))
    sys.stdout.buffer.write(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    return 0


# ------------------------------------------------------------------------------------- merging


def _merge_by(rows: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _median_int(values: list[int]) -> int:
    return int(round(statistics.median(values)))


def _kernel_stats(reports: list[Report], pick: Callable[[Report], KernelsSection | SmallOpsSection | None], top: int,
                  whole: int) -> tuple[list[KernelStat], int, int, int]:
    rows = [r for rep in reports for r in (pick(rep).rows if pick(rep) is not None else [])]  # type: ignore[union-attr]
    merged = []
    for name, group in _merge_by(rows, lambda r: r.name).items():
        count = sum(g.count for g in group)
        total = sum(g.total_ns for g in group)
        merged.append(
            KernelStat(
                name=name,
                short_name=group[0].short_name,
                category=group[0].category,
                count=count,
                total_ns=total,
                mean_ns=total // count if count else 0,
                median_ns=_median_int([g.median_ns for g in group]),  # the median of the ranks' medians
                min_ns=min(g.min_ns for g in group),
                max_ns=max(g.max_ns for g in group),
                share=total / whole if whole else 0.0,
            )
        )
    merged.sort(key=lambda r: (-r.total_ns, r.name))
    return merged[:top], sum(r.count for r in merged), sum(r.total_ns for r in merged), len(merged)


def merge(results: list[RankResult], source: str, top: int, limits: dict[str, float]) -> Report:
    """The merged report of several ranks: sums over ranks, a ``ranks`` section, and findings."""
    reports = [r.report for r in results]
    summary = _summary(results, source)
    report = Report(summary=summary)
    cats = [c for rep in reports if rep.categories is not None for c in rep.categories.rows]
    cat_total = sum(c.total_ns for c in cats)
    if any(rep.categories is not None for rep in reports):
        rows = []
        for name, group in _merge_by(cats, lambda c: c.category).items():
            total = sum(g.total_ns for g in group)
            rows.append(CategoryStat(category=name, count=sum(g.count for g in group), total_ns=total,
                                     share=total / cat_total if cat_total else 0.0, step_median_ns=None,
                                     step_p10_ns=None, step_p90_ns=None))
        rows.sort(key=lambda r: (-r.total_ns, r.category))
        other = next((r.total_ns for r in rows if r.category == "other"), 0)
        report.categories = CategoriesSection(total_ns=cat_total, other_share=other / cat_total if cat_total else 0.0, rows=rows)
    for section in ("kernels", "non_gemm", "attention"):
        if any(getattr(rep, section) is not None for rep in reports):
            krows, count, total, distinct = _kernel_stats(reports, lambda rep: getattr(rep, section), top, cat_total)
            setattr(report, section, KernelsSection(total_ns=total, count=count, distinct=distinct, rows=krows))
    if any(rep.small_ops is not None for rep in reports):
        smalls = [rep.small_ops for rep in reports if rep.small_ops is not None]
        krows, count, total, _ = _kernel_stats(reports, lambda rep: rep.small_ops, top, cat_total)
        all_kernels = sum(rep.summary.kernel_count for rep in reports)
        report.small_ops = SmallOpsSection(threshold_ns=smalls[0].threshold_ns, count=count,
                                           count_share=count / all_kernels if all_kernels else 0.0, total_ns=total,
                                           time_share=total / cat_total if cat_total else 0.0, rows=krows)
    fams = [f for rep in reports if rep.families is not None for f in rep.families.rows]
    if fams:
        frows = []
        for name, group in _merge_by(fams, lambda f: f.family).items():
            total = sum(g.total_ns for g in group)
            frows.append(FamilyStat(family=name, category=group[0].category, variants=max(g.variants for g in group),
                                    count=sum(g.count for g in group), total_ns=total,
                                    share=total / cat_total if cat_total else 0.0, step_median_ns=None,
                                    step_p10_ns=None, step_p90_ns=None))
        frows.sort(key=lambda r: (-r.total_ns, r.family))
        report.families = FamiliesSection(total_ns=cat_total, rows=frows[:top])
    report.launches = _launches(reports, top)
    mem = [m for rep in reports if rep.memory is not None for m in rep.memory.rows]
    if any(rep.memory is not None for rep in reports):
        mrows = []
        for (kind, direction), group in _merge_by(mem, lambda m: (m.kind, m.direction)).items():
            nbytes, ns = sum(g.bytes for g in group), sum(g.total_ns for g in group)
            mrows.append(MemOpStat(kind=kind, direction=direction, count=sum(g.count for g in group), bytes=nbytes,
                                   total_ns=ns, bandwidth_gbps=nbytes / ns if ns else None))
        mrows.sort(key=lambda r: (-r.total_ns, r.kind, r.direction))
        report.memory = MemorySection(total_bytes=sum(r.bytes for r in mrows), total_ns=sum(r.total_ns for r in mrows),
                                      rows=mrows)
    rngs = [r for rep in reports if rep.ranges is not None for r in rep.ranges.rows]
    if any(rep.ranges is not None for rep in reports):
        rrows = []
        for path, group in _merge_by(rngs, lambda r: r.path).items():
            def total(field: str) -> int | None:
                vals = [getattr(g, field) for g in group if getattr(g, field) is not None]
                return sum(vals) if vals else None
            rrows.append(RangeStat(path=path, name=group[0].name, depth=group[0].depth,
                                   count=sum(g.count for g in group), cpu_ns=sum(g.cpu_ns for g in group),
                                   gpu_busy_ns=total("gpu_busy_ns"), kernel_ns=total("kernel_ns"),
                                   gpu_span_ns=total("gpu_span_ns"), launches=sum(g.launches for g in group),
                                   gpu_ops=sum(g.gpu_ops for g in group)))
        report.ranges = RangesSection(distinct=len(rrows), rows=rrows)
    report.steps = _steps(reports)
    ops = [o for rep in reports if rep.cpu_ops is not None for o in rep.cpu_ops.rows]
    if any(rep.cpu_ops is not None for rep in reports):
        orows = []
        for name, group in _merge_by(ops, lambda o: o.name).items():
            count, total_ns = sum(g.count for g in group), sum(g.total_ns for g in group)
            orows.append(CpuOpStat(name=name, count=count, total_ns=total_ns, mean_ns=total_ns // count if count else 0,
                                   max_ns=max(g.max_ns for g in group)))
        orows.sort(key=lambda r: (-r.total_ns, r.name))
        report.cpu_ops = CpuOpsSection(count=sum(rep.cpu_ops.count for rep in reports if rep.cpu_ops is not None),
                                       rows=orows[:top])
    idles = [rep.idle for rep in reports if rep.idle is not None]
    if idles:
        irows = []
        for index, group in _merge_by([r for i in idles for r in i.rows], lambda r: r.index).items():
            irows.append(IdleRow(index=index, **{f: sum(getattr(g, f) for g in group) for f in (
                "window_ns", "busy_ns", "idle_launch_ns", "idle_sync_ns", "idle_other_ns")}))
        irows.sort(key=lambda r: r.index)
        report.idle = IdleSection(scope=idles[0].scope, rows=irows, **{f: sum(getattr(i, f) for i in idles) for f in (
            "window_ns", "busy_ns", "idle_launch_ns", "idle_sync_ns", "idle_other_ns")})
    report.ranks = _ranks_section(results, source)
    report.findings = order(_merged_findings(results) + _rank_findings(report.ranks, limits))
    return report


def _summary(results: list[RankResult], source: str) -> Summary:
    s = [r.report.summary for r in results]
    events: dict[str, int] = {}
    for x in s:
        for k, v in x.events.items():
            events[k] = events.get(k, 0) + v

    def known_sum(field: str) -> int | None:
        vals = [getattr(x, field) for x in s if getattr(x, field) is not None]
        return sum(vals) if vals else None

    span = max(x.span_ns for x in s)
    busy = known_sum("gpu_busy_ns")
    paths = sorted({os.path.dirname(r.path) or "." for r in results})
    return Summary(
        path=f"{len(results)} ranks in {', '.join(paths)} (ranks from {source})",
        source=s[0].source,
        devices=sorted({d for x in s for d in x.devices}),
        base_time_ns=min((x.base_time_ns for x in s if x.base_time_ns is not None), default=None),
        span_ns=span,
        events=dict(sorted(events.items())),
        skipped_events=sum(x.skipped_events for x in s),
        kernel_count=sum(x.kernel_count for x in s),
        kernel_ns=known_sum("kernel_ns"),
        gpu_op_count=sum(x.gpu_op_count for x in s),
        gpu_busy_ns=busy,
        gpu_busy_share=busy / (span * len(s)) if busy is not None and span else None,
        launch_count=sum(x.launch_count for x in s),
        launch_api_ns=sum(x.launch_api_ns for x in s),
        step_count=max(x.step_count for x in s),
        warnings=[f"rank {r.rank}: {w}" for r in results for w in r.report.summary.warnings],
    )


def _launches(reports: list[Report], top: int) -> LaunchesSection | None:
    ls = [rep.launches for rep in reports if rep.launches is not None]
    if not ls:
        return None
    apis = []
    for name, group in _merge_by([a for x in ls for a in x.apis], lambda a: a.name).items():
        count, total = sum(g.count for g in group), sum(g.total_ns for g in group)
        apis.append(ApiStat(name=name, kind=group[0].kind, count=count, total_ns=total,
                            mean_ns=total // count if count else 0, max_ns=max(g.max_ns for g in group)))
    apis.sort(key=lambda a: (-a.total_ns, a.name))
    delays = [x for x in ls if x.delay_count]
    dcount = sum(x.delay_count for x in delays)

    def med(field: str) -> int | None:
        vals = [getattr(x, field) for x in delays if getattr(x, field) is not None]
        return _median_int(vals) if vals else None

    per_step = [x.per_step_median for x in ls if x.per_step_median is not None]
    return LaunchesSection(
        launch_count=sum(x.launch_count for x in ls),
        api_ns=sum(x.api_ns for x in ls),
        sync_count=sum(x.sync_count for x in ls),
        sync_ns=sum(x.sync_ns for x in ls),
        per_step_median=sum(per_step) if per_step else None,  # all ranks' launches per step, together
        delay_count=dcount,
        delay_mean_ns=sum((x.delay_mean_ns or 0) * x.delay_count for x in delays) // dcount if dcount else None,
        delay_median_ns=med("delay_median_ns"),
        delay_p90_ns=med("delay_p90_ns"),
        delay_max_ns=max((x.delay_max_ns for x in delays if x.delay_max_ns is not None), default=None),
        launches_without_gpu_op=sum(x.launches_without_gpu_op for x in ls),
        gpu_ops_without_launch=sum(x.gpu_ops_without_launch for x in ls),
        apis=apis[:top],
    )


def _steps(reports: list[Report]) -> StepsSection | None:
    """Steps side by side: step *i* of the merged report sums step *i* of every rank."""
    sections = [rep.steps for rep in reports if rep.steps is not None]
    if not sections:
        return None
    rows = []
    for index, group in sorted(_merge_by([r for s in sections for r in s.rows], lambda r: r.index).items()):
        def total(field: str) -> int | None:
            vals = [getattr(g, field) for g in group if getattr(g, field) is not None]
            return sum(vals) if vals else None
        cats: dict[str, int] = {}
        for g in group:
            for k, v in g.categories.items():
                cats[k] = cats.get(k, 0) + v
        rows.append(StepRow(index=index, name=group[0].name, phase=group[0].phase, start_ns=min(g.start_ns for g in group),
                            cpu_ns=sum(g.cpu_ns for g in group), gpu_busy_ns=total("gpu_busy_ns"),
                            gpu_span_ns=total("gpu_span_ns"), kernel_ns=total("kernel_ns"),
                            kernels=sum(g.kernels for g in group), launches=sum(g.launches for g in group),
                            launch_api_ns=sum(g.launch_api_ns for g in group), sync_ns=sum(g.sync_ns for g in group),
                            memcpy_bytes=sum(g.memcpy_bytes for g in group), categories=cats))

    def spread(values: list[int]) -> tuple[int | None, int | None, int | None]:
        if not values:
            return None, None, None
        q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
        return int(round(q[0])), _median_int(values), int(round(q[-1]))

    cpu = spread([r.cpu_ns for r in rows])
    gpu = spread([r.gpu_busy_ns for r in rows if r.gpu_busy_ns is not None])
    launches = [r.launches for r in rows]
    return StepsSection(pattern=sections[0].pattern, count=len(rows), cpu_median_ns=cpu[1], cpu_p10_ns=cpu[0],
                        cpu_p90_ns=cpu[2], gpu_busy_median_ns=gpu[1], gpu_busy_p10_ns=gpu[0], gpu_busy_p90_ns=gpu[2],
                        launches_median=statistics.median(launches) if launches else None, rows=rows)


def _ranks_section(results: list[RankResult], source: str) -> RanksSection:
    rows = []
    step_rows = []
    for r in results:
        rep = r.report
        comm = rep.communication
        steps = rep.steps.rows if rep.steps is not None else []
        rows.append(RankRow(
            rank=r.rank,  # type: ignore[arg-type]
            path=r.path,
            kernel_ns=rep.summary.kernel_ns,
            communication_ns=comm.communication_ns if comm is not None else 0,
            overlap_ns=comm.overlap_ns if comm is not None else 0,
            exposed_communication_ns=comm.exposed_ns if comm is not None else 0,
            busy_ns=rep.summary.gpu_busy_ns,
            span_ns=rep.summary.span_ns,
            launches=rep.summary.launch_count,
            steps=len(steps),
            step_median_ns=_median_int([s.cpu_ns for s in steps]) if steps else None,
        ))
        comm_rows = {c.index: c for c in comm.rows} if comm is not None else {}
        for s in steps:
            c = comm_rows.get(s.index)
            step_rows.append(RankStepRow(
                rank=r.rank,  # type: ignore[arg-type]
                index=s.index,
                cpu_ns=s.cpu_ns,
                gpu_busy_ns=s.gpu_busy_ns,
                communication_ns=c.communication_ns if c else 0,
                overlap_ns=c.overlap_ns if c else 0,
                exposed_communication_ns=c.exposed_ns if c else 0,
            ))
    return RanksSection(source=source, count=len(results), rows=rows, steps=step_rows,
                        stragglers=_stragglers(results), skew=_skew(results))


def _stragglers(results: list[RankResult]) -> list[StragglerRow]:
    """Per step: the slowest rank against the median, and the category that explains the gap."""
    by_index: dict[int, list[tuple[int, StepRow]]] = {}
    for r in results:
        for s in (r.report.steps.rows if r.report.steps is not None else []):
            by_index.setdefault(s.index, []).append((r.rank, s))  # type: ignore[arg-type]
    out = []
    for index in sorted(by_index):
        group = by_index[index]
        if len(group) < 2:
            continue
        times = [s.cpu_ns for _, s in group]
        median = statistics.median(times)
        rank, slow = max(group, key=lambda rs: (rs[1].cpu_ns, -rs[0]))
        category, excess = None, 0
        cats = {c for _, s in group for c in s.categories}
        for c in sorted(cats):
            gap = slow.categories.get(c, 0) - statistics.median([s.categories.get(c, 0) for _, s in group])
            if gap > excess:
                category, excess = c, int(gap)
        out.append(StragglerRow(index=index, slowest_rank=rank, slowest_ns=slow.cpu_ns, median_ns=int(round(median)),
                                excess_ns=int(round(slow.cpu_ns - median)), category=category,
                                category_excess_ns=excess))
    return out


def _skew(results: list[RankResult]) -> list[SkewRow]:
    """Per collective family: how far apart the ranks start the same collective (the k-th of the family
    on each rank), on the traces' clocks (one node, or synchronized clocks)."""
    families = sorted({f for r in results for f in r.collectives})
    out = []
    for fam in families:
        lists = [(r.rank, r.collectives.get(fam, [])) for r in results]
        n = min(len(starts) for _, starts in lists)
        if n == 0 or len(lists) < 2:
            continue
        skews = []
        last: dict[int, int] = {}
        for k in range(n):
            starts = [(starts[k], rank) for rank, starts in lists]
            skews.append(max(starts)[0] - min(starts)[0])
            late = max(starts)[1]
            last[late] = last.get(late, 0) + 1
        worst = max(last.items(), key=lambda kv: (kv[1], -kv[0]))
        out.append(SkewRow(family=fam, occurrences=n, median_skew_ns=_median_int(skews), max_skew_ns=max(skews),
                           last_rank=worst[0], last_rank_share=worst[1] / n))
    out.sort(key=lambda r: (-r.median_skew_ns, r.family))
    return out


def _merged_findings(results: list[RankResult]) -> list[Finding]:
    """One finding per rule across ranks: the worst rank's, with the ranks that show it."""
    out = []
    by_id = _merge_by([(r.rank, f) for r in results for f in (r.report.findings or [])], lambda rf: rf[1].id)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    for rule, group in by_id.items():
        worst_rank, worst = max(group, key=lambda rf: (rank[rf[1].severity], rf[1].evidence.get("at_stake_ns", 0)))
        ranks = sorted(r for r, _ in group)
        evidence = {**worst.evidence, "at_stake_ns": sum(f.evidence.get("at_stake_ns", 0) for _, f in group),
                    "ranks": ranks, "worst_rank": worst_rank}
        title = f"{worst.title} (rank {worst_rank}; on {len(ranks)} of {len(results)} ranks)"
        out.append(Finding(id=rule, severity=worst.severity, title=title, evidence=evidence, remedy=worst.remedy))
    return out


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
        median = statistics.median([t for t, _ in timed])
        slow_ns, slow = max(timed, key=lambda tr: (tr[0], -tr[1].rank))
        ratio = slow_ns / median if median else 1.0
        if ratio >= t["straggler.ratio"]:
            cats: dict[str, int] = {}
            for s in ranks.stragglers:
                if s.slowest_rank == slow.rank and s.category:
                    cats[s.category] = cats.get(s.category, 0) + 1
            out.append(Finding(
                id="straggler",
                severity="warning",
                title=f"Rank {slow.rank} is a straggler: its steps take {ratio:.2f}x the median rank's",
                evidence={"at_stake_ns": int((slow_ns - median) * slow.steps),
                          "rank": slow.rank, "step_median_ns": slow_ns, "median_of_ranks_ns": int(median),
                          "ratio": ratio, "explained_by": dict(sorted(cats.items(), key=lambda kv: -kv[1]))},
                remedy="Compare this rank's report with another's (gpuprobe diff): uneven work (data, sequence lengths, "
                       "expert routing), a slower device or link, or host contention on its node.",
            ))
    return out

