"""The transformers and torch versions pyproject.toml declares, for scripts/test-floor and scripts/compat.

Usage:
    python scripts/versions.py spec transformers   # the declared range, e.g. ">=5.5,<6"
    python scripts/versions.py floor transformers  # its lower bound, e.g. "5.5"
    python scripts/versions.py floor torch
    python scripts/versions.py check               # every place that declares transformers' range agrees

The range is written once per extra in pyproject.toml (``transformers`` and ``instruments``) and once
in gpuprobe/integrations/_transformers/compat.py (``SUPPORTED_VERSIONS``, checked at run time); ``check``
fails, naming each place, when they differ. Only the standard library (and pip's own TOML reader on
Python 3.10) is used, so any interpreter of the project can run it before a virtual environment exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = ROOT / "gpuprobe" / "integrations" / "_transformers" / "compat.py"
# The extra whose requirement CI's floor run pins, per package; the others must agree with it.
EXTRAS = {"transformers": ("transformers", "instruments"), "torch": ("transformers",)}
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*([^;]*)")


def _spec(extra: str, package: str) -> str:
    """The version specifier of ``package`` in ``extra``, spaces removed (``">=5.5,<6"``)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = data["project"]["optional-dependencies"].get(extra)
    if reqs is None:
        raise SystemExit(f"pyproject.toml has no extra {extra!r}")
    for req in reqs:
        m = _REQ.match(req)
        if m and m.group(1).lower().replace("_", "-") == package:
            return m.group(3).replace(" ", "")
    raise SystemExit(f"pyproject.toml: the extra {extra!r} does not require {package}")


def spec(package: str) -> str:
    if package not in EXTRAS:
        raise SystemExit(f"unknown package {package!r}: one of {', '.join(EXTRAS)}")
    return _spec(EXTRAS[package][0], package)


def floor(package: str) -> str:
    """The ``>=`` bound of the declared range: the lowest version CI tests."""
    bounds = [part[2:] for part in spec(package).split(",") if part.startswith(">=")]
    if len(bounds) != 1:
        raise SystemExit(f"pyproject.toml: {package}{spec(package)} needs exactly one '>=' lower bound")
    return bounds[0]


def problems() -> list[str]:
    """Each place whose transformers range differs from the transformers extra's."""
    want = spec("transformers")
    out = []
    for extra in EXTRAS["transformers"][1:]:
        got = _spec(extra, "transformers")
        if got != want:
            out.append(f"pyproject.toml: extra {extra!r} declares transformers{got}, "
                       f"extra 'transformers' declares transformers{want}")
    m = re.search(r'^SUPPORTED_VERSIONS\s*=\s*"([^"]*)"', INTEGRATION.read_text(encoding="utf-8"), re.M)
    got = m.group(1).replace(" ", "") if m else None
    # "5.5" and "5.5.0" bound the same versions; compare release numbers without trailing zeros.
    if got is None or _norm(got) != _norm(want):
        out.append(f"{INTEGRATION.relative_to(ROOT)}: SUPPORTED_VERSIONS = {got!r}, "
                   f"pyproject.toml declares transformers{want}")
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
