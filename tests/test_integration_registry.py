"""The integrations are rows of ``gpuprobe.integrations.registry``, and everything else loops over them.

Checked here: the rows agree with what pyproject.toml and the compat modules declare; the start-up hook of
``gpuprobe run`` reads the same rows from the registry's file and hooks every trigger; no module outside an
integration's package names a library an integration serves (an AST scan, with the few exceptions listed
and why); and a toy integration added as one row, with a library module made by the test, is hooked by the
start-up hook, switched on by the bootstrap, described by doctor and listed and instrumented by the
OpenTelemetry instrumentor.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import doctor
from gpuprobe._sitecustomize import sitecustomize
from gpuprobe.integrations import registry
from gpuprobe.integrations.registry import INTEGRATIONS, Integration
from gpuprobe.testing import reset

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuprobe"
sys.path.insert(0, str(ROOT / "scripts"))
import versions  # noqa: E402 - scripts/versions.py

from helpers import run_python  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset()
    yield
    reset()


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def _spaceless(requirement: str) -> str:
    return requirement.replace(" ", "")


# -- the rows and what else declares them -------------------------------------------------------------------

def test_the_instruments_any_extra_is_one_requirement_per_row() -> None:
    assert [_spaceless(r) for r in _extras()["instruments-any"]] == [row.requirement for row in INTEGRATIONS]
    # OpenTelemetry reads `instruments` as requirements that must all be installed: not one per integration.
    assert "instruments" not in _extras()


@pytest.mark.parametrize("row", INTEGRATIONS, ids=lambda row: row.name)
def test_each_integrations_extra_installs_its_library_in_its_versions(row: Integration) -> None:
    assert row.requirement in [_spaceless(r) for r in _extras()[row.name]]


@pytest.mark.parametrize("row", INTEGRATIONS, ids=lambda row: row.name)
def test_each_rows_versions_are_its_compat_modules_supported_versions(row: Integration) -> None:
    compat = importlib.import_module(row.compat)  # a compat module imports nothing of its library at import
    assert _spaceless(compat.SUPPORTED_VERSIONS) == _spaceless(row.versions)


def test_scripts_versions_checks_every_row_and_finds_them_agreeing() -> None:
    assert versions.problems() == []
    assert [row.name for row in versions.rows()] == list(registry.names())
    for row in INTEGRATIONS:
        assert versions.spec(row.distribution) == _spaceless(row.versions)


def test_scripts_versions_names_each_place_that_disagrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = INTEGRATIONS[0]
    compats = [Path(*r.compat.split(".")).with_suffix(".py") for r in INTEGRATIONS]
    for rel in (Path("pyproject.toml"), Path("gpuprobe/integrations/registry.py"), *compats):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text(encoding="utf-8"), encoding="utf-8")
    text = (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
    planted = text.replace(f'instruments-any = ["{row.requirement}"', f'instruments-any = ["{row.distribution}>=0.1"')
    assert planted != text
    (tmp_path / "pyproject.toml").write_text(planted, encoding="utf-8")
    monkeypatch.setattr(versions, "ROOT", tmp_path)
    monkeypatch.setattr(versions, "REGISTRY", tmp_path / "gpuprobe/integrations/registry.py")
    found = versions.problems()
    assert len(found) == 1 and "'instruments-any'" in found[0] and f"{row.distribution}>=0.1" in found[0], found


def test_a_row_is_frozen_and_a_bad_one_is_refused_naming_the_field() -> None:
    row = INTEGRATIONS[0]
    with pytest.raises(AttributeError, match="frozen"):
        row.versions = ">=0"  # type: ignore[misc]
    fields = {f: getattr(row, f) for f in ("name", "library", "distribution", "versions", "triggers", "module",
                                           "package", "compat", "doctor", "scenarios", "objects")}
    assert Integration(**fields) == row and hash(Integration(**fields)) == hash(row)
    assert copy.deepcopy(row) == row and pickle.loads(pickle.dumps(row)) == row
    with pytest.raises(ValueError, match="triggers must name at least one module"):
        Integration(**{**fields, "triggers": ()})
    with pytest.raises(ValueError, match="doctor must be 'module:function'"):
        Integration(**{**fields, "doctor": "gpuprobe.doctor"})
    with pytest.raises(ValueError, match="versions must be non-empty text"):
        Integration(**{**fields, "versions": ""})


def test_a_folder_of_a_librarys_name_on_the_path_is_not_the_library_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/<name>/ is such a folder: on the path while pytest runs, a namespace package of the library's name.
    row = INTEGRATIONS[0]
    fields = {f: getattr(row, f) for f in ("name", "library", "distribution", "versions", "triggers", "module",
                                           "package", "compat", "doctor", "scenarios", "objects")}
    toy = Integration(**{**fields, "library": "gp_toy_absent_library"})
    (tmp_path / "gp_toy_absent_library").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.installed(toy) is False
    (tmp_path / "gp_toy_absent_library" / "__init__.py").write_text("", encoding="utf-8")
    assert registry.installed(toy) is True


def test_an_unknown_integration_is_a_key_error_naming_those_there_are() -> None:
    with pytest.raises(KeyError, match="no integration named 'nope'; there are: " + ", ".join(registry.names())):
        registry.get("nope")


# -- everything else loops over the rows ---------------------------------------------------------------------

def test_the_start_up_hook_reads_the_rows_from_the_registrys_file() -> None:
    assert sitecustomize.rows() == [(row.name, row.triggers) for row in INTEGRATIONS]


@pytest.mark.subprocess_only  # what it checks is the start-up of a process of its own
def test_under_gpuprobe_run_every_trigger_of_every_integration_is_hooked(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("import json, sys\n"
                   "print(json.dumps([f.name for f in sys.meta_path if type(f).__name__ == '_AfterImport']))\n"
                   "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'gpuprobe')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "run", "--port", "0", "--", sys.executable, str(app)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    hooked, imported = (json.loads(line) for line in done.stdout.splitlines())
    assert sorted(hooked) == sorted(t for row in INTEGRATIONS for t in row.triggers)
    assert imported == []  # the rows were read from the registry's file: nothing of gpuprobe is imported


def test_doctor_shows_a_line_per_integration_after_the_threads_line() -> None:
    checks = [line.check for line in doctor.diagnose()]
    at = checks.index("threads") + 1
    assert checks[at:at + len(INTEGRATIONS)] == list(registry.names())


def test_the_opentelemetry_instrumentor_depends_on_any_one_row() -> None:
    pytest.importorskip("opentelemetry.instrumentation")
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

    from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor

    instrumentor = GpuprobeInstrumentor()
    assert list(instrumentor.instrumentation_dependencies()) == [f"{r.distribution} {r.versions}" for r in INTEGRATIONS]
    # OpenTelemetry's own check of one requirement at a time: gpuprobe goes on when any one is met.
    any_met = any(get_dependency_conflicts([row.requirement]) is None for row in INTEGRATIONS)
    assert (instrumentor._check_dependency_conflicts() is None) == any_met


# -- a toy integration: one row -------------------------------------------------------------------------------

TOY_LIBRARY = '''
"""A library of the test's own: a function a program calls."""

def work(n):
    return sum(range(n))
'''

TOY_INTEGRATION = '''
"""The toy library's integration: instrument_all() puts a probe around gp_toylib.work."""

import gpuprobe
import gp_toylib

CALLS = []
_original = []


def instrument_all(**options):
    CALLS.append(("instrument_all", options))
    if not _original:
        _original.append(gp_toylib.work)
        gp_toylib.work = gpuprobe.probe("toylib.work")(gp_toylib.work)


def uninstrument_all():
    CALLS.append(("uninstrument_all", {}))
    if _original:
        gp_toylib.work = _original.pop()


def describe():
    return {"state": "ok", "reason": "gp_toylib, made by the test", "details": {"version": "1.0"},
            "seams": {}, "checked_against": "gp_toylib 1.0"}
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Integration]:
    """A toy integration's row, added to the registry; its library and integration modules live in ``tmp_path``."""
    (tmp_path / "gp_toylib.py").write_text(textwrap.dedent(TOY_LIBRARY), encoding="utf-8")
    (tmp_path / "gp_toylib_integration.py").write_text(textwrap.dedent(TOY_INTEGRATION), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    row = Integration(name="toylib", library="gp_toylib", distribution="gp-toylib", versions=">=1.0",
                      triggers=("gp_toylib",), module="gp_toylib_integration", package="gp_toylib_integration",
                      compat="gp_toylib_integration", doctor="gp_toylib_integration:describe")
    monkeypatch.setattr(registry, "INTEGRATIONS", (*INTEGRATIONS, row))
    monkeypatch.setattr(sitecustomize, "_started", set())
    hooks_before = list(sys.meta_path)
    try:
        yield row
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if f in hooks_before or type(f).__name__ != "_AfterImport"]
        for name in ("gp_toylib", "gp_toylib_integration"):
            sys.modules.pop(name, None)


def test_a_toy_row_is_hooked_by_the_start_up_hook_and_switched_on_when_its_library_is_imported(
        toy: Integration) -> None:
    sitecustomize.hook([(toy.name, toy.triggers)])
    assert [f.name for f in sys.meta_path if type(f).__name__ == "_AfterImport"][:1] == ["gp_toylib"]
    assert "gp_toylib_integration" not in sys.modules  # nothing of it before its library is imported

    import gp_toylib  # the program imports the library: the hook switches the integration on

    integration = sys.modules["gp_toylib_integration"]
    try:
        assert integration.CALLS == [("instrument_all", {})]
        assert not any(getattr(f, "name", None) == "gp_toylib" for f in sys.meta_path)  # the hook left
        assert gp_toylib.work(10) == 45  # the library's own result, through gpuprobe's probe
        points = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.probe.duration" for p in d.points
                  if p.labels.get("probe") == "toylib.work" and p.labels.get("clock", "host") == "host"]
        assert sum(p.count for p in points) == 1  # one call (a CUDA device adds a device-clock point of its own)
    finally:
        integration.uninstrument_all()


def test_a_toy_row_is_described_by_doctor_with_its_seams_checked_against_it(toy: Integration) -> None:
    lines = {line.check: line for line in doctor.diagnose()}
    assert (lines["toylib"].state, lines["toylib"].reason) == ("ok", "gp_toylib, made by the test")
    assert lines["toylib"].details == {"version": "1.0"}
    assert "gp_toylib 1.0" in lines["seams"].reason
    checks = list(lines)
    assert checks.index("toylib") == checks.index(INTEGRATIONS[-1].name) + 1


def test_a_toy_row_is_listed_and_instrumented_by_the_opentelemetry_instrumentor(toy: Integration) -> None:
    pytest.importorskip("opentelemetry.instrumentation")
    from opentelemetry.sdk.metrics import MeterProvider

    from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor

    instrumentor = GpuprobeInstrumentor()
    assert "gp-toylib >=1.0" in instrumentor.instrumentation_dependencies()
    instrumentor.instrument(meter_provider=MeterProvider(), layers=True)
    try:
        integration = sys.modules["gp_toylib_integration"]
        assert integration.CALLS == [("instrument_all", {"layers": True})]
    finally:
        instrumentor.uninstrument()
    assert integration.CALLS[-1] == ("uninstrument_all", {})


def test_a_toy_row_whose_description_raises_fails_its_own_line_only(toy: Integration,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    integration = importlib.import_module("gp_toylib_integration")
    monkeypatch.setattr(integration, "describe", lambda: {}["state"])
    lines = {line.check: line for line in doctor.diagnose()}
    assert lines["toylib"].state == "fail"
    assert lines["toylib"].reason == "its description (gp_toylib_integration:describe) raised KeyError: 'state'"
    assert all("raised" not in lines[row.name].reason for row in INTEGRATIONS)  # the other lines as they are


# -- no module outside an integration's package names a library it serves ------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(row: Integration, module: str) -> bool:
    """Whether the dotted ``module`` is the library's, or a module of the integration's package."""
    return any(module == root or module.startswith(root + ".") for root in (row.library, row.module, row.package))


def library_names(source: str, module: str, rows: tuple[Integration, ...] = INTEGRATIONS,
                  is_package: bool = False) -> list[tuple[str, str]]:
    """``(row name, what)`` for each import of, and each string naming, a served library or an integration's
    module in ``source`` (the module ``module``): ``import transformers``, ``from .integrations import
    transformers``, ``sys.modules.get("transformers.cli")``. Prose is not a name: only a string that is a
    dotted module name counts."""
    found = []
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        targets: list[tuple[str, str]] = []  # (dotted module, how it is written)
        if isinstance(node, ast.Import):
            targets = [(alias.name, f"import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source_module = node.module or ""
            if node.level:
                source_module = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            written = f"from {'.' * node.level}{node.module or ''} import"
            if any(_names(row, source_module) for row in rows):
                targets = [(source_module, written)]
            else:
                targets = [(f"{source_module}.{a.name}", f"{written} {a.name}") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.replace(".", "").replace(
                "_", "").isalnum() and not node.value[:1].isdigit():
            targets = [(node.value, repr(node.value))]
        for dotted, written in targets:
            for row in rows:
                if _names(row, dotted) and (row.name, written) not in found:
                    found.append((row.name, written))
    return found


EXCEPTIONS: dict[str, frozenset[str]] = {
    # The rows themselves.
    "gpuprobe/integrations/registry.py": frozenset({"*"}),
    # Programs built on the transformers integration, as a user's program is: `gpuprobe demo` generates with a
    # tiny transformers model, `gpuprobe try` loads transformers models as its workloads and applies remedies
    # to them, and the pytest plugin's budgets count generation blocks of transformers models.
    "gpuprobe/demo.py": frozenset({"*"}),
    "gpuprobe/experiment/": frozenset({"*"}),
    "gpuprobe/testing/budget.py": frozenset({"*"}),
    # A published series: gpuprobe.build_info's `transformers.version` label (the dashboards read it).
    "gpuprobe/_metrics.py": frozenset({"'transformers.version'", "'transformers'"}),
    # A seam's failure warning names the versions to report with it.
    "gpuprobe/_seams.py": frozenset({"'transformers'"}),
    # The sync audit tells a sync transformers' own code makes (expected, by the stop check) from the program's
    # by the file it comes from.
    "gpuprobe/_sync_audit.py": frozenset({"'transformers'"}),
    # A request's span names its provider (gen_ai.provider.name) when the record does not.
    "gpuprobe/exporters/traces.py": frozenset({"'transformers'"}),
}
"""Modules outside an integration's package that name its library, and exactly what they name (``*``: all)."""


def _excepted(rel: str, what: str) -> bool:
    for where, allowed in EXCEPTIONS.items():
        if (rel == where or (where.endswith("/") and rel.startswith(where))) and ("*" in allowed or what in allowed):
            return True
    return False


def _own(row: Integration, path: Path) -> bool:
    module = _module_name(path)
    return _names(row, module)


def test_no_module_outside_an_integrations_package_names_a_library_an_integration_serves() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        for name, what in library_names(source, _module_name(path), is_package=path.name == "__init__.py"):
            if _own(registry.get(name), path) or _excepted(rel, what):
                continue
            hits.append(f"{rel}: {what} ({name})")
    assert hits == [], ("name an integration's library only inside its package (loop over "
                        "gpuprobe.integrations.registry elsewhere):\n" + "\n".join(hits))


def test_every_exception_names_a_file_that_still_names_the_library() -> None:
    for where, allowed in EXCEPTIONS.items():
        paths = sorted((ROOT / where).rglob("*.py")) if where.endswith("/") else [ROOT / where]
        assert paths and all(p.is_file() for p in paths), where
        seen = {what for p in paths for _, what in library_names(p.read_text(encoding="utf-8"), _module_name(p),
                                                                 is_package=p.name == "__init__.py")}
        assert seen, f"{where} names no integrated library any more: take it off the exceptions"
        if "*" not in allowed:
            assert allowed <= seen, f"{where}: {sorted(allowed - seen)} no longer there"


TOYS = (Integration(name="toylib", library="toylib", distribution="toylib", versions=">=1", triggers=("toylib.core",),
                    module="gpuprobe.integrations.toylib", package="gpuprobe.integrations._toylib",
                    compat="gpuprobe.integrations._toylib.compat", doctor="gpuprobe.integrations.toylib:describe"),)


@pytest.mark.parametrize(("source", "what"), [
    ("import toylib\n", "import toylib"),
    ("import toylib.core as c\n", "import toylib.core"),
    ("from toylib.core import Thing\n", "from toylib.core import"),
    ("from .integrations import toylib\n", "from .integrations import toylib"),
    ("from .integrations._toylib.compat import x\n", "from .integrations._toylib.compat import"),
    ("import sys\nm = sys.modules.get('toylib.core')\n", "'toylib.core'"),
    ("import importlib\nm = importlib.import_module('gpuprobe.integrations.toylib')\n",
     "'gpuprobe.integrations.toylib'"),
])
def test_the_scan_finds_a_planted_name(source: str, what: str) -> None:
    assert ("toylib", what) in library_names(source, "gpuprobe.doctor", TOYS)


@pytest.mark.parametrize("source", [
    '"""Describes what toylib does, in prose."""\n',
    "x = 'install toylib first'\n",
    "import toylibrary\n",
    "x = 'toylibs'\n",
])
def test_the_scan_passes_prose_and_other_names(source: str) -> None:
    assert library_names(source, "gpuprobe.doctor", TOYS) == []


def test_the_registry_module_imports_nothing() -> None:
    # It is read from its file at every start-up under gpuprobe run: the standard library only inside functions.
    tree = ast.parse((PACKAGE / "integrations" / "registry.py").read_text(encoding="utf-8"))
    top = [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert top == ["from __future__ import annotations"]
    done = run_python("""
        import sys
        from gpuprobe._sitecustomize import sitecustomize
        before = set(sys.modules)
        rows = sitecustomize.rows()
        print(sorted(set(sys.modules) - before), len(rows))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[] {len(INTEGRATIONS)}"
