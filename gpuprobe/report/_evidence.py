"""Evidence for the findings: where syncs happen, what concatenation costs per step, graph replays,
copies from pageable memory; computed once from a finished scan and its columns. (The idle and FLOPs
figures the rules also read are report sections: :mod:`gpuprobe.report.sections`.)

Everything here is interval arithmetic over the columns of :class:`~gpuprobe.report._scan.TraceScan`
in plain Python, per step: the loops run over the GPU operations, sync calls and CPU operators of
the steps, once each.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpuprobe._kernel_names import CATEGORIES, CONCAT_OPS, WOULD_SYNC_OPS, short_kernel_name
from gpuprobe._stats import quantile
from gpuprobe.report._columns import merge_intervals
from gpuprobe.report._scan import GpuOpKind, TraceScan
from gpuprobe.report._section import Columns, StepSpan

__all__ = [
    "StepSpan",
    "SyncEvidence",
    "ConcatEvidence",
    "LaunchEvidence",
    "Evidence",
    "GENERATE_LOOP",
    "STOP_CHECK",
    "STOP_CHECK_FUNCTION",
    "STOPPING_CRITERION",
    "sync_role",
    "gather",
    "float_median",
    "innermost",
    "is_concat_kernel",
    "CONCAT_OPS",
    "FUSED_ATTENTION_OPS",
    "SOFTMAX_OPS",
    "BMM_OPS",
]

#: CPU operators of fused attention.
FUSED_ATTENTION_OPS = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
        "aten::_fused_sdp_choice",
    }
)
SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
BMM_OPS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm"})
_CONCAT_KERNEL = re.compile(r"catarray|(?:^|_)cat(?:_|\d|$)")
_KERNEL = GpuOpKind.KERNEL.value


def is_concat_kernel(name: str) -> bool:
    """Whether a kernel concatenates tensors (``CatArrayBatchedCopy``, Triton ``..._fused_cat_...``).

    Example:
        >>> is_concat_kernel("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>()")
        True
        >>> is_concat_kernel("triton_poi_fused_cat_0"), is_concat_kernel("ampere_sgemm_128x64_nn")
        (True, False)
    """
    return bool(_CONCAT_KERNEL.search(short_kernel_name(name).lower()))


#: Where a launch or sync sits when its innermost range is a gpuprobe step itself: between the
#: step's component ranges (forward, processors, stopping criteria, streamer), in generate's loop.
GENERATE_LOOP = "the generate loop"
#: The role of generate's once-per-step stopping check (see :data:`STOP_CHECK_FUNCTION`).
STOP_CHECK = "stop_check"
#: What transformers runs there: ``StopCheck.__call__`` in ``transformers/generation/utils.py``.
STOP_CHECK_FUNCTION = "transformers StopCheck: bool(unfinished_sequences.max() == 0)"
#: The role of a sync inside a stopping criterion's range (``stopping_criteria/<class>``).
STOPPING_CRITERION = "stopping_criterion"
_STEP_RANGE = "gpuprobe.step"
_BOOL_OPS = frozenset({"aten::is_nonzero"})  # bool(tensor): what the stopping check calls
_NO_OPERATOR = "(no operator)"
_IN_PLACE_CACHE_OPS = frozenset({"aten::index_copy_", "aten::index_copy"})  # StaticCache.update
_IN_PLACE_KERNEL = "index_copy"  # in kernel names: Triton's fused index_copy_ of a static cache


class SyncEvidence:
    """Host syncs (GPU traces) or operators that would sync on a GPU (CPU traces).

    Attributes:
        calls: Sync API calls (or would-sync operators) in the whole trace.
        blocked_ns: Time the host spent in them.
        per_step: Per step, how many (empty without steps).
        stop_check_per_step: Per step, how many of them are generate's stopping check.
        by_api: Calls by API (or operator) name.
        offenders: ``(operator, place) -> [count, blocked ns]``; the place is the range path
            below the step (``stopping_criteria/MyCriterion``), :data:`GENERATE_LOOP` for a sync
            directly in a gpuprobe step, or the innermost range's name outside steps.
        roles: ``(operator, place) -> role`` where one is known (:data:`STOP_CHECK`,
            :data:`STOPPING_CRITERION`).
        gpu_idle_ns: Time some host thread is in a sync and no GPU operation of the trace runs
            (any launch, any stream): what the syncs cost the GPU, unlike ``blocked_ns``, which
            counts the waits for work the GPU is doing.
    """

    __slots__ = (
        "calls", "blocked_ns", "gpu_idle_ns", "per_step", "stop_check_per_step", "by_api", "offenders", "roles"
    )

    def __init__(self) -> None:
        self.calls = 0
        self.blocked_ns = 0
        self.gpu_idle_ns = 0
        self.per_step: list[int] = []
        self.stop_check_per_step: list[int] = []
        self.by_api: dict[str, int] = {}
        self.offenders: dict[tuple[str, str], list[int]] = {}
        self.roles: dict[tuple[str, str], str] = {}

    def add(self, operator: str, place: str, role: str | None, dur: int) -> None:
        """Count one sync of ``operator`` at ``place``."""
        key = (operator, place)
        acc = self.offenders.setdefault(key, [0, 0])
        acc[0] += 1
        acc[1] += dur
        if role is not None:
            self.roles[key] = role


class LaunchEvidence:
    """Launches outside CUDA graph replays, per step and by where they come from (graph runs only).

    Attributes:
        per_step: Per step, launch calls that are not graph replays.
        by_place: Place (as in :attr:`SyncEvidence.offenders`) -> launches over all steps.
        node_kernel_ns: Kernel time of the graphs' node kernels, in steps.
        kernel_ns: All kernel time in steps.
    """

    __slots__ = ("per_step", "by_place", "node_kernel_ns", "kernel_ns")

    def __init__(self) -> None:
        self.per_step: list[int] = []
        self.by_place: dict[str, int] = {}
        self.node_kernel_ns = 0
        self.kernel_ns = 0


class _Places:
    """Names where an event sits: the path of its innermost range below the step that holds it.

    Example:
        >>> class R: pass
        >>> r = R(); r.thread_id, r.start, r.dur, r.name_id = [0, 0, 0], [0, 10, 50], [100, 20, 10], [0, 1, 2]
        >>> p = _Places(r, ["gpuprobe.step#N", "forward", "stopping_criteria/Stop"], {0})
        >>> [p.place(i) for i in (0, 1, 2, None)]
        ['the generate loop', 'forward', 'stopping_criteria/Stop', '(no range)']
    """

    def __init__(self, ranges: Any, display: list[str], step_name_ids: set[int]) -> None:
        self.name = [display[n] for n in ranges.name_id]
        self.is_step = [n in step_name_ids for n in ranges.name_id]
        self.step_kind = [display[n].startswith(_STEP_RANGE) for n in ranges.name_id]
        self.intervals = [
            (t, st, st + d, i) for i, (t, st, d) in enumerate(zip(ranges.thread_id, ranges.start, ranges.dur))
        ]
        self.parent = [-1] * len(self.intervals)
        stack: list[tuple[int, int]] = []  # (end, row)
        thread = None
        for t, st, end, i in sorted(self.intervals, key=lambda x: (x[0], x[1], -x[2])):
            if t != thread:
                stack.clear()
                thread = t
            while stack and stack[-1][0] < end:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1][1]
            stack.append((end, i))

    def rows(self, queries: Sequence[tuple[int, int, Any]]) -> dict[Any, int]:
        """The innermost range row around each ``(thread, time, key)`` query."""
        return innermost(self.intervals, queries)

    def place(self, row: int | None) -> str:
        """The path of range ``row`` below its step; :data:`GENERATE_LOOP` for a gpuprobe step."""
        if row is None:
            return "(no range)"
        if self.is_step[row]:
            return GENERATE_LOOP if self.step_kind[row] else self.name[row]
        parts = [self.name[row]]
        up = self.parent[row]
        while up >= 0 and not self.is_step[up]:
            parts.append(self.name[up])
            up = self.parent[up]
        if up < 0:
            return self.name[row]  # outside steps: the innermost range, as before
        return "/".join(reversed(parts))


def sync_role(operator: str, outer_operator: str | None, place: str) -> str | None:
    """What a sync is, where its operators and place say it: generate's stopping check, a stopping
    criterion, or unknown (``None``).

    In generate's loop, between the step's component ranges, transformers itself reads the device once
    per step: the stopping check, ``bool()`` of a tensor. A sync there without any operator around it
    (an nsys export, a trace without CPU operators) is taken for it too.

    Example:
        >>> sync_role("aten::_local_scalar_dense", "aten::is_nonzero", GENERATE_LOOP)
        'stop_check'
        >>> sync_role("(no operator)", None, GENERATE_LOOP)
        'stop_check'
        >>> sync_role("aten::item", "aten::item", "stopping_criteria/MyStop"), sync_role("aten::item", None, "forward")
        ('stopping_criterion', None)
    """
    if place == GENERATE_LOOP and (
        outer_operator in _BOOL_OPS or operator in _BOOL_OPS or (outer_operator is None and operator == _NO_OPERATOR)
    ):
        return STOP_CHECK
    if place.startswith("stopping_criteria/"):
        return STOPPING_CRITERION
    return None


class ConcatEvidence:
    """Concatenation per decode step (kernels on GPU traces, ``aten::cat`` operators on CPU traces).

    Kernels of CUDA graph replays are left out (a compiled step's fused kernels are named after
    what they fuse, ``..._cat_...`` included); with gpuprobe's ``forward`` ranges present, only
    what the model runs counts (generate's loop appends the token with a concatenation of its own).

    Attributes:
        source: ``kernels`` or ``cpu_ops``.
        steps: Step indexes of the decode steps.
        count: Concatenations per step.
        ns: Their time per step (GPU time of the kernels, CPU time of the operators).
        step_ns: Each step's CPU time.
        base_ns: What ``ns`` is a share of, per step: its kernel time (GPU), its CPU time (CPU).
        in_forward: Whether the counts are of the model's ``forward`` ranges only.
        in_place: Per step, in-place cache writes (``aten::index_copy_``, a static cache's update).
        layers: Per step, attention operators (one per layer); empty if the trace has none.
        elements: Elements concatenated per step, from the operators' recorded shapes; empty if unknown.
    """

    __slots__ = ("source", "steps", "count", "ns", "step_ns", "base_ns", "in_forward", "in_place", "layers", "elements")

    def __init__(self, source: str) -> None:
        self.source = source
        self.steps: list[int] = []
        self.count: list[int] = []
        self.ns: list[int] = []
        self.step_ns: list[int] = []
        self.base_ns: list[int] = []
        self.in_forward = False
        self.in_place: list[int] = []
        self.layers: list[int] = []
        self.elements: list[int] = []


class Evidence:
    """What the rules read besides the report sections."""

    def __init__(self) -> None:
        self.syncs = SyncEvidence()
        self.would_sync = SyncEvidence()
        self.gpu_sync_records = 0
        self.gpu_sync_ns = 0
        self.concat: ConcatEvidence | None = None
        self.graph_launches = 0
        self.graph_launches_per_step: list[int] = []
        self.graph_node_ops = 0
        #: Launches outside graph replays (``None`` without graph replays in steps).
        self.eager: LaunchEvidence | None = None
        #: ``torch.profiler`` recorded the trace (kineto): its own host time per operator counts.
        self.profiler = False
        #: Counts the CPU operators per step (median), when a rule needs them; ``None`` without steps.
        self.count_cpu_ops: Callable[[], float | None] = lambda: None
        self.fused_attention_kernels = 0
        self.softmax_kernels = 0
        self.softmax_kernel_ns = 0
        self.cpu_op_counts: dict[str, int] = {}
        self.cpu_op_ns: dict[str, int] = {}
        #: Copies from or to pageable memory: (direction, count, bytes, ns) per direction.
        self.pageable: list[tuple[str, int, int, int]] = []

    @functools.cached_property
    def cpu_ops_per_step(self) -> float | None:
        """CPU operators per step, median (``None`` without steps or operators); counted once, on demand."""
        return self.count_cpu_ops()


def innermost(
    intervals: Sequence[tuple[int, int, int, int]], queries: Sequence[tuple[int, int, Any]], *, outer: bool = False
) -> dict[Any, int]:
    """For each query point, the innermost (or outermost) interval of its thread that contains it.

    Args:
        intervals: ``(thread, start, end, label)``; intervals of one thread nest or are disjoint.
        queries: ``(thread, time, key)``.
        outer: Return the outermost interval instead.

    Returns:
        ``{key: label}`` for the queries inside some interval.

    Example:
        >>> innermost([(0, 0, 100, 1), (0, 10, 20, 2)], [(0, 15, "a"), (0, 50, "b"), (1, 15, "c")])
        {'a': 2, 'b': 1}
        >>> innermost([(0, 0, 100, 1), (0, 10, 20, 2)], [(0, 15, "a")], outer=True)
        {'a': 1}
    """
    # one walk in (thread, time) order: intervals open before the queries at the same time
    items: list[tuple[int, int, int, int, Any]] = [(t, s, 0, -e, lab) for t, s, e, lab in intervals]
    items += [(t, at, 1, 0, key) for t, at, key in queries]
    items.sort(key=lambda x: (x[0], x[1], x[2], x[3]))
    out: dict[Any, int] = {}
    stack: list[tuple[int, int]] = []  # (end, label)
    thread = None
    for t, at, is_query, neg_end, payload in items:
        if t != thread:
            stack.clear()
            thread = t
        while stack and stack[-1][0] < at:
            stack.pop()
        if is_query:
            if stack:
                out[payload] = stack[0][1] if outer else stack[-1][1]
        else:
            stack.append((-neg_end, payload))
    return out


def _step_of(steps: list[StepSpan], starts: list[int], thread: int, at: int, step_threads: set[int]) -> int:
    """The step holding a point of a thread (a step's own thread, or a thread without steps); -1 if none."""
    i = bisect.bisect_right(starts, at) - 1
    for j in (i, i - 1):  # steps of two threads may overlap; those of one thread never do
        if j >= 0:
            st = steps[j]
            if st.start <= at <= st.end and (st.thread == thread or thread not in step_threads):
                return j
    return -1


def _length(pairs: Iterable[tuple[int, int]]) -> int:
    return sum(b - a for a, b in pairs)


def gather(
    scan: TraceScan,
    cols: Columns,
    steps: list[StepSpan],
    gpu_names: list[str],
    range_display: list[str],
    step_name_ids: set[int] | None = None,
    source: str = "kineto",
) -> Evidence:
    """Compute the :class:`Evidence` of a finished scan.

    Args:
        scan: The pass over the trace.
        cols: Its columns.
        steps: The steps, by start.
        gpu_names: GPU operation names by id.
        range_display: Range names by id, as the ranges section shows them (``#N`` for numbers).
        step_name_ids: Range name ids that are steps (the step pattern's matches).
        source: The trace's source (``kineto``: recorded by ``torch.profiler``).
    """
    ev = Evidence()
    ev.gpu_sync_records, ev.gpu_sync_ns = scan.gpu_syncs
    step_starts = [s.start for s in steps]
    step_threads = {s.thread for s in steps}
    cpu = scan.cpu_op_rows
    cpu_names = list(scan.cpu_ops)  # by first appearance: the name ids of the CPU operator rows
    api_names = list(scan.api_names)
    places = _Places(scan.ranges, range_display, step_name_ids or set())
    gpu_known = cols.n_ops > 0
    ev.profiler = source == "kineto" and len(cpu) > 0

    # CPU operator totals by name (for attention and concatenation on CPU traces)
    for name, stat in scan.cpu_ops.items():
        ev.cpu_op_counts[name] = stat.count
        ev.cpu_op_ns[name] = stat.total_ns
    if steps and len(cpu):
        ev.count_cpu_ops = lambda: _cpu_ops_per_step(cpu, steps, step_starts, step_threads)

    # ---- host syncs: the API calls; the operators that would sync on a GPU; pageable copies
    if len(scan.syncs):
        _host_syncs(ev, scan, cpu_names, api_names, places, steps, step_starts, step_threads)
    _would_sync(ev, scan, cpu_names, places, steps, step_starts, step_threads)
    ev.pageable = _pageable_copies(scan, gpu_names)

    # ---- graph launches, their node kernels, and the launches outside them
    graphs = scan.graph_launches
    ev.graph_launches = len(graphs)
    graph_corrs: set[int] = set()
    if len(graphs):
        graph_corrs = {c for c in graphs.corr if c >= 0}
        ev.graph_node_ops = sum(1 for c in scan.ops.corr if c in graph_corrs)
        if steps:
            per_step = [0] * len(steps)
            for t, s in zip(graphs.thread_id, graphs.start):
                k = _step_of(steps, step_starts, t, s, step_threads)
                if k >= 0:
                    per_step[k] += 1
            ev.graph_launches_per_step = per_step
            if any(per_step):
                ev.eager = _eager_launches(scan, cols, steps, step_starts, step_threads, places, graph_corrs)

    # ---- kernels of fused attention and softmax
    if gpu_known:
        cat_of = {c: i for i, c in enumerate(CATEGORIES)}
        counts, totals = cols.category_stats(len(CATEGORIES))
        ev.fused_attention_kernels = counts[cat_of["attention"]]
        ev.softmax_kernels = counts[cat_of["softmax"]]
        ev.softmax_kernel_ns = totals[cat_of["softmax"]]

    # ---- concatenation per step
    ev.concat = _concat(scan, cols, steps, gpu_names, cpu_names, gpu_known, places, graph_corrs)
    return ev


def _host_syncs(ev: Evidence, scan: TraceScan, cpu_names: list[str], api_names: list[str], places: _Places,
                steps: list[StepSpan], step_starts: list[int], step_threads: set[int]) -> None:
    """The sync API calls into ``ev.syncs``: with their operators (innermost, outermost), place and role,
    per step, and the GPU's idle time while they block."""
    syncs = scan.syncs
    cpu = scan.cpu_op_rows
    n_sync = len(syncs)
    s_ev = ev.syncs
    around = _ops_around(cpu, syncs)
    queries = [(syncs.thread_id[i], syncs.start[i], i) for i in range(n_sync)]
    op_of_sync = innermost(around, queries)
    outer_of_sync = innermost(around, queries, outer=True)
    where = places.rows(queries)
    per_step = [0] * len(steps)
    stop_per_step = [0] * len(steps)
    for i in range(n_sync):
        dur = syncs.dur[i]
        s_ev.calls += 1
        s_ev.blocked_ns += dur
        api = api_names[syncs.name_id[i]]
        s_ev.by_api[api] = s_ev.by_api.get(api, 0) + 1
        op = op_of_sync.get(i)
        outer = outer_of_sync.get(i)
        operator = cpu_names[op] if op is not None else _NO_OPERATOR
        place = places.place(where.get(i))
        role = sync_role(operator, cpu_names[outer] if outer is not None else None, place)
        s_ev.add(operator, place, role, dur)
        k = _step_of(steps, step_starts, syncs.thread_id[i], syncs.start[i], step_threads)
        if k >= 0:
            per_step[k] += 1
            stop_per_step[k] += role == STOP_CHECK
    s_ev.per_step = per_step if steps else []
    s_ev.stop_check_per_step = stop_per_step if steps else []
    s_ev.gpu_idle_ns = _idle_during(syncs, scan.ops)


def _would_sync(ev: Evidence, scan: TraceScan, cpu_names: list[str], places: _Places, steps: list[StepSpan],
                step_starts: list[int], step_threads: set[int]) -> None:
    """The operators that would sync on a GPU into ``ev.would_sync`` (outermost ones only: ``item()`` holds
    ``_local_scalar_dense``), with their place and role, per step."""
    cpu = scan.cpu_op_rows
    sync_op_ids = {i for i, n in enumerate(cpu_names) if n in WOULD_SYNC_OPS}
    if not sync_op_ids:
        return
    rows = [i for i, n in enumerate(cpu.name_id) if n in sync_op_ids]
    rows.sort(key=lambda i: (cpu.thread_id[i], cpu.start[i], -cpu.dur[i]))
    outer_rows: list[int] = []
    last_thread, last_end = None, -1
    for i in rows:
        if cpu.thread_id[i] == last_thread and cpu.start[i] < last_end:
            continue  # nested in a would-sync operator already counted
        outer_rows.append(i)
        last_thread, last_end = cpu.thread_id[i], cpu.start[i] + cpu.dur[i]
    where = places.rows([(cpu.thread_id[i], cpu.start[i], i) for i in outer_rows])
    w_ev = ev.would_sync
    per_step = [0] * len(steps)
    stop_per_step = [0] * len(steps)
    for i in outer_rows:
        name = cpu_names[cpu.name_id[i]]
        w_ev.calls += 1
        w_ev.blocked_ns += cpu.dur[i]
        w_ev.by_api[name] = w_ev.by_api.get(name, 0) + 1
        place = places.place(where.get(i))
        role = sync_role(name, name, place)
        w_ev.add(name, place, role, cpu.dur[i])
        k = _step_of(steps, step_starts, cpu.thread_id[i], cpu.start[i], step_threads)
        if k >= 0:
            per_step[k] += 1
            stop_per_step[k] += role == STOP_CHECK
    w_ev.per_step = per_step if steps else []
    w_ev.stop_check_per_step = stop_per_step if steps else []


def _pageable_copies(scan: TraceScan, gpu_names: list[str]) -> list[tuple[str, int, int, int]]:
    """Copies from or to pageable host memory (named so by kineto, and by the nsys loader): ``(direction,
    copies, bytes, ns)`` per direction, by direction."""
    pageable_ids = {i for i, n in enumerate(gpu_names) if "Pageable" in n}
    if not pageable_ids:
        return []
    ops = scan.ops
    directions = list(scan.directions)
    by_direction: dict[str, list[int]] = {}
    for nid, nbytes, dur, did in zip(ops.name_id, ops.nbytes, ops.dur, ops.direction_id):
        if nid in pageable_ids:
            row = by_direction.setdefault(directions[did] or "unknown", [0, 0, 0])
            row[0] += 1
            row[1] += max(nbytes, 0)
            row[2] += dur
    return [(d, n, b, t) for d, (n, b, t) in sorted(by_direction.items())]


def _cpu_ops_per_step(cpu: Any, steps: list[StepSpan], step_starts: list[int], step_threads: set[int]) -> float | None:
    per_step = [0] * len(steps)
    for t, a in zip(cpu.thread_id, cpu.start):
        k = _step_of(steps, step_starts, t, a, step_threads)
        if k >= 0:
            per_step[k] += 1
    return float_median(per_step)


def _eager_launches(
    scan: TraceScan,
    cols: Columns,
    steps: list[StepSpan],
    step_starts: list[int],
    step_threads: set[int],
    places: _Places,
    graph_corrs: set[int],
) -> LaunchEvidence:
    """Launches in steps that are not graph replays, per step and by place; graph node kernel time."""
    out = LaunchEvidence()
    launches = scan.launches
    per_step = [0] * len(steps)
    mine: list[tuple[int, int, int]] = []
    for j, (t, a, c) in enumerate(zip(launches.thread_id, launches.start, launches.corr)):
        if c in graph_corrs:
            continue
        k = _step_of(steps, step_starts, t, a, step_threads)
        if k >= 0:
            per_step[k] += 1
            mine.append((t, a, j))
    where = places.rows(mine)
    for _t, _a, j in mine:
        place = places.place(where.get(j))
        out.by_place[place] = out.by_place.get(place, 0) + 1
    out.per_step = per_step
    graphs = scan.graph_launches
    in_steps = {
        c
        for t, a, c in zip(graphs.thread_id, graphs.start, graphs.corr)
        if c >= 0 and _step_of(steps, step_starts, t, a, step_threads) >= 0
    }
    ops = scan.ops
    out.node_kernel_ns = sum(d for k, c, d in zip(ops.kind, ops.corr, ops.dur) if k == _KERNEL and c in in_steps)
    out.kernel_ns = sum(cols.window_total(cols.cum_kernel_ns, st.op_windows) for st in steps)
    return out


def _idle_during(syncs: Any, ops: Any) -> int:
    """Time inside the union of the sync calls in which no GPU operation runs.

    Example:
        >>> class C: pass
        >>> sy, op = C(), C()
        >>> sy.start, sy.dur, op.start, op.dur = [0, 50], [40, 10], [10, 35], [5, 100]
        >>> _idle_during(sy, op)  # syncs cover 0-40 and 50-60; GPU busy 10-15 and 35-135
        30
    """
    waits = merge_intervals(sorted((a, a + d) for a, d in zip(syncs.start, syncs.dur) if d > 0))
    if not waits:
        return 0
    starts = [a for a, _ in waits]
    clipped: list[tuple[int, int]] = []
    for a, d in zip(ops.start, ops.dur):
        b = a + d
        i = bisect.bisect_right(starts, b) - 1  # the last wait starting before the operation ends
        while i >= 0 and waits[i][1] > a:
            lo, hi = max(a, waits[i][0]), min(b, waits[i][1])
            if hi > lo:
                clipped.append((lo, hi))
            i -= 1
    return _length(waits) - _length(merge_intervals(sorted(clipped)))


def _ops_around(cpu: Any, syncs: Any) -> list[tuple[int, int, int, int]]:
    """The CPU operators that hold at least one sync call: ``(thread, start, end, name id)``.

    Why a filter before :func:`innermost`: a trace holds up to millions of operators and a few
    hundred syncs; one bisect per operator here saves sorting them all.
    """
    starts: dict[int, list[int]] = {}
    for t, when in zip(syncs.thread_id, syncs.start):
        starts.setdefault(t, []).append(when)
    for v in starts.values():
        v.sort()
    np: Any = sys.modules.get("numpy")
    # Why numpy only from 100,000 operators unless it is already imported: importing it costs 75-100 ms
    # in a fresh process (test CPU), what the loop below takes for ~70,000 operators.
    if np is None and len(cpu) > 100_000:
        try:
            import numpy as np
        except ImportError:
            np = None
    if np is not None and len(cpu) > 10_000:
        # why: the same test vectorized over the typed-array columns, 0.09 s -> 0.01 s for 76,000
        # operators (synthetic 100 MB trace)
        thread = np.frombuffer(cpu.thread_id, dtype=np.int32)
        start = np.frombuffer(cpu.start, dtype=np.int64)
        end = start + np.frombuffer(cpu.dur, dtype=np.int64)
        name = np.frombuffer(cpu.name_id, dtype=np.int32)
        found: list[tuple[int, int, int, int]] = []
        for t, mine in starts.items():
            rows = np.flatnonzero(thread == t)
            at = np.asarray(mine, dtype=np.int64)
            j = np.searchsorted(at, start[rows], "left")
            inside = j < len(at)
            inside[inside] &= at[j[inside]] <= end[rows[inside]]
            hit = rows[inside]
            found.extend(zip([t] * len(hit), start[hit].tolist(), end[hit].tolist(), name[hit].tolist()))
        return found
    out = []
    for t, a, d, n in zip(cpu.thread_id, cpu.start, cpu.dur, cpu.name_id):
        held = starts.get(t)
        if held is None:
            continue
        j = bisect.bisect_left(held, a)
        if j < len(held) and held[j] <= a + d:
            out.append((t, a, a + d, n))
    return out


def _label(range_id: int | None, display: list[str]) -> str:
    return display[range_id] if range_id is not None else "(no range)"


def _concat(
    scan: TraceScan,
    cols: Columns,
    steps: list[StepSpan],
    gpu_names: list[str],
    cpu_names: list[str],
    gpu_known: bool,
    places: _Places,
    graph_corrs: set[int],
) -> ConcatEvidence | None:
    decode = [s for s in steps if s.phase != "prefill"]
    if steps and not any(s.phase for s in steps):
        decode = steps[1:]  # no phases named: the first step is taken for the prefill
    if not decode:
        return None
    cpu = scan.cpu_op_rows
    sizes = cpu.elements
    forward_rows = [i for i, n in enumerate(places.name) if n == "forward"]
    in_forward = bool(forward_rows)
    # (thread, start, end) of the forward ranges, by thread and start, for bisecting
    rng = scan.ranges
    forwards = sorted((rng.thread_id[i], rng.start[i], rng.start[i] + rng.dur[i]) for i in forward_rows)

    def inside_forward(thread: int, at: int) -> bool:
        if not in_forward:
            return True
        j = bisect.bisect_right(forwards, (thread, at, 1 << 62)) - 1
        return j >= 0 and forwards[j][0] == thread and forwards[j][1] <= at <= forwards[j][2]

    # one pass over the operators: (thread, start, dur, elements) of those of each wanted name, in
    # the forward, sorted for bisecting by step
    wanted = CONCAT_OPS | _IN_PLACE_CACHE_OPS | FUSED_ATTENTION_OPS | SOFTMAX_OPS
    name_of = {i: n for i, n in enumerate(cpu_names) if n in wanted}
    by_name: dict[str, list[tuple[int, int, int, int]]] = {}
    for i in cols.rows_named(cpu.name_id, name_of):
        name = name_of[cpu.name_id[i]]
        if inside_forward(cpu.thread_id[i], cpu.start[i]):
            size = sizes.get(i, -1) if name in CONCAT_OPS else -1  # only concatenations have sizes
            by_name.setdefault(name, []).append((cpu.thread_id[i], cpu.start[i], cpu.dur[i], size))
    hits = sorted(r for n in CONCAT_OPS for r in by_name.get(n, ()))
    writes = sorted(r for n in _IN_PLACE_CACHE_OPS for r in by_name.get(n, ()))
    attention = [sorted(rows) for n, rows in by_name.items() if n in FUSED_ATTENTION_OPS or n in SOFTMAX_OPS]
    if not gpu_known and not hits:
        return None
    out = ConcatEvidence("kernels" if gpu_known else "cpu_ops")
    out.in_forward = in_forward
    concat_names = [is_concat_kernel(n) for n in gpu_names] if gpu_known else []
    write_names = [_IN_PLACE_KERNEL in n for n in gpu_names] if gpu_known else []
    launches = scan.launches
    all_sized = bool(hits)

    def between(rows: list[tuple[int, int, int, int]], st: StepSpan) -> list[tuple[int, int, int, int]]:
        lo = bisect.bisect_left(rows, (st.thread, st.start, -1, -1))
        hi = bisect.bisect_right(rows, (st.thread, st.end, 1 << 62, 1 << 62))
        return rows[lo:hi]

    for st in decode:
        mine = between(hits, st)
        elements = sum(h[3] for h in mine)
        if not mine or any(h[3] < 0 for h in mine):
            all_sized = False
        n_write = len(between(writes, st))
        if gpu_known:
            ops = cols.window_ops(st.op_windows)
            n = ns = kernel_ns = 0
            for k, nid, a, b, j in zip(ops.kind, ops.name_id, ops.start, ops.end, ops.launch):
                if k != _KERNEL:
                    continue
                kernel_ns += b - a
                if write_names[nid]:
                    n_write += 1
                if not concat_names[nid] or (j >= 0 and launches.corr[j] in graph_corrs):
                    continue  # a graph's node kernels run what the compiled step fused, not a cache
                if inside_forward(launches.thread_id[j], launches.start[j]) if j >= 0 else not in_forward:
                    n += 1
                    ns += b - a
            base = kernel_ns
        else:
            n, ns = len(mine), sum(h[2] for h in mine)
            base = st.end - st.start
        out.steps.append(st.index)
        out.count.append(n)
        out.ns.append(ns)
        out.step_ns.append(st.end - st.start)
        out.base_ns.append(base)
        out.in_place.append(n_write)
        out.elements.append(elements)
        if attention:
            out.layers.append(max(len(between(a, st)) for a in attention))
    if not all_sized:
        out.elements = []
    return out


def float_median(values: Sequence[int]) -> float | None:
    """The median of some integers as a float, the 0.5 quantile (``None`` if there are none): the evidence
    says ``1.0`` of a middle step with 1, as it says ``1.5`` between steps with 1 and 2."""
    return quantile(sorted(values), 0.5) if values else None
