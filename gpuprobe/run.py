"""``gpuprobe run [OPTIONS] -- COMMAND [ARGS...]``: run a Python program with gpuprobe switched on inside it.

No code change: ``gpuprobe run`` puts a directory holding a ``sitecustomize`` module first on the
command's ``PYTHONPATH``, sets the ``GPUPROBE_*`` variables its options name, and *replaces itself*
with the command (``os.execvpe``), as OpenTelemetry's ``opentelemetry-instrument`` does. The command
keeps gpuprobe's process id, so its exit status, the signals sent to it (Ctrl-C, ``kill``) and its
stdout/stderr are its own, unchanged; before it starts, ``gpuprobe run`` says one line of its own on stderr
(where ``/metrics`` and the live page will answer, how to capture steps, where traces go). Inside every Python process it starts, Python imports that
``sitecustomize`` at start-up, which switches gpuprobe on once the program imports a library an integration
serves (transformers, diffusers: the rows of :mod:`gpuprobe.integrations.registry`; see
:mod:`gpuprobe._bootstrap`): every model or pipeline of it is instrumented at first use (for transformers
``generate()`` and continuous batching) and ``/metrics`` is served. An existing ``sitecustomize`` still runs after it.

Limits: the command must be a Python program (a script, ``python ...``, a console script such as
``transformers serve``) run by a Python that can import gpuprobe. ``python -I`` (isolated mode) and
``python -E`` ignore ``PYTHONPATH``, and ``python -S`` imports no ``sitecustomize``: under those
nothing is switched on. Python subprocesses of the command inherit the environment and are switched
on too when they import transformers (or use ``@probe``); the first to start serves ``/metrics`` on the
port, torchrun's workers get one port per local rank, and any other that finds the port taken warns
once and runs on without an endpoint (docs/serving.md). A ``GPUPROBE_*`` variable gpuprobe cannot use is
named once and left out of the command's environment, so its default applies.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import Any

from . import config
from ._bootstrap import LAYERS_ENV
from .errors import ConfigError

__all__ = ["main", "child_environment", "start_line", "SITECUSTOMIZE_DIR", "DEFAULT_PORT"]

SITECUSTOMIZE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sitecustomize")
"""The directory put first on the command's ``PYTHONPATH``."""
DEFAULT_PORT = 9464

USAGE = """\
usage: gpuprobe run [OPTIONS] [--] COMMAND [ARGS...]

Run COMMAND (a Python program: `python app.py`, `transformers serve ...`) with gpuprobe switched on
inside it: every transformers model and diffusers pipeline instrumented at first use, /metrics served
for Prometheus. The command's exit status, signals and output are its own.

options:
  --port N             serve /metrics on port N (default: GPUPROBE_PROMETHEUS_PORT, else 9464;
                       0: a free port)
  --addr ADDR          address /metrics binds (default: GPUPROBE_PROMETHEUS_ADDR, else 127.0.0.1)
  --otlp URL           also push OTLP/HTTP metrics to URL (GPUPROBE_OTLP_ENDPOINT)
  --jsonl PATH         also write every observation to PATH (GPUPROBE_JSONL)
  --layers N           time decoder layers on one decode step in N (GPUPROBE_RUN_LAYERS)
  --profile-steps A-B  capture generation steps A to B with torch.profiler (GPUPROBE_PROFILE_STEPS)
  -h, --help           show this help

Any other GPUPROBE_* variable in the environment applies as usual (docs/quickstart.md)."""


def _setting(key: str) -> Callable[[str, str], str]:
    """Validate a flag's value with the parser of setting ``key``; the error names the flag."""
    parse = config.SETTINGS[key].parse

    def check(flag: str, raw: str) -> str:
        return str(parse(flag, raw))

    return check


# flag -> (environment variable, validator)
_FLAGS: dict[str, tuple[str, Callable[[str, str], str]]] = {
    "--port": (config.SETTINGS["prometheus_port"].env, _setting("prometheus_port")),
    "--addr": (config.SETTINGS["prometheus_addr"].env, _setting("prometheus_addr")),
    "--otlp": (config.SETTINGS["otlp_endpoint"].env, _setting("otlp_endpoint")),
    "--jsonl": (config.SETTINGS["jsonl"].env, _setting("jsonl")),
    "--layers": (LAYERS_ENV, lambda flag, raw: str(config._int(1)(flag, raw))),
    "--profile-steps": (config.SETTINGS["profile_steps"].env, _setting("profile_steps")),
}


class UsageError(Exception):
    """A bad command line; the message names the flag."""


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split ``argv`` into the variables the options set and the command.

    Options come first; the command starts at ``--`` or at the first argument that is not an option.

    Raises:
        UsageError: an unknown option, an option without its value, a bad value, or no command.

    Example:
        >>> parse(["--port", "9500", "--", "python", "app.py"])
        ({'GPUPROBE_PROMETHEUS_PORT': '9500'}, ['python', 'app.py'])
    """
    env: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        flag, eq, value = arg.partition("=")
        if flag not in _FLAGS:
            raise UsageError(f"unknown option {flag}; known: {', '.join(_FLAGS)}")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"{flag} needs a value")
            value = argv[i + 1]
            i += 1
        variable, check = _FLAGS[flag]
        try:
            env[variable] = check(flag, value)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        i += 1
    command = argv[i:]
    if not command:
        raise UsageError("no command given: put it after the options, e.g. gpuprobe run -- python app.py")
    return env, command


def child_environment(options: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ``environ``, the options' variables, the sitecustomize directory first
    on ``PYTHONPATH`` and, unless set, ``/metrics`` on the default port and ``SIGUSR2`` capturing the
    next steps (a program run for serving takes the signal; a library alone never does).

    Example:
        >>> env = child_environment({}, {"PATH": "/bin"})
        >>> env["GPUPROBE_PROMETHEUS_PORT"], env["GPUPROBE_PROFILE_SIGNAL"], env["PYTHONPATH"] == SITECUSTOMIZE_DIR
        ('9464', 'SIGUSR2', True)
    """
    env = dict(os.environ if environ is None else environ)
    env.update(options)
    for problem in config.from_environment(env)[1]:
        del env[problem.variable]  # the default applies, as it would inside the command; said by main()
    for setting, default in (("prometheus_port", str(DEFAULT_PORT)), ("profile_signal", "SIGUSR2")):
        variable = config.SETTINGS[setting].env
        if not env.get(variable, "").strip():
            env[variable] = default
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITECUSTOMIZE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITECUSTOMIZE_DIR, *paths])
    return env


def start_line(env: Mapping[str, str], pid: int | None = None) -> str:
    """The one line ``gpuprobe run`` says before the command starts: where ``/metrics`` and the live page
    will answer, how to capture steps and where traces go (read from the command's environment).

    Example:
        >>> start_line({"GPUPROBE_PROMETHEUS_PORT": "9500", "GPUPROBE_PROFILE_SIGNAL": "off"}, pid=42)[:107]
        'gpuprobe run: once the program imports transformers or diffusers, /metrics at http://127.0.0.1:9500/metrics'
    """
    cfg = config.from_environment(env)[0]
    parts = []
    if cfg.prometheus_port is None:
        parts.append("no /metrics (GPUPROBE_PROMETHEUS_PORT is empty)")
    elif cfg.prometheus_port == 0:
        parts.append("/metrics and the live page on a free port (gpuprobe.info()['exporters'] names it)")
    else:
        port = cfg.prometheus_port + (cfg.local_rank if cfg.port_by_local_rank else 0)
        host = f"[{cfg.prometheus_addr}]" if ":" in cfg.prometheus_addr else cfg.prometheus_addr
        parts.append(f"/metrics at http://{host}:{port}/metrics, the live page at http://{host}:{port}/")
    traces = os.path.abspath(cfg.profile_dir)
    if cfg.profile_signal != "off":
        signal = cfg.profile_signal.removeprefix("SIG")
        parts.append(f"kill -{signal} {os.getpid() if pid is None else pid} captures the next "
                     f"{cfg.profile_on_demand_steps} steps to {traces}/")
    else:
        parts.append(f"captures go to {traces}/")
    if cfg.profile_steps is not None and cfg.profile_output != "none":
        first, _, last = cfg.profile_steps.partition("-")
        output = (f"gpuprobe-steps-{first}-{last or first}-rank{cfg.rank}.json.gz" if cfg.profile_output == "auto"
                  else cfg.profile_output)
        parts.append(f"steps {cfg.profile_steps} are traced to {os.path.abspath(output)}")
    return f"gpuprobe run: once the program imports {_libraries()}, " + "; ".join(parts)


def _libraries() -> str:
    """The libraries whose import switches gpuprobe on, in the registry's order: ``transformers or diffusers``."""
    from .integrations.registry import INTEGRATIONS

    names = [row.library for row in INTEGRATIONS]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _resolve(command: str, env: Mapping[str, str]) -> str | None:
    if os.sep in command or (os.altsep and os.altsep in command):
        return command if os.path.exists(command) else None
    return shutil.which(command, path=env.get("PATH", os.defpath))


def main(argv: list[str] | None = None, *, execvpe: Callable[..., Any] = os.execvpe) -> int:
    """Replace this process with the command, gpuprobe switched on inside it.

    Returns only when the command cannot be started: 2 for a bad command line or setting, 127 for a
    command not found, 126 for one that cannot be executed.

    Example:
        >>> main(["--port", "x", "--", "python"])  # doctest: +SKIP
        2
    """
    args = sys.argv[2:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        options, command = parse(args)
    except UsageError as exc:
        print(f"gpuprobe run: {exc} (gpuprobe run --help shows the options)", file=sys.stderr)
        return 2
    # A GPUPROBE_* variable gpuprobe cannot use is named now, once, and left out of the command's
    # environment (its default applies): the command runs, and its processes do not warn again.
    for problem in config.from_environment({**os.environ, **options})[1]:
        print(f"gpuprobe run: {problem.message().removeprefix('gpuprobe: ')}", file=sys.stderr)
    env = child_environment(options)
    path = _resolve(command[0], env)
    if path is None:
        print(f"gpuprobe run: {command[0]}: command not found", file=sys.stderr)
        return 127
    try:
        print(start_line(env), file=sys.stderr)
    except Exception as exc:  # the line is a courtesy: the command starts whatever it could not say
        print(f"gpuprobe run: (where /metrics will answer could not be said: {exc!r})", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        execvpe(path, command, env)
    except OSError as exc:
        print(f"gpuprobe run: {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126
    return 0  # only a stand-in execvpe returns
