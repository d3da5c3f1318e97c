"""Budgets of counts for a block of generation: host syncs, kernel launches, recompiles and graph breaks,
cache concatenations, Python calls and peak memory, measured while a :class:`Measurement` is entered.

Counts, not timings: the same code gives the same counts on a quiet machine and on a loaded one, so a
budget on them is a test that does not flake. The pytest plugin (:mod:`gpuprobe.pytest_plugin`, the
``gpuprobe_budget`` fixture) is built on this module; ``docs/testing.md`` says what each count counts on a
CPU and on a GPU.

What each count reads (only the counts asked for are set up):

- ``host_syncs``, ``host_syncs_per_step``: the sync audit (:mod:`gpuprobe._sync_audit`) over the whole
  block, and per generation step with its attribution (``sync_audit=1`` for the block: every step audited,
  each logits processor and stopping criterion by class); the source line of each sync kind is kept.
  They count the syncs the user can act on: a ``(component, processor, op)`` whose every sighting the
  block's :class:`~gpuprobe._sync_audit.SyncSites` classified as expected (transformers' own: its stop
  check, ``masking_utils``) is left out, and kept in :attr:`Measured.expected`; ``host_syncs_all`` and
  ``host_syncs_per_step_all`` count every sync.
- ``launches_per_step``: each step profiled on its own (the kernel sampler's recorder): CUDA kernels,
  memcpy and memset on a GPU; without CUDA the computing ATen operators stand in for kernels.
- ``recompiles``, ``graph_breaks``: Dynamo's own records (``gpuprobe._torch_caps.dynamo_caps``).
- ``dynamic_cache_concats``: :class:`gpuprobe.integrations._transformers.cache.ConcatCounter`.
- ``python_calls_per_step``: ``sys.setprofile`` on the block's thread, calls by the package of their code.
- ``peak_memory_bytes``: the CUDA caching allocator's peak, reset as the block starts.

Steps are the transformers integration's (a model that is not instrumented yet is instrumented for the
block, class-wide, and given back as it was). A *per step* count is the most in any one **decode step**
of the block: the steps of each ``generate()`` call after its first (the prefill, which runs the whole
prompt) and before its last (which runs into the call's own end); the step runs from its start to the
next step's start.

A count that cannot be counted here (no CUDA for peak memory, another profiler running, a torch
without Dynamo's records) is :attr:`Measured.skipped` with the reason, never reported as zero.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .. import _files
from ..errors import GpuprobeError

__all__ = ["COUNTS", "CountSpec", "budget_table", "BudgetError", "BaselineError", "Part", "Measured", "Measurement",
           "Row", "check", "compare_baseline", "render", "parse_budgets", "check_name", "read_baseline",
           "baseline_record", "write_baseline", "version_note", "machine_key", "BASELINE_FORMAT"]


class BudgetError(GpuprobeError, ValueError):
    """A budget asked for in a way that cannot be checked (an unknown name, a negative number, ...)."""


class BaselineError(GpuprobeError, ValueError):
    """A baseline file that cannot be used as it is (unreadable, hand-edited into another shape, ...)."""


# -- the counts -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CountSpec:
    """One count a budget can hold.

    Attributes:
        name: the budget's keyword (``host_syncs_per_step``).
        per_step: the most in any one decode step (else: the whole block).
        components: what a component key names (``None``: the count has no components).
        cpu: what it counts on a machine without CUDA ("" where it cannot be counted there).
        gpu: what it counts with CUDA.
    """

    name: str
    per_step: bool
    components: str | None
    cpu: str
    gpu: str


COUNTS: dict[str, CountSpec] = {s.name: s for s in (
    CountSpec("host_syncs", False,
              "`forward`, `logits_processor`, `stopping_criteria`, `streamer`, `other` (each a step's part), "
              "`logits_processor/<class>`, `stopping_criteria/<class>`, `outside_steps`",
              "operations that would force a device-to-host sync on a GPU (`.item()`, `x[mask]`, `nonzero`; no "
              "copy to the host exists on a CPU, so none is counted) that your code runs: transformers' own are "
              "left out as expected",
              "operations that force a device-to-host sync (`.item()`, `x[mask]`, `nonzero`, blocking `.cpu()`) "
              "that your code runs: transformers' own are left out as expected"),
    CountSpec("host_syncs_per_step", True, "as `host_syncs`, without `outside_steps`",
              "as `host_syncs`, in one decode step", "as `host_syncs`, in one decode step"),
    CountSpec("host_syncs_all", False, "as `host_syncs`",
              "as `host_syncs`, transformers' own included (its stop check: one a step)", "the same"),
    CountSpec("host_syncs_per_step_all", True, "as `host_syncs_per_step`",
              "as `host_syncs_all`, in one decode step", "the same"),
    CountSpec("launches_per_step", True, "kernel category (`gemm`, `attention`, `elementwise`, ...)",
              "computing ATen operators (views, allocations and dtype conversions left out; an operator run "
              "directly inside one of the same name counts once), the CPU's stand-in for kernels",
              "CUDA kernels, memcpy and memset"),
    CountSpec("recompiles", False, None,
              "frames Dynamo compiled again after a guard failed (a new shape, dtype, ...)", "the same"),
    CountSpec("graph_breaks", False, None,
              "graph breaks Dynamo met while compiling (each counted once per compilation, not per call)",
              "the same"),
    CountSpec("dynamic_cache_concats", False, "the cache layer class (`DynamicLayer`, `DynamicSlidingWindowLayer`)",
              "`update` calls of transformers' concatenating cache layers: one per decoder layer and step "
              "with a dynamic cache, none with a static one", "the same"),
    CountSpec("python_calls_per_step", True, "the top-level package of the code called (`transformers`, "
              "`torch`, `gpuprobe`, your own modules)",
              "Python function calls on the block's thread, in one decode step", "the same"),
    CountSpec("peak_memory_bytes", False, "the device (`cuda:0`)", "",
              "the CUDA caching allocator's peak of allocated bytes during the block, per device"),
)}
"""Every count, in the order the docs and the failure table list them."""

def budget_table() -> str:
    """The table of every budget in ``docs/testing.md`` (a test keeps the page's copy current).

    Example:
        >>> budget_table().splitlines()[0]
        '| budget | for | components | on a CPU | on a GPU (CUDA) |'
    """
    lines = ["| budget | for | components | on a CPU | on a GPU (CUDA) |", "|---|---|---|---|---|"]
    for spec in COUNTS.values():
        lines.append(f"| `{spec.name}` | {'the most in a decode step' if spec.per_step else 'the block'} | "
                     f"{spec.components or '—'} | {spec.cpu or 'not counted: skipped'} | {spec.gpu} |")
    return "\n".join(lines)


def parse_budgets(budgets: Mapping[str, Any]) -> dict[str, int | dict[str, int]]:
    """Check budget keywords and values: a whole number >= 0, or a dict of component → such a number.

    Raises:
        BudgetError: an unknown name (the message suggests the nearest), a value of another type, a
            negative one, components for a count that has none.

    Example:
        >>> parse_budgets({"host_syncs_per_step": {"logits_processor": 0}, "recompiles": 0})
        {'host_syncs_per_step': {'logits_processor': 0}, 'recompiles': 0}
    """
    out: dict[str, int | dict[str, int]] = {}
    if not budgets:
        raise BudgetError(f"gpuprobe_budget needs at least one budget: {', '.join(COUNTS)}")
    for name, value in budgets.items():
        spec = COUNTS.get(name)
        if spec is None:
            near = difflib.get_close_matches(name, list(COUNTS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise BudgetError(f"unknown budget {name!r}{hint}; the budgets are: {', '.join(COUNTS)}")
        if isinstance(value, Mapping):
            if spec.components is None:
                raise BudgetError(f"budget {name} is one number for the whole block, not per component: got {value!r}")
            if not value:
                raise BudgetError(f"budget {name}: an empty dict budgets nothing; give component: number")
            parts = {}
            for key, limit in value.items():
                if not isinstance(key, str) or not key:
                    raise BudgetError(f"budget {name}: a component is a non-empty string, got {key!r}")
                if name in _SYNC_COUNTS and key.split("/", 1)[0] not in _SYNC_COMPONENTS:
                    known = ", ".join(c for c in _SYNC_COMPONENTS if not spec.per_step or c != "outside_steps")
                    raise BudgetError(f"budget {name}: unknown component {key!r}; the components are {known} "
                                      "(and logits_processor/<class>, stopping_criteria/<class>)")
                if name in _SYNC_COUNTS and spec.per_step and key == "outside_steps":
                    raise BudgetError(f"budget {name}: outside_steps is not in a step (budget it with "
                                      f"{name.replace('_per_step', '')})")
                parts[key] = _whole(name, limit, key)
            out[name] = parts
        else:
            out[name] = _whole(name, value, None)
    return out


_SYNC_COUNTS = ("host_syncs", "host_syncs_per_step", "host_syncs_all", "host_syncs_per_step_all")
_SYNC_COMPONENTS = ("forward", "logits_processor", "stopping_criteria", "streamer", "other", "draft", "verify",
                    "outside_steps")


def _whole(name: str, value: Any, key: str | None) -> int:
    what = f"budget {name}" + (f"[{key}]" if key is not None else "")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and value >= 0:
            return int(value)
        raise BudgetError(f"{what} must be a whole number >= 0 (or a dict of component: number), got {value!r}")
    if value < 0:
        raise BudgetError(f"{what} must be >= 0, got {value}: a count is never negative")
    return value


# -- what was measured ------------------------------------------------------------------------------

@dataclasses.dataclass
class Part:
    """One counted step (per-step counts) or the whole block: its counts by component.

    Attributes:
        label: ``"call 1, step 3"`` or ``"block"``.
        by: fine component → count (``logits_processor/BanRepeats``, ``gemm``, ``transformers``).
        total: the part's count (the sum of ``by`` unless the count keeps no components).
    """

    label: str
    by: dict[str, int]
    total: int


@dataclasses.dataclass
class Measured:
    """One count of one block.

    Attributes:
        name: the count (a key of :data:`COUNTS`).
        parts: the counted steps (per-step counts) or the one block part.
        details: fine component → where it comes from, in words (a sync's source line, a recompile's
            guard failure, a graph break's reason).
        skipped: why it could not be counted here (None when it was).
        note: how it was counted, in a few words (``"14 decode steps"``, ``"CPU operators"``).
        expected: for ``host_syncs`` and ``host_syncs_per_step``, the syncs left out of them as expected
            (transformers' own: its stop check, ``masking_utils``), counted the same way; None for the others.
    """

    name: str
    parts: list[Part] = dataclasses.field(default_factory=list)
    details: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: str | None = None
    note: str = ""
    expected: Measured | None = None

    def value(self, component: str | None = None) -> int:
        """The count (per step: the most in any one step), of one component or of all.

        A component key names a fine component or its prefix before ``/`` (``logits_processor`` is
        every logits processor together).
        """
        best = 0
        for part in self.parts:
            n = part.total if component is None else _matching(part.by, component)
            best = max(best, n)
        return best

    def where(self, component: str | None = None) -> str:
        """Where the count's value comes from: the step that holds the most and what it ran."""
        if not self.parts:
            return ""
        part = max(self.parts, key=lambda p: p.total if component is None else _matching(p.by, component))
        keys = [k for k in part.by if component is None or k == component or k.startswith(component + "/")]
        shown = sorted(keys, key=lambda k: -part.by[k])
        bits = []
        for k in shown[:4]:
            detail = self.details.get(k)
            bits.append(f"{k} {part.by[k]}" + (f" ({detail})" if detail else ""))
        if len(shown) > 4:
            bits.append(f"+{len(shown) - 4} more")
        head = "" if part.label == "block" else part.label + ": "
        return head + ", ".join(bits)

    def components(self) -> dict[str, int]:
        """Every fine component with its value (per step: its most in any one step)."""
        keys = sorted({k for p in self.parts for k in p.by})
        return {k: self.value(k) for k in keys}


def _matching(by: dict[str, int], component: str) -> int:
    return sum(n for k, n in by.items() if k == component or k.startswith(component + "/"))


# -- the measurement --------------------------------------------------------------------------------

_active = threading.local()


class Measurement:
    """Measure ``counts`` (names of :data:`COUNTS`) while entered, on the entering thread.

    Enter it around the code to measure; after it exits, :attr:`results` holds a :class:`Measured` per
    count. Blocks do not nest.

    Example:
        >>> from gpuprobe.testing.budget import Measurement
        >>> with Measurement(["dynamic_cache_concats"]) as m:
        ...     pass  # model.generate(...)
        >>> m.results["dynamic_cache_concats"].value()
        0
    """

    def __init__(self, counts: Iterable[str]) -> None:
        self.counts = tuple(dict.fromkeys(counts))
        unknown = [c for c in self.counts if c not in COUNTS]
        if unknown:
            raise BudgetError(f"unknown count(s) {', '.join(unknown)}; the counts are: {', '.join(COUNTS)}")
        self.results: dict[str, Measured] = {}
        self._undo: list[Callable[[], None]] = []
        self._finish: list[Callable[[], None]] = []
        self._thread = 0
        self._calls_ended: list[Callable[[], None]] = []

    # -- entering ---------------------------------------------------------------------------------
    def __enter__(self) -> Measurement:
        if getattr(_active, "on", False):
            raise BudgetError("a budget block inside another: measure one block at a time")
        _active.on = True
        self._thread = threading.get_ident()
        self.results = {name: Measured(name) for name in self.counts}
        try:
            self._start()
        except BaseException:
            self._stop_all()
            _active.on = False
            raise
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            self._stop_all()
            if exc_type is None:
                for finish in self._finish:
                    finish()
        finally:
            _active.on = False

    def _stop_all(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception:  # putting things back must go on: the next one is as needed
                pass

    def _skip(self, names: tuple[str, ...], why: str) -> None:
        for name in names:
            if name in self.results and self.results[name].skipped is None:
                self.results[name].skipped = why

    def _start(self) -> None:
        wanted = set(self.counts)
        syncs = tuple(n for n in _SYNC_COUNTS if n in wanted)
        stepped = tuple(n for n in (*_SYNC_COUNTS, "launches_per_step", "python_calls_per_step") if n in wanted)
        torch = _torch()
        if torch is None:
            self._skip(tuple(n for n in wanted if n not in ("python_calls_per_step", "dynamic_cache_concats")),
                       "torch is not installed")
        if stepped:
            self._observe_steps(stepped)
        if syncs and torch is not None:
            self._audit_syncs(syncs)
        if "launches_per_step" in wanted and torch is not None:
            self._record_launches()
        if "python_calls_per_step" in wanted:
            self._count_python_calls()
        if {"recompiles", "graph_breaks"} & wanted and torch is not None:
            self._watch_dynamo(torch)
        if "dynamic_cache_concats" in wanted:
            self._count_concats()
        if "peak_memory_bytes" in wanted and torch is not None:
            self._watch_memory(torch)

    # -- steps: the integration observes generate(); call ends come from the step clock's done hook
    def _observe_steps(self, names: tuple[str, ...]) -> None:
        from .. import _probe
        from ..runtime import DISABLED_AT_IMPORT, runtime

        if DISABLED_AT_IMPORT or not _probe.is_enabled():
            self._skip(tuple(n for n in names if n not in ("host_syncs", "host_syncs_all")),
                       "gpuprobe is disabled (GPUPROBE_DISABLE or gpuprobe.disable()): no generation step is observed")
            return
        try:
            import transformers  # noqa: F401 - only to know whether it is there
        except ImportError:  # no transformers: steps come only from gpuprobe.step() of the program's own loop
            pass
        else:
            from ..integrations import transformers as hf

            # Models instrumented already keep their options; the others are instrumented at their first
            # generate() in the block, without the gauges (no reading of memory or cache bytes added to a step).
            # Class-wide instrumentation of the program's own (instrument_class, gpuprobe run) is left as it is.
            if not hf._class_patches:
                hf.instrument_all(memory=False, kv_cache=False)
                self._undo.append(hf.uninstrument_all)
        rt = runtime()
        rt.drain()  # an empty buffer: no drain of earlier records inside a step of the block

        def done() -> None:
            if threading.get_ident() == self._thread:
                for fn in self._calls_ended:
                    fn()

        rt.add_steps_done_hook(done)
        self._undo.append(lambda: rt.remove_steps_done_hook(done))

    # -- host syncs -------------------------------------------------------------------------------
    def _audit_syncs(self, names: tuple[str, ...]) -> None:
        import gpuprobe

        from .. import _sync_audit
        from ..runtime import runtime

        rt = runtime()
        sites = _sync_audit.SyncSites(lambda key, message: None, keep=10_000)
        previous_sites = rt.sync_sites
        rt.sync_sites = sites  # the block's own: its sites are all new to it, and nothing is warned
        self._undo.append(lambda: _restore_sites(rt, previous_sites))
        previous_every = rt.settings.sync_audit
        if previous_every != 1:
            gpuprobe.configure(sync_audit=1)
            self._undo.append(lambda: gpuprobe.configure(sync_audit=previous_every))
        stream = _SyncSteps()
        rt.add_sink(stream.sink)
        self._undo.append(lambda: rt.remove_sink(stream.sink))
        outside = _OutsideSites(sites)
        try:
            audit = _sync_audit.new_audit(outside)  # type: ignore[arg-type]
            audit.where = ("outside_steps", None)
            audit.__enter__()
        except Exception as exc:
            self._calls_ended.append(lambda: (rt.drain(), stream.call_ended()))
            self._skip(names, f"the sync audit cannot start here: {exc}")
            return
        outside.audit = audit
        by_op: dict[str, int] = {}  # every sync of the block by operator (the block's audit's, folded)

        def fold() -> None:
            # Emptied at each call's end: the audit looks again at the first hits of a key seen only as
            # expected, counted in its counts, so this starts them over and a sync of the user's between
            # two calls is looked at however many transformers ran before.
            counts, audit.counts = audit.counts, {}
            for (_where, func), n in counts.items():
                op = _sync_audit.op_name(func)
                by_op[op] = by_op.get(op, 0) + n

        self._calls_ended.append(lambda: (rt.drain(), stream.call_ended(), fold()))
        on = audit in (getattr(_sync_audit._local, "audits", None) or ())

        def leave() -> None:
            audit.__exit__(None, None, None)
            rt.drain()
            stream.call_ended()
            fold()

        self._undo.append(leave)
        if not on:
            self._skip(names, "the sync audit switched itself off after a failure of its own (gpuprobe.info()['seams'])")
            return

        def finish() -> None:
            expected = sites.only_expected()
            for name in names:
                m = self.results[name]
                if m.skipped is not None:
                    continue
                every = name.endswith("_all")
                if not COUNTS[name].per_step:
                    parts = _sync_block(stream, by_op, expected)
                    m.note = f"{stream.steps_seen()} steps audited" if stream.steps_seen() else "no generation step"
                else:
                    parts, unaudited = stream.decode_parts(expected)
                    if unaudited:
                        m.skipped = (f"{unaudited} decode step(s) were not audited (a forward transformers "
                                     "compiles, or a CUDA graph capture underway)")
                        continue
                    _need_steps(name, parts.every)
                    m.note = f"{len(parts.every)} decode steps"
                if every:
                    m.parts, m.details = parts.every, _site_details(sites, expected, None, parts.keys)
                    continue
                m.parts, m.details = parts.users, _site_details(sites, expected, False, parts.keys)
                m.expected = Measured(name, parts.expected, _site_details(sites, expected, True, parts.keys),
                                      note="transformers' own syncs, left out of the count")

        self._finish.append(finish)

    # -- launches ---------------------------------------------------------------------------------
    def _record_launches(self) -> None:
        from .. import _kernel_sampler
        from ..runtime import runtime

        m = self.results["launches_per_step"]
        if m.skipped is not None:
            return
        try:
            recorder = _kernel_sampler._recorder()
        except Exception as exc:
            m.skipped = f"kernels cannot be recorded on this torch: {exc}"
            return
        if recorder.busy():
            m.skipped = "another profiler records this thread (a profile window, kernel sampling, torch.profiler)"
            return
        rt = runtime()
        steps: _LaunchSteps | _LaunchCalls = _LaunchSteps(recorder)
        if isinstance(recorder, _kernel_sampler._CpuLegacyRecorder):
            try:
                steps = _LaunchCalls(recorder, _torch())
            except Exception as exc:
                m.skipped = f"the steps cannot be marked in the autograd profiler on this torch: {exc!r}"
                return

        def on_step(index: int) -> None:
            if threading.get_ident() == self._thread:
                if steps.step_started():
                    rt.steps.mark_sampled(index)  # a session nobody reads: the step needs no ranges in it

        rt.add_step_hook(on_step)
        self._undo.append(lambda: rt.remove_step_hook(on_step))
        self._calls_ended.append(steps.call_ended)
        self._undo.append(steps.call_ended)

        def finish() -> None:
            parts, unrecorded = steps.decode_parts()
            if unrecorded:
                m.skipped = f"{unrecorded} decode step(s) were recorded by another profiler, not this count"
                return
            m.parts = _need_steps("launches_per_step", parts)
            m.note = f"{len(parts)} decode steps, " + ("CPU operators" if recorder.cpu_ops else "CUDA kernels")

        self._finish.append(finish)

    # -- Python calls -----------------------------------------------------------------------------
    def _count_python_calls(self) -> None:
        from ..runtime import runtime

        m = self.results["python_calls_per_step"]
        if m.skipped is not None:
            return
        if sys.getprofile() is not None:
            m.skipped = f"another profile function is set on this thread (sys.getprofile(): {sys.getprofile()!r})"
            return
        rt = runtime()
        calls = _PythonCalls(rt)

        def on_step(index: int) -> None:
            if threading.get_ident() == self._thread:
                calls.step_started()

        rt.add_step_hook(on_step)
        self._undo.append(lambda: rt.remove_step_hook(on_step))
        self._calls_ended.append(calls.call_ended)
        sys.setprofile(calls.profile)
        self._undo.append(calls.stop)

        def finish() -> None:
            parts = calls.decode_parts()
            m.parts = _need_steps("python_calls_per_step", parts)
            m.note = f"{len(parts)} decode steps"

        self._finish.append(finish)

    # -- Dynamo -----------------------------------------------------------------------------------
    def _watch_dynamo(self, torch: Any) -> None:
        from .._torch_caps import dynamo_caps

        names = tuple(n for n in ("recompiles", "graph_breaks") if n in self.results)
        caps = dynamo_caps(torch)
        if caps is None:
            self._skip(names, f"torch {getattr(torch, '__version__', '?')} keeps no compile records gpuprobe can read "
                              "(torch._dynamo.utils.counters, guard_failures, callback_handler)")
            return
        breaks_before = dict(caps.counters.get("graph_break", {}))
        failures_before = {code: len(v) for code, v in caps.guard_failures.items()}
        recompiles: list[tuple[str, str]] = []  # (function, reason)

        def on_compile(args: Any) -> None:
            if getattr(args, "callback_trigger", caps.dynamo_trigger) != caps.dynamo_trigger:
                return
            found = re.match(r"^\[?(\d+)/(\d+)", str(getattr(args, "compile_id", "")))
            if not found or int(found.group(2)) == 0:
                return
            where, reason = "?", "?"
            for code, reasons in list(caps.guard_failures.items()):
                seen = failures_before.get(code, 0)
                if len(reasons) > seen:
                    where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
                    reason = re.sub(r"^\d+/\d+: ", "", str(reasons[seen]))
                    failures_before[code] = len(reasons)
            recompiles.append((where, reason))

        caps.add_start_callback(on_compile)
        self._undo.append(lambda: caps.remove_start_callback(on_compile))

        def finish() -> None:
            if "recompiles" in self.results:
                m = self.results["recompiles"]
                by: dict[str, int] = {}
                for where, reason in recompiles:
                    by[where] = by.get(where, 0) + 1
                    m.details.setdefault(where, reason)
                m.parts = [Part("block", by, len(recompiles))]
            if "graph_breaks" in self.results:
                m = self.results["graph_breaks"]
                by = {}
                for message, n in dict(caps.counters.get("graph_break", {})).items():
                    grew = int(n) - int(breaks_before.get(message, 0))
                    if grew > 0:
                        key = _break_reason(str(message))
                        by[key] = by.get(key, 0) + grew
                m.parts = [Part("block", by, sum(by.values()))]

        self._finish.append(finish)

    # -- cache concatenations ---------------------------------------------------------------------
    def _count_concats(self) -> None:
        m = self.results["dynamic_cache_concats"]
        try:
            from ..integrations._transformers.cache import ConcatCounter

            counter = ConcatCounter()
            counter.__enter__()
        except Exception as exc:
            m.skipped = f"transformers' cache layers cannot be counted here: {exc}"
            return
        self._undo.append(lambda: counter.__exit__(None, None, None))

        def finish() -> None:
            if not counter.working:
                m.skipped = "its seam switched itself off after a failure of its own (gpuprobe.info()['seams'])"
                return
            m.parts = [Part("block", dict(counter.counts), sum(counter.counts.values()))]

        self._finish.append(finish)

    # -- memory -----------------------------------------------------------------------------------
    def _watch_memory(self, torch: Any) -> None:
        m = self.results["peak_memory_bytes"]
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_available():
            m.skipped = ("no CUDA device: peak memory is the CUDA caching allocator's (a CPU has no counter "
                         "of its own that repeats exactly)")
            return
        devices = range(cuda.device_count())
        if cuda.is_initialized():
            for d in devices:
                cuda.reset_peak_memory_stats(d)

        def finish() -> None:
            by = {f"cuda:{d}": int(cuda.max_memory_allocated(d)) for d in devices} if cuda.is_initialized() else {}
            m.parts = [Part("block", by, max(by.values(), default=0))]
            m.note = "CUDA caching allocator"

        self._finish.append(finish)


def _restore_sites(rt: Any, sites: Any) -> None:
    """Give the runtime back the sync sites it had (the block had its own)."""
    rt.sync_sites = sites


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        import torch  # noqa: F811 - a budget of syncs, launches or compiles needs it; imported when asked for
    except ImportError:
        return None
    return torch


def _need_steps(name: str, parts: list[Part]) -> list[Part]:
    if not parts:
        raise BudgetError(f"{name}: no decode step ran in the block (a per-step count needs a generate() call of 3 "
                          "or more new tokens: its first step is the prefill, its last runs into the call's end)")
    return parts


SyncKey = tuple[str, "str | None", str]  # (component, processor, op): what the sync audit's sites classify


def _fine(key: SyncKey) -> str:
    """The fine component of a sync key: ``other``, ``logits_processor/NoRepeat``."""
    return key[0] if key[1] is None else f"{key[0]}/{key[1]}"


@dataclasses.dataclass
class _SyncParts:
    """The syncs of the counted steps (or of the block) three ways, part for part.

    Attributes:
        users: the syncs of the user's code: every key but those ``SyncSites.only_expected()`` names.
        expected: those keys' syncs (transformers' own).
        every: both together.
        keys: every key counted in them.
    """

    users: list[Part] = dataclasses.field(default_factory=list)
    expected: list[Part] = dataclasses.field(default_factory=list)
    every: list[Part] = dataclasses.field(default_factory=list)
    keys: set[SyncKey] = dataclasses.field(default_factory=set)

    def add(self, label: str, by: Mapping[SyncKey, int], expected: frozenset[SyncKey]) -> None:
        """One more part: ``by`` (key → syncs) split into the user's and the expected ones."""
        users: dict[str, int] = {}
        theirs: dict[str, int] = {}
        every: dict[str, int] = {}
        for key, n in by.items():
            if n <= 0:
                continue
            self.keys.add(key)
            fine = _fine(key)
            every[fine] = every.get(fine, 0) + n
            side = theirs if key in expected else users
            side[fine] = side.get(fine, 0) + n
        for parts, counts in ((self.users, users), (self.expected, theirs), (self.every, every)):
            parts.append(Part(label, counts, sum(counts.values())))


def _sync_block(stream: _SyncSteps, by_op: Mapping[str, int], expected: frozenset[SyncKey]) -> _SyncParts:
    """The block's syncs: those of its audited steps by key, and the rest by operator as ``outside_steps``."""
    by: dict[SyncKey, int] = {}
    in_steps: dict[str, int] = {}
    for steps in stream.calls:
        for step in steps:
            for key, n in (step.by or {}).items():
                by[key] = by.get(key, 0) + n
                in_steps[key[2]] = in_steps.get(key[2], 0) + n
    for op, n in by_op.items():
        rest = n - in_steps.get(op, 0)
        if rest > 0:
            by[("outside_steps", None, op)] = rest
    parts = _SyncParts()
    parts.add("block", by, expected)
    return parts


class _OutsideSites:
    """The block's own audit (``outside_steps``) tells the block's sites of its sightings outside audited
    steps only: inside one, the step's audit sees the same sync under its component and classifies it."""

    __slots__ = ("sites", "audit", "active")

    def __init__(self, sites: Any) -> None:
        from .. import _sync_audit

        self.sites = sites
        self.audit: Any = None
        self.active = _sync_audit.active

    def seen(self, where: Any, op: str) -> bool:
        if self.active() is not self.audit:
            return False  # not settled: its next hits are looked at, those outside a step among them
        return bool(self.sites.seen(where, op))


def _site_details(sites: Any, expected: frozenset[SyncKey], side: bool | None, keys: set[SyncKey]) -> dict[str, str]:
    """Fine component → where its syncs ran, for the keys counted on one side (True: the expected ones,
    False: the user's, None: both); the user's sightings first."""
    out: dict[str, str] = {}
    for entry in sorted(list(sites.recent), key=lambda e: bool(e.get("expected"))):
        key = (entry["component"], entry.get("processor"), entry["op"])
        if key not in keys or (side is not None and (key in expected) != side):
            continue
        fine = _fine(key)
        text = _site_text(entry)
        if fine in out:
            if text not in out[fine]:
                out[fine] += f"; {text}"
        else:
            out[fine] = text
    return out


def _site_text(entry: Mapping[str, Any]) -> str:
    """``aten::op at file:line``; a sync of transformers' own: ``aten::op in transformers at its file:line``."""
    via = entry.get("via")
    if via is None:
        return f"{entry['op']} at {_short(entry['source'])}"
    if entry.get("expected"):
        return f"{entry['op']} in transformers at {_in_package(via)}"
    return f"{entry['op']} at {_short(entry['source'])} (in transformers at {_in_package(via)})"


def _in_package(path_line: str) -> str:
    """A source line inside transformers, from the package's folder on (``transformers/generation/utils.py:396``)."""
    marker = os.sep + "transformers" + os.sep
    i = path_line.rfind(marker)
    return path_line[i + 1:] if i >= 0 else _short(path_line)


def _short(path_line: str) -> str:
    """A source line's path made relative to the working folder when it is under it."""
    try:
        path, _, line = path_line.rpartition(":")
        rel = os.path.relpath(path)
        return f"{rel if not rel.startswith('..') else path}:{line}"
    except ValueError:
        return path_line


def _break_reason(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    head = lines[0] if lines else message
    explanation = next((line[len("Explanation:"):].strip() for line in lines if line.startswith("Explanation:")), "")
    text = f"{head}: {explanation}" if explanation else head
    return text[:160]


class _SyncSteps:
    """The audited steps as the sink sees their records: ``audited``, its syncs, then its host duration."""

    def __init__(self) -> None:
        self.calls: list[list[_Step]] = []
        self.current: list[_Step] = []
        self.pending: dict[SyncKey, int] | None = None

    def sink(self, name: str, labels: Any, value: Any) -> None:
        if name == "gpuprobe.step.audited":
            self.pending = {}
        elif name == "gpuprobe.step.syncs":
            if self.pending is not None:
                d = dict(labels)
                key = (d.get("component", "other"), d.get("processor") or None, d.get("op", "?"))
                self.pending[key] = self.pending.get(key, 0) + int(round(value))
        elif name == "gpuprobe.step.duration":
            d = dict(labels)
            if d.get("clock", "host") == "host":
                self.current.append(_Step(d.get("phase", "decode"), self.pending))
                self.pending = None

    def call_ended(self) -> None:
        if self.current:
            self.calls.append(self.current)
            self.current = []

    def steps_seen(self) -> int:
        return sum(len(c) for c in self.calls)

    def decode_parts(self, expected: frozenset[SyncKey]) -> tuple[_SyncParts, int]:
        """Each audited decode step's syncs, split (``expected``: the keys left out), and how many were not audited."""
        parts = _SyncParts()
        unaudited = 0
        for c, steps in enumerate(self.calls):
            for s, step in enumerate(steps[1:-1], start=1):
                if step.by is None:
                    unaudited += 1
                    continue
                parts.add(f"call {c + 1}, step {s}", step.by, expected)
        return parts, unaudited


@dataclasses.dataclass
class _Step:
    phase: str
    by: dict[SyncKey, int] | None  # None: the step was not audited


class _LaunchSteps:
    """Each step of the block's thread recorded on its own by torch.profiler (CUDA kernels, or without
    CUDA the kineto CPU trace where torch has no autograd-profiler CPU state); parsed once the block is over."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.recording = False
        self.calls: list[list[Any]] = []  # per call: each step's raw record (None: not recorded)
        self.current: list[Any] = []

    def _stop(self) -> None:
        if self.recording:
            self.recording = False
            self.current[-1] = self.recorder.stop()

    def step_started(self) -> bool:
        """A step of the block's thread starts: record it; returns whether it is recorded."""
        self._stop()
        self.current.append(None)
        if not self.recorder.busy():
            self.recorder.start()
            self.recording = True
        return self.recording

    def call_ended(self) -> None:
        self._stop()
        if self.current:
            self.calls.append(self.current)
            self.current = []

    def decode_parts(self) -> tuple[list[Part], int]:
        from .._kernel_names import categorize_cpu_op, categorize_kernel

        parts: list[Part] = []
        unrecorded = 0
        category = categorize_cpu_op if self.recorder.cpu_ops else categorize_kernel
        for c, steps in enumerate(self.calls):
            for s, raw in enumerate(steps[1:-1], start=1):
                if raw is None:
                    unrecorded += 1
                    continue
                names = [name for name, _ns in self.recorder.events(raw)]
                parts.append(Part(f"call {c + 1}, step {s}", _by_category(names, category), len(names)))
        return parts, unrecorded


_STEP_MARK = "gpuprobe.budget.step"
"""The range :class:`_LaunchCalls` opens and closes at each step start, in its session only."""


class _LaunchCalls:
    """The block's thread recorded by the autograd profiler's CPU state, one session a ``generate()`` call:
    from its first decode step's start to the call's end, an empty ``gpuprobe.budget.step`` range at each
    step start telling the steps apart. Parsed once the block is over; the prefill is not recorded.

    Why a session a call and not one a step: a session's cost is mostly per operator it records (recording
    ~1.7 us, stopping ~2.3 us, reading ~1 us, for the ~1,700 operators of a decode step of a Llama 512 x 8);
    what a session a step adds on top is its start and stop, which on a step of ~1 ms (a Llama 64 x 2,
    ~300 operators) is a third of the count's cost (benchmarks/RESULTS-budget.md). The steps are told
    apart by a range in the same record, not by clocks: each operator falls in the step it ran in.
    """

    def __init__(self, recorder: Any, torch: Any) -> None:
        from .._torch_caps import record_function_ops

        ops = record_function_ops(torch)  # AttributeError on a torch without them: the caller skips the count
        self.recorder = recorder
        self._enter, self._exit, self._no_torch_function = ops.enter, ops.exit, ops.no_torch_function
        self.recording = False
        self.steps = 0  # step starts in the running call
        self.calls: list[tuple[Any, int]] = []  # per call: (its session's record or None, its step starts)

    def step_started(self) -> bool:
        """A step of the block's thread starts: mark it in the call's session (started at its second step);
        returns whether it is recorded."""
        self.steps += 1
        if self.steps == 2 and not self.recording and not self.recorder.busy():
            self.recorder.start()
            self.recording = True
        if self.recording:
            handle = self._enter(_STEP_MARK, None)
            with self._no_torch_function():
                self._exit(handle)
        return self.recording

    def call_ended(self) -> None:
        raw = None
        if self.recording:
            self.recording = False
            try:
                raw = self.recorder.stop()
            except Exception:  # a session stopped by someone else: the call's steps count as not recorded
                raw = None
        if self.steps:
            self.calls.append((raw, self.steps))
        self.steps = 0

    def decode_parts(self) -> tuple[list[Part], int]:
        from .._kernel_names import categorize_cpu_op

        parts: list[Part] = []
        unrecorded = 0
        for c, (raw, steps) in enumerate(self.calls):
            decode = max(0, steps - 2)  # the steps after the prefill and before the last
            counted = _legacy_steps(raw) if raw is not None else []
            if len(counted) != steps - 1:  # not recorded, or not from its first decode step on
                unrecorded += decode
                continue
            for s, names in enumerate(counted[:decode], start=1):
                parts.append(Part(f"call {c + 1}, step {s}", _by_category(names, categorize_cpu_op), len(names)))
        return parts, unrecorded


def _by_category(names: list[str], category: Callable[[str], str]) -> dict[str, int]:
    """Operator or kernel names counted by category (each distinct name categorized once)."""
    by_name: dict[str, int] = {}
    for name in names:
        by_name[name] = by_name.get(name, 0) + 1
    by: dict[str, int] = {}
    for name, n in by_name.items():
        cat = category(name)
        by[cat] = by.get(cat, 0) + n
    return by


def _legacy_steps(threads: list[list[Any]]) -> list[list[str]]:
    """The computing ATen operators of each step of an autograd-profiler session, one per run.

    Args:
        threads: ``_disable_profiler_legacy()``'s result: one list of push/pop events per thread, in order.
            A step starts at each push of :data:`_STEP_MARK` on the thread that marks them; an operator of
            another thread falls in the step whose mark started last before it.

    Why not the kernel sampler's self times: an operator the sync audit runs again underneath itself
    (its PreDispatch kernel calls it once more, the key excluded) is recorded twice, nested; counted
    once here (an operator directly inside one of the same name), so that the count is the same whether
    the syncs are audited in the same block or not.
    """
    from .._kernel_sampler import _METADATA_NAMES

    skip = _METADATA_NAMES
    steps: list[list[str]] = []
    starts: list[float] = []  # each mark's start (us): the steps of the other threads' operators
    unmarked: list[list[Any]] = []
    for evs in threads:
        current: list[str] | None = None
        for e, name, parent in _pushes(evs):
            if name == _STEP_MARK:
                current = []
                steps.append(current)
                starts.append(e.start_us())
            elif current is not None and name != parent and name.startswith("aten::") and name not in skip:
                current.append(name)
        if current is None and evs:
            unmarked.append(evs)
    if starts:
        for evs in unmarked:
            _add_by_time(evs, starts, steps, skip)
    return steps


def _pushes(evs: list[Any]) -> Iterator[tuple[Any, str, str]]:
    """Each push of one thread's push/pop events: the event, its name and the name of the range it opens in."""
    if not evs:
        return
    event = type(evs[0])
    # Why the methods looked up once and the parent's name kept in a local: this loop runs over every
    # push and pop of the call (~3,400 a step of a Llama 512 x 8), each accessor a call into C++.
    kind_of, name_of = event.kind, event.name
    stack: list[str] = []
    top = ""
    for e in evs:
        kind = kind_of(e)
        if kind == "push":
            name = name_of(e)
            yield e, name, top
            stack.append(top)
            top = name
        elif kind == "pop" and stack:
            top = stack.pop()


def _add_by_time(evs: list[Any], starts: list[float], steps: list[list[str]], skip: frozenset[str]) -> None:
    """The computing operators of a thread without step marks, each into the step that had started when it did."""
    import bisect

    for e, name, parent in _pushes(evs):
        if name != parent and name.startswith("aten::") and name not in skip:
            i = bisect.bisect_right(starts, e.start_us()) - 1
            if i >= 0:
                steps[i].append(name)


class _PythonCalls:
    """``sys.setprofile`` on the block's thread: calls by package, per step (a step hook marks each start).

    Not counted: this module's own functions and the pytest plugin's, and with what they call: the step
    clock's dispatch to hooks (``advance``, ``traced``, ``sampled``: only there because a budget installed
    a hook) and the runtime's drain (applying buffered records, which a step runs when its buffer fills).
    """

    def __init__(self, rt: Any) -> None:
        from .._steps import StepClock

        self.excluded = {StepClock.advance.__code__, StepClock.traced.__code__, StepClock.sampled.__code__,
                         type(rt).drain.__code__}
        here = os.path.dirname(os.path.abspath(__file__))
        self.own_files = {os.path.join(here, "budget.py"), os.path.join(os.path.dirname(here), "pytest_plugin.py")}
        self.packages: dict[Any, str] = {}
        self.calls: list[list[dict[str, int]]] = []
        self.current: list[dict[str, int]] = []
        self.bucket: dict[str, int] = {}  # the running step's calls by package, or those outside any step
        self.in_step = False
        self.skipping = 0
        self.stopped = False

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            if self.skipping:
                self.skipping += 1
                return
            code = frame.f_code
            package = self.packages.get(code)
            if package is None:
                if code in self.excluded or code.co_filename in self.own_files:
                    self.skipping = 1
                    return
                package = _package(code, frame)
                self.packages[code] = package
            bucket = self.bucket
            bucket[package] = bucket.get(package, 0) + 1
        elif event == "return" and self.skipping:
            self.skipping -= 1

    def step_started(self) -> None:
        if self.in_step:
            self.current.append(self.bucket)
        self.bucket = {}
        self.in_step = True

    def call_ended(self) -> None:
        if self.in_step:
            self.current.append(self.bucket)
        self.bucket = {}
        self.in_step = False
        if self.current:
            self.calls.append(self.current)
            self.current = []

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            sys.setprofile(None)
            self.call_ended()

    def decode_parts(self) -> list[Part]:
        return [Part(f"call {c + 1}, step {s}", dict(by), sum(by.values()))
                for c, steps in enumerate(self.calls) for s, by in enumerate(steps[1:-1], start=1)]


def _package(code: Any, frame: Any) -> str:
    """The top-level package of the code a frame runs (the wrappers gpuprobe generates are gpuprobe's)."""
    if code.co_filename.startswith("<gpuprobe"):
        return "gpuprobe"
    module = frame.f_globals.get("__name__") or "?"
    return str(module).split(".", 1)[0]


# -- checking -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table a budget or baseline check prints.

    Attributes:
        count: the count, with its component in brackets (``host_syncs_per_step[logits_processor]``).
        limit: the budget or the baseline's value, in words.
        measured: the value measured here (None: skipped).
        verdict: ``ok``, ``over`` (the budget), ``grew``, ``shrank`` (against a baseline), ``new``,
            ``skipped``, ``expected`` (syncs of transformers' own a count left out, shown beside it).
        where: where the value comes from (or why it was skipped).
    """

    count: str
    limit: str
    measured: int | None
    verdict: str
    where: str

    @property
    def failed(self) -> bool:
        return self.verdict in ("over", "grew", "new")


def check(budgets: Mapping[str, int | dict[str, int]], results: Mapping[str, Measured]) -> list[Row]:
    """Each budget against what was measured: one row per budget (and per component budgeted)."""
    rows: list[Row] = []
    for name, limit in budgets.items():
        m = results[name]
        items = limit.items() if isinstance(limit, dict) else [(None, limit)]
        for component, n in items:
            label = name if component is None else f"{name}[{component}]"
            if m.skipped is not None:
                rows.append(Row(label, str(n), None, "skipped", m.skipped))
                continue
            got = m.value(component)
            rows.append(Row(label, str(n), got, "over" if got > n else "ok", m.where(component) if got else m.note))
        rows.extend(_expected_rows(name, m))
    return rows


def _expected_rows(name: str, m: Measured) -> list[Row]:
    """The syncs a count left out as expected, as one row of the table (none when there were none)."""
    theirs = m.expected
    if m.skipped is not None or theirs is None or not theirs.value():
        return []
    return [Row(f"{name} (expected)", "-", theirs.value(), "expected", "left out, transformers' own: " + theirs.where())]


def render(rows: list[Row], header: str) -> str:
    """A short table: count, budget or baseline, measured, verdict, where; failing rows first."""
    ordered = [r for r in rows if r.failed] + [r for r in rows if not r.failed]
    table = [("count", "limit", "measured", "", "where")]
    table += [(r.count, r.limit, "-" if r.measured is None else str(r.measured), r.verdict, r.where) for r in ordered]
    widths = [max(len(t[i]) for t in table) for i in range(4)]
    lines = [header]
    for t in table:
        lines.append("  ".join(t[i].ljust(widths[i]) if i != 2 else t[i].rjust(widths[i]) for i in range(4))
                     + ("  " + t[4] if t[4] else ""))
    return "\n".join(line.rstrip() for line in lines)


# -- baselines ----------------------------------------------------------------------------------------

BASELINE_FORMAT = 1
"""The version of the baseline files' shape (``"format"``)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def check_name(name: Any) -> str:
    """A baseline's name: letters, digits, ``_ . -`` (it names the file ``<name>.json``)."""
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith(".json"):
        raise BudgetError(f"a baseline name is 1-100 letters, digits, '_', '.' or '-', starting with a letter or "
                          f"digit, without .json (it names the file NAME.json): got {name!r}")
    return name


def machine_key() -> str:
    """What a baseline's counts belong to: ``cpu``, or ``cuda:<device name>`` (kernels differ by GPU)."""
    cuda = getattr(_torch(), "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            return f"cuda:{cuda.get_device_name(cuda.current_device())}"
    except Exception:
        pass
    return "cpu"


def _versions() -> dict[str, str]:
    out = {}
    for lib in ("torch", "transformers"):
        mod = sys.modules.get(lib)
        if mod is not None:
            out[lib] = str(getattr(mod, "__version__", "?"))
    return out


def baseline_record(results: Mapping[str, Measured]) -> dict[str, Any]:
    """What a baseline keeps of one machine's counts: each count's value and its components' values."""
    counts: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name, m in results.items():
        if m.skipped is not None:
            skipped[name] = m.skipped
            continue
        # Counts without components (recompiles, graph breaks) keep none: their parts name functions and
        # files of this machine, which another machine's checkout names otherwise.
        counts[name] = {"all": m.value(), "components": m.components() if COUNTS[name].components else {}}
    record: dict[str, Any] = {"counts": counts, "versions": _versions()}
    if skipped:
        record["skipped"] = skipped
    return record


def read_baseline(path: str) -> dict[str, Any] | None:
    """The baseline file at ``path`` (None when there is none), its shape checked.

    Raises:
        BaselineError: the file cannot be read as a baseline; the message names the file and the problem.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"baseline {path} cannot be read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix it "
                            "or write it again with pytest --gpuprobe-update") from None
    _check_shape(path, data)
    return data


def _check_shape(path: str, data: Any) -> None:
    def bad(what: str) -> BaselineError:
        return BaselineError(f"baseline {path}: {what}; fix it or write it again with pytest --gpuprobe-update")

    if not isinstance(data, dict):
        raise bad(f"the file holds {type(data).__name__}, not an object")
    unknown = set(data) - {"format", "name", "test", "machines"}
    if unknown:
        raise bad(f"unknown field(s) {', '.join(sorted(unknown))}")
    if data.get("format") != BASELINE_FORMAT:
        raise bad(f"format is {data.get('format')!r}, this gpuprobe reads format {BASELINE_FORMAT}")
    for field in ("name", "test"):
        if not isinstance(data.get(field), str):
            raise bad(f"{field} must be a string, got {data.get(field)!r}")
    machines = data.get("machines")
    if not isinstance(machines, dict) or not machines:
        raise bad("machines must be an object of machine → counts")
    for machine, record in machines.items():
        if not isinstance(record, dict):
            raise bad(f"machines[{machine!r}] must be an object")
        extra = set(record) - {"counts", "versions", "skipped"}
        if extra:
            raise bad(f"machines[{machine!r}]: unknown field(s) {', '.join(sorted(extra))}")
        counts = record.get("counts")
        if not isinstance(counts, dict):
            raise bad(f"machines[{machine!r}].counts must be an object")
        for name, entry in counts.items():
            where = f"machines[{machine!r}].counts.{name}"
            if name not in COUNTS:
                raise bad(f"{where}: no such count (the counts are: {', '.join(COUNTS)})")
            if not isinstance(entry, dict) or set(entry) != {"all", "components"}:
                raise bad(f"{where} must be an object with all and components")
            values = [("all", entry["all"])]
            if not isinstance(entry["components"], dict):
                raise bad(f"{where}.components must be an object")
            values += [(f"components[{k!r}]", v) for k, v in entry["components"].items()]
            for label, v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise bad(f"{where}.{label} must be a whole number >= 0, got {v!r}")
        for field in ("versions", "skipped"):
            value = record.get(field, {})
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise bad(f"machines[{machine!r}].{field} must be an object of strings")


def compare_baseline(record: Mapping[str, Any], results: Mapping[str, Measured]) -> list[Row]:
    """Every count against the baseline's record for this machine: grew fails, shrank passes and says so."""
    counts = record.get("counts", {})
    rows: list[Row] = []
    for name, m in results.items():
        kept = counts.get(name)
        if m.skipped is not None:
            rows.append(Row(name, "-" if kept is None else str(kept["all"]), None, "skipped", m.skipped))
            continue
        if kept is None:
            rows.append(Row(name, "not in the baseline", m.value(), "new",
                            "counted here, not when the baseline was written: write it again with --gpuprobe-update"))
            continue
        got = m.value()
        rows.append(Row(name, str(kept["all"]), got, _verdict(kept["all"], got), m.where() if got else m.note))
        now = m.components() if COUNTS[name].components else {}
        for component in sorted(set(now) | set(kept["components"])):
            before, after = int(kept["components"].get(component, 0)), now.get(component, 0)
            if before != after:
                rows.append(Row(f"{name}[{component}]", str(before), after, _verdict(before, after),
                                m.where(component) if after else ""))
        rows.extend(_expected_rows(name, m))
    return rows


def _verdict(before: int, after: int) -> str:
    return "grew" if after > before else "shrank" if after < before else "ok"


def write_baseline(path: str, data: Mapping[str, Any]) -> None:
    """Write a baseline file whole (a temporary file renamed into place: never half-written)."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    _files.write_file_atomic(path, text, make_parents=True)


def version_note(record: Mapping[str, Any]) -> str:
    """``recorded with torch 2.12, now 2.13`` where the libraries changed since the baseline was written."""
    kept = record.get("versions", {})
    now = _versions()
    changed = [f"{lib} {kept[lib]} → {now[lib]}" for lib in sorted(kept) if lib in now and kept[lib] != now[lib]]
    return ("; the libraries changed since it was written: " + ", ".join(changed)) if changed else ""
