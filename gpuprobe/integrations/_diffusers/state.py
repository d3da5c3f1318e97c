"""The state of one instrumented pipeline (its series, its components, prepared once) and its calls' steps.

What the call's seam finds in ``pipe.__dict__[STATE_KEY]``: a :class:`PipelineState`. A call begins
(:meth:`PipelineState.begin_call`: its :class:`Call`, the innermost of this thread's calls) and ends
(:meth:`PipelineState.end_call`: its duration, the images it made). The component seams' hooks (the
``*_before`` / ``*_after`` functions below) find the call running on their thread (:func:`current`) and
measure it:

- a denoising step opens at the first step part (the denoiser's or ControlNet's forward) after the
  previous step's scheduler step, and closes at the next step's opening, at a component of the call (the
  VAE decode) or at the call's end: the steps tile the denoising loop, and ``denoiser + controlnet +
  scheduler + other`` is each step's host time;
- a part's host time always, its device span on a GPU (CUDA events on the device of its inputs, read
  later by the runtime: nothing waits for the device); an NVTX range for each while a tool is attached;
- the denoiser's calls of a step by branch: ``cond`` / ``uncond`` where the pipeline names them
  (``cache_context``), ``batched`` for the one forward of a step that computes guidance in one batch,
  ``cond`` without guidance, ``other`` for further unnamed calls;
- the memory high-water mark at the end of each component of the call, and of the denoising loop;
- the time to the first step's end; the step clock advances at each step (profile windows, kernel
  sampling); one step in ``sync_audit`` is audited and traced steps get component ranges (:mod:`.marks`);
  the denoiser's blocks on one step in ``layer_every`` (:mod:`.blocks`).

No device synchronisation is added, no argument is changed, no random number drawn. Copies and pickles
of a pipeline or of a component leave its state out (``__deepcopy__`` and ``__reduce__`` give ``None``): a
copied component's seams pass through to its class's methods.
"""

from __future__ import annotations

import sys
import threading
import weakref
from time import perf_counter_ns
from typing import Any

from ... import _seams, is_enabled, memory
from ..._torch_caps import profiler_caps
from ...runtime import Runtime
from . import compat
from .blocks import BlockTiming, find_blocks
from .marks import StepMarker
from .seams import COMPONENT_SEAMS, SEAM_BLOCKS, STATE_KEY, ComponentSeam

__all__ = ["PipelineState", "ComponentState", "Call", "current", "bind_torch"]

_local = threading.local()
_install_lock = threading.RLock()


def current() -> Call | None:
    """The innermost instrumented pipeline call running on this thread, if any."""
    return getattr(_local, "ctx", None)


def _never() -> bool:
    return False


# torch.compiler.is_dynamo_compiling once torch is there: a plain `return False` in eager code that Dynamo
# folds to True while it traces (bound when the first pipeline is instrumented).
compiling: Any = _never
# Whether a torch.profiler session records on the calling thread (a program's own profiler: its steps get
# ranges of their own).
profiling: Any = _never


def bind_torch() -> None:
    """Bind :data:`compiling` and :data:`profiling` to torch's own."""
    global compiling, profiling
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        compiling = getattr(compiler, "is_dynamo_compiling", compiler.is_compiling)
    if torch is not None:
        profiling = profiler_caps(torch).profiler_enabled or _never


class Call:
    """What one pipeline call on one thread knows while it runs (this thread's innermost, :func:`current`)."""

    __slots__ = ("state", "t0", "records", "nv", "clock", "device", "placed", "step", "step_open", "step_t0",
                 "sched_done", "parts_ns", "forwards", "branch_next", "batched", "inside", "dev_tok", "boundary",
                 "marks", "audit", "blocks_on", "block_stack", "depth", "live", "prev", "ttfs_done", "denoiser",
                 "reset_peak")

    def __init__(self, state: PipelineState, t0: int, records: Any, nv: Any, clock: Any) -> None:
        self.state = state
        self.t0 = t0
        self.records = records
        self.nv = nv  # the NVTX backend when a tool is attached, else None
        self.clock = clock  # the device clock, when the runtime has one (CUDA)
        self.device: int | None = None  # the CUDA device of the denoising steps (the denoiser's inputs)
        self.placed = False  # the steps' device is known (at the first step)
        self.step = -1  # the index of the running (or last) step in this call
        self.step_open = False
        self.step_t0 = 0
        self.sched_done = False  # the running step's scheduler step has returned: the next step part opens a step
        self.parts_ns = 0  # host time of the running step's parts (denoiser, ControlNet, scheduler)
        self.forwards = 0  # denoiser calls in the running step
        self.branch_next: str | None = None  # the name cache_context gave the denoiser call that follows
        self.batched = False  # the call computes guidance in one batched forward (read at the first step)
        self.inside = False  # a measured component is running: a component it calls is its own time
        self.dev_tok: Any = None  # the running step's device start
        self.boundary: Any = None  # the end event of the step just closed, for the next one to start at
        self.marks: Any = None  # the running step's ranges and sync audit, when it is marked
        self.audit = 0  # the sync_audit setting when the call began
        self.blocks_on = False  # the running step times the denoiser's blocks
        self.block_stack: list[tuple[int, Any]] = []
        self.depth = 0  # NVTX ranges the steps opened (closed at the call's end after a failure)
        self.live = True
        self.prev: Call | None = None  # the call this one runs inside on this thread (a pipeline calling another)
        self.ttfs_done = False
        self.denoiser = ""  # the denoiser component that ran last (the loop's memory reading is its)
        self.reset_peak = False  # memory_peak_reset: a reading resets the peak (the next one is a part's own)


class ComponentState:
    """What gpuprobe keeps on one component it patched (in its ``__dict__``): the originals and patches of its
    seams, its name in the pipelines that hold it, and those pipelines."""

    __slots__ = ("name", "role", "patches", "classwide", "users", "compiled", "__weakref__")

    def __init__(self, name: str, role: str) -> None:
        self.name = name
        self.role = role
        self.patches: list[_seams.Patch] = []  # replacements of its instance attributes
        self.classwide: list[tuple[type, str]] = []  # the class-wide replacements it uses
        self.users: weakref.WeakSet[PipelineState] = weakref.WeakSet()
        self.compiled: Any = None  # the in-place compiled call its seam stands in front of, if any

    def undo(self) -> None:
        for patch in reversed(self.patches):
            patch.undo()
        self.patches.clear()
        for cls, attribute in self.classwide:
            _off_class(cls, attribute)
        self.classwide.clear()

    # A deep copy of a component (or of its __dict__, put back by the pipeline) is still that component: the
    # copy shares the state (its name and role); the class-wide seams measure whichever instance they run on.
    def __deepcopy__(self, memo: dict[int, Any]) -> ComponentState:
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (type(None), ())  # NoneType() is None: loading imports nothing of gpuprobe


# -- the replacements ------------------------------------------------------------------------------------
#
# A method of the component's class (forward, step, decode, encode, cache_context) is replaced on the class,
# once per class and seam while a component of it is instrumented: the replacement finds the component's
# state in the instance it is called on (``self.__dict__``), and lets an instance without one through. Why on
# the class and not the instance: a copy of the component (``copy.copy``, ``copy.deepcopy``, a pipeline that
# deep-copies its scheduler's ``__dict__`` and puts it back) then runs its own method on itself, never a
# method bound to another object. An instance attribute (a compiled call, an ``OptimizedModule``'s
# ``forward``, accelerate's hooked ``forward``) is replaced on the instance, wrapping what was there.

_class_patches: dict[tuple[type, str], list[Any]] = {}  # (class, attribute) -> [Patch, components using it]


def _on_class(cls: type, cseam: ComponentSeam) -> _seams.Patch | None:
    """The class-wide replacement of ``cls.<attribute>`` (installed now if it is not); counted per user."""
    key = (cls, cseam.attribute)
    found = _class_patches.get(key)
    if found is None:
        before, after = _HOOKS[cseam.kind](cseam.component)

        def class_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            d = getattr(args[0], "__dict__", None) if args else None
            cs = d.get(STATE_KEY) if isinstance(d, dict) else None
            return None if cs is None else before(cs, args[1:], kwargs)

        original = _seams.unwrapped(cls, cseam.attribute)
        fn = _seams.wrap(cseam.seam, original, class_before, after)
        fn._gpuprobe_class_wrapper = True  # type: ignore[attr-defined]
        found = _class_patches[key] = [cseam.seam.patch(cls, fn, on_class=True), 0]
    found[1] += 1
    return found[0]


def _off_class(cls: type, attribute: str) -> None:
    """A component of ``cls`` no longer uses the class-wide replacement of ``attribute``: the last one undoes it."""
    found = _class_patches.get((cls, attribute))
    if found is not None:
        found[1] -= 1
        if found[1] <= 0:
            _class_patches.pop((cls, attribute))[0].undo()


def _on_instance(component: Any, cs: ComponentState, cseam: ComponentSeam, original: Any) -> _seams.Patch:
    """The replacement of an instance attribute of ``component`` (a callable that is not a method)."""
    before, after = _HOOKS[cseam.kind](cseam.component)

    def instance_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return before(cs, args, kwargs)

    return cseam.seam.patch(component, _seams.wrap(cseam.seam, original, instance_before, after))


def _step_hooks(component: str) -> tuple[Any, Any]:
    """A part of a denoising step (the denoiser, a ControlNet): it opens the step when none runs."""
    def before(cs: ComponentState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = getattr(_local, "ctx", None)
        if ctx is None or ctx.inside or not ctx.live or compiling():
            return None
        st = ctx.state
        t = perf_counter_ns()
        if ctx.step_open and ctx.sched_done:
            st.close_step(ctx, t, chain=True)
        if not ctx.step_open:
            st.open_step(ctx, t, args, kwargs)
        branch = None
        if component == "denoiser":
            name, ctx.branch_next = ctx.branch_next, None
            if name is not None:
                branch = name if name in ("cond", "uncond") else "other"
            elif ctx.forwards == 0:
                branch = "batched" if ctx.batched else "cond"
            else:
                branch = "other"
            ctx.forwards += 1
            ctx.denoiser = cs.name
        return st.begin_part(ctx, component, cs.name, branch, ctx.device, True)

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None:
            ctx = token[0]
            ctx.parts_ns += ctx.state.end_part(ctx, token, error)

    return before, after


def _scheduler_hooks(component: str) -> tuple[Any, Any]:
    """The scheduler's step: a part of the running denoising step, which it lets close at the next step part."""
    def before(cs: ComponentState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = getattr(_local, "ctx", None)
        if ctx is None or ctx.inside or not ctx.step_open or compiling():
            return None  # a scheduler step outside the denoising steps (a pipeline's own use) is not a part
        return ctx.state.begin_part(ctx, component, cs.name, None, ctx.device, True)

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None:
            ctx = token[0]
            ctx.parts_ns += ctx.state.end_part(ctx, token, error)
            ctx.sched_done = True

    return before, after


def _call_hooks(component: str) -> tuple[Any, Any]:
    """A component of the call outside the steps (text encoders, the VAE, the safety checker): it ends the
    denoising loop's last step when that step's scheduler step has run."""
    def before(cs: ComponentState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = getattr(_local, "ctx", None)
        if ctx is None or ctx.inside or not ctx.live or compiling():
            return None
        st = ctx.state
        if ctx.step_open and ctx.sched_done:
            st.close_step(ctx, perf_counter_ns())
        dev = compat.input_device(args, kwargs)
        device = (dev.index or 0) if dev is not None and dev.type == "cuda" else None
        if st.memory and ctx.reset_peak:
            st.memory_reading(device)  # resets the peak: the reading at the end is this component's own
        return st.begin_part(ctx, component, cs.name, None, device, False)

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None:
            ctx = token[0]
            st = ctx.state
            st.end_part(ctx, token, error)
            if st.memory and error is None:
                st.record_peak(ctx, component, token[1][1], token[5])

    return before, after


def _branch_hooks(component: str) -> tuple[Any, None]:
    """``cache_context(name)``: the name of the denoiser call that follows (the context manager is entered
    right after, around that call)."""
    def before(cs: ComponentState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ctx = getattr(_local, "ctx", None)
        if ctx is not None and ctx.live and not compiling():
            name = kwargs["name"] if "name" in kwargs else (args[0] if args else None)
            ctx.branch_next = name if isinstance(name, str) else None

    return before, None


_HOOKS = {"step": _step_hooks, "scheduler": _scheduler_hooks, "call": _call_hooks, "branch": _branch_hooks}


class PipelineState:
    """Everything prepared once for one instrumented pipeline: options, series, NVTX strings, its components."""

    def __init__(self, pipe: Any, rt: Runtime, *, name: str, layers: bool, layer_every: int, layer_index: bool,
                 memory: bool, options: dict[str, Any]) -> None:
        self.model_name = name
        self.pipe = weakref.ref(pipe)
        self.rt = rt
        self.options = options
        self.layers = layers
        self.layer_every = layer_every
        self.memory = memory
        self.sampled = 0  # steps counted for block sampling (racy across threads: fine for sampling)
        self._nvtx_cache: dict[tuple[str, str, int], Any] = {}
        self._seen: tuple[Any, ...] | None = None  # the components installed at the last call (their identity)
        self.installed: list[ComponentState] = []
        fam = rt.family
        ml = {"model": name}
        self._calls = fam("gpuprobe.diffusion.call.duration")
        self.call_ok = self._calls.child(**ml).apply
        self._errors: dict[str, Any] = {}
        self.ttfs = fam("gpuprobe.diffusion.time_to_first_step").child(**ml).apply
        step = fam("gpuprobe.diffusion.step.duration")
        self.step_host = step.child(**ml, clock="host").apply
        self.step_dev = step.child(**ml, clock="device")
        self.images = fam("gpuprobe.diffusion.images").child(**ml).apply
        self._components = fam("gpuprobe.diffusion.component.duration")
        self._parts: dict[tuple[str, str, str | None], tuple[Any, Any]] = {}
        self._peaks: dict[tuple[str, str, str], Any] = {}
        self._memory_family = fam("gpuprobe.diffusion.component.memory.peak")
        self.other_host = self.part("other", "", None)[0]
        self.marker = StepMarker(rt, name)
        self.blocks = BlockTiming(rt, ml, layer_index, current, lambda: compiling(), self.nvtx, SEAM_BLOCKS)
        self.message = f"pipeline {name}"

    # -- series -------------------------------------------------------------------------------------
    def part(self, component: str, module: str, branch: str | None) -> tuple[Any, Any]:
        """``(host apply, device series)`` of a component (prepared on first use, then a dict hit)."""
        key = (component, module, branch)
        found = self._parts.get(key)
        if found is None:
            labels = {"model": self.model_name, "component": component}
            if module:
                labels["module"] = module
            if branch is not None:
                labels["branch"] = branch
            found = (self._components.child(**labels, clock="host").apply,
                     self._components.child(**labels, clock="device"))
            if len(self._parts) < 256:  # components of one pipeline: a handful
                self._parts[key] = found
        return found

    def call_error(self, error_type: str) -> Any:
        found = self._errors.get(error_type)
        if found is None:
            found = self._calls.child(model=self.model_name, **{"error.type": error_type}).apply
            if len(self._errors) < 64:  # exception class names: bounded like the series
                self._errors[error_type] = found
        return found

    def nvtx(self, nv: Any, message: str, kind: str, payload: int | None) -> Any:
        """A prepared NVTX range (cached per message and step; only used when a tool is attached)."""
        key = (message, kind, -1 if payload is None else payload)
        h = self._nvtx_cache.get(key)
        if h is None:
            h = nv.prepare(message, kind, payload)
            # Why a cache: preparing a range with a payload costs 1.3 us; a dict hit 0.12 us.
            if len(self._nvtx_cache) < 65536:
                self._nvtx_cache[key] = h
        return h

    # -- components ---------------------------------------------------------------------------------
    def refresh(self, pipe: Any) -> None:
        """Install the seams on the pipeline's components that do not have them yet: at instrument() and at
        each call (a component replaced since, ``pipe.unet = torch.compile(pipe.unet)``, a new scheduler)."""
        found = [(name, component, r) for name, component in compat.components(pipe)
                 if (r := compat.role(name)) is not None]
        seen = tuple((name, id(component), id(compat.compiled_call(component))) for name, component, _ in found)
        if seen == self._seen:
            return
        with _install_lock:  # two threads starting a call of the pipeline at once install its seams once
            for name, component, r in found:
                cs = self.install(name, component, r)
                if cs is not None and r == "denoiser" and self.layers:
                    self.blocks.add(find_blocks(component))
            self._seen = seen

    def install(self, name: str, component: Any, r: str) -> ComponentState | None:
        """The component's state, its seams installed now if they are not (or no longer fit)."""
        d = getattr(component, "__dict__", None)
        if not isinstance(d, dict):
            return None
        cs = d.get(STATE_KEY)
        compiled = compat.compiled_call(component)
        if cs is not None and compiled is not cs.compiled and not _seams.is_replacement(compiled):
            cs.undo()  # compiled in place since: its seams move to the compiled call
            d.pop(STATE_KEY, None)
            cs = None
        if cs is None:
            cs = ComponentState(name, r)
            cs.compiled = compiled
            cls = type(component)
            for cseam in COMPONENT_SEAMS.get(r, ()):
                if cseam.attribute == "forward" and compiled is not None:
                    continue  # the compiled call runs in its place: its own seam measures it
                if cseam.compiled and compiled is None:
                    continue
                name_ = cseam.attribute
                if cseam.optional and not callable(getattr(component, name_, None)):
                    continue
                if cseam.seam.check(component) is not None:
                    continue
                existing = d.get(name_)
                if existing is not None and not _seams.is_replacement(existing):
                    # an instance attribute (a compiled call, an OptimizedModule's or accelerate's forward):
                    # it runs underneath
                    cs.patches.append(_on_instance(component, cs, cseam, existing))
                elif existing is None:
                    _on_class(cls, cseam)
                    cs.classwide.append((cls, name_))
            d[STATE_KEY] = cs
        if cs not in self.installed:
            self.installed.append(cs)
        cs.users.add(self)
        return cs

    def release(self) -> None:
        """This pipeline is uninstrumented: components no other instrumented pipeline holds get their methods back."""
        for cs in self.installed:
            cs.users.discard(self)
            if not len(cs.users):
                cs.undo()
        pipe = self.pipe()
        if pipe is not None:
            for _name, component in compat.components(pipe):
                d = getattr(component, "__dict__", None)
                if isinstance(d, dict):
                    cs = d.get(STATE_KEY)
                    if cs is not None and not len(cs.users):
                        d.pop(STATE_KEY, None)
        self.installed.clear()
        self.blocks.remove()
        self._seen = None

    # -- the call -----------------------------------------------------------------------------------
    def begin_call(self, pipe: Any) -> Call | None:
        """A call starts on this thread: its context, or None when it is not measured."""
        if not is_enabled() or compiling():
            return None
        self.refresh(pipe)
        rt = self.rt
        backends = rt.backends
        nv = backends.nvtx if backends.nvtx.enabled else None
        ctx = Call(self, perf_counter_ns(), rt.thread_records(), nv, backends.device_clock)
        settings = rt.settings
        ctx.audit = settings.sync_audit
        ctx.reset_peak = settings.memory_peak_reset
        ctx.prev = getattr(_local, "ctx", None)
        _local.ctx = ctx
        if nv is not None:
            nv.push(self.nvtx(nv, self.message, "generate", None))
        return ctx

    def end_call(self, ctx: Call, result: Any, error: BaseException | None) -> None:
        """The call ``ctx`` returned ``result`` or raised ``error``: its samples."""
        try:
            self._finish(ctx, result, error)
        finally:
            _local.ctx = ctx.prev
            ctx.prev = None

    def _finish(self, ctx: Call, result: Any, error: BaseException | None) -> None:
        t1 = perf_counter_ns()
        if ctx.step_open:
            if error is None:
                self.close_step(ctx, t1)
            else:  # a failed step leaves no sample, only what it opened to close
                self._drop_step(ctx)
        if ctx.clock is not None:
            ctx.clock.drop(ctx.boundary)
            ctx.boundary = None
        nv = ctx.nv
        if nv is not None:
            for _ in range(ctx.depth):
                nv.pop()
            ctx.depth = 0
            nv.pop()  # the call's range
        ctx.live = False
        records = ctx.records
        dur = t1 - ctx.t0
        if error is not None:
            records.append((self.call_error(type(error).__qualname__), dur))
            self.rt.observe_exception(error)
        else:
            records.append((self.call_ok, dur))
            made = compat.images_made(result)
            if made:
                records.append((self.images, made))
        self.rt.steps_done()
        self.rt.drain_if_full(records)

    # -- the steps ----------------------------------------------------------------------------------
    def open_step(self, ctx: Call, t: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rt = self.rt
        if not ctx.placed:  # the first step: where the steps run, whether guidance is batched
            ctx.placed = True
            dev = compat.input_device(args, kwargs)
            if ctx.clock is not None and dev is not None and dev.type == "cuda":
                ctx.device = dev.index if dev.index is not None else 0
            pipe = self.pipe()
            ctx.batched = compat.guidance_batched(pipe) if pipe is not None else False
            if self.memory and ctx.reset_peak:
                self.memory_reading(ctx.device)  # resets the peak: the loop's reading at its end is its own
        steps = rt.steps
        boundary = ctx.boundary
        ctx.boundary = None
        if steps.hooks:
            index = steps.advance()
            traced = steps.traced(index)  # a profile window records this step
            own = not traced and profiling() and not steps.sampled(index)  # the program's own profiler
            t = perf_counter_ns()  # the hooks (a profiler starting) are kept out of the step's time
            if boundary is not None:  # the hooks may have queued device work: the step starts after it
                ctx.clock.drop(boundary)
                boundary = None
        else:
            # Why tick: without hooks, advancing is one C call instead of a Python call.
            index = steps.tick()
            traced = False
            own = profiling()
        ctx.step += 1
        ctx.step_open = True
        ctx.step_t0 = t
        ctx.parts_ns = 0
        ctx.forwards = 0
        ctx.sched_done = False
        nv = ctx.nv
        if nv is not None:
            nv.push(self.nvtx(nv, "denoise", "step", ctx.step))
            ctx.depth += 1
        clock = ctx.clock
        if clock is not None and ctx.device is not None:
            # Why resume: the previous step's end event starts this one: one event record per step, not two.
            ctx.dev_tok = clock.start(ctx.device) if boundary is None else clock.resume(boundary, ctx.device)
        else:
            ctx.dev_tok = None
            if boundary is not None:
                clock.drop(boundary)
        if self.blocks.blocks and SEAM_BLOCKS.on:
            self.sampled += 1
            if self.sampled % self.layer_every == 0 and not compiling():
                self.blocks.acquire()
                ctx.blocks_on = True
        every = ctx.audit
        audited = every != 0 and index % every == 0 and not rt.capture.underway and not compiling()
        if traced or audited or own:
            ctx.marks = self.marker.open(traced, audited, index if own else None)

    def close_step(self, ctx: Call, t: int, chain: bool = False) -> None:
        """End the running step at ``t``; ``chain``: the next step opens at once, at this one's end event."""
        marks = ctx.marks
        if marks is not None:
            ctx.marks = None
            self.marker.close(marks, ctx.records)
        dur = t - ctx.step_t0
        append = ctx.records.append
        append((self.step_host, dur))
        append((self.other_host, max(0, dur - ctx.parts_ns)))
        tok, ctx.dev_tok = ctx.dev_tok, None
        if tok is not None:
            if chain:
                pending, ctx.boundary = ctx.clock.split(tok)
            else:
                pending = ctx.clock.stop(tok)
            append((self.rt.pending.apply, (self.step_dev, pending)))
        if ctx.blocks_on:
            ctx.blocks_on = False
            ctx.block_stack.clear()
            self.blocks.release()
        if ctx.nv is not None:
            ctx.nv.pop()
            ctx.depth -= 1
        ctx.step_open = False
        if not ctx.ttfs_done:
            ctx.ttfs_done = True
            append((self.ttfs, t - ctx.t0))
        if not chain and self.memory:  # the denoising loop ended: its high-water mark
            self.record_peak(ctx, "denoiser", ctx.denoiser, ctx.device)

    def _drop_step(self, ctx: Call) -> None:
        ctx.step_open = False
        marks, ctx.marks = ctx.marks, None
        if marks is not None:
            self.marker.close(marks, ctx.records)
        tok, ctx.dev_tok = ctx.dev_tok, None
        if tok is not None:
            ctx.clock.discard(ctx.clock.stop(tok))
        if ctx.blocks_on:
            ctx.blocks_on = False
            ctx.block_stack.clear()
            self.blocks.release()

    # -- the parts ----------------------------------------------------------------------------------
    def begin_part(self, ctx: Call, component: str, module: str, branch: str | None, device: int | None,
                   in_step: bool) -> tuple[Any, ...]:
        """A component starts: its NVTX range, its mark, its device start. Pass the token to :meth:`end_part`."""
        nv = ctx.nv
        if nv is not None:
            message = f"denoiser {branch}" if branch is not None else (module if component == "text_encoder"
                                                                        else component)
            nv.push(self.nvtx(nv, message, "component", ctx.step if in_step else None))
        mark = ctx.marks.begin(component) if in_step and ctx.marks is not None else None
        clock = ctx.clock
        dev_tok = clock.start(device) if clock is not None and device is not None else None
        ctx.inside = True
        return (ctx, (component, module, branch), perf_counter_ns(), dev_tok, mark, device)

    def end_part(self, ctx: Call, token: tuple[Any, ...], error: BaseException | None) -> int:
        """The component of ``token`` returned (or raised ``error``): its samples; returns its host time."""
        t = perf_counter_ns()
        _, key, t0, dev_tok, mark, _device = token
        ctx.inside = False
        if mark is not None and ctx.marks is not None:
            ctx.marks.end(mark)
        if ctx.nv is not None:
            ctx.nv.pop()
        if error is not None:  # a failed component leaves no sample
            if dev_tok is not None:
                ctx.clock.discard(ctx.clock.stop(dev_tok))
            return 0
        host, dev = self.part(*key)
        ctx.records.append((host, t - t0))
        if dev_tok is not None:
            ctx.records.append((self.rt.pending.apply, (dev, ctx.clock.stop(dev_tok))))
        return t - t0

    def memory_reading(self, device: int | None) -> Any:
        """One reading of ``device`` (None: the process's memory, on a CPU); None when there is nothing to read."""
        try:
            return self.rt.backends.read_memory(device) if device is not None else memory.process_reading()
        except Exception as exc:
            self.rt.warn_once("memory", f"gpuprobe: memory reading failed: {exc!r}")
            return None

    def record_peak(self, ctx: Call, component: str, module: str, device: int | None) -> None:
        """The allocator's high-water mark now, for ``component`` (the peak since the previous reading with
        ``memory_peak_reset``, which is then the component's own)."""
        reading = self.memory_reading(device)
        if reading is None:
            return
        key = (component, module, reading.device)
        found = self._peaks.get(key)
        if found is None:
            labels = {"model": self.model_name, "component": component, "device": reading.device}
            if module:
                labels["module"] = module
            found = self._memory_family.child(**labels).apply
            if len(self._peaks) < 256:
                self._peaks[key] = found
        ctx.records.append((found, reading.peak))

    # pickling and deep copies of a pipeline drop its instrumentation
    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (type(None), ())
