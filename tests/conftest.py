"""Shared fixtures: every test starts from zeroed metrics and default settings.

``pytest --simulate-gpu`` (or ``GPUPROBE_TEST_SIMULATE_GPU=1``) runs the suite as a GPU machine sees
it: a simulated CUDA (gpuprobe.testing.simcuda) stands in for the process's CUDA from before
collection to the end of the run, so ``torch.cuda.is_available()`` is True, gpuprobe picks its CUDA
backends, and a test's own simulation installs over it as over a real one (docs/gpu.md).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import gpuprobe
from gpuprobe.testing import InMemoryExporter, reset

_SIMULATE_ENV = "GPUPROBE_TEST_SIMULATE_GPU"
_machine_sim: Any = None  # the SimulatedCuda installed for the whole run, if any
_real_cuda_key = pytest.StashKey[int]()  # CUDA devices torch really has, counted before any simulation
_rng_key = pytest.StashKey[list]()  # (module, name, original) of the RNG state stand-ins


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprobe")
    group.addoption("--simulate-gpu", action="store_true", default=False,
                    help="run the suite as a GPU machine sees it: a simulated CUDA stands in for the process's "
                         f"CUDA for the whole run (also {_SIMULATE_ENV}=1, or =N for N devices)")
    group.addoption("--simulate-gpu-devices", type=int, default=None, metavar="N",
                    help="number of simulated devices with --simulate-gpu (default 1, as on a one-GPU machine)")


def _simulated_devices(config: pytest.Config) -> int:
    """How many devices the run simulates: 0 for a plain run."""
    # Read once and taken out: no test, gpuprobe setting or child process sees a GPUPROBE_ variable.
    env = os.environ.pop(_SIMULATE_ENV, "").strip()
    if env not in ("", "0") and not env.isdigit():
        raise pytest.UsageError(f"{_SIMULATE_ENV} must be a number of devices (0 = off), got {env!r}")
    devices = config.getoption("--simulate-gpu-devices")
    if not config.getoption("--simulate-gpu") and env in ("", "0"):
        if devices is not None:
            raise pytest.UsageError("--simulate-gpu-devices needs --simulate-gpu")
        return 0
    if devices is None:
        devices = int(env) if env not in ("", "0") else 1
    if devices < 1:
        raise pytest.UsageError(f"--simulate-gpu-devices must be at least 1, got {devices}")
    return devices


def _real_cuda_devices() -> int:
    """CUDA devices torch really has (NVML first: unlike is_available(), this leaves fork usable)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def pytest_configure(config: pytest.Config) -> None:
    global _machine_sim
    config.addinivalue_line("markers", "no_cuda: about a process without a CUDA device (skipped where torch sees one, "
                                       "--simulate-gpu included)")
    config.stash[_real_cuda_key] = _real_cuda_devices()
    devices = _simulated_devices(config)
    if not devices:
        return
    try:
        import torch
    except ImportError as exc:
        raise pytest.UsageError(f"--simulate-gpu needs torch: {exc}") from exc
    from gpuprobe.testing.simcuda import SimulatedCuda

    _machine_sim = SimulatedCuda(devices).install(as_machine=True)
    config.stash[_rng_key] = _install_rng_state_stand_ins(torch)
    reset()  # gpuprobe picks its backends again, now seeing CUDA


def pytest_unconfigure(config: pytest.Config) -> None:
    global _machine_sim
    if _machine_sim is not None:
        for target, name, original in reversed(config.stash.get(_rng_key, [])):
            setattr(target, name, original)
        _machine_sim.uninstall()
        _machine_sim = None


def _install_rng_state_stand_ins(torch: Any) -> list[tuple[Any, str, Any]]:
    """``torch.cuda.get_rng_state`` / ``set_rng_state`` for the simulated machine; returns what to put back.

    The simulation keeps no CUDA generator states, and a CPU build of torch has none to read, but
    Dynamo saves and restores the CUDA generator's state around every frame it compiles whenever
    ``torch.cuda.is_available()`` (torch/_dynamo/convert_frame.py ``preserve_global_state``). These
    keep one state per device, as torch does, and initialize CUDA where torch does
    (torch/cuda/random.py: ``get_rng_state`` calls ``_lazy_init``; ``set_rng_state`` is queued until
    initialization). The state's bytes are not a real generator's (a Philox seed and offset).
    """
    states: dict[int, Any] = {}

    def index(device: Any) -> int:
        if isinstance(device, str):
            device = torch.device(device)
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return device.index if device.index is not None else torch.cuda.current_device()

    def get_rng_state(device: Any = "cuda") -> Any:
        torch.cuda._lazy_init()
        return states.get(index(device), torch.zeros(16, dtype=torch.uint8)).clone()

    def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
        states[index(device) if torch.cuda.is_initialized() else 0] = new_state.clone()

    def get_rng_state_all() -> list[Any]:
        return [get_rng_state(i) for i in range(torch.cuda.device_count())]

    def set_rng_state_all(new_states: Any) -> None:
        for i, state in enumerate(new_states):
            set_rng_state(state, i)

    saved = []
    for target in (torch.cuda, torch.cuda.random):
        for fn in (get_rng_state, set_rng_state, get_rng_state_all, set_rng_state_all):
            saved.append((target, fn.__name__, getattr(target, fn.__name__)))
            setattr(target, fn.__name__, fn)
    return saved


def pytest_report_header(config: pytest.Config) -> str | None:
    if _machine_sim is None:
        return None
    return f"gpuprobe: simulated GPU machine ({_machine_sim.devices} simulated CUDA device(s), --simulate-gpu)"


# The test files that take a minute or more (seconds of CPU in the whole suite on the 2-core machine),
# run first: the parts of scripts/test give files to two worker processes in this order (pytest-xdist,
# --dist loadfile --no-loadscope-reorder), and a long file taken last would leave one worker running it
# alone at the end.
_SLOW_FILES = ("tests/test_docs.py", "tests/report/test_findings_recorded.py", "tests/page/test_live_page.py",
               "tests/report/test_executors.py", "tests/monitoring/test_prometheus_server.py",
               "tests/report/test_ranks.py", "tests/serving/test_serve_continuous.py",
               "tests/serving/test_run_command.py", "tests/test_gpu_check.py", "tests/transformers/test_nvtx.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.has_plugin("randomly"):  # a random order stays random
        first = {name: i for i, name in enumerate(_SLOW_FILES)}
        items.sort(key=lambda item: first.get(item.nodeid.split("::", 1)[0], len(first)))  # the rest as collected
    # Tests marked cuda need a real device, and torch's real CUDA: under --simulate-gpu the simulation
    # stands in for it. Tests marked no_cuda are about a process without CUDA: a simulated machine counts.
    real_cuda = config.stash.get(_real_cuda_key, 0) > 0
    needs_cuda = pytest.mark.skip(reason="needs a real CUDA device" if _machine_sim is None else
                                  "needs the real CUDA device; this run simulates CUDA (--simulate-gpu)")
    needs_none = pytest.mark.skip(reason="about a process without CUDA; torch sees a CUDA device here")
    for item in items:
        if "cuda" in item.keywords and (not real_cuda or _machine_sim is not None):
            item.add_marker(needs_cuda)
        if item.get_closest_marker("no_cuda") and (real_cuda or _machine_sim is not None):
            item.add_marker(needs_none)


@pytest.fixture(autouse=True)
def _fresh_gpuprobe() -> None:
    reset()
    yield
    reset()


@pytest.fixture
def exporter() -> InMemoryExporter:
    with InMemoryExporter() as exp:
        yield exp




@pytest.fixture
def simcuda():  # type: ignore[no-untyped-def]
    """``simcuda(devices=2, cpu_tensors_on=None)`` → a simulated CUDA installed for the test.

    No GPU exists on the machines these tests run on: the simulation (gpuprobe.testing.simcuda) stands
    in for torch.cuda with its real semantics. gpuprobe's backends are picked again once it is
    installed, and again after it is removed.
    """
    pytest.importorskip("torch")
    from gpuprobe.testing.simcuda import simulated_cuda

    stack = []

    def install(devices: int = 2, **options):  # type: ignore[no-untyped-def]
        ctx = simulated_cuda(devices, **options)
        sim = ctx.__enter__()
        stack.append(ctx)
        reset()
        return sim

    yield install
    while stack:
        stack.pop().__exit__(None, None, None)
    reset()


@pytest.fixture
def sim(simcuda):  # type: ignore[no-untyped-def]
    """Two simulated CUDA devices, CUDA already initialized by 'the program'."""
    import torch

    s = simcuda(2)
    torch.cuda.current_device()
    return s


@pytest.fixture(params=["cpu", "simcuda"])
def device_backend(request):  # type: ignore[no-untyped-def]
    """Runs a test twice: on the CPU, and on two simulated CUDA devices where every CPU tensor counts
    as living on cuda:0 and CUDA is initialized (so probes and the integration take device spans too)."""
    if request.param == "cpu":
        yield None
        return
    pytest.importorskip("torch")
    import torch

    from gpuprobe.testing.simcuda import simulated_cuda

    with simulated_cuda(2, cpu_tensors_on=0) as sim:
        reset()
        torch.cuda.current_device()
        yield sim
    reset()
