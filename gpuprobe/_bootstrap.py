"""What ``gpuprobe run`` switches on inside the command's Python processes (see :mod:`gpuprobe.run`).

Python imports the ``sitecustomize`` module of ``gpuprobe/_sitecustomize/`` at start-up (``gpuprobe
run`` puts that directory first on ``PYTHONPATH``). It imports nothing of gpuprobe: it installs a
post-import hook on ``transformers.generation.utils`` (where ``GenerationMixin`` lives), and when the
program imports transformers the hook calls :func:`switch_on`:

- every transformers model is instrumented at first use: ``instrument_all()``, which covers
  ``generate()`` and continuous batching;
- the runtime starts what the ``GPUPROBE_*`` settings ask for (``/metrics`` on
  ``GPUPROBE_PROMETHEUS_PORT``, OTLP, JSON lines, a profile window).

When the program imports ``transformers serve``'s server module (its CLI does, before it loads any
model), the hook calls :func:`serve_on`: the app it builds gets gpuprobe's request ids and
``Server-Timing`` (docs/serving.md).

A Python process that never imports transformers (a helper subprocess, a launcher such as torchrun's)
therefore binds no port and imports no part of gpuprobe. A problem is reported on stderr and the
program runs on without gpuprobe: telemetry never stops it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from . import config
from ._seams import declare
from .errors import ConfigError

__all__ = ["switch_on", "serve_on", "instrument_options", "LAYERS_ENV"]

LAYERS_ENV = "GPUPROBE_RUN_LAYERS"
"""Time decoder layers on one decode step in this many (``gpuprobe run --layers N``); unset: off."""

_parse_layers = config._int(1)

SEAM = declare(
    "python.run_import_hook", library="python", scenario="run",
    target="the loader of transformers.generation.utils, under gpuprobe run (its sitecustomize's post-import hook)")
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


def switch_on(environ: Mapping[str, str] | None = None) -> bool:
    """Instrument every transformers model at first use and start what the settings ask for.

    Called once transformers is imported; never raises. Returns whether gpuprobe is on.

    Example:
        >>> switch_on({"GPUPROBE_RUN_LAYERS": "x"})  # doctest: +SKIP
        False
    """
    env = os.environ if environ is None else environ
    try:
        options = instrument_options(env)
        from .integrations.transformers import instrument_all
        from .runtime import runtime

        instrument_all(**options)
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


def serve_on() -> None:
    """Install the seams of ``transformers serve``'s app (its server module was just imported); never raises."""
    try:
        from .runtime import DISABLED_AT_IMPORT

        if not DISABLED_AT_IMPORT:
            from .integrations._transformers.serve_app import instrument_server

            instrument_server()
    except Exception as exc:
        _say(f"gpuprobe could not observe transformers serve's app ({type(exc).__name__}: {exc}); it serves "
             "without request timings")
