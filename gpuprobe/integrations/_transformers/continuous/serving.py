"""The series of one model's continuous batching, prepared once, and the managers it observes."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from .... import _seams
from ....runtime import Runtime
from ...kit import MemoryGauges, RequestSeries, StepSeries
from ..compat import fits, manager_parts, request_statuses
from .loop import Loop
from .seams import MANAGER, MANAGER_HOOKS, MARK, ROUTER, SEAM_DELIVER, SEAM_DELIVER_BATCH, install_hooks, weak_method

__all__ = ["ServingState", "PHASES", "FINISH_REASONS"]

PHASES = ("prefill", "decode", "mixed")
"""The ``phase`` of a continuous-batching step: only prompt tokens, only generated tokens, or both."""
FINISH_REASONS = ("stop", "length", "cancelled", "failed")
"""``finish_reason`` of ``gpuprobe.requests.finished``: an end-of-sequence token, the token limit,
cancelled (the client went away), failed (an error)."""


class ServingState:
    """The series of one model's continuous batching, prepared once, and the objects observed.

    Made by the model's :class:`~gpuprobe.integrations._transformers.generate.ModelState` the first time a
    manager is created for the model.
    """

    def __init__(self, rt: Runtime, name: str, request_series: RequestSeries, *, memory: MemoryGauges | None = None,
                 memory_every: int = 8, memory_devices: Callable[[int | None], tuple[int, ...]] | None = None) -> None:
        self.rt = rt
        self.model_name = name
        # The model's memory gauges (None: instrument(memory=False)), read on one step in memory_every and at
        # the loop's end, on the devices memory_devices names for the processor's device (none: a CPU).
        self.memory = memory
        self.memory_every = memory_every
        self.memory_devices = memory_devices or (lambda device: () if device is None else (device,))
        self.finished_status, self.failed_status = request_statuses()
        fam = rt.family
        # Records are (bound apply of a series, value), as in the generate() integration: prepared here.
        # A request's GenAI series are the model's, shared with its generate() calls.
        self.request_series = requests = request_series
        self.ttft_dev = requests.ttft_device.apply  # called by FirstSpan targets
        self.req_cancelled = requests.request_error("cancelled")
        self.req_failed = requests.request_error("failed")
        steps = StepSeries(rt, name, PHASES)
        ml = steps.model
        self.queue = fam("gpuprobe.request.queue.duration").child(**ml).apply
        finished = fam("gpuprobe.requests.finished")
        self.finished = {r: finished.child(**ml, finish_reason=r).apply for r in FINISH_REASONS}
        self.preempted = fam("gpuprobe.requests.preempted").child(**ml).apply
        self.running = fam("gpuprobe.requests.running").child(**ml).apply
        self.waiting = fam("gpuprobe.requests.waiting").child(**ml).apply
        self.kv_usage = fam("gpuprobe.kv_cache.usage").child(**ml).apply
        blocks = fam("gpuprobe.kv_cache.blocks")
        self.kv_used = blocks.child(**ml, state="used").apply
        self.kv_total = blocks.child(**ml, state="total").apply
        tokens = fam("gpuprobe.batch.tokens")
        self.tokens_prefill = tokens.child(**ml, phase="prefill").apply
        self.tokens_decode = tokens.child(**ml, phase="decode").apply
        self.batch_requests = fam("gpuprobe.batch.requests").child(**ml).apply
        self.prefix_queries = fam("gpuprobe.prefix_cache.queries").child(**ml).apply
        self.prefix_hits = fam("gpuprobe.prefix_cache.hits").child(**ml).apply
        self.prefix_tokens = fam("gpuprobe.prefix_cache.tokens").child(**ml).apply
        self.step_host, self.step_dev = steps.host, steps.device
        self.c_schedule = steps.component("schedule")
        self.c_forward = steps.component("forward")
        self.c_update = steps.component("update")
        # Per request and output token after its first (see Loop.tokens_held): the host samples of one
        # update go as one batch, the device ones with the step's device span (series.DecodeSpan).
        self.inter_token = steps.itl_host.apply_many
        self.device_span = steps.device_span  # a decoding step's device record target (series.DecodeSpan)
        self._patched: list[_seams.Patch] = []
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- observing ------------------------------------------------------------------------------
    def observe(self, manager: Any) -> Any:
        """Put the seams on ``manager`` (once); returns it. Another transformers shape: not installed
        (``info()["seams"]`` says why), the manager runs unobserved."""
        d = getattr(manager, "__dict__", None)
        if d is None or d.get(MARK) is not None:
            return manager
        router, bp = manager_parts(manager)
        if not (fits(manager, MANAGER) and fits(router, ROUTER)):
            return manager
        loop = Loop(self)
        d[MARK] = loop
        self._managers.add(manager)
        loop.read_output = _seams.ArgReader(router.deliver, SEAM_DELIVER.reads)
        loop.read_outputs = _seams.ArgReader(router.deliver_batch, SEAM_DELIVER_BATCH.reads)
        install_hooks(self._install, {"manager": manager, "router": router}, loop, MANAGER_HOOKS)
        if bp is not None:  # a manager kept from an earlier session
            loop.attach(bp)
        return manager

    def _install(self, obj: Any, seam: _seams.Seam, before: Any = None, after: Any = None) -> Any:
        """Put ``seam``'s replacement on ``obj`` (its instance attribute); :meth:`close` takes it away."""
        original = weak_method(obj, seam.attribute)  # type: ignore[arg-type]
        self._patched.append(seam.patch(obj, _seams.wrap(seam, original, before, after)))
        return original

    def close(self) -> None:
        """Take every seam away again (the model is uninstrumented)."""
        for patch in reversed(self._patched):
            patch.undo()  # gone, or replaced since: left as it is
        self._patched.clear()
        for manager in list(self._managers):
            manager.__dict__.pop(MARK, None)
        self._managers = weakref.WeakSet()
