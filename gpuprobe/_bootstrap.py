"""What ``gpuprobe run`` switches on inside the command's Python processes (see :mod:`gpuprobe.run`).

Python imports the ``sitecustomize`` module of ``gpuprobe/_sitecustomize/`` at start-up (``gpuprobe
run`` puts that directory first on ``PYTHONPATH``). It imports nothing of gpuprobe: it reads the
integrations' rows (:mod:`gpuprobe.integrations.registry`) and installs a post-import hook on each
row's trigger modules. When the program imports the first trigger of an integration, the hook calls
:func:`switch_on` for it:

- every object of that library is instrumented at first use: the integration's ``instrument_all()``
  (with the options of ``gpuprobe run --layers``);
- the runtime starts what the ``GPUPROBE_*`` settings ask for (``/metrics`` on
  ``GPUPROBE_PROMETHEUS_PORT``, OTLP, JSON lines, a profile window).

A Python process that imports no integrated library (a helper subprocess, a launcher such as
torchrun's) therefore binds no port and imports no part of gpuprobe. A problem is reported on stderr
and the program runs on without gpuprobe: telemetry never stops it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from . import config
from ._seams import declare
from .errors import ConfigError
from .integrations import registry

__all__ = ["switch_on", "instrument_options", "LAYERS_ENV"]

LAYERS_ENV = "GPUPROBE_RUN_LAYERS"
"""Time the model's layers on one step in this many (``gpuprobe run --layers N``); unset: off."""

_parse_layers = config._int(1)

SEAM = declare(
    "python.run_import_hook", library="python", scenario="run",
    target="the loaders of the integrations' trigger modules, under gpuprobe run (its sitecustomize's post-import "
           "hooks)")
"""The post-import hook of ``gpuprobe run``. Its code is the stdlib-only ``_sitecustomize`` module (a
Python process pays ~3 ms for it at start-up instead of ~45 ms for importing gpuprobe); the real
loader runs first and untouched, and :func:`switch_on` never raises."""


def instrument_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """The keywords of ``instrument_all()`` that the environment asks for.

    Raises:
        ConfigError: a bad value; the message names the variable.

    Example:
        >>> instrument_options({"GPUPROBE_RUN_LAYERS": "8"})
        {'layers': True, 'layer_every': 8}
    """
    raw = environ.get(LAYERS_ENV, "")
    if not raw.strip():
        return {}
    return {"layers": True, "layer_every": _parse_layers(LAYERS_ENV, raw)}


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"gpuprobe run: {message}\n")
        sys.stderr.flush()
    except Exception:  # no usable stderr (a daemon): stay quiet
        pass


def switch_on(environ: Mapping[str, str] | None = None, integration: str | None = None) -> bool:
    """Instrument every object of an integrated library at first use and start what the settings ask for.

    Called once the program has imported the library (the first of its row's triggers); never raises.

    Args:
        environ: the environment to read ``gpuprobe run``'s options from (default: ``os.environ``).
        integration: the integration to switch on (its row's name); default: every integration whose
            library the program has imported.

    Returns:
        Whether gpuprobe is on. False once gpuprobe's own failure switched the hook off: the
        integrations switched on later in the process stay off too.

    Example:
        >>> switch_on({"GPUPROBE_RUN_LAYERS": "x"})  # doctest: +SKIP
        False
    """
    env = os.environ if environ is None else environ
    if not SEAM.on:
        return False
    try:
        options = instrument_options(env)
        if integration is not None:
            rows = [registry.get(integration)]
        else:
            rows = [row for row in registry.INTEGRATIONS if row.library in sys.modules]
        from .runtime import runtime

        for row in rows:
            registry.load(row).instrument_all(**options)
        runtime()  # starts /metrics and whatever else the GPUPROBE_* settings ask for
    except ConfigError as exc:
        _say(f"{exc}; the program runs without gpuprobe")
        SEAM.refuse(str(exc), quiet=True)
        return False
    except Exception as exc:
        _say(f"gpuprobe could not be switched on in this process ({type(exc).__name__}: {exc}); "
             "the program runs without it")
        SEAM.fail(exc, report=False)
        return False
    return True
