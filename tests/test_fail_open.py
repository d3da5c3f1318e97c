"""gpuprobe never changes what the program does: every seam into another library fails open.

One table over the registry of seams (``gpuprobe._seams``), derived from the code: every module of the
package is imported, so a seam declared anywhere is a row here, and a seam without a scenario fails
the table. For each seam, gpuprobe's own work inside it is made to raise while a real workload runs
through it; the workload's results must equal those of the same workload without gpuprobe, the seam
must switch itself off (with the others of its group), say so in ``info()``, count
``gpuprobe.seam.disabled`` once and warn once.

The scenarios of the core's seams are here: a CUDA graph capture and a sync audit on the simulated
CUDA, ``gpuprobe run``'s start-up hook and the OpenTelemetry instrumentor, both over every integration.
Each integration's own come from its kit, ``tests/<name>/_fail_open.py``, for the rows of
``gpuprobe.integrations.registry`` whose library is installed; its row names them
(``Integration.scenarios``), and the kit gives ``SCENARIOS``, ``KEYWORDS`` (seams whose scenario runs
with keywords, such as class-wide instrumentation) and ``BREAKERS``.

The faults are injected with :func:`gpuprobe.testing.seam_fault` for seams built from the seam
template; the few seams whose guard is written out (for speed, or to hand on an argument wrapped) get a
fault in the function their guard calls (``BREAKERS``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gpuprobe
from gpuprobe import _seams
from gpuprobe.integrations import registry
from gpuprobe.testing import reset, seam_fault

torch = pytest.importorskip("torch")

PACKAGE = Path(gpuprobe.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
ROWS = [row for row in registry.INTEGRATIONS if registry.installed(row)]
"""The integrations whose library is installed here: their seams are declared, their kits run."""
_ABSENT = tuple(part for row in registry.INTEGRATIONS if row not in ROWS for part in (row.module, row.package))


def _import_everything() -> None:
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="gpuprobe."):
        if info.name.startswith(("gpuprobe.report", "gpuprobe.dashboards")) or info.name.endswith(
                ("__main__", "sitecustomize")):
            continue  # offline tools and entry points: they declare no seam
        if any(info.name == part or info.name.startswith(part + ".") for part in _ABSENT):
            continue  # an integration whose library is not installed
        importlib.import_module(info.name)


def _kit(row: registry.Integration) -> ModuleType | None:
    """The integration's fail-open kit, ``tests/<name>/_fail_open.py`` (None when it has none)."""
    path = TESTS / row.name / "_fail_open.py"
    if not path.is_file():
        return None
    name = f"_fail_open_{row.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_import_everything()
SEAMS = sorted(_seams.registry(), key=lambda s: s.name)
KITS = {row.name: _kit(row) for row in ROWS}


# -- the core's workloads ---------------------------------------------------------------------------------

def _run_cuda_graph(instrumented: bool) -> list[Any]:
    from gpuprobe.testing.simcuda import simulated_cuda

    with simulated_cuda(devices=1) as sim:
        reset()  # the device clock (and its capture guard) is picked with the simulation in place
        try:
            torch.cuda.current_device()
            if not instrumented:
                gpuprobe.disable()
            x = torch.arange(6.0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                sim.launch(1_000_000, "captured")
                y = x * 2
            graph.replay()
            sim.finish()
            return [y.tolist(), sim.stats.invalidated_captures]
        finally:
            gpuprobe.enable()


def _run_sync_audit(instrumented: bool) -> list[Any]:
    t = torch.arange(10.0)
    if not instrumented:
        return [t.sum().item(), t[t > 4].tolist()]
    with gpuprobe.probe("audited", sync_audit=True):
        return [t.sum().item(), t[t > 4].tolist()]


def _uninstrument_all() -> None:
    for row in ROWS:
        registry.load(row).uninstrument_all()


def _run_bootstrap(instrumented: bool) -> list[Any]:
    from gpuprobe import _bootstrap

    if not instrumented:
        return [False for _ in ROWS]
    try:
        return [_bootstrap.switch_on({}, integration=row.name) for row in ROWS]
    finally:
        _uninstrument_all()


def _run_otel(instrumented: bool) -> list[Any]:
    from opentelemetry.sdk.metrics import MeterProvider

    from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor

    if not instrumented:
        return [None]
    instrumentor = GpuprobeInstrumentor()
    try:
        instrumentor.instrument(meter_provider=MeterProvider())
        return [None]
    finally:
        instrumentor.uninstrument()


CORE_SCENARIOS: dict[str, Callable[..., list[Any]]] = {
    "cuda_graph": _run_cuda_graph,
    "sync_audit": _run_sync_audit,
    "run": _run_bootstrap,
    "otel": _run_otel,
}


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a fault injected into gpuprobe")


def _break_audit(mp: pytest.MonkeyPatch) -> None:
    from gpuprobe import _sync_audit

    mp.setattr(_sync_audit.SyncAudit, "hit", _boom)


def _break_instrument_all(mp: pytest.MonkeyPatch) -> None:
    """Every integration's instrument_all() raises (the start-up hook and the instrumentor call them)."""
    for row in ROWS:
        mp.setattr(registry.load(row), "instrument_all", _boom)


SCENARIOS: dict[str, Callable[..., list[Any]]] = dict(CORE_SCENARIOS)
KEYWORDS: dict[str, dict[str, Any]] = {}
# Seams whose guard is written out (not built from the seam template): the fault goes where their guard calls.
BREAKERS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "torch.sync_audit.kernels": _break_audit,
    "python.run_import_hook": _break_instrument_all,
    "opentelemetry.instrumentor": _break_instrument_all,
}
for _name, _found in KITS.items():
    if _found is not None:
        SCENARIOS.update(_found.SCENARIOS)
        KEYWORDS.update(getattr(_found, "KEYWORDS", {}))
        BREAKERS.update(getattr(_found, "BREAKERS", {}))


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    reset()
    yield
    reset()


_baselines: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Any]] = {}


def _baseline(scenario: str, keywords: dict[str, Any]) -> list[Any]:
    key = (scenario, tuple(sorted(keywords.items())))
    if key not in _baselines:
        _baselines[key] = SCENARIOS[scenario](False, **keywords)
    return _baselines[key]


def test_the_registry_lists_every_seam_with_a_scenario() -> None:
    names = {s.name for s in SEAMS}
    assert {"torch.cuda_graph.capture_begin", "torch.sync_audit.kernels", "python.run_import_hook",
            "opentelemetry.instrumentor"} <= names
    assert [row.name for row in ROWS if not any(s.library == row.library for s in SEAMS)] == []
    assert [s.name for s in SEAMS if s.scenario not in SCENARIOS] == []


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_integrations_kit_runs_the_scenarios_its_row_names(row: registry.Integration) -> None:
    found = KITS[row.name]
    assert found is not None, f"tests/{row.name}/_fail_open.py (the scenarios of {row.name}'s seams) is missing"
    assert sorted(found.SCENARIOS) == sorted(row.scenarios)
    assert not set(found.SCENARIOS) & set(CORE_SCENARIOS)
    others = {name for other in ROWS if other != row for name in other.scenarios}
    assert not set(row.scenarios) & others, "two integrations name the same scenario"
    assert [s.name for s in SEAMS if s.library == row.library and s.scenario not in row.scenarios] == []


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.name)
def test_a_failure_of_gpuprobe_inside_a_seam_leaves_the_results_and_switches_it_off(
        seam: _seams.Seam, monkeypatch: pytest.MonkeyPatch) -> None:
    keywords = KEYWORDS.get(seam.name, {})
    expected = _baseline(seam.scenario, keywords)
    run = SCENARIOS[seam.scenario]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if seam.name in BREAKERS:
            BREAKERS[seam.name](monkeypatch)
            got = run(True, **keywords)
        else:
            with seam_fault(seam.name):
                got = run(True, **keywords)
    assert got == expected  # the program's results, as without gpuprobe
    assert not seam.on, f"{seam.name} was not reached by its scenario, or did not switch itself off"
    group = {s["seam"]: s["state"] for s in gpuprobe.info()["seams"] if _seams.seam(s["seam"]).group == seam.group}
    assert set(group.values()) == {"off"}
    mine = [w for w in caught if f"seam {seam.name} " in str(w.message) or "gpuprobe run:" in str(w.message)]
    if seam.name == "python.run_import_hook":  # said on stderr by the hook itself, not as a warning
        assert mine == []
    else:
        assert len(mine) == 1, [str(w.message) for w in caught]
        disabled = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.seam.disabled" for p in d.points]
        assert [(p.labels["seam"], p.value) for p in disabled] == [(seam.name, 1)]


# -- nothing is patched outside the registry ------------------------------------------------------------

# Where gpuprobe sets attributes of objects it does not own: only through the seam mechanism.
_PATCHING_CALLS = {"setattr", "delattr", "__setattr__", "__delattr__", "impl", "py_impl"}
_ALLOWED = {
    "gpuprobe/_seams.py",  # the mechanism itself
    "gpuprobe/testing/simcuda/install.py",  # the simulated CUDA (its install), a test double installed on purpose
    "gpuprobe/testing/simnvml.py",  # the simulated NVML: it fills a module of its own making
}


def _patching_sites(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _PATCHING_CALLS:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
        elif isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
            for target in targets:
                # obj.__dict__[name] = ... / del obj.__dict__[name]
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                        and target.value.attr == "__dict__"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    return found


# Known sites that set gpuprobe's own attributes, or the user's objects' attributes on their behalf.
_OWN = (
    "object.__setattr__(self",  # the stand-ins' own slots
    "setattr(self._gp_inner",  # a stand-in forwards an attribute set to the element it holds
    "setattr(self.__wrapped__",  # a probed callable object forwards an attribute set to the object it wraps
    # The sync audit's dispatcher kernels: the seam torch.sync_audit.kernels, whose guard is written out
    # (registering a kernel is torch's own API for it, not an attribute set).
    "gpuprobe/_sync_audit.py:",
)


def test_nothing_is_patched_outside_the_seam_mechanism() -> None:
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        if rel in _ALLOWED or rel.startswith(("gpuprobe/report/", "gpuprobe/dashboards/")):
            continue
        sites += [s for s in _patching_sites(path) if not any(own in s for own in _OWN)]
    assert sites == [], "patch other libraries only through gpuprobe._seams (declare a Seam):\n" + "\n".join(sites)
