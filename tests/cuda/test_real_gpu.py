"""The checks a run on real GPUs must make (skipped without CUDA; some need two GPUs or nsys).

Each mirrors a simulated-CUDA test; here the driver, the kernels, CUPTI and the caching allocator are
real. Run with ``bash scripts/test tests/cuda`` on a machine with a GPU.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import probe
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter, reset

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda
two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA devices")
DUR = "gpuprobe.probe.duration"


@pytest.fixture(autouse=True)
def _fresh() -> None:  # type: ignore[misc]
    reset()
    yield
    reset()


def busy(ms: float, device: int | None = None) -> None:
    """Keep the GPU busy for about ``ms`` milliseconds (a spin kernel)."""
    torch.cuda._sleep(int(ms * 1.4e6))  # _sleep spins for a number of cycles: ~1.4 GHz


def test_a_program_that_reaches_cuda_only_through_an_extension_gets_host_time_until_torch_initializes_it() -> None:
    """torch.cuda._sleep launches a kernel without torch's Python-level initialization: gpuprobe never
    initializes CUDA itself (a forked child could then not use it), so device spans wait for it."""
    import subprocess
    import sys

    code = (
        "import torch, gpuprobe\n"
        "from gpuprobe import probe\n"
        "from gpuprobe.testing import InMemoryExporter\n"
        "with InMemoryExporter() as exp:\n"
        "    with probe('spin'):\n"
        "        torch.cuda._sleep(1_000_000)\n"
        "    before = len(exp.values('gpuprobe.probe.duration', probe='spin', clock='device'))\n"
        "    torch.cuda.init()\n"
        "    with probe('spin'):\n"
        "        torch.cuda._sleep(1_000_000)\n"
        "    torch.cuda.synchronize()\n"
        "    gpuprobe.collect()\n"
        "    after = len(exp.values('gpuprobe.probe.duration', probe='spin', clock='device'))\n"
        "print(torch.cuda.is_initialized(), before, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "0", "1"]


def test_device_spans_resolve_without_synchronizing() -> None:
    torch.cuda.init()  # busy() launches through torch.cuda._sleep, which does not initialize torch's CUDA
    with InMemoryExporter() as exp:
        p = probe("spin")
        for _ in range(5):
            with p:
                busy(5)
        torch.cuda.synchronize()  # the test waits; gpuprobe itself never does
        values = exp.values(DUR, probe="spin", clock="device")
    assert len(values) == 5 and all(0.002 < v < 0.05 for v in values)


@two_gpus
def test_data_parallel_replicas_time_their_own_devices() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1024, 1024)

        @probe("replica_forward")
        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.lin(x)

    model = torch.nn.DataParallel(Net().cuda(), device_ids=[0, 1])
    with InMemoryExporter() as exp:
        for _ in range(10):
            model(torch.randn(64, 1024, device="cuda"))
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        assert len(exp.values(DUR, probe="replica_forward", clock="device")) == 20  # no RuntimeError, both devices
    assert runtime().backends.device_clock.devices == [0, 1]  # type: ignore[union-attr]


@two_gpus
def test_device_map_auto_layers_are_timed_on_their_devices() -> None:
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from gpuprobe.integrations.transformers import instrument

    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=4, vocab_size=1024)
    model = transformers.LlamaForCausalLM(cfg)
    model = accelerate.dispatch_model(
        model, device_map={"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0,
                           "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1,
                           "lm_head": 1})
    instrument(model, model_name="split", layers=True, layer_every=1, layer_index=True)
    with InMemoryExporter() as exp:
        model.generate(torch.randint(3, 1024, (1, 64), device="cuda:0"), max_new_tokens=8, min_new_tokens=8)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        for index in range(4):
            times = exp.values("gpuprobe.layer.duration", **{"layer.index": str(index)})
            assert times and min(times) > 1e-5, f"layer {index} reads ~0: timed on the wrong device"
        memory = {o.attrs["device"] for o in exp.observations("gpuprobe.memory.allocated")}
    assert memory == {"cuda:0", "cuda:1"}


def test_reduce_overhead_compile_with_the_static_cache() -> None:
    transformers = pytest.importorskip("transformers")
    from gpuprobe.integrations.transformers import instrument

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    model = transformers.LlamaForCausalLM(cfg).cuda().eval()
    instrument(model, model_name="compiled", layers=True, layer_every=1)
    ids = torch.randint(3, 512, (1, 16), device="cuda")
    with InMemoryExporter() as exp:
        for _ in range(3):  # CUDA-graph trees capture on the first calls
            model.generate(ids, max_new_tokens=16, min_new_tokens=16, cache_implementation="static",
                           compile_config=transformers.CompileConfig(mode="reduce-overhead", fullgraph=True))
        torch.cuda.synchronize()
        assert len(exp.values("gpuprobe.step.duration", clock="host")) == 3 * 16
    assert runtime().capture.underway == 0


def test_a_real_graph_capture_is_not_disturbed_by_the_background_reader() -> None:
    gpuprobe.configure(collect_interval=0.001)
    with probe("pending_during_capture"):
        busy(50)
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)  # warm-up on a side stream, as torch documents
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):  # global mode: an event query from any thread would break it
        for _ in range(200):
            x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert x[0].item() == 3 + 200


@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs Nsight Systems (nsys)")
def test_nsys_bracket_captures_exactly_the_window(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import torch, gpuprobe
        gpuprobe.profile("3-4", nsys=True)
        x = torch.randn(2048, 2048, device="cuda")
        for i in range(8):
            gpuprobe.step()
            with gpuprobe.probe(f"step_body"):
                x = x @ x / 2048
        torch.cuda.synchronize()
    """))
    report = tmp_path / "out"
    subprocess.run(["nsys", "profile", "--capture-range=cudaProfilerApi", "--trace=cuda,nvtx", "-o", str(report),
                    "--export=sqlite", sys.executable, str(script)], check=True, cwd=tmp_path)
    import sqlite3

    con = sqlite3.connect(str(report) + ".sqlite")
    kernels = con.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert kernels == 2  # steps 3 and 4: one matmul each (nothing from a second CUPTI client)


def test_every_oom_is_dumped_once_with_python_stacks(tmp_path: Path) -> None:
    gpuprobe.configure(snapshot_on_oom=True, snapshot_dir=str(tmp_path))
    torch.cuda.current_device()
    gpuprobe.step()  # history starts once CUDA is up
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError):
        with probe("outer"):
            with probe("inner"):
                torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    (path,) = tmp_path.iterdir()
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert any(e["action"] == "oom" for trace in snap["device_traces"] for e in trace)


def test_kernel_sampling_matches_a_reference_profile(tmp_path: Path) -> None:
    from gpuprobe.profiling import KernelSampler

    a = torch.randn(1024, 1024, device="cuda")
    sampler = KernelSampler(4).attach()
    with InMemoryExporter() as exp:
        for _ in range(9):
            gpuprobe.step()
            b = a @ a
            torch.softmax(b, dim=-1)
        runtime().steps_done()
        sampler.detach()
        sampled = sum(exp.values("gpuprobe.kernel.launches", category="gemm"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as ref:
        b = a @ a
        torch.softmax(b, dim=-1)
    gemms = sum(1 for e in ref.events() if e.device_type == torch.autograd.DeviceType.CUDA and "gemm" in e.name.lower())
    assert sampled == 2 * gemms  # steps 4 and 8


@pytest.mark.parametrize("layers", [False, True])
def test_instrumented_generation_adds_no_synchronization(layers: bool) -> None:
    transformers = pytest.importorskip("transformers")
    from gpuprobe.integrations.transformers import instrument, uninstrument

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    model = transformers.LlamaForCausalLM(cfg).cuda().eval()
    ids = torch.randint(3, 512, (2, 16), device="cuda")

    def syncs() -> int:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                torch.manual_seed(0)
                model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    syncs()  # warm-up
    plain = syncs()
    instrument(model, model_name="m", layers=layers, layer_every=2, memory_every=1)
    try:
        assert syncs() == plain
    finally:
        uninstrument(model)


def test_threads_with_their_own_device_never_raise() -> None:
    errors: list[BaseException] = []
    p = probe("per_thread")

    def run(device: int) -> None:
        try:
            torch.cuda.set_device(device)
            for _ in range(50):
                with p:
                    busy(0.1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(d % torch.cuda.device_count(),)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_fork_after_probes_were_prepared_leaves_cuda_usable_in_the_child() -> None:
    code = textwrap.dedent("""
        import os, torch, gpuprobe
        @gpuprobe.probe("prepared")
        def f(): pass
        f()
        pid = os.fork()
        if pid == 0:
            torch.zeros(1, device="cuda")
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        raise SystemExit(os.waitstatus_to_exitcode(status))
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_the_sync_audit_counts_what_torch_sync_debug_mode_warns_about() -> None:
    from gpuprobe._sync_audit import SyncSites, new_audit

    x = torch.arange(8.0, device="cuda")
    mask = x > 3

    def work() -> None:
        x.sum().item()
        x.nonzero()
        x[mask]
        x.cpu()
        x.to("cpu", non_blocking=True)  # not a sync
        torch.unique(x)

    work()  # warm-up: lazy initialisation syncs once
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    warned = sum("synchroniz" in str(w.message) for w in seen)
    audit = new_audit(SyncSites(lambda key, message: None))
    with audit:
        work()
    assert sum(audit.counts.values()) == warned > 0


def test_kernel_sampling_on_this_torch_counts_the_kernels_its_profiler_counts() -> None:
    """The sampler's CUDA path on the installed torch's real kineto events (torch 2.11's have no
    activity_type(), 2.13's do): a matmul step's kernel time is positive and its launches are the
    device-side records of a plain CUDA-only torch.profiler run of the same step."""
    from gpuprobe.profiling import KernelSampler, kernel_sampling_status

    a = torch.randn(2048, 2048, device="cuda")

    def work() -> None:
        a @ a
        torch.cuda.synchronize()

    work()
    work()  # cuBLAS is set up: the profiled steps launch the same kernels
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as ref:
        work()
    expected = sum(1 for e in ref.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    sampler = KernelSampler(2).attach()
    with InMemoryExporter() as exp:
        for _ in range(4):  # step 2 is sampled; it ends when step 3 starts
            gpuprobe.step()
            work()
        status = kernel_sampling_status()
        sampler.detach()
        launches = sum(exp.values("gpuprobe.kernel.launches"))
        seconds = sum(exp.values("gpuprobe.kernel.time"))
    assert status.startswith("every 2 steps: kernels, memcpy and memset"), status
    assert sampler.samples == 1
    assert launches == expected > 0
    assert seconds > 0
