"""The seams table of continuous batching: every method gpuprobe replaces on an observed manager's objects.

transformers' continuous batching (``generate_batch``, ``continuous_batching_context_manager``,
``init_continuous_batching`` — and ``transformers serve --continuous-batching``, which calls the
last) runs a generation loop on a thread of its own::

    ContinuousBatchingManager                    seam: observed when init_continuous_batching returns it
      _run_generation_loop()   (its thread)      seam: the loop's start and end (gauges, steps done)
        _create_batch_processor()                seam: the processor, scheduler, cache are observed
        loop:
          prepare_next_batch()                   seam: a step opens (component schedule); gauges
            scheduler.schedule_batch()           seam: the requests of the batch
            offloading_manager.offload_requests  seam: preemptions
          _generation_step(model)                seam: component forward (device span on GPUs)
          update_batch()                         seam: component update; first tokens; the step closes
            output_router.deliver(_batch)()      seam: finished and failed requests
      scheduler.set_request_cancellation()       seam: cancelled requests

Every seam is an instance attribute of the object transformers calls it on (the manager, its batch
processor, scheduler, offloading manager and output router), so only observed managers change and
:meth:`~.serving.ServingState.close` takes them all away again. The manager's and router's hooks are
installed by :meth:`~.serving.ServingState.observe`, the processor's, scheduler's and offloader's by
:meth:`~.loop.Loop.attach`, each from its table below (:data:`MANAGER_HOOKS`, :data:`PROCESSOR_HOOKS`).

**Adding a seam here.** Declare it with :func:`_declare` (the owner class, the method, the parameters
read), add it to the group of its owner below (its shape is checked with the others before anything
is installed), write its hooks as methods of :class:`~.loop.Loop`, and add a :class:`Hooked` row to
:data:`MANAGER_HOOKS` (the manager and its router) or :data:`PROCESSOR_HOOKS` (the batch processor,
its scheduler and offloader); :func:`install_hooks` puts the rows on each observed object. ``tests/test_fail_open.py`` iterates the registry.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from .... import _seams
from ..compat import continuous_batching_classes

__all__ = ["GROUP", "OWNERS", "owner_classes", "weak_method", "MARK", "Hooked", "MANAGER_HOOKS", "PROCESSOR_HOOKS"]

GROUP = "transformers.continuous_batching"
"""The switch of every continuous-batching seam: they work together."""


OWNERS: dict[str, str] = {}
"""The transformers class whose instances each continuous-batching seam patches, by seam name."""


def _declare(owner: str, attribute: str, short: str, reads: tuple[str, ...] = ()) -> _seams.Seam:
    seam = _seams.declare(f"transformers.continuous_batching.{short}", library="transformers", attribute=attribute,
                          reads=reads, group=GROUP, scenario="generate_batch",
                          target=f"{owner}.{attribute}, on each observed manager's objects")
    OWNERS[seam.name] = owner
    return seam


def owner_classes() -> dict[str, type]:
    """The classes of the installed transformers that :data:`OWNERS` names, by seam name, for a shape
    check before any manager exists (``gpuprobe doctor``); a class not found is left out (a few
    seconds: see :func:`~..compat.continuous_batching_classes`)."""
    classes = continuous_batching_classes(OWNERS.values())
    return {seam: classes[owner] for seam, owner in OWNERS.items() if owner in classes}


# The methods that become seams, on the objects transformers calls them on; shapes checked before patching.
SEAM_CREATE = _declare("ContinuousBatchingManager", "_create_batch_processor", "create_batch_processor")
SEAM_LOOP = _declare("ContinuousBatchingManager", "_run_generation_loop", "generation_loop")
SEAM_DELIVER = _declare("OutputRouter", "deliver", "deliver", ("output",))
SEAM_DELIVER_BATCH = _declare("OutputRouter", "deliver_batch", "deliver_batch", ("outputs",))
SEAM_PREPARE = _declare("ContinuousBatchProcessor", "prepare_next_batch", "prepare_next_batch")
SEAM_STEP = _declare("ContinuousBatchProcessor", "_generation_step", "generation_step")
SEAM_UPDATE = _declare("ContinuousBatchProcessor", "update_batch", "update_batch")
SEAM_SCHEDULE = _declare("Scheduler", "schedule_batch", "schedule_batch")
SEAM_CANCEL = _declare("Scheduler", "set_request_cancellation", "cancel", ("request_id",))
SEAM_OFFLOAD = _declare("OffloadingManager", "offload_requests", "offload_requests")
MANAGER = (SEAM_CREATE, SEAM_LOOP)
ROUTER = (SEAM_DELIVER, SEAM_DELIVER_BATCH)
PROCESSOR = (SEAM_PREPARE, SEAM_STEP, SEAM_UPDATE)
SCHEDULER = (SEAM_SCHEDULE, SEAM_CANCEL)
MARK = "_gpuprobe_loop"  # the manager's Loop, in its __dict__


class Hooked(NamedTuple):
    """A row of a hooks table: a seam, the object it goes on, and the :class:`~.loop.Loop` methods that
    run before and after transformers' own method (``None``: no hook on that side)."""

    seam: _seams.Seam
    owner: str  # a key of the objects handed to install_hooks: "manager", "router", "processor", ...
    before: str | None = None
    after: str | None = None


MANAGER_HOOKS = (
    Hooked(SEAM_CREATE, "manager", after="processor_created"),
    Hooked(SEAM_LOOP, "manager", "loop_begins", "loop_ends"),
    Hooked(SEAM_DELIVER, "router", before="deliver"),
    Hooked(SEAM_DELIVER_BATCH, "router", before="deliver_batch"),
)
"""The seams put on a manager when it is observed (:meth:`~.serving.ServingState.observe`)."""

PROCESSOR_HOOKS = (
    Hooked(SEAM_PREPARE, "processor", "prepare_before", "prepare_after"),
    Hooked(SEAM_STEP, "processor", "step_before", "step_after"),
    Hooked(SEAM_UPDATE, "processor", "update_before", "update_after"),
    Hooked(SEAM_SCHEDULE, "scheduler", after="batch_scheduled"),
    Hooked(SEAM_CANCEL, "scheduler", "cancel_before", "cancel_after"),
    Hooked(SEAM_OFFLOAD, "offloader", "offload_before", "offload_after"),
)
"""The seams put on a batch processor and its parts when the manager creates it (:meth:`~.loop.Loop.attach`)."""


def install_hooks(install: Callable[[Any, _seams.Seam, Any, Any], Any], objects: dict[str, Any],
                  observer: Any, table: tuple[Hooked, ...]) -> None:
    """Install each row of ``table`` whose owner is in ``objects``, with ``observer``'s methods as hooks."""
    for row in table:
        obj = objects.get(row.owner)
        if obj is None:
            continue
        before = getattr(observer, row.before) if row.before is not None else None
        after = getattr(observer, row.after) if row.after is not None else None
        install(obj, row.seam, before, after)


def weak_method(obj: Any, name: str) -> Any:
    """``obj.<name>`` as a callable that does not keep ``obj`` alive.

    A bound method stored on the object it is bound to is a reference cycle. transformers frees its
    batch processor — and the KV cache with it — by reference counting when it stops; a cycle would
    keep the cache until the next garbage collection.
    """
    own = obj.__dict__.get(name)
    if own is not None:  # an instance attribute put there by someone else: it runs underneath
        return own
    func = getattr(type(obj), name)
    ref = weakref.ref(obj)

    def call(*args: Any, **kwargs: Any) -> Any:
        return func(ref(), *args, **kwargs)

    call.__name__ = getattr(func, "__name__", name)
    call.__qualname__ = getattr(func, "__qualname__", name)
    try:  # the bound method's signature (self left out), for inspect.signature of the replacement
        call.__signature__ = inspect.signature(getattr(obj, name))  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return call
