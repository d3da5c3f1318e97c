"""Where the ranks of a multi-rank report run, named on the command line (``--executor``).

- ``processes`` (the default): local worker processes, ``--jobs`` at a time (:func:`analyze_ranks`'s own).
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
from collections.abc import Iterator
from typing import Any

from gpuprobe.errors import ConfigError

__all__ = ["EXECUTOR_HELP", "open_executor", "is_local", "check_address"]

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
        with contextlib.closing(client):
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
    with contextlib.closing(cluster), Client(cluster, set_as_default=False) as client:
        yield client
