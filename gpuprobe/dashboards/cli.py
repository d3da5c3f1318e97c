"""``python -m gpuprobe dashboard``: write the dashboards and Prometheus files, check them, print a
scrape configuration, or verify every panel against a live Prometheus."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any, NoReturn

from ..errors import ConfigError, GpuprobeError
from .doc_tables import gpu_panels_table, mapping_table
from .files import DASHBOARD_DIR, PROMETHEUS_DIR, dashboard_files, differences, prometheus_files, write_files
from .prometheus_api import PrometheusAnswerError, PrometheusError
from .prometheus_config import DEFAULT_PORT, scrape_config
from .promql import check_queries, check_rules
from .rules import alert_rules, recording_rules
from .verify import summary, verify
from .yaml_emit import to_yaml

__all__ = ["main"]

PROG = "gpuprobe dashboard"
PROMETHEUS_SUBDIR = "prometheus"
"""Where under ``--out`` the Prometheus files go when ``--prometheus-out`` is not given."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {PROG} --help)")  # one line, not usage + error


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Write gpuprobe's Grafana dashboards and Prometheus rules, check them, "
                                       "print scrape configurations, or verify panels against Prometheus.")
    p.add_argument("--out", help=f"dashboard folder (default: {DASHBOARD_DIR})")
    p.add_argument("--prometheus-out",
                   help=f"folder for rules and example scrape configurations (default: OUT/{PROMETHEUS_SUBDIR} when "
                        f"--out is given, else {PROMETHEUS_DIR})")
    p.add_argument("--inline-quantiles", action="store_true",
                   help="compute quantiles in the panel queries instead of reading the recording rules")
    p.add_argument("--check", action="store_true",
                   help="fail if the files on disk differ from the generator or a query is not valid PromQL "
                        "naming series gpuprobe exports")
    p.add_argument("--scrape-config", action="store_true", help="print a Prometheus configuration and exit")
    p.add_argument("--ranks", type=int, default=1, help="processes per host (default: %(default)s)")
    p.add_argument("--base-port", type=int, default=DEFAULT_PORT, help="port of local rank 0 (default: %(default)s)")
    p.add_argument("--host", action="append", help="host to scrape; repeat for several nodes (default: 127.0.0.1)")
    p.add_argument("--job", default="gpuprobe", help="job name (default: %(default)s)")
    p.add_argument("--interval", default="5s", help="scrape and evaluation interval (default: %(default)s)")
    p.add_argument("--verify", metavar="URL", help="run every panel query against the Prometheus at URL")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="with --verify: select VALUE for a dashboard variable (repeatable)")
    p.add_argument("--skip-gpu-only", action="store_true", help="with --verify: leave out panels that need a GPU")
    p.add_argument("--doc-tables", action="store_true", help="print the Markdown tables used in docs/grafana.md")
    return p


def _folders(args: argparse.Namespace) -> None:
    """Fill in the output folders: everything under ``--out`` when it is given (the Prometheus files in
    its ``prometheus`` folder), the repository's ``deploy/`` folders when neither is."""
    if args.prometheus_out is None:
        args.prometheus_out = PROMETHEUS_DIR if args.out is None else os.path.join(args.out, PROMETHEUS_SUBDIR)
    if args.out is None:
        args.out = DASHBOARD_DIR


def _write(flag: str, folder: str, files: dict[str, str]) -> None:
    try:
        paths = write_files(folder, files)
    except OSError as exc:
        raise ConfigError(f"{flag} {folder}: cannot write there ({exc.strerror or exc})") from None
    for path in paths:
        print(f"wrote {path}")


def _read_dashboard(folder: str, name: str) -> Any:
    path = os.path.join(folder, name)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--out {folder} has no {name}; write the dashboards there first "
                          f"({PROG} --out {folder})") from None
    except ValueError as exc:
        raise ConfigError(f"--out: {path} is not valid JSON ({exc})") from None


def _check(args: argparse.Namespace) -> int:
    boards = dashboard_files(args.inline_quantiles)
    prom_files = prometheus_files()
    problems = differences(args.out, boards, ".json") + differences(args.prometheus_out, prom_files, ".yml")
    for name in boards:
        if os.path.exists(os.path.join(args.out, name)):
            try:
                problems += check_queries(_read_dashboard(args.out, name))
            except ConfigError as exc:
                problems.append(str(exc))
    problems += check_rules(recording_rules()) + check_rules(alert_rules())
    for line in problems:
        print(f"gpuprobe dashboard --check: {line}", file=sys.stderr)
    if problems:
        print(f"regenerate with: {PROG}", file=sys.stderr)
        return 1
    print(f"gpuprobe dashboard --check: {len(boards)} dashboards and {len(prom_files)} Prometheus files "
          "are current")
    return 0


def _verify(args: argparse.Namespace) -> int:
    url = urllib.parse.urlsplit(args.verify)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ConfigError(f"--verify must be the URL of a Prometheus server such as http://127.0.0.1:9090, "
                          f"got {args.verify!r}")
    chosen: dict[str, list[str]] = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--var must be NAME=VALUE, got {item!r}")
        chosen.setdefault(name, []).append(value)
    boards = [_read_dashboard(args.out, name) for name in dashboard_files(args.inline_quantiles)]
    results = verify(args.verify, boards, chosen, gpu_only=False if args.skip_gpu_only else None)
    for r in results:
        print(r)
    lines, failed = summary(results)
    print("\n".join(lines))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuprobe dashboard``: write, check, print a scrape configuration, or verify.

    Returns:
        0 on success, 1 when a check or verification fails or Prometheus cannot be reached, 2 on bad
        arguments, a missing dependency, or an answer at the ``--verify`` URL that is not a Prometheus
        API answer (each with a one-line message on stderr).

    Example:
        >>> main(["--ranks", "many"])  # doctest: +SKIP
        gpuprobe dashboard: argument --ranks: invalid int value: 'many' (see gpuprobe dashboard --help)
        2
    """
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
        _folders(args)
        if args.doc_tables:
            print("## Metric names\n\n" + mapping_table() + "\n## Panels that need a GPU\n\n" + gpu_panels_table(),
                  end="")
            return 0
        if args.scrape_config:
            cfg = scrape_config(ranks=args.ranks, base_port=args.base_port, hosts=args.host or ["127.0.0.1"],
                                job=args.job, interval=args.interval)
            print(to_yaml(cfg), end="")
            return 0
        if args.verify:
            return _verify(args)
        if args.check:
            return _check(args)
        boards, prom_files = dashboard_files(args.inline_quantiles), prometheus_files()  # both made before writing
        _write("--out", args.out, boards)
        _write("--prometheus-out", args.prometheus_out, prom_files)
        return 0
    except PrometheusAnswerError as exc:  # the URL is not that of a Prometheus: bad input, like a bad flag
        print(f"gpuprobe dashboard: --verify: {exc}", file=sys.stderr)
        return 2
    except PrometheusError as exc:
        print(f"gpuprobe dashboard: {exc}", file=sys.stderr)
        return 1
    except (GpuprobeError, OSError) as exc:
        print(f"gpuprobe dashboard: {exc}", file=sys.stderr)
        return 2
