"""The integrations gpuprobe has, one row each: what switches each on, what it serves, where its parts are.

An integration is one package under ``gpuprobe/integrations/`` — its public module (``instrument_all()``,
``uninstrument_all()``, ``describe()``) and its private package (its seams, its compat module) — and one
:class:`Integration` row in :data:`INTEGRATIONS`. Everything that switches integrations on or tells about
them loops over the rows and names no library: ``gpuprobe run``'s start-up hook (a post-import hook on
each row's :attr:`~Integration.triggers`) and :mod:`gpuprobe._bootstrap`, the OpenTelemetry instrumentor
(its ``instrumentation_dependencies``), ``gpuprobe doctor`` (a line per row), scripts/versions.py, and
the tests (the ``instruments-any`` extra of pyproject.toml equals the rows; the fail-open scenarios, the
promises about compat modules, no module outside an integration's package naming its library).

This module imports nothing at all (the standard library only inside functions): ``gpuprobe run``'s
start-up hook, which may import only the standard library, reads it from its file in every Python
process it starts (before gpuprobe itself can be imported), and scripts/versions.py reads it the same
way before a virtual environment exists.

Example:
    >>> from gpuprobe.integrations.registry import INTEGRATIONS, get
    >>> get("transformers").module
    'gpuprobe.integrations.transformers'
    >>> [row.name for row in INTEGRATIONS][:1]
    ['transformers']
"""

from __future__ import annotations

TYPE_CHECKING = False  # Why not typing's: importing typing costs ~3 ms, paid at every start-up under gpuprobe run
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["Integration", "INTEGRATIONS", "get", "names", "load", "describer", "installed"]

_FIELDS = ("name", "library", "distribution", "versions", "triggers", "module", "package", "compat", "doctor",
           "scenarios", "objects")


class Integration:
    """One integration: the library it serves, the versions it supports, and where its parts are.

    A frozen row with named fields (written out rather than a dataclass: ``dataclasses`` costs ~8.7 ms to
    import, min of 25 on the test machine, three times the start-up hook that reads this module).

    Attributes:
        name: the integration's name: doctor's line, the extra of pyproject.toml that installs what it
            needs, its test folder (``tests/<name>/``).
        library: the top-level module the library is imported as (``import <library>``).
        distribution: the library's distribution on PyPI.
        versions: the versions of ``distribution`` it supports, a PEP 440 specifier (``">=5.18,<6"``);
            equal to its compat module's ``SUPPORTED_VERSIONS`` and to pyproject.toml's extras (tests and
            ``scripts/versions.py check`` hold them together).
        triggers: the modules whose import switches it on under ``gpuprobe run`` (the first of them to be
            imported calls its ``instrument_all()``); more than one where the library can be entered
            without its first one (a server module that builds its app before any model is loaded).
        module: the public module, imported lazily by name: ``instrument_all(**options)`` (every object of
            the library in the process, at first use; the options ``gpuprobe run`` and the OpenTelemetry
            instrumentor pass: ``layers``, ``layer_every``, ...), ``uninstrument_all()``.
        package: the private package holding the rest of it (seams, hooks, its compat module).
        compat: the module holding every reading of the library's own objects, and ``SUPPORTED_VERSIONS``.
        doctor: ``"module:function"``, the callable that describes it for ``gpuprobe doctor``: it returns
            ``{"state", "reason", "details"}`` (a doctor line; ``state`` ``ok`` / ``off`` / ``fail``) and,
            where the library is there to check against, ``"seams"`` (seam name → why it does not fit, or
            None) and ``"checked_against"`` (``"<library> <version>"``).
        scenarios: the fail-open scenarios its seams name (``Seam.scenario``), run by tests/test_fail_open.py
            from ``tests/<name>/_fail_open.py``.
        objects: the names under which its code holds objects the library made (``model``, ``scheduler``):
            every attribute read on them outside its compat module fails tests/test_promises.py.
    """

    __slots__ = _FIELDS
    name: str
    library: str
    distribution: str
    versions: str
    triggers: tuple[str, ...]
    module: str
    package: str
    compat: str
    doctor: str
    scenarios: tuple[str, ...]
    objects: tuple[str, ...]

    def __init__(self, *, name: str, library: str, distribution: str, versions: str, triggers: tuple[str, ...],
                 module: str, package: str, compat: str, doctor: str, scenarios: tuple[str, ...] = (),
                 objects: tuple[str, ...] = ()) -> None:
        values = {"name": name, "library": library, "distribution": distribution, "versions": versions,
                  "triggers": tuple(triggers), "module": module, "package": package, "compat": compat,
                  "doctor": doctor, "scenarios": tuple(scenarios), "objects": tuple(objects)}
        for field, value in values.items():
            texts = value if isinstance(value, tuple) else (value,)
            if not all(isinstance(t, str) and t and t == t.strip() for t in texts):
                raise ValueError(f"Integration({name!r}): {field} must be non-empty text without surrounding "
                                 f"spaces, got {value!r}")
        if not values["triggers"]:
            raise ValueError(f"Integration({name!r}): triggers must name at least one module")
        module_name, colon, function = doctor.partition(":")
        if not (colon and module_name and function):
            raise ValueError(f"Integration({name!r}): doctor must be 'module:function', got {doctor!r}")
        for field, value in values.items():
            object.__setattr__(self, field, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an Integration row is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"an Integration row is frozen: {name} cannot be deleted")

    def __repr__(self) -> str:
        return "Integration(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS) + ")"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Integration):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f) for f in _FIELDS))

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles are built anew: the fields cannot be set
        return (_rebuild, (tuple(getattr(self, f) for f in _FIELDS),))

    @property
    def requirement(self) -> str:
        """The library and its versions as pyproject.toml writes them (``"transformers>=5.18,<6"``)."""
        return f"{self.distribution}{self.versions}"


def _rebuild(values: tuple[Any, ...]) -> Integration:
    return Integration(**dict(zip(_FIELDS, values)))


INTEGRATIONS: tuple[Integration, ...] = (
    Integration(
        name="transformers",
        library="transformers",
        distribution="transformers",
        versions=">=5.18,<6",
        # GenerationMixin's module; and transformers serve's server module, whose app is built before any
        # model is loaded (so before the first).
        triggers=("transformers.generation.utils", "transformers.cli.serving.server"),
        module="gpuprobe.integrations.transformers",
        package="gpuprobe.integrations._transformers",
        compat="gpuprobe.integrations._transformers.compat",
        doctor="gpuprobe.integrations.transformers:describe",
        scenarios=("generate", "pickle", "generate_batch", "cache_concats", "serve"),
        objects=(
            "model",  # the instrumented PreTrainedModel
            "root",  # its decoding module (compat.decoding_module)
            "config",  # a model's PretrainedConfig
            "generation_config",  # a call's GenerationConfig
            "manager",  # a ContinuousBatchingManager
            "router",  # its OutputRouter
            "bp",  # its ContinuousBatchProcessor
            "scheduler",  # the processor's Scheduler
            "offloader",  # the processor's OffloadingManager
            "fs",  # a scheduled FutureRequestState
            "output",  # a GenerationOutput the router delivers
            "outputs",  # several of them
            "generator",  # a candidate generator of assisted decoding
            "stop_check",  # the decoding loop's stop check
            "frame",  # the frame of transformers' decoding loop
        ),
    ),
    Integration(
        name="diffusers",
        library="diffusers",
        distribution="diffusers",
        versions=">=0.35,<1",
        triggers=("diffusers.pipelines.pipeline_utils",),  # DiffusionPipeline's module
        module="gpuprobe.integrations.diffusers",
        package="gpuprobe.integrations._diffusers",
        compat="gpuprobe.integrations._diffusers.compat",
        doctor="gpuprobe.integrations.diffusers:describe",
        scenarios=("diffusers",),
        objects=(
            "pipe",  # the instrumented DiffusionPipeline
            "denoiser",  # its UNet or transformer
            "scheduler",  # its scheduler
            "vae",  # its autoencoder
        ),
    ),
)
"""Every integration, in the order doctor shows them."""


def get(name: str) -> Integration:
    """The row named ``name``.

    Raises:
        KeyError: no integration has that name; the message names those there are.

    Example:
        >>> get("transformers").distribution
        'transformers'
    """
    for row in INTEGRATIONS:
        if row.name == name:
            return row
    raise KeyError(f"no integration named {name!r}; there are: {', '.join(names())}")


def names() -> tuple[str, ...]:
    """The integrations' names, in order.

    Example:
        >>> "transformers" in names()
        True
    """
    return tuple(row.name for row in INTEGRATIONS)


def load(row: Integration) -> ModuleType:
    """The integration's public module (imported now if it is not yet)."""
    import importlib

    return importlib.import_module(row.module)


def describer(row: Integration) -> Callable[[], dict[str, Any]]:
    """The callable that describes the integration for ``gpuprobe doctor`` (its module imported now)."""
    import importlib

    module_name, _, function = row.doctor.partition(":")
    return getattr(importlib.import_module(module_name), function)  # type: ignore[no-any-return]


def installed(row: Integration) -> bool:
    """Whether the library can be imported here (found on the path, a package or module with a file of its
    own, not a namespace folder of its name; nothing is imported).

    Example:
        >>> installed(get("transformers")) in (True, False)
        True
    """
    import importlib.util
    import sys

    # A folder of the library's name on the path (a test folder, a checkout) is a namespace package, not the
    # library: it has no origin, and its import gives none of the library's modules.
    module = sys.modules.get(row.library)
    if module is not None:
        return getattr(module, "__file__", None) is not None
    try:
        spec = importlib.util.find_spec(row.library)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None
