"""The versions pyproject.toml declares for each integration's library and for torch, for scripts/test-floor,
scripts/compat and CI.

Usage:
    python scripts/versions.py spec transformers   # the declared range of a library, e.g. ">=5.5,<6"
    python scripts/versions.py floor transformers  # its lower bound, e.g. "5.5"
    python scripts/versions.py floor torch
    python scripts/versions.py libraries           # the integrations' libraries (distributions), one a line
    python scripts/versions.py check               # every place that declares a range agrees

An integration's range (a row of gpuprobe/integrations/registry.py: its ``distribution`` and ``versions``)
is written four times: in the row, in pyproject.toml's extra named after the integration and in its
``instruments-any`` extra, and in the integration's compat module (``SUPPORTED_VERSIONS``, checked at
run time). torch's range is written in every integration's extra that needs it. ``check`` fails, naming
each place, when they differ. Only the standard library (and pip's own TOML reader on Python 3.10) is
used, and the registry is read from its file (it imports nothing), so any interpreter of the project can
run it before a virtual environment exists.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "gpuprobe" / "integrations" / "registry.py"
ANY_EXTRA = "instruments-any"
"""The extra OpenTelemetry's auto-instrumentation reads: any one of its requirements installed is enough."""
TORCH = "torch"
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*([^;]*)")


def registry() -> ModuleType:
    """gpuprobe/integrations/registry.py, read from its file (gpuprobe is not imported)."""
    spec = importlib.util.spec_from_file_location("_gpuprobe_registry", REGISTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows() -> tuple[Any, ...]:
    """The integrations' rows."""
    return tuple(registry().INTEGRATIONS)


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _spec(extra: str, package: str) -> str | None:
    """The version specifier of ``package`` in ``extra``, spaces removed (``">=5.5,<6"``); None when the
    extra does not require it."""
    reqs = _pyproject()["project"]["optional-dependencies"].get(extra)
    if reqs is None:
        raise SystemExit(f"pyproject.toml has no extra {extra!r}")
    for req in reqs:
        m = _REQ.match(req)
        if m and _name(m.group(1)) == _name(package):
            return m.group(3).replace(" ", "")
    return None


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _row(package: str) -> Any:
    for row in rows():
        if _name(row.distribution) == _name(package):
            return row
    return None


def spec(package: str) -> str:
    """The declared range of ``package``: an integration's library (its extra's) or torch (the first
    integration extra that requires it)."""
    row = _row(package)
    if row is not None:
        found = _spec(row.name, row.distribution)
        if found is None:
            raise SystemExit(f"pyproject.toml: the extra {row.name!r} does not require {row.distribution}")
        return found
    if _name(package) == TORCH:
        for row in rows():
            found = _spec(row.name, TORCH)
            if found is not None:
                return found
        raise SystemExit("pyproject.toml: no integration's extra requires torch")
    known = [row.distribution for row in rows()] + [TORCH]
    raise SystemExit(f"unknown package {package!r}: one of {', '.join(known)}")


def floor(package: str) -> str:
    """The ``>=`` bound of the declared range: the lowest version CI tests."""
    bounds = [part[2:] for part in spec(package).split(",") if part.startswith(">=")]
    if len(bounds) != 1:
        raise SystemExit(f"pyproject.toml: {package}{spec(package)} needs exactly one '>=' lower bound")
    return bounds[0]


def _compat_file(row: Any) -> Path:
    return ROOT.joinpath(*row.compat.split(".")).with_suffix(".py")


def problems() -> list[str]:
    """Each place whose range differs from the one the integration's extra declares."""
    out = []
    torches: dict[str, str] = {}
    for row in rows():
        want = _spec(row.name, row.distribution)
        if want is None:
            out.append(f"pyproject.toml: the extra {row.name!r} does not require {row.distribution}")
            continue
        where = f"extra {row.name!r} declares {row.distribution}{want}"
        got = _spec(ANY_EXTRA, row.distribution)
        if got is None or _norm(got) != _norm(want):
            out.append(f"pyproject.toml: extra {ANY_EXTRA!r} declares {row.distribution}{got or ' nothing'}, {where}")
        if _norm(row.versions.replace(" ", "")) != _norm(want):
            out.append(f"{REGISTRY.relative_to(ROOT)}: the row {row.name!r} has versions {row.versions!r}, "
                       f"pyproject.toml's {where}")
        compat = _compat_file(row)
        text = compat.read_text(encoding="utf-8") if compat.is_file() else ""
        m = re.search(r'^SUPPORTED_VERSIONS\s*=\s*"([^"]*)"', text, re.M)
        supported = m.group(1).replace(" ", "") if m else None
        # "5.5" and "5.5.0" bound the same versions; compare release numbers without trailing zeros.
        if supported is None or _norm(supported) != _norm(want):
            out.append(f"{compat.relative_to(ROOT)}: SUPPORTED_VERSIONS = {supported!r}, pyproject.toml's {where}")
        torch = _spec(row.name, TORCH)
        if torch is not None:
            torches[row.name] = torch
    if len({tuple(_norm(t)) for t in torches.values()}) > 1:
        out.append("pyproject.toml: the integrations' extras declare different torch ranges: "
                   + ", ".join(f"{extra!r} torch{t}" for extra, t in torches.items()))
    listed = {_name(_REQ.match(r).group(1)) for r in _pyproject()["project"]["optional-dependencies"].get(ANY_EXTRA, [])
              if _REQ.match(r)}
    extra = sorted(listed - {_name(row.distribution) for row in rows()})
    if extra:
        out.append(f"pyproject.toml: extra {ANY_EXTRA!r} requires {', '.join(extra)}, which no integration serves")
    return out


def _norm(spec_text: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for part in spec_text.split(","):
        m = re.fullmatch(r"(>=|<=|==|!=|<|>|~=)([0-9.]+)", part)
        if not m:
            return [(spec_text, ())]
        nums = [int(x) for x in m.group(2).split(".")]
        while len(nums) > 1 and nums[-1] == 0:
            nums.pop()
        out.append((m.group(1), tuple(nums)))
    return sorted(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["spec"] and len(argv) == 2:
        print(spec(argv[1]))
    elif argv[:1] == ["floor"] and len(argv) == 2:
        print(floor(argv[1]))
    elif argv == ["libraries"]:
        for row in rows():
            print(row.distribution)
    elif argv == ["check"]:
        found = problems()
        for line in found:
            print(f"version ranges disagree: {line}", file=sys.stderr)
        return 1 if found else 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
