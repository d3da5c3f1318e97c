"""Every reading of diffusers' own objects is in ``gpuprobe/integrations/_diffusers/compat.py``, checked on the
code with the scan of tests/test_promises.py (:mod:`ast`; nothing is imported).

A *diffusers object* is a name bound to a diffusers module, or one of the names under which the integration
holds what diffusers made (its registry row's ``objects``, and ``component`` and ``result``), or a name
assigned from one; a *reading* is an attribute of one of them, other than a dunder, torch's ``nn.Module``
API, or the method of a declared diffusers seam.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_promises import STABLE_API, _Scan

from gpuprobe import _seams
from gpuprobe.integrations import registry

PACKAGE = Path(__file__).resolve().parents[2] / "gpuprobe" / "integrations"
FILES = [PACKAGE / "diffusers.py", *sorted((PACKAGE / "_diffusers").glob("*.py"))]
COMPAT = PACKAGE / "_diffusers" / "compat.py"
OBJECTS = frozenset(registry.get("diffusers").objects) | {"component", "result"}


def diffusers_reads(source: str, allowed: frozenset[str] = STABLE_API) -> list[str]:
    scan = _Scan("diffusers", "<source>", OBJECTS, allowed)
    import ast

    scan.visit(ast.parse(source))
    return [str(h) for h in scan.hits]


def _seam_attributes() -> frozenset[str]:
    import gpuprobe.integrations.diffusers  # noqa: F401 (declares its seams)

    return frozenset(s.attribute for s in _seams.registry() if s.library == "diffusers" and s.attribute)


def test_every_reading_of_diffusers_objects_is_in_compat() -> None:
    allowed = STABLE_API | _seam_attributes()
    hits = [f"{path.name}: {hit}" for path in FILES if path != COMPAT
            for hit in diffusers_reads(path.read_text(encoding="utf-8"), allowed)]
    assert hits == [], "read diffusers' objects through gpuprobe/integrations/_diffusers/compat.py"


def test_compat_is_where_the_readings_are() -> None:
    assert diffusers_reads(COMPAT.read_text(encoding="utf-8"))


@pytest.mark.parametrize("source", [
    "def f(pipe):\n    return pipe.do_classifier_free_guidance\n",
    "def f(component):\n    return getattr(component, '_compiled_call_impl', None)\n",
    "import diffusers\nX = diffusers.DiffusionPipeline\n",
    "def f(pipe):\n    unet = pipe.unet\n    return unet.config\n",
])
def test_the_scan_finds_a_planted_reading(source: str) -> None:
    assert diffusers_reads(source), source
