"""Where the report's work runs in other processes: gpuprobe's own isolated worker processes, and the
executors the command line names for the ranks of a multi-rank report (``--executor``).

:class:`IsolatedProcessPool` is a ``concurrent.futures.Executor`` whose workers are ``python -I``
processes of gpuprobe's own (a ``ProcessPoolExecutor``'s are not isolated: a ``bisect.py`` beside the
traces would be imported): the ranks of a multi-rank report, and the tail of a large trace read while
this process reads its head (:mod:`gpuprobe.report._split`), run on it.

``--executor``:

- ``processes`` (the default): local worker processes, ``--jobs`` at a time (an :class:`IsolatedProcessPool`).
- A Dask scheduler's address, as Dask spells it (``tcp://HOST:PORT``, ``tls://HOST:PORT``, or any
  other of its protocols), or ``dask://HOST:PORT`` for ``tcp://HOST:PORT``: each rank is one task of
  that cluster (``Client(address).get_executor()``).
- ``dask`` (or ``dask://``): as Dask's own ``Client()`` does, the scheduler of Dask's configuration
  (``DASK_SCHEDULER_ADDRESS``, or ``scheduler-address`` in its configuration files), else a local
  cluster of worker processes started for the run (bound to 127.0.0.1, without a dashboard) and
  stopped after it.

Dask's ``distributed`` package is imported only here, and only when a Dask executor is named
(``pip install 'dask[distributed]'``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from gpuprobe.errors import ConfigError

__all__ = ["EXECUTOR_HELP", "open_executor", "is_local", "check_address", "usable_cpus", "IsolatedProcessPool",
           "IsolatedWorker", "WorkerFailed", "TaskFailed", "worker_main"]

#: The ``--executor`` help text.
EXECUTOR_HELP = (
    "several ranks: where each rank runs: 'processes' (default: local worker processes, --jobs at a time), a Dask "
    "scheduler address (tcp://HOST:PORT, or dask://HOST:PORT), or 'dask' (the scheduler Dask's configuration "
    "names, DASK_SCHEDULER_ADDRESS, else a local Dask cluster for the run)"
)
_LOCAL = ("", "processes")
_DASK_PROTOCOLS = ("tcp://", "tls://", "ucx://", "ws://", "wss://", "inproc://")
#: Seconds to reach a scheduler before giving up (Dask's own default is 30).
CONNECT_TIMEOUT_S = 10


def is_local(spec: str | None) -> bool:
    """Whether ``spec`` names gpuprobe's own local worker processes."""
    return spec is None or spec.strip() in _LOCAL


@contextlib.contextmanager
def open_executor(spec: str | None) -> Iterator[concurrent.futures.Executor | None]:
    """The executor ``spec`` names, for the length of the ``with`` block; None for local worker processes.

    Raises:
        ConfigError: An executor gpuprobe does not know, or a scheduler that cannot be reached.
        gpuprobe.errors.MissingDependencyError: A Dask executor without ``distributed`` installed.
    """
    if is_local(spec):
        yield None
        return
    assert spec is not None
    text = spec.strip()
    if text in ("dask", "dask://"):
        address = None
    elif text.startswith("dask://"):
        address = "tcp://" + text[len("dask://"):]
        check_address(address, text)
    elif text.startswith(_DASK_PROTOCOLS):
        address = text
        check_address(address, text)
    else:
        raise ConfigError(
            f"unknown executor {spec!r}: 'processes', a Dask scheduler address (tcp://HOST:PORT, dask://HOST:PORT) "
            "or 'dask'"
        )
    with _dask_client(address) as client:
        yield client.get_executor()


def check_address(address: str, given: str | None = None) -> None:
    """Nothing if ``address`` is a Dask scheduler address this process can reach: ``PROTOCOL://HOST:PORT``
    (an IPv6 host in brackets), its port a number from 1 to 65535.

    Checked before a client is made: Dask's ``Client`` refuses a malformed address only once it has
    started, and then blocks the interpreter's exit for 20 s closing itself (with a traceback).

    Args:
        address: The address Dask is given.
        given: How the user wrote it, for the message (``dask://HOST:PORT``); ``address`` if None.

    Raises:
        ConfigError: The address, as given, and what is wrong with it.

    Example:
        >>> check_address("tcp://127.0.0.1:8786")
        >>> check_address("tcp://127.0.0.1:notaport")
        Traceback (most recent call last):
        ...
        gpuprobe.errors.ConfigError: bad Dask scheduler address 'tcp://127.0.0.1:notaport': the port must be a whole number from 1 to 65535, not 'notaport'
    """
    shown = given if given is not None else address
    protocol, _, rest = address.partition("://")

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"bad Dask scheduler address {shown!r}: {problem}")

    if protocol == "inproc":
        raise bad("an inproc:// address names a scheduler inside one process; name its tcp:// address instead")
    if rest.startswith("["):  # an IPv6 host: [::1]:8786
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or not tail.startswith(":"):
            raise bad("an IPv6 host in brackets must be followed by ':PORT' ([::1]:8786)")
        port = tail[1:]
    else:
        host, colon, port = rest.rpartition(":")
        if not colon:
            raise bad(f"no port: {protocol}://HOST:PORT (Dask's scheduler listens on 8786 by default)")
    if not host or any(c.isspace() or c in "/?#@[]" for c in host):
        raise bad(f"no host name or IP address before the port ({protocol}://HOST:PORT)" if not host else
                  f"{host!r} is not a host name or IP address")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise bad(f"the port must be a whole number from 1 to 65535, not {port!r}")


@contextlib.contextmanager
def _dask_client(address: str | None) -> Iterator[Any]:
    try:
        import dask.config
        from distributed import Client, LocalCluster
    except ImportError as exc:
        from gpuprobe.errors import missing

        raise missing("distributed", "report-dask") from exc
    configured = address or dask.config.get("scheduler-address", None)
    if configured:
        if not address:  # Dask's configuration names it (DASK_SCHEDULER_ADDRESS, its files)
            where = "in Dask's configuration, DASK_SCHEDULER_ADDRESS or scheduler-address"
            if not isinstance(configured, str) or "://" not in configured:
                raise ConfigError(f"bad Dask scheduler address {configured!r} ({where}): PROTOCOL://HOST:PORT")
            try:
                check_address(configured)
            except ConfigError as exc:
                raise ConfigError(f"{exc} ({where})") from None
        try:
            client = Client(configured, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, ValueError, TypeError) as exc:  # unreachable, timed out, or not an address
            raise ConfigError(f"cannot reach the Dask scheduler at {configured}: {exc}") from None
        with _quiet(_DASK_CLIENT_LOGGERS), contextlib.closing(client):
            yield client
        return
    # Dask's Client() starts a LocalCluster on every interface with a dashboard on port 8787; this one
    # stays on 127.0.0.1 and serves nothing else. Its logs are silenced below CRITICAL: a worker's
    # heartbeat racing the cluster's shutdown logs a traceback now and then, and a task's own errors
    # come back through its result.
    try:
        cluster = LocalCluster(host="127.0.0.1", dashboard_address=None, processes=True, threads_per_worker=1,
                               silence_logs=logging.CRITICAL)
    except (OSError, RuntimeError, TimeoutError) as exc:  # no free port, workers that did not start in time
        raise ConfigError(f"cannot start a local Dask cluster: {exc}") from None
    with _quiet(_DASK_CLIENT_LOGGERS), contextlib.closing(cluster), Client(cluster, set_as_default=False) as client:
        yield client


#: The loggers of a Dask client's own machinery. When a rank fails, the others' tasks are cancelled while
#: their results may be on their way back; Dask then logs the race (a result set on a cancelled future, a
#: gather of a cancelled key) as tracebacks, which say nothing about the traces. A task's own errors
#: come back through its result, and an unreachable scheduler through the submit.
_DASK_CLIENT_LOGGERS = ("distributed.client", "tornado.application")


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """The loggers ``names`` log nothing below CRITICAL for the length of the ``with`` block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# ------------------------------------------------------------------------- isolated worker processes


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WorkerFailed(RuntimeError):
    """A worker process ended (or answered what is not an answer) during a call; the message is the last
    line it wrote on stderr, else its exit status (``exit status -9``: killed)."""


class TaskFailed(RuntimeError):
    """The function a worker ran raised; the message is the exception's type and text (the exception itself
    stays in the worker: its class may not unpickle here)."""


# A worker process: gpuprobe imported from where this process has it, then calls run one after another
# (see worker_main). -I: neither the current folder, PYTHONPATH nor the user's site-packages on its path.
_WORKER = ("import sys; sys.path.insert(0, sys.argv[1]); from gpuprobe.report._executors import worker_main; "
           "raise SystemExit(worker_main())")
_HEADER = struct.Struct(">Q")  # the length of each message, before its pickle
_EXIT_S = 10.0  # seconds a worker whose stdin closed has to exit before it is killed


def _read_message(stream: IO[bytes]) -> Any:
    """One length-prefixed pickle of ``stream``; EOFError if it ends first."""
    header = stream.read(_HEADER.size)
    if len(header) != _HEADER.size:
        raise EOFError("the stream ended")
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) != size:
        raise EOFError("the stream ended inside a message")
    return pickle.loads(body)


def _write_message(stream: IO[bytes], value: Any) -> None:
    _write_pickle(stream, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _write_pickle(stream: IO[bytes], body: bytes) -> None:
    """One message whose pickle is ``body``, length-prefixed."""
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


class IsolatedWorker:
    """One worker process (``python -I``, its working folder the one holding this gpuprobe, which goes first
    on its path): runs the calls it is given one after another (:func:`worker_main`).

    Isolated so that no file of the folder a report runs in (a ``bisect.py`` beside the traces) is imported;
    the worker imports the same gpuprobe as this process. Its stderr goes to a file, so that a chatty
    worker never blocks.
    """

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", _WORKER, root], cwd=root,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors)

    def call(self, call: bytes) -> Any:
        """What ``fn(*args, **kwargs)`` returns in the worker, ``call`` the pickle of ``(fn, args, kwargs)``
        (``fn`` importable by its qualified name).

        Raises:
            TaskFailed: ``fn`` raised.
            WorkerFailed: The worker ended, or its answer is not one; it is gone afterwards.
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            _write_pickle(self.proc.stdin, call)
            status, value = _read_message(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError):
            raise self._failure() from None
        if status != "ok":
            raise TaskFailed(value)
        return value

    def _failure(self) -> WorkerFailed:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            self.errors.seek(0)
            lines = self.errors.read().decode("utf-8", "replace").strip().splitlines()[-1:]
        except ValueError:  # closed: stopped by the pool (terminate), which killed it
            lines = []
        self._release()
        return WorkerFailed(lines[0] if lines else f"exit status {self.proc.returncode}")

    def close(self) -> None:
        """End the worker: its stdin closes, and it exits after the call it is running (killed if it does not)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:  # it has gone already
                pass
        try:
            self.proc.wait(timeout=_EXIT_S)
        except subprocess.TimeoutExpired:
            self.stop()
        self._release()

    def stop(self) -> None:
        """Kill the worker now."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._release()

    def _release(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.errors):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass


def worker_main() -> int:
    """A worker process's loop: for each call on stdin (a length-prefixed pickle of ``(fn, args, kwargs)``),
    ``("ok", result)`` or ``("raised", "Type: message")``, length-prefixed and pickled on stdout; it returns
    at the end of stdin."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    calls = os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    # Anything else written on stdout (a library's print) goes to stderr, never into an answer.
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while True:
        try:
            fn, args, kwargs = _read_message(calls)
        except EOFError:
            return 0
        try:
            answer: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except Exception as exc:  # the caller's TaskFailed
            answer = ("raised", f"{type(exc).__name__}: {exc}")
        _write_message(answers, answer)


class IsolatedProcessPool(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` of at most ``max_workers`` :class:`IsolatedWorker` processes, each
    running the calls submitted one after another, in the order submitted (one thread here per worker
    hands it the next call and waits for its answer).

    A worker runs many calls, so a small one costs its work, not the start of an interpreter (gpuprobe's
    imports: 0.3 to 0.4 s of CPU). A worker starts with its first call; one whose call ``retire`` is true
    for (called with the call's arguments) exits after it and a fresh one takes its place, so that the
    memory a large call left behind goes back to the system. A future whose worker ended fails with
    :class:`WorkerFailed`, one whose function raised with :class:`TaskFailed`.

    Example:
        >>> with IsolatedProcessPool(2) as pool:  # doctest: +SKIP
        ...     pool.submit(pow, 2, 10).result()
        1024
    """

    def __init__(self, max_workers: int = 1, *, retire: Callable[..., bool] | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, not {max_workers}")
        self.max_workers = max_workers
        self.retire = retire
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._workers: set[IsolatedWorker] = set()
        self._closed = False  # shut down: no more calls
        self._terminated = False  # terminated: no more workers either

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Schedule ``fn(*args, **kwargs)`` in a worker. The call is pickled here and now, so that what its
        arguments become afterwards (a trace whose head this process goes on reading) never reaches the
        worker, nor races with the pickling; a call that cannot be pickled fails its future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            call: bytes | None = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickle's errors are of many types (PicklingError, TypeError, AttributeError)
            call = None
            future.set_exception(exc)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that was shut down")
            if call is None:
                return future
            self._calls.put((future, call, args, kwargs))
            if len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._serve, name=f"gpuprobe-worker-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        worker: IsolatedWorker | None = None
        try:
            while (item := self._calls.get()) is not None:
                future, call, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if worker is None:
                        worker = self._start()
                    future.set_result(worker.call(call))
                except WorkerFailed as exc:
                    self._forget(worker)
                    worker = None
                    future.set_exception(exc)
                    continue
                except BaseException as exc:  # a worker that could not start, or a call's own failure
                    future.set_exception(exc)
                if worker is not None and self.retire is not None and self.retire(*args, **kwargs):
                    self._forget(worker)
                    worker.close()
                    worker = None
        finally:
            if worker is not None:
                self._forget(worker)
                worker.close()

    def _start(self) -> IsolatedWorker:
        worker = IsolatedWorker()
        with self._lock:
            self._workers.add(worker)
            if self._terminated:  # meanwhile
                worker.stop()
                raise WorkerFailed("the pool was terminated")
        return worker

    def _forget(self, worker: IsolatedWorker | None) -> None:
        with self._lock:
            self._workers.discard(worker)  # type: ignore[arg-type]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ``concurrent.futures``: no more calls; the workers exit once the calls submitted are done."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            self._cancel_waiting()
        for _ in threads:
            self._calls.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def terminate(self) -> None:
        """Shut down now: the calls not started are cancelled, the workers killed (their futures fail with
        :class:`WorkerFailed`), and no worker outlives this call."""
        with self._lock:
            self._terminated = True
        self.shutdown(wait=False, cancel_futures=True)
        while True:
            with self._lock:
                workers = list(self._workers)
                threads = [t for t in self._threads if t.is_alive()]
            for worker in workers:
                worker.stop()
            if not threads:
                return
            threads[0].join(timeout=0.05)

    def _cancel_waiting(self) -> None:
        held = []
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is None:
                held.append(item)
            else:
                item[0].cancel()
        for item in held:
            self._calls.put(item)
