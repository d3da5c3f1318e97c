"""Record buffers: what the hot path appends to, and what :meth:`drain` moves into the aggregates.

Two shapes of record, both per thread, so no lock is taken on the hot path:

- a *record* ``(apply, value)`` in the thread's deque, where ``apply`` is the bound ``apply`` method
  of a series prepared once (``family.child(**labels).apply``) — integrations and slow paths;
- a bare *value* in a queue that belongs to one series and one thread — the probes' host
  durations (no tuple per call), aggregated as a sorted batch. Every probe of one series shares its
  queues (:meth:`RecordBuffers.series_local`): a name folded into ``other`` adds none, so there are
  never more queues than series times threads, and a drain costs that, not the names ever seen.

``deque.append`` and ``popleft`` are atomic, so a drain on another thread never loses or doubles a
record. Device timings wait in :class:`PendingTimings` until the device has reached their events.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Record", "RecordBuffers", "PendingTimings"]

Record = tuple[Callable[[Any], None], Any]
OnError = Callable[[BaseException], None]


class _ThreadRecords:
    __slots__ = ("records", "thread", "__weakref__")

    def __init__(self) -> None:
        self.records: deque[Record] = deque()
        self.thread = weakref.ref(threading.current_thread())


class _ValueQueue:
    __slots__ = ("child", "values", "thread")

    def __init__(self, child: Any, values: deque[Any]) -> None:
        self.child = child
        self.values = values
        self.thread = weakref.ref(threading.current_thread())


class RecordBuffers:
    """Every thread's records and value queues."""

    def __init__(self) -> None:
        self._tls = threading.local()
        self._threads: list[_ThreadRecords] = []
        self._queues: list[_ValueQueue] = []
        self._locals: dict[Any, threading.local] = {}  # series -> its queues' holder (one per thread)
        self._lock = threading.Lock()

    def for_this_thread(self) -> deque[Record]:
        """This thread's record deque (created on first use); append ``(apply, value)`` to it."""
        try:
            return self._tls.buf.records  # type: ignore[no-any-return]
        except AttributeError:
            buf = _ThreadRecords()
            self._tls.buf = buf
            with self._lock:
                self._threads.append(buf)
            return buf.records

    def series_local(self, child: Any) -> threading.local:
        """Where each thread's queue of values for ``child`` is kept (``.queue``), shared by every probe
        of that series; pass it to :meth:`value_queue` when this thread has none yet."""
        found = self._locals.get(child)
        if found is None:
            with self._lock:
                found = self._locals.setdefault(child, threading.local())
        return found

    def value_queue(self, child: Any, local: threading.local) -> deque[Any]:
        """A new queue of bare values for ``child`` owned by this thread, stored on ``local.queue``."""
        values: deque[Any] = deque()
        local.queue = values
        with self._lock:
            self._queues.append(_ValueQueue(child, values))
        return values

    def drain(self, on_error: OnError) -> int:
        """Apply every buffered record and value; returns how many. Run by one thread at a time."""
        applied = 0
        with self._lock:
            threads = list(self._threads)
            queues = list(self._queues)
        dead_threads = []
        for buf in threads:
            records = buf.records
            popleft = records.popleft
            for _ in range(len(records)):
                # Records hold the bound apply method of their series: no attribute lookup here.
                apply, value = popleft()
                try:
                    apply(value)
                except Exception as exc:  # a bad record must never stop collection
                    on_error(exc)
                applied += 1
            if not records and buf.thread() is None:
                dead_threads.append(buf)
        dead_queues = []
        for q in queues:
            values = q.values
            n = len(values)
            if n:
                popleft = values.popleft
                batch = [popleft() for _ in range(n)]  # popleft is atomic: appends race safely
                try:
                    q.child.apply_many(batch)
                except Exception as exc:
                    on_error(exc)
                applied += n
            elif q.thread() is None:
                dead_queues.append(q)
        if dead_threads or dead_queues:
            with self._lock:
                self._threads = [b for b in self._threads if b not in dead_threads]
                self._queues = [q for q in self._queues if q not in dead_queues]
        return applied

    def clear(self) -> None:
        """Drop everything buffered (a reset)."""
        with self._lock:
            for buf in self._threads:
                buf.records.clear()
            for q in self._queues:
                q.values.clear()

    def reset_after_fork(self) -> None:
        """In a forked child: only the forking thread exists; what the parent buffered is the parent's."""
        self._lock = threading.Lock()
        self.clear()
        alive = threading.current_thread()
        self._threads = [b for b in self._threads if b.thread() is alive]
        self._queues = [q for q in self._queues if q.thread() is alive]


class PendingTimings:
    """Device timings recorded and not read yet: ``(series, pending token)`` pairs.

    :meth:`apply` is a record target: the hot path appends ``(pending.apply, (series, token))`` to its
    thread's buffer, and the drain moves the pair here.
    """

    def __init__(self) -> None:
        self._items: list[tuple[Any, Any]] = []

    def apply(self, value: tuple[Any, Any]) -> None:
        if value[1] is not None:
            self._items.append(value)

    def __len__(self) -> int:
        return len(self._items)

    def resolve(self, poll: Callable[[Any], int | None], discard: Callable[[Any], None], on_error: OnError) -> int:
        """Apply every timing whose events the device has reached; keep the others. Returns how many."""
        still = []
        done = 0
        for child, token in self._items:
            try:
                ns = poll(token)
            except Exception as exc:
                on_error(exc)
                discard(token)
                continue
            if ns is None:
                still.append((child, token))
            else:
                child.apply(ns)
                done += 1
        self._items = still
        return done

    def clear(self, discard: Callable[[Any], None] | None = None) -> None:
        """Forget every pending timing (giving its events back through ``discard``)."""
        items, self._items = self._items, []
        if discard is not None:
            for _, token in items:
                discard(token)
