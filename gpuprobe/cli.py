"""Command line: ``gpuprobe run|demo|report|diff|dashboard|info|doctor|ncu-args|try`` (also
``python -m gpuprobe ...``).

Each subcommand lives in its own module and is imported only when asked for, so ``gpuprobe info``
works with no optional dependency installed. Every usage line names the command ``gpuprobe``.
"""

from __future__ import annotations

import importlib
import json
import sys

__all__ = ["main"]

_COMMANDS = {
    "run": ("gpuprobe.run", "main", "run a Python program with gpuprobe switched on inside it, no code change"),
    "demo": ("gpuprobe.demo", "main", "run a tiny model's generate() with probes on and serve live metrics"),
    "report": ("gpuprobe.report.cli", "main_report", "summarize a kineto (.json/.json.gz) or nsys (.sqlite) trace"),
    "diff": ("gpuprobe.report.cli", "main_diff", "compare two traces side by side"),
    "dashboard": ("gpuprobe.dashboards", "main", "write the Grafana dashboards / print scrape configs"),
    "info": (None, None, "show which timing, NVTX and export backends are active"),
    "doctor": ("gpuprobe.doctor", "main", "what works on this machine and why not (initializes CUDA)"),
    "ncu-args": ("gpuprobe._ncu_args", "main", "print Nsight Compute filter arguments for gpuprobe's NVTX ranges"),
    "try": ("gpuprobe.experiment.cli", "main", "measure the remedies (static cache, compile, attention, ...) on a model"),
}


INFO_USAGE = """\
usage: gpuprobe info

Print gpuprobe.info() as JSON, as a program started here would see it: the version, the timing, NVTX,
memory and export backends, the settings' problems, the sync audit and where it saw syncs, profiling,
kernel sampling, the seams and the GPU health gauges.

options:
  -h, --help  show this help"""


def _usage() -> str:
    lines = ["usage: gpuprobe [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += ["", "gpuprobe COMMAND --help shows a command's options."]
    return "\n".join(lines)


def _info(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        print(INFO_USAGE)
        return 0
    if args:
        print(f"gpuprobe info: unknown argument(s) {' '.join(args)} (gpuprobe info takes none; see gpuprobe info "
              "--help)", file=sys.stderr)
        return 2
    import gpuprobe

    print(json.dumps(gpuprobe.info(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; returns its exit status (2 for bad usage).

    Example:
        >>> main(["info"])  # doctest: +SKIP
        0
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-V"], ["--version"]):
        from ._version import __version__

        print(f"gpuprobe {__version__}")
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        print(f"gpuprobe: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = _COMMANDS[name]
    if module is None or func is None:
        return _info(rest)
    try:
        entry = getattr(importlib.import_module(module), func)
    except ImportError as exc:
        print(f"gpuprobe {name}: {exc}", file=sys.stderr)
        return 2
    return int(entry(rest) or 0)
