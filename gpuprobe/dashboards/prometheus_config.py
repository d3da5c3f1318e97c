"""Prometheus scrape configurations for gpuprobe: one port per local rank on each host."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from .rules import ALERTS_FILE, RULES_FILE

__all__ = ["DEFAULT_PORT", "scrape_config"]

DEFAULT_PORT = 9464
"""The port gpuprobe serves ``/metrics`` on for local rank 0 (``GPUPROBE_PROMETHEUS_PORT``)."""

_INTERVAL = re.compile(r"^[1-9][0-9]*(ms|s|m|h)$")
_JOB = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def scrape_config(*, ranks: int = 1, base_port: int = DEFAULT_PORT, hosts: Sequence[str] = ("127.0.0.1",),
                  job: str = "gpuprobe", interval: str = "5s",
                  rule_files: Sequence[str] = (RULES_FILE, ALERTS_FILE), honor_labels: bool = False,
                  ) -> dict[str, Any]:
    """A Prometheus configuration that scrapes gpuprobe on each host, one port per local rank.

    gpuprobe serves rank ``LOCAL_RANK`` on ``base_port + LOCAL_RANK`` (see :func:`gpuprobe.serve`), so
    ``ranks`` ports per host are scraped; each target also gets a ``local_rank`` label.

    Args:
        ranks: processes per host (torchrun's ``--nproc_per_node``).
        base_port: the port of local rank 0 (``GPUPROBE_PROMETHEUS_PORT``, default 9464).
        hosts: the hosts to scrape, one per node.
        job: the job name.
        interval: scrape and rule-evaluation interval (``5s``, ``15s``, ...).
        rule_files: rule files to load, relative to the configuration file.
        honor_labels: keep ``job``/``instance`` from the scraped series (for an OpenTelemetry Collector).

    Raises:
        ConfigError: a bad count, port range, host list or interval; the message names the option.

    Example:
        >>> cfg = scrape_config(ranks=2, base_port=9500)
        >>> [g["targets"] for g in cfg["scrape_configs"][0]["static_configs"]]
        [['127.0.0.1:9500'], ['127.0.0.1:9501']]
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"--ranks must be an integer >= 1, got {ranks!r}")
    if isinstance(base_port, bool) or not isinstance(base_port, int) or not 1 <= base_port <= 65535:
        raise ConfigError(f"--base-port must be a TCP port between 1 and 65535, got {base_port!r}")
    if base_port + ranks - 1 > 65535:
        raise ConfigError(f"--base-port {base_port} with --ranks {ranks} needs ports up to "
                          f"{base_port + ranks - 1}, above 65535; choose a lower --base-port")
    hosts = [h.strip() for h in hosts]
    if not hosts or any(not h or any(c in h for c in " /,") for h in hosts):
        raise ConfigError(f"--host must name hosts (no spaces, slashes or commas), got {hosts!r}")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ConfigError(f"--host {twice[0]} is given twice: its ranks would be scraped twice")
    if not _INTERVAL.match(interval):
        raise ConfigError(f"--interval must be a Prometheus duration such as 5s or 1m, got {interval!r}")
    if not _JOB.match(job):
        raise ConfigError(f"--job must be a plain name, got {job!r}")

    def host_port(host: str, port: int) -> str:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    groups: list[dict[str, Any]] = []
    for local in range(ranks):
        group: dict[str, Any] = {"targets": [host_port(h, base_port + local) for h in hosts]}
        if ranks > 1:
            group["labels"] = {"local_rank": str(local)}
        groups.append(group)
    scrape: dict[str, Any] = {"job_name": job}
    if honor_labels:
        scrape["honor_labels"] = True
    scrape["static_configs"] = groups
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": list(rule_files), "scrape_configs": [scrape]}
