"""The step clock: one process-wide count of generation steps and the hooks that run at each.

Steps are counted by the transformers integration (one per generation step) or by your own
``gpuprobe.step()``; each :meth:`StepClock.advance` marks the *start* of a step. Hooks (profile
windows, kernel sampling, snapshot triggers) run on the thread that advances, after the count.
:meth:`StepClock.done` says that the calling thread's steps are over for now (a ``generate()`` call
ended); its hooks let a feature close what that thread opened (a kernel sample).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

__all__ = ["StepClock", "StepHook"]

StepHook = Callable[[int], None]
OnHookError = Callable[[StepHook, BaseException], None]


class StepClock:
    """An atomic step counter and its hooks (``hooks``: a tuple, replaced whole when it changes, so
    running them takes no lock).

    Example:
        >>> clock = StepClock(lambda hook, exc: None)
        >>> clock.advance(), clock.advance()
        (0, 1)
    """

    def __init__(self, on_hook_error: OnHookError) -> None:
        self._lock = threading.Lock()  # guards the hook tuples
        # Why a counter and no lock: next() on itertools.count is one atomic C call under the GIL
        # (~40 ns against ~110 ns for a lock around `+= 1`), and it never hands out an index twice.
        self._counter = itertools.count()
        # Start a step when no hook is installed (a caller tests ``hooks`` first): the counter's own
        # __next__, one C call. Why: a Python method call is 1 of the ~10 Python calls a decode step of
        # an instrumented generate() adds (benchmarks/RESULTS-probe.md).
        self.tick: Callable[[], int] = self._counter.__next__
        self.hooks: tuple[StepHook, ...] = ()  # read-only outside: use add_hook / remove_hook
        self._done_hooks: tuple[Callable[[], None], ...] = ()
        self._on_hook_error = on_hook_error
        # .index: the step a trace records ranges of, on this thread; .sampled: the step the kernel
        # sampler's own profiler session records on this thread
        self._traced = threading.local()

    @property
    def index(self) -> int:
        """The index of the step that started last (-1 before the first; with several threads stepping
        at once, one of the latest)."""
        # itertools.count keeps its value in C; its repr, count(N), shows the index it hands out next.
        return int(repr(self._counter)[6:-1]) - 1

    def advance(self) -> int:
        """Start the next step: count it, run the hooks; returns its index."""
        index = next(self._counter)
        for hook in self.hooks:
            try:
                hook(index)
            except Exception as exc:
                self._on_hook_error(hook, exc)
        return index

    def mark_traced(self, index: int) -> None:
        """A hook says that a trace records step ``index`` on the calling thread (a profile window).

        Whoever advanced the step reads it back with :meth:`traced` right after :meth:`advance`, so a
        mark needs no clearing: the next step has another index.
        """
        self._traced.index = index

    def traced(self, index: int) -> bool:
        """Whether a hook marked step ``index`` as traced on the calling thread (see :meth:`mark_traced`)."""
        return getattr(self._traced, "index", -1) == index

    def mark_sampled(self, index: int) -> None:
        """A hook says that the kernel sampler's own profiler session records step ``index`` on the
        calling thread: a session whose trace nobody reads, so the step needs no ranges in it."""
        self._traced.sampled = index

    def sampled(self, index: int) -> bool:
        """Whether the kernel sampler marked step ``index`` on the calling thread (see :meth:`mark_sampled`)."""
        return getattr(self._traced, "sampled", -1) == index

    def add_hook(self, hook: StepHook, *, first: bool = False) -> None:
        """Run ``hook(index)`` at every step start (``first``: before the hooks already there)."""
        with self._lock:
            self.hooks = (hook, *self.hooks) if first else (*self.hooks, hook)

    def remove_hook(self, hook: StepHook) -> None:
        """Stop running ``hook`` (no error if it is not there)."""
        with self._lock:
            self.hooks = tuple(h for h in self.hooks if h != hook)

    def done(self) -> None:
        """The calling thread's steps are over for now: run the done-hooks."""
        for hook in self._done_hooks:
            try:
                hook()
            except Exception as exc:
                self._on_hook_error(hook, exc)  # type: ignore[arg-type]

    def add_done_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` when a thread's steps are over (see :meth:`done`)."""
        with self._lock:
            self._done_hooks = (*self._done_hooks, hook)

    def remove_done_hook(self, hook: Callable[[], None]) -> None:
        """Stop running ``hook`` at :meth:`done`."""
        with self._lock:
            self._done_hooks = tuple(h for h in self._done_hooks if h != hook)

    def clear_hooks(self) -> None:
        """Remove every hook."""
        with self._lock:
            self.hooks = ()
            self._done_hooks = ()

    def restart(self) -> None:
        """Count from 0 again (hooks stay)."""
        with self._lock:
            self._counter = itertools.count()
            self.tick = self._counter.__next__
            self._traced = threading.local()  # indexes repeat from now: forget the marks

    def reset_after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()
