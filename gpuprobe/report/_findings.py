"""Findings: rules that read a report and its evidence and say what is wrong, with the numbers that
show it and the usual remedy.

Each rule has a fixed id, documented thresholds (:data:`THRESHOLDS`, overridable with
``--threshold id.name=value``) and returns zero or one :class:`~gpuprobe.report.schema.Finding`.
Findings are ordered by the time at stake (``evidence["at_stake_ns"]``), then severity.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from gpuprobe._kernel_names import short_kernel_name
from gpuprobe._remedies import remedy_line
from gpuprobe._stats import median
from gpuprobe.errors import ConfigError
from gpuprobe.report._evidence import (
    BMM_OPS,
    FUSED_ATTENTION_OPS,
    GENERATE_LOOP,
    SOFTMAX_OPS,
    STOP_CHECK,
    STOP_CHECK_FUNCTION,
    STOPPING_CRITERION,
    Evidence,
    float_median,
)
from gpuprobe.report.schema import SEVERITIES, Finding, Report

__all__ = ["THRESHOLDS", "RULES", "Threshold", "evaluate", "parse_thresholds", "worst_at_least", "at_least", "order"]


class Threshold(NamedTuple):
    """A documented, overridable threshold of a rule."""

    default: float
    doc: str


#: Every threshold, ``rule.name``: default and meaning (``docs/diagnosis.md`` shows this table).
THRESHOLDS: dict[str, Threshold] = {
    "host_sync.per_step": Threshold(1, "syncs per step (median) at or above which host_sync fires"),
    "host_sync.calls": Threshold(1, "sync calls in a trace without steps at or above which host_sync fires"),
    "host_sync.critical_share": Threshold(0.25, "share of step time blocked in syncs at or above which it is critical"),
    "pageable_memcpy.count": Threshold(1, "pageable copies at or above which pageable_memcpy fires"),
    "pageable_memcpy.warning_bytes": Threshold(1_000_000, "pageable bytes at or above which it is a warning, not info"),
    "launch_bound.busy_share": Threshold(0.6, "median per-step GPU busy share below which launch_bound can fire"),
    "launch_bound.launch_idle_share": Threshold(
        0.5, "share of GPU idle time spent waiting for the host to launch, at or above which launch_bound fires"
    ),
    "launch_bound.kernels_per_step": Threshold(20, "median kernels per step at or above which launch_bound can fire"),
    "launch_bound.critical_busy_share": Threshold(0.25, "median busy share below which launch_bound is critical"),
    "small_kernels.count_share": Threshold(0.5, "share of kernels below the small size, at or above which it fires"),
    "small_kernels.min_count": Threshold(100, "small kernels needed at least for small_kernels to fire"),
    "logits_processor_share.share": Threshold(0.1, "share of step time in one processor at or above which it fires"),
    "logits_processor_share.critical_share": Threshold(0.3, "share at or above which it is critical"),
    "kv_cache_concat.growth": Threshold(
        1.5, "concatenation time (or count) per step, median of the last quarter ÷ median of the first"
    ),
    "kv_cache_concat.min_steps": Threshold(8, "decode steps needed at least"),
    "kv_cache_concat.share": Threshold(0.02, "concatenation share of step time in the last quarter, at least"),
    "attention_impl.min_softmax": Threshold(
        2, "softmax operators (or kernels) per step (or in a trace without steps) at least, with no fused attention"
    ),
    "other_category.share": Threshold(0.1, "share of GPU time in 'other' at or above which it fires"),
    "exposed_communication.share": Threshold(
        0.1, "multi-rank: exposed communication ÷ GPU time at or above which exposed_communication fires"
    ),
    "exposed_communication.critical_share": Threshold(0.3, "multi-rank: the share at or above which it is critical"),
    "straggler.ratio": Threshold(1.1, "multi-rank: a rank's median step ÷ the median rank's at or above which it fires"),
    "regression.ratio": Threshold(1.1, "diff: B ÷ A at or above which a category or family has regressed"),
    "regression.min_ns": Threshold(10_000, "diff: B - A per unit (step, token) at least, in ns"),
    "regression.critical_ratio": Threshold(1.5, "diff: B ÷ A at or above which a regression is critical"),
    "kv_cache_concat.per_layer": Threshold(
        2, "concatenations per layer per decode step (keys and values) at least, with no in-place cache writes"
    ),
    "kv_cache_concat.step_share": Threshold(
        0.02, "concatenation share of decode-step kernel time (CPU time on a CPU trace) at least, per step"
    ),
    "host_sync.critical_steps": Threshold(
        3, "steps needed at least for a critical host_sync (the waits for the trace's own GPU work, step after step)"
    ),
    "launch_bound.host_gap_ns": Threshold(
        100_000, "host time per launch (idle waiting for launches ÷ launches) above which the run is host-bound"
    ),
    "launch_bound.graph_share": Threshold(
        0.5, "share of step kernel time in CUDA graph replays at or above which launch_bound is a warning at most"
    ),
    "verdict.min_change": Threshold(0.05, "diff: relative change of a per-step median that counts for the verdict"),
    "fusion.cover": Threshold(
        0.8, "diff: time removed from other families ÷ time of the new families at or above which they are a fusion"
    ),
}

_PROCESSOR_NAME = re.compile(r"(?:LogitsProcessor|LogitsWarper|Processor|Sampler)$")
_PROCESSOR_PARENTS = ("logits_processor", "logits_processors", "sampling")


def parse_thresholds(items: Mapping[str, float] | Sequence[str] | None) -> dict[str, float]:
    """Validate threshold overrides: ``["host_sync.per_step=2"]`` or a mapping.

    Raises:
        ConfigError: An unknown name or a value that is not a number.

    Example:
        >>> parse_thresholds(["host_sync.per_step=2"])["host_sync.per_step"]
        2.0
    """
    out = {name: t.default for name, t in THRESHOLDS.items()}
    for name, value in threshold_pairs(items):
        if name not in THRESHOLDS:
            raise ConfigError(f"unknown threshold {name!r}; choose from {', '.join(THRESHOLDS)}")
        out[name] = threshold_number(name, value)
    return out


def threshold_pairs(items: Mapping[str, Any] | Sequence[str] | None) -> list[tuple[str, Any]]:
    """``(name, value)`` of threshold overrides given as a mapping or as ``NAME=VALUE`` texts."""
    if not items:
        return []
    if isinstance(items, Mapping):
        return [(str(name).strip(), value) for name, value in items.items()]
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--threshold {item!r}: expected NAME=VALUE, e.g. host_sync.per_step=2")
        pairs.append((name.strip(), value.strip()))
    return pairs


def threshold_number(name: str, value: Any) -> float:
    """A threshold's value: a number at or above 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"threshold {name}: not a number: {value!r}") from None
    if number != number or number < 0:
        raise ConfigError(f"threshold {name}: must be a number at or above 0, not {value!r}")
    return number


class _Context:
    """What a rule reads: the report (every section computed), the evidence and the thresholds."""

    def __init__(self, report: Report, ev: Evidence, t: dict[str, float]) -> None:
        self.report = report
        self.ev = ev
        self.t = t
        steps = report.steps.rows if report.steps is not None else []
        self.steps = steps
        self.step_ns_total = sum(r.cpu_ns for r in steps)
        self.gpu_known = report.summary.gpu_op_count > 0
        self.launch_bound: Finding | None = None


def _finding(
    id: str, severity: str, title: str, at_stake_ns: int, remedy: str, *, asks_nothing: bool = False,
    measured: bool = True, **evidence: Any
) -> Finding:
    """A finding; one that asks something (not info) ends its remedy with the ``gpuprobe try`` variant that
    measures it, unless ``measured`` is false (the remedy is not what that variant changes)."""
    if severity != "info" and measured:
        # a remedy of items (one a line) gets the command as one more item; a paragraph, as its last sentence
        remedy = ("\n" if "\n" in remedy else " ").join(filter(None, [remedy, remedy_line(id)]))
    return Finding(id=id, severity=severity, title=title, evidence={"at_stake_ns": int(at_stake_ns), **evidence},
                   remedy=remedy, asks_nothing=asks_nothing)


def _offenders(
    table: dict[tuple[str, str], list[int]], steps: int, roles: dict[tuple[str, str], str] | None = None, limit: int = 5
) -> list[dict[str, Any]]:
    rows = sorted(table.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))[:limit]
    out = []
    for (op, rng), (n, ns) in rows:
        row: dict[str, Any] = {
            "operator": op,
            "range": rng,
            "calls": n,
            "per_step": round(n / steps, 3) if steps else None,
            "time_ns": ns,
        }
        role = (roles or {}).get((op, rng))
        if role is not None:
            row["role"] = role
            if role == STOP_CHECK:
                row["function"] = STOP_CHECK_FUNCTION
        out.append(row)
    return out


# ------------------------------------------------------------------------------------- rules

# The host_sync remedies are items, one a line (the text report lists them): each says one thing.
_SYNC_REMEDY = "\n".join((
    "Keep values on the device inside the step: avoid .item(), bool(tensor), int(tensor), .tolist(), .cpu(), "
    "nonzero(), masked_select(), unique() and boolean-mask indexing.",
    "Use torch.where or fixed-shape masks.",
    "Check stopping conditions every few steps.",
    "Copy to the host with non_blocking=True into pinned memory.",
    "gpuprobe's live sync audit (GPUPROBE_SYNC_AUDIT) names the component and source line.",
))
_STOP_CHECK_REMEDY = "\n".join((
    "Nothing to do for generate's stopping check: once per step, in its own loop between the step's components, "
    "generate() reads whether every sequence has finished (transformers' StopCheck: "
    "bool(unfinished_sequences.max() == 0)).",
    "The host waits there for the step's GPU work, which the next step needs anyway; the GPU then idles while the "
    "host prepares the next step's first launches, which CUDA graphs and a lighter loop shorten.",
    "transformers defers the read by one step (DeferredStopCheck) on MPS only.",
))


def _criteria(roles: dict[tuple[str, str], str]) -> list[str]:
    return sorted({place.split("/", 1)[1] for (_op, place), role in roles.items() if role == STOPPING_CRITERION})


def _sync_remedy(roles: dict[tuple[str, str], str], stop_checks: int) -> str:
    parts = [_SYNC_REMEDY]
    criteria = _criteria(roles)
    if criteria:
        parts.append(
            f"The stopping criteria {', '.join(criteria)} read device values on the host: return the per-sequence "
            "done flags as a tensor (torch.isin, comparisons) and leave the reading to generate's own once-per-step "
            "check."
        )
    if stop_checks:
        parts.append(_STOP_CHECK_REMEDY)
    return "\n".join(parts)


def _stop_check_finding(calls: int, per_step: float | None, blocked_ns: int, would: bool) -> Finding:
    verb = "would synchronize the host on a GPU (a CPU trace: none did here)" if would else "synchronizes the host"
    return _finding(
        "host_sync",
        "info",
        f"Only generate's stopping check {verb}, once per step, in its loop between the components: expected",
        0,
        _STOP_CHECK_REMEDY,
        asks_nothing=True,
        calls=0 if would else calls,
        per_step=per_step,
        blocked_ns=0 if would else blocked_ns,
        stop_check={
            "calls": calls,
            "per_step": per_step,
            "time_ns": blocked_ns,
            "where": GENERATE_LOOP,
            "function": STOP_CHECK_FUNCTION,
        },
    )


_UNEXPLAINED_WAIT_NS = 1_000_000  # a sync call costs µs even with the GPU idle: below 1 ms, no story


def _role_totals(ev: Any, role: str) -> tuple[int, int]:
    calls = ns = 0
    for key, (n, t) in ev.offenders.items():
        if ev.roles.get(key) == role:
            calls += n
            ns += t
    return calls, ns


def _quiet(ev: Any, stop_calls: int, t: dict[str, float]) -> tuple[bool, float | None]:
    """Whether the syncs besides the stopping check stay under the thresholds; their median per step."""
    if ev.per_step:
        others = float_median([a - b for a, b in zip(ev.per_step, ev.stop_check_per_step)])
        return others is not None and others < t["host_sync.per_step"], others
    return ev.calls - stop_calls < t["host_sync.calls"], None


def host_sync(c: _Context) -> Finding | None:
    s = c.ev.syncs
    n_steps = len(c.steps)
    # Sync calls without any device work (a CPU model profiled on a GPU machine: the profiler's own
    # synchronize at its end) say nothing of the program: its operators that would sync are the evidence.
    gpu = bool(s.calls and c.gpu_known)
    ev = s if gpu else c.ev.would_sync
    if not gpu and (c.gpu_known or not ev.calls):
        return None
    stop_calls, stop_ns = _role_totals(ev, STOP_CHECK)
    quiet, others = _quiet(ev, stop_calls, c.t)
    if quiet:
        if not stop_calls:
            return None
        stop_per_step = float_median(ev.stop_check_per_step) if ev.stop_check_per_step else None
        return _stop_check_finding(stop_calls, stop_per_step, stop_ns, would=not gpu)
    per_step = float_median(ev.per_step) if ev.per_step else None
    where = f" ({per_step:g} per step)" if per_step is not None else ""
    remedy = _sync_remedy(ev.roles, stop_calls)
    if not gpu:
        return _finding(
            "host_sync",
            "warning",
            f"{ev.calls:,} operators would synchronize the host on a GPU{where} (a CPU trace: none did here)",
            ev.blocked_ns,
            remedy,
            calls=0,
            per_step=None,
            blocked_ns=0,
            would_sync_on_gpu={
                "count": ev.calls,
                "per_step": per_step,
                "per_step_besides_stop_check": others,
                "stop_check_calls": stop_calls,
                "cpu_ns": ev.blocked_ns,
                "by_op": dict(sorted(ev.by_api.items(), key=lambda kv: (-kv[1], kv[0]))),
                "top_offenders": _offenders(ev.offenders, n_steps, ev.roles),
            },
        )
    share = s.blocked_ns / c.step_ns_total if c.step_ns_total else None
    whole = c.step_ns_total or c.report.summary.span_ns
    idle_share = s.gpu_idle_ns / whole if whole else None
    # critical: a pattern of the steps (not a one-off wait at the window's start) in which the host
    # waits for this trace's own GPU work, a large share of the step
    own_work = s.gpu_idle_ns * 2 < s.blocked_ns
    repeated = n_steps >= c.t["host_sync.critical_steps"]
    severity = (
        "critical"
        if repeated and own_work and share is not None and share >= c.t["host_sync.critical_share"]
        else "warning"
    )
    if not own_work and s.gpu_idle_ns >= _UNEXPLAINED_WAIT_NS:
        title = (
            f"The host blocks in synchronizing calls while the GPU idles: {s.calls:,} calls{where}, "
            f"{s.blocked_ns / 1e6:.3f} ms blocked, {s.gpu_idle_ns / 1e6:.3f} ms of it with no GPU work running "
            "(the wait is for something this trace does not show: another device, process or untraced work)"
        )
    else:
        title = (
            f"The host waits for the GPU: {s.calls:,} synchronizing calls{where}, {s.blocked_ns / 1e6:.3f} ms "
            f"blocked ({s.gpu_idle_ns / 1e6:.3f} ms of it with the GPU idle)"
        )
    return _finding(
        "host_sync",
        severity,
        title,
        s.blocked_ns,
        remedy,
        calls=s.calls,
        per_step=per_step,
        per_step_besides_stop_check=others,
        stop_check_calls=stop_calls,
        blocked_ns=s.blocked_ns,
        blocked_share_of_steps=share,
        gpu_idle_in_sync_ns=s.gpu_idle_ns,
        gpu_idle_in_sync_share=idle_share,
        by_api=dict(sorted(s.by_api.items(), key=lambda kv: (-kv[1], kv[0]))),
        gpu_side_records=c.ev.gpu_sync_records,
        gpu_side_ns=c.ev.gpu_sync_ns,
        top_offenders=_offenders(s.offenders, n_steps, s.roles),
    )


def pageable_memcpy(c: _Context) -> Finding | None:
    mem = c.report.memory
    if mem is None:
        return None
    by_direction: dict[str, dict[str, int]] = {}
    count = nbytes = ns = 0
    for row in c.ev.pageable:
        d = by_direction.setdefault(row[0], {"count": 0, "bytes": 0, "time_ns": 0})
        d["count"] += row[1]
        d["bytes"] += row[2]
        d["time_ns"] += row[3]
        count += row[1]
        nbytes += row[2]
        ns += row[3]
    if count < c.t["pageable_memcpy.count"] or not count:
        return None
    severity = "warning" if nbytes >= c.t["pageable_memcpy.warning_bytes"] else "info"
    return _finding(
        "pageable_memcpy",
        severity,
        f"{count:,} copies use pageable host memory ({nbytes / 1e6:.2f} MB, {ns / 1e6:.3f} ms on the GPU)",
        ns,
        "Pin the host side: tensor.pin_memory() (DataLoader(pin_memory=True)) and copy with non_blocking=True; "
        "for device-to-host results, copy into a preallocated pinned buffer. Pageable copies are staged "
        "through a driver buffer and block the host.",
        count=count,
        bytes=nbytes,
        time_ns=ns,
        by_direction=by_direction,
    )


_LAUNCH_REMEDY = (
    "Cut the launches: CUDA graphs (torch.compile(mode='reduce-overhead'), or generate() with "
    "cache_implementation='static' and a compile config), fuse small operations (torch.compile), "
    "batch more sequences per step."
)
#: What to do about launches outside the graphs, by where they come from (first match of the place).
_OUTSIDE_GRAPH_REMEDIES: tuple[tuple[str, str], ...] = (
    (
        GENERATE_LOOP,
        "generate's own loop (token selection, the token append, the unfinished-sequence update, the stopping "
        "check) runs eagerly every step: compile the decode step with its token selection (a function doing "
        "forward + argmax or sampling under torch.compile), or decode several tokens per host round trip",
    ),
    (
        "stopping_criteria",
        "the stopping criteria launch work every step: keep only those the request needs (an eos check and a "
        "length limit cost a few launches each)",
    ),
    (
        "forward",
        "the forward launches work outside its graph: input copies into the graph's static buffers and "
        "operations that broke the graph (TORCH_LOGS=graph_breaks names them)",
    ),
    (
        "streamer",
        "the streamer copies each token to the host: stream less often, or not at all when timing",
    ),
)
_PROCESSOR_REMEDY = (
    "the logits processors run eagerly on the host path: drop those that do nothing for this request (a "
    "min-length processor with no minimum, a temperature of 1), or move them and do_sample's softmax and "
    "multinomial into the compiled step (torch.compile of the sampling step)"
)


def _outside_graph_remedy(places: list[str], profiler: bool, cpu_ops: float | None) -> str:
    parts = []
    for place in places:
        for prefix, text in _OUTSIDE_GRAPH_REMEDIES:
            if place == prefix or place.startswith(prefix + "/"):
                parts.append(text)
                break
        else:
            if place != "(no range)":
                parts.append(_PROCESSOR_REMEDY if _is_processor(place, place.rsplit("/", 1)[-1]) else
                             f"{place} launches work every step outside the graphs: fold it into the compiled step")
    sentences = ["The step already replays CUDA graphs; what remains is the work launched outside them."]
    if parts:
        sentences.append("; ".join(dict.fromkeys(parts)) + ".")
    if profiler:
        sentences.append(_profiler_note(cpu_ops))
    return " ".join(sentences)


def _profiler_note(cpu_ops: float | None) -> str:
    count = f" ({cpu_ops:g} operators per step here)" if cpu_ops is not None else ""
    return (
        "The window was recorded under torch.profiler, whose bookkeeping adds host time to every operator it "
        f"records{count}: part of the host gaps is the profiler's own, so the GPU is less idle without it; "
        "compare the step times gpuprobe measures without a profile window."
    )


def launch_bound(c: _Context) -> Finding | None:
    idle = c.report.idle
    if idle is None or not idle.rows:
        return None
    shares = [r.busy_ns / r.window_ns for r in idle.rows if r.window_ns]
    if not shares:
        return None
    busy_share = median(shares)
    idle_total = idle.idle_launch_ns + idle.idle_sync_ns + idle.idle_other_ns
    launch_share = idle.idle_launch_ns / idle_total if idle_total else 0.0
    kernels = float_median([r.kernels for r in c.steps]) if c.steps else c.report.summary.kernel_count
    if (
        busy_share >= c.t["launch_bound.busy_share"]
        or launch_share < c.t["launch_bound.launch_idle_share"]
        or (kernels or 0) < c.t["launch_bound.kernels_per_step"]
    ):
        return None
    kernels_section = c.report.kernels
    median_kernel = None
    if kernels_section is not None and kernels_section.count:
        median_kernel = kernels_section.total_ns // kernels_section.count
    la = c.report.launches
    severity = "critical" if busy_share < c.t["launch_bound.critical_busy_share"] else "warning"
    scope = "per step" if c.steps else "over the trace"
    evidence: dict[str, Any] = dict(
        gpu_busy_share=busy_share,
        kernels_per_step=kernels if c.steps else None,
        mean_kernel_ns=median_kernel,
        mean_launch_api_ns=(la.api_ns // la.launch_count) if la is not None and la.launch_count else None,
        launch_to_start_median_ns=la.delay_median_ns if la is not None else None,
        idle_launch_ns=idle.idle_launch_ns,
        idle_sync_ns=idle.idle_sync_ns,
        idle_other_ns=idle.idle_other_ns,
        idle_launch_share=launch_share,
    )
    if c.ev.profiler:
        evidence["profiler"] = {"recorded_with": "torch.profiler", "cpu_ops_per_step": c.ev.cpu_ops_per_step}
    launches = sum(r.launches for r in c.steps) if c.steps else c.report.summary.launch_count
    gap = idle.idle_launch_ns / launches if launches else None
    evidence["host_gap_per_launch_ns"] = round(gap) if gap is not None else None
    eager = c.ev.eager
    if gap is not None and gap > c.t["launch_bound.host_gap_ns"]:
        # far more host time per launch than a launch costs: the host does other work between them
        finding = _finding(
            "launch_bound",
            "warning",
            f"Host-bound: the GPU is busy {busy_share * 100:.0f} % of the time {scope}; between launches the host "
            f"works {gap / 1e3:.0f} µs per launch, far more than a launch costs",
            idle.idle_launch_ns,
            "Find what the host does between launches: Python, data loading, tokenization, logging "
            "(profile with with_stack=True, or py-spy); move it off the step's path (DataLoader workers, "
            "pinned prefetch). CUDA graphs help only once launching is what the host spends its time on."
            + (" " + _profiler_note(c.ev.cpu_ops_per_step) if c.ev.profiler else ""),
            measured=False,  # the host's own work, which a compiled step does not remove
            **evidence,
        )
        return finding  # not launch-bound: cuda_graphs and small_kernels do not build on it
    if eager is not None:  # graph replays in the steps: the launches outside them are the evidence
        n_steps = max(1, len(eager.per_step))
        outside = float_median(eager.per_step) or 0
        graph_share = eager.node_kernel_ns / eager.kernel_ns if eager.kernel_ns else 0.0
        if graph_share >= c.t["launch_bound.graph_share"]:
            severity = "warning"
        places = sorted(eager.by_place.items(), key=lambda kv: (-kv[1], kv[0]))
        by_place = {p: round(n / n_steps, 2) for p, n in places}
        top = ", ".join(f"{p} {v:g}" for p, v in list(by_place.items())[:4])
        evidence.update(
            graph_replays_per_step=float_median(c.ev.graph_launches_per_step),
            launches_outside_graphs_per_step=outside,
            outside_graphs_by_place_per_step=by_place,
            graph_kernel_share=graph_share,
        )
        title = (
            f"Launch-bound outside the CUDA graphs: the GPU is busy {busy_share * 100:.0f} % of the time {scope}; "
            f"{outside:g} launches per step run outside the graph replays ({top})"
        )
        remedy = _outside_graph_remedy([p for p, _ in places[:4]], c.ev.profiler, c.ev.cpu_ops_per_step)
    else:
        title = (
            f"Launch-bound: the GPU is busy {busy_share * 100:.0f} % of the time {scope}; it mostly waits for "
            f"the host to launch ({kernels:g} kernels per step)"
            if c.steps
            else f"Launch-bound: the GPU is busy {busy_share * 100:.0f} % of the time; it mostly waits for the host "
            "to launch"
        )
        remedy = _LAUNCH_REMEDY + (" " + _profiler_note(c.ev.cpu_ops_per_step) if c.ev.profiler else "")
    finding = _finding("launch_bound", severity, title, idle.idle_launch_ns, remedy, **evidence)
    c.launch_bound = finding
    return finding


def small_kernels(c: _Context) -> Finding | None:
    so = c.report.small_ops
    if so is None or not so.count:
        return None
    if so.count < c.t["small_kernels.min_count"] or so.count_share < c.t["small_kernels.count_share"]:
        return None
    la = c.report.launches
    per_launch = (la.api_ns // la.launch_count) if la is not None and la.launch_count else 0
    families: dict[str, list[int]] = {}
    for row in so.rows:
        fam = short_kernel_name(row.name)
        acc = families.setdefault(fam, [0, 0])
        acc[0] += row.count
        acc[1] += row.total_ns
    top = sorted(families.items(), key=lambda kv: (-kv[1][0], kv[0]))[:5]
    return _finding(
        "small_kernels",
        "warning" if c.launch_bound is not None else "info",
        f"{so.count:,} tiny kernels (mean < {so.threshold_ns / 1000:g} µs): {so.count_share * 100:.0f} % of "
        f"kernels, {so.time_share * 100:.1f} % of kernel time",
        so.count * per_launch,
        "Fuse them: torch.compile, fused kernels (fused norms, fused rotary, fused optimizers), fewer "
        "elementwise steps in Python; each launch costs a few µs of host time however small the kernel.",
        count=so.count,
        count_share=so.count_share,
        time_ns=so.total_ns,
        time_share=so.time_share,
        threshold_ns=so.threshold_ns,
        top=[{"kernel": k, "count": n, "time_ns": t} for k, (n, t) in top],
    )


_COMPONENTS = ("forward", "streamer", "stopping_criteria")


def _is_processor(path: str, name: str) -> bool:
    """A logits processor's range: by its name, or as a component range of a gpuprobe step.

    In a profile window, the transformers integration names the components of a step
    ``gpuprobe.step#N/forward``, ``.../<processor class>``, ``.../stopping_criteria/<class>`` and
    ``.../streamer``: every other child of the step is a logits processor.
    """
    if _PROCESSOR_NAME.search(name):
        return True
    parent = path[: -len(name) - 1] if path.endswith("/" + name) else ""
    if parent.startswith("gpuprobe.step") and "/" not in parent:
        return name.split("/", 1)[0] not in _COMPONENTS
    parts = path.split("/")
    return len(parts) > 1 and parts[-2] in _PROCESSOR_PARENTS


def logits_processor_share(c: _Context) -> Finding | None:
    ranges = c.report.ranges
    if ranges is None or not c.step_ns_total:
        return None
    by_class: dict[str, list[int]] = {}
    for row in ranges.rows:
        if not _is_processor(row.path, row.name):
            continue
        acc = by_class.setdefault(row.name, [0, 0, 0, 0])
        acc[0] += row.count
        acc[1] += row.cpu_ns
        acc[2] += row.gpu_ops
        acc[3] += row.launches
    steps = len(c.steps)
    heavy = {
        name: v for name, v in by_class.items() if v[1] / c.step_ns_total >= c.t["logits_processor_share.share"]
    }
    if not heavy:
        return None
    rows = sorted(heavy.items(), key=lambda kv: (-kv[1][1], kv[0]))
    worst = rows[0][1][1] / c.step_ns_total
    names = ", ".join(name for name, _ in rows)
    return _finding(
        "logits_processor_share",
        "critical" if worst >= c.t["logits_processor_share.critical_share"] else "warning",
        f"Logits processing takes {worst * 100:.0f} % of step time ({names})",
        sum(v[1] for _, v in rows),
        "Vectorize the processor: no Python loop over the batch or the vocabulary, no .item(); use the "
        "built-in processors where one fits; torch.compile the processor or fold it into one masked "
        "operation.",
        by_class=[
            {
                "processor": name,
                "share_of_step": v[1] / c.step_ns_total,
                "calls": v[0],
                "time_ns": v[1],
                "time_per_step_ns": v[1] // steps if steps else None,
                "gpu_ops_per_call": round(v[2] / v[0], 2) if v[0] else None,
                "launches_per_call": round(v[3] / v[0], 2) if v[0] else None,
            }
            for name, v in rows
        ],
    )


def _quarters(values: list[int]) -> tuple[float, float]:
    """Medians of the first and the last quarter (medians: a step slowed by something else is no trend)."""
    q = max(2, len(values) // 4)
    return median(values[:q]), median(values[-q:])


def kv_cache_concat(c: _Context) -> Finding | None:
    cc = c.ev.concat
    if cc is None or not cc.steps:
        return None
    return _concat_growth(c, cc) or _concat_per_step(c, cc)


_STATIC_CACHE_REMEDY = (
    "Use a static, preallocated cache: generate(..., cache_implementation='static') (or a StaticCache), "
    "which writes new keys and values in place (index_copy_) instead of concatenating the whole cache every "
    "step; its fixed shapes also let the step be captured in a CUDA graph (torch.compile(mode='reduce-overhead'))."
)


def _concat_per_step(c: _Context, cc: Any) -> Finding | None:
    """A dynamic cache's concatenations, step by step: as many per layer as keys and values, no in-place writes."""
    per_step = float_median(cc.count) or 0
    in_place = float_median(cc.in_place) or 0
    layers = float_median(cc.layers) if cc.layers else None
    base = sum(cc.base_ns)
    share = sum(cc.ns) / base if base else 0.0
    need = c.t["kv_cache_concat.per_layer"] * (layers or 1)
    if in_place or not per_step or per_step < max(need, 2):
        return None
    severity = "warning"
    if share < c.t["kv_cache_concat.step_share"]:
        if cc.source == "kernels":
            return None
        # a CPU trace: the pattern is there, what it costs on a GPU is not in the trace
        severity = "info"
    per_layer = per_step / layers if layers else None
    what = "concatenation kernels" if cc.source == "kernels" else "aten::cat operators"
    of = "kernel time" if cc.source == "kernels" else "step time"
    where = " in the forward" if cc.in_forward else ""
    layer_text = (
        f" ({per_layer:.2g} per layer over {layers:g} layers; a dynamic cache's keys and values are 2 of them)"
        if per_layer is not None
        else ""
    )
    return _finding(
        "kv_cache_concat",
        severity,
        f"Dynamic KV cache: {per_step:g} {what} per decode step{where}{layer_text}, {share * 100:.1f} % of {of}; "
        "no in-place cache writes",
        sum(cc.ns),
        _STATIC_CACHE_REMEDY,
        source=cc.source,
        basis="per_step",
        decode_steps=len(cc.steps),
        per_step=per_step,
        layers=layers,
        per_layer=per_layer,
        in_forward=cc.in_forward,
        in_place_writes_per_step=in_place,
        time_ns=sum(cc.ns),
        time_per_step_ns=round(sum(cc.ns) / len(cc.steps)),
        share=share,
        share_of=of,
    )


def _concat_growth(c: _Context, cc: Any) -> Finding | None:
    if len(cc.steps) < max(2, c.t["kv_cache_concat.min_steps"]):
        return None
    first_ns, last_ns = _quarters(cc.ns)
    first_n, last_n = _quarters(cc.count)
    first_step, last_step = _quarters(cc.step_ns)
    if not last_n:
        return None
    growth_ns = last_ns / first_ns if first_ns else float("inf") if last_ns else 0.0
    growth_n = last_n / first_n if first_n else float("inf")
    first_el: float | None = None
    last_el: float | None = None
    if cc.elements:  # shapes recorded: the size concatenated, free of timing noise
        first_el, last_el = _quarters(cc.elements)
        growth = last_el / first_el if first_el else float("inf")
        basis = "elements"
    else:
        growth, basis = growth_ns, "time"
    share = last_ns / last_step if last_step else 0.0
    grows = growth >= c.t["kv_cache_concat.growth"] or growth_n >= c.t["kv_cache_concat.growth"]
    if not grows or share < c.t["kv_cache_concat.share"]:
        return None
    extra = sum(max(0, ns - int(first_ns)) for ns in cc.ns)
    what = "kernels" if cc.source == "kernels" else "aten::cat operators"
    size = "elements" if basis == "elements" else "time"
    return _finding(
        "kv_cache_concat",
        "warning",
        f"Concatenation grows with the sequence: {what} concatenate {growth:.1f}x more {size} per step at the "
        f"end than at the start ({share * 100:.1f} % of step time) — a dynamic KV cache",
        extra,
        _STATIC_CACHE_REMEDY,
        source=cc.source,
        basis=basis,
        growth=growth,
        decode_steps=len(cc.steps),
        first_quarter_ns=round(first_ns),
        last_quarter_ns=round(last_ns),
        time_growth=growth_ns,
        first_quarter_elements=first_el,
        last_quarter_elements=last_el,
        count_first_quarter=first_n,
        count_last_quarter=last_n,
        share_of_step_last_quarter=share,
        step_ns_first_quarter=round(first_step),
        step_ns_last_quarter=round(last_step),
    )


def cuda_graphs(c: _Context) -> Finding | None:
    ev = c.ev
    if ev.graph_launches:
        per_step = float_median(ev.graph_launches_per_step) if ev.graph_launches_per_step else None
        if not ev.graph_node_ops:
            return _finding(
                "cuda_graphs",
                "warning",
                f"{ev.graph_launches:,} CUDA graph replays, but the trace holds none of their kernels",
                0,
                "Record graph nodes: nsys profile --cuda-graph-trace=node; with the PyTorch profiler, a recent "
                "torch records graph kernels by default. Without them GPU time inside graphs is unknown.",
                graph_launches=ev.graph_launches,
                per_step=per_step,
                node_ops=0,
            )
        outside = float_median(ev.eager.per_step) if ev.eager is not None else None
        title = f"CUDA graphs replayed {ev.graph_launches:,} times" + (
            f" ({per_step:g} per step)" if per_step is not None else ""
        )
        remedy = "Nothing to do for the replays: each launches its captured kernels at once."
        if outside:
            title += f"; {outside:g} launches per step run outside them"
            remedy += (
                " The launches outside them are what the host still pays per step"
                + (": see launch_bound." if c.launch_bound is not None else ".")
            )
        return _finding(
            "cuda_graphs",
            "info",
            title,
            0,
            remedy,
            asks_nothing=True,  # the replays themselves; what remains outside them is launch_bound's
            graph_launches=ev.graph_launches,
            per_step=per_step,
            node_ops=ev.graph_node_ops,
            launches_outside_graphs_per_step=outside,
            graph_kernel_share=ev.eager.node_kernel_ns / ev.eager.kernel_ns
            if ev.eager is not None and ev.eager.kernel_ns
            else None,
        )
    if c.launch_bound is not None:
        return _finding(
            "cuda_graphs",
            "warning",
            "No CUDA graphs in a launch-bound run",
            c.launch_bound.evidence["at_stake_ns"],
            "Capture the step in a CUDA graph: torch.compile(mode='reduce-overhead'), or generate() with "
            "cache_implementation='static' and compilation; graphs need static shapes (a static cache).",
            graph_launches=0,
            gpu_busy_share=c.launch_bound.evidence["gpu_busy_share"],
        )
    return None


def attention_impl(c: _Context) -> Finding | None:
    ev = c.ev
    per = max(1, len(c.steps))
    minimum = c.t["attention_impl.min_softmax"] * per
    remedy = (
        "Use fused attention: attn_implementation='sdpa' (or 'flash_attention_2' / 'flex_attention') when "
        "loading the model, or torch.nn.functional.scaled_dot_product_attention in custom code."
    )
    counts = ev.cpu_op_counts
    if counts:  # operators say what the model called, on CPU and GPU traces alike
        fused = sum(counts.get(n, 0) for n in FUSED_ATTENTION_OPS) + ev.fused_attention_kernels
        softmax = max(counts.get(n, 0) for n in SOFTMAX_OPS)  # aten::softmax holds aten::_softmax
        bmm = sum(counts.get(n, 0) for n in BMM_OPS)
        if fused or softmax < max(1, minimum) or not bmm:
            return None
        softmax_ns = ev.softmax_kernel_ns if c.gpu_known else max(ev.cpu_op_ns.get(n, 0) for n in SOFTMAX_OPS)
        return _finding(
            "attention_impl",
            "warning",
            f"Eager attention: {softmax:,} softmax operators between matrix products, no fused attention",
            softmax_ns,
            remedy,
            softmax_ops=softmax,
            softmax_per_step=round(softmax / per, 2),
            softmax_ns=softmax_ns,
            softmax_clock="gpu" if c.gpu_known else "cpu",
            matmul_ops=bmm,
            fused_attention=0,
        )
    if not c.gpu_known:
        return None
    cats = c.report.categories
    gemm = next((r.count for r in cats.rows if r.category == "gemm"), 0) if cats is not None else 0
    if ev.fused_attention_kernels or ev.softmax_kernels < max(1, minimum) or not gemm:
        return None
    return _finding(
        "attention_impl",
        "warning",
        f"Eager attention: {ev.softmax_kernels:,} softmax kernels between matrix products, no fused attention kernel",
        ev.softmax_kernel_ns,
        remedy,
        softmax_kernels=ev.softmax_kernels,
        softmax_per_step=round(ev.softmax_kernels / per, 2),
        softmax_ns=ev.softmax_kernel_ns,
        gemm_kernels=gemm,
        fused_attention=0,
    )


def other_category(c: _Context) -> Finding | None:
    cats = c.report.categories
    if cats is None or not cats.total_ns or cats.other_share < c.t["other_category.share"]:
        return None
    top = [
        {"kernel": r.short_name, "count": r.count, "time_ns": r.total_ns}
        for r in (c.report.kernels.rows if c.report.kernels is not None else [])
        if r.category == "other"
    ][:5]
    other_ns = next((r.total_ns for r in cats.rows if r.category == "other"), 0)
    return _finding(
        "other_category",
        "info",
        f"{cats.other_share * 100:.0f} % of GPU time is in kernels gpuprobe cannot categorize",
        0,
        "Read the top 'other' kernels in the kernels section; if they are common library kernels, report "
        "their names so that the categorizer learns them.",
        share=cats.other_share,
        time_ns=other_ns,
        top=top,
    )


#: The rules, by id, in evaluation order (``cuda_graphs`` reads what ``launch_bound`` found).
RULES: dict[str, Callable[[_Context], Finding | None]] = {
    "host_sync": host_sync,
    "pageable_memcpy": pageable_memcpy,
    "launch_bound": launch_bound,
    "small_kernels": small_kernels,
    "logits_processor_share": logits_processor_share,
    "kv_cache_concat": kv_cache_concat,
    "cuda_graphs": cuda_graphs,
    "attention_impl": attention_impl,
    "other_category": other_category,
}


def order(findings: list[Finding]) -> list[Finding]:
    """Most time at stake first, then the most severe, then in rule order (a cause before its remedy)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    rule = {r: i for i, r in enumerate(RULES)}
    return sorted(
        findings,
        key=lambda f: (-f.evidence.get("at_stake_ns", 0), -rank[f.severity], rule.get(f.id, len(rule)), f.id),
    )


def evaluate(report: Report, ev: Evidence, thresholds: dict[str, float]) -> list[Finding]:
    """Run every rule on a report whose sections are all computed."""
    c = _Context(report, ev, thresholds)
    found = [f for f in (rule(c) for rule in RULES.values()) if f is not None]
    return order(found)


def at_least(findings: list[Finding], severity: str) -> list[Finding]:
    """The findings at least as severe as ``severity`` that ask something of the user (a CI gate's)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return [f for f in findings if rank[f.severity] >= rank[severity] and not f.asks_nothing]


def worst_at_least(findings: list[Finding], severity: str) -> bool:
    """Whether some finding that asks something of the user is at least as severe as ``severity``."""
    return bool(at_least(findings, severity))
