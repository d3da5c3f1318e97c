"""Imported by Python's ``site`` at start-up when ``gpuprobe run`` started the process.

``gpuprobe run`` puts this module's directory first on ``PYTHONPATH``, so this ``sitecustomize`` is
found before any other. It reads the integrations' rows (:mod:`gpuprobe.integrations.registry`, from
its file: gpuprobe itself is not imported) and installs a post-import hook on each row's trigger
modules; the first of them the program imports imports gpuprobe and switches that integration on
(:func:`gpuprobe._bootstrap.switch_on`). Then it imports the ``sitecustomize`` that would have been
imported without it, if there is one, so both run.

Only the standard library is imported here. Why: importing gpuprobe costs ~45 ms (test machine),
paid by every Python process of the command — helpers and launchers that never import an integrated
library included — if it were done at start-up; this module costs ~3 ms.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

# Why no typing imports at run time: typing and collections.abc cost ~3 ms at every start-up (test
# machine), a third of what this module costs; the annotations are only read by type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from types import ModuleType
    from typing import Any

REGISTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integrations", "registry.py")
"""The file of :mod:`gpuprobe.integrations.registry`, read as it is (it imports nothing)."""


class _Loader:
    """Runs the real loader, then ``after(module)``."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


class _AfterImport:
    """A meta path finder that calls ``after()`` once module ``name`` has been imported (a post-import
    hook), then takes itself off ``sys.meta_path``."""

    def __init__(self, name: str, after: Callable[[], None]) -> None:
        self.name = name
        self.after = after

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self._done)  # type: ignore[assignment]
        return spec

    def _done(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.after()


def _shadowing() -> str | None:
    """The folder ``import gpuprobe`` finds instead of the package this module belongs to, if another one.

    Why it happens: a folder named ``gpuprobe`` without ``__init__.py`` (a checkout of gpuprobe's
    repository, say) in the script's folder or the current directory is a namespace package; with
    gpuprobe installed in editable mode (found by a finder after the path), it wins, and its module
    has none of gpuprobe's names.
    """
    import importlib.util

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        spec = importlib.util.find_spec("gpuprobe")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    found = list(spec.submodule_search_locations or [])
    if spec.origin is not None and found and os.path.samefile(found[0], ours):
        return None
    return found[0] if found else (spec.origin or "?")


_started: set[str] = set()  # the integrations whose trigger was imported (switched on, or tried)
_said: list[str] = []  # why gpuprobe cannot be imported, once said


def _tell(message: str) -> None:
    if _said:
        return
    _said.append(message)
    try:
        sys.stderr.write(message)
    except Exception:
        pass


def _switch_on(name: str) -> None:
    """The trigger of integration ``name`` was imported: switch it on (once, whichever trigger came first)."""
    if name in _started:
        return
    _started.add(name)
    shadow = _shadowing()
    if shadow is not None:
        _tell(f"gpuprobe run: the folder {shadow} shadows the installed gpuprobe ("
              f"{os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}): `import gpuprobe` "
              "finds it first (it is on sys.path: the script's folder or the current directory); "
              "the program runs without gpuprobe; rename that folder or run from another one\n")
        return
    try:
        from gpuprobe import _bootstrap
    except Exception as exc:  # another Python than gpuprobe's, or a broken install: run without it
        _tell(f"gpuprobe run: {sys.executable} cannot import gpuprobe ({type(exc).__name__}: {exc}); the "
              "program runs without it\n")
        return
    _bootstrap.switch_on(integration=name)


def rows() -> list[tuple[str, tuple[str, ...]]]:
    """``(name, triggers)`` of every integration, read from the registry's file (gpuprobe is not imported).

    Example:
        >>> all(name and triggers for name, triggers in rows())
        True
    """
    # Why from its file, not `import gpuprobe.integrations.registry`: that imports gpuprobe (~45 ms); reading
    # the file costs ~0.15 ms from its .pyc (~1.3 ms compiling it where no .pyc is written), min of 30 runs.
    loader = importlib.machinery.SourceFileLoader("_gpuprobe_run_registry", REGISTRY)
    spec = importlib.machinery.ModuleSpec("_gpuprobe_run_registry", loader, origin=REGISTRY)
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    loader.exec_module(module)  # not put in sys.modules: a copy read for its rows, then dropped
    return [(row.name, tuple(row.triggers)) for row in module.INTEGRATIONS]


def hook(integrations: Iterable[tuple[str, Sequence[str]]]) -> None:
    """Switch each integration on when the program imports one of its triggers (now, if imported already)."""
    for name, triggers in integrations:
        for trigger in triggers:
            def after(name: str = name) -> None:
                _switch_on(name)

            if trigger in sys.modules:
                after()
            else:
                sys.meta_path.insert(0, _AfterImport(trigger, after))


def _chain() -> None:
    """Import the next ``sitecustomize`` on ``sys.path`` (the one this module shadows)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # imported by site, not as gpuprobe._sitecustomize.sitecustomize
    try:
        hook(rows())
    except Exception as exc:  # a broken install: the program runs without gpuprobe
        try:
            sys.stderr.write(f"gpuprobe run: the integrations cannot be read from {REGISTRY} ("
                             f"{type(exc).__name__}: {exc}); the program runs without gpuprobe\n")
        except Exception:
            pass
    _chain()
