"""Concatenations of transformers' dynamic KV cache, counted while a :class:`ConcatCounter` is entered.

A dynamic cache (transformers' default) grows each decoder layer's keys and values with ``torch.cat`` in
its layer's ``update``: a copy of the whole layer cache at every step, the cost a static cache (a buffer
written in place) does not pay. The classes that do so are read in :func:`~.compat.concatenating_cache_layers`
(``DynamicLayer`` and its subclasses with an ``update`` of their own); one concatenation is one ``update``
call of such a layer (its keys and its values, two ``torch.cat``), counted by the layer's class.

The classes' ``update`` methods are a seam (:data:`SEAM_UPDATE`) only while at least one counter is
entered: the first counter patches them, the last one out puts them back. The count runs on every thread
(transformers' generation is on one); an ``update`` called from another's (a subclass's ``super().update``)
counts once. Used by :mod:`gpuprobe.testing.budget` (budget ``dynamic_cache_concats``).
"""

from __future__ import annotations

import threading
from typing import Any

from ... import _seams
from .compat import concatenating_cache_layers

__all__ = ["SEAM_UPDATE", "ConcatCounter"]

SEAM_UPDATE = _seams.declare(
    "transformers.cache.update", library="transformers", attribute="update", scenario="cache_concats",
    target="update() of transformers' concatenating KV-cache layers (DynamicLayer and its subclasses with "
           "their own), on the class, while a gpuprobe budget counts cache concatenations")

_lock = threading.Lock()
_active: list[ConcatCounter] = []  # the counters entered, on any thread
_patches: list[_seams.Patch] = []  # in place while _active is not empty
_local = threading.local()  # .depth: update calls running on this thread (the outermost counts)


def _before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    depth = getattr(_local, "depth", 0)
    if depth == 0 and args:
        name = type(args[0]).__name__
        for counter in _active:
            counter.counts[name] = counter.counts.get(name, 0) + 1
    _local.depth = depth + 1


def _after(token: Any, result: Any, error: BaseException | None) -> None:
    _local.depth = max(0, getattr(_local, "depth", 1) - 1)


def _install() -> None:
    for cls in concatenating_cache_layers():
        if SEAM_UPDATE.check(cls) is not None:
            continue
        original = cls.__dict__["update"]
        _patches.append(SEAM_UPDATE.patch(cls, _seams.wrap(SEAM_UPDATE, original, _before, _after), on_class=True))


class ConcatCounter:
    """While entered, count the concatenations of transformers' dynamic cache layers (by layer class).

    Attributes:
        counts: layer class name → concatenations (one per ``update`` call of a layer).

    Example:
        >>> from gpuprobe.integrations._transformers.cache import ConcatCounter
        >>> with ConcatCounter() as counter:
        ...     pass  # model.generate(...) with a dynamic cache
        >>> counter.counts
        {}
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.entered = False

    @property
    def working(self) -> bool:
        """False once the seam switched itself off after a failure of its own (the counts stop there)."""
        return SEAM_UPDATE.on

    def __enter__(self) -> ConcatCounter:
        with _lock:
            if not _active:
                _install()
            _active.append(self)
            self.entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)
            self.entered = False
            if not _active:
                while _patches:
                    _patches.pop().undo()
