"""Behaviour of probe() in every form: names, errors, nesting, threads, sampling, switches."""

from __future__ import annotations

import asyncio
import threading

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.testing import InMemoryExporter

from helpers import cuda_present, expected_device_label, run_python

DUR = "gpuprobe.probe.duration"

pytestmark = pytest.mark.usefixtures("device_backend")


def test_bare_decorator_names_the_probe_after_the_qualname(exporter: InMemoryExporter) -> None:
    class Model:
        @probe
        def forward(self, x: int) -> int:
            return x * 2

    assert Model().forward(4) == 8
    obs = exporter.observations(DUR, clock="host")
    assert [o.attrs["probe"] for o in obs] == ["test_bare_decorator_names_the_probe_after_the_qualname.<locals>.Model.forward"]
    assert obs[0].attrs["kind"] == "user" and obs[0].attrs["clock"] == "host"
    assert obs[0].value > 0


def test_named_decorator_carries_kind_and_attrs(exporter: InMemoryExporter) -> None:
    @probe("decode", kind="step", attrs={"model": "tiny", "batch": 4})
    def decode() -> str:
        return "ok"

    assert decode() == "ok"
    (ob,) = exporter.observations(DUR, probe="decode", clock="host")
    assert ob.attrs["kind"] == "step" and ob.attrs["model"] == "tiny" and ob.attrs["batch"] == "4"


def test_decorator_keeps_function_metadata() -> None:
    @probe
    def documented(a: int) -> int:
        """Docs."""
        return a

    assert documented.__name__ == "documented" and documented.__doc__ == "Docs."
    assert documented.__wrapped__(3) == 3


def test_context_manager_measures_the_block(exporter: InMemoryExporter) -> None:
    import time

    with probe("sleepy"):
        time.sleep(0.02)
    (value,) = exporter.values(DUR, probe="sleepy", clock="host")
    assert 0.015 < value < 1.0


def test_exception_propagates_unchanged_and_is_counted(exporter: InMemoryExporter) -> None:
    err = KeyError("missing")

    @probe("lookup")
    def lookup() -> None:
        raise err

    with pytest.raises(KeyError) as info:
        lookup()
    assert info.value is err
    assert exporter.values("gpuprobe.probe.errors", probe="lookup", error_type="KeyError") == [1]
    assert len(exporter.values(DUR, probe="lookup", clock="host")) == 1  # the failed call is still timed


def test_exception_in_with_block_is_counted_and_not_swallowed(exporter: InMemoryExporter) -> None:
    with pytest.raises(ZeroDivisionError):
        with probe("div"):
            1 / 0  # noqa: B018
    assert exporter.values("gpuprobe.probe.errors", probe="div", error_type="ZeroDivisionError") == [1]


def test_async_function_range_spans_the_awaited_body_not_creation(exporter: InMemoryExporter) -> None:
    @probe("fetch")
    async def fetch() -> int:
        await asyncio.sleep(0.03)
        return 7

    coro = fetch()
    assert exporter.values(DUR, probe="fetch", clock="host") == []  # creating the coroutine records nothing
    assert asyncio.run(coro) == 7
    (value,) = exporter.values(DUR, probe="fetch", clock="host")
    assert value >= 0.025


def test_async_exception_is_counted(exporter: InMemoryExporter) -> None:
    @probe("afail")
    async def afail() -> None:
        await asyncio.sleep(0)
        raise ValueError("x")

    with pytest.raises(ValueError):
        asyncio.run(afail())
    assert exporter.values("gpuprobe.probe.errors", probe="afail", error_type="ValueError") == [1]


def test_async_with_block(exporter: InMemoryExporter) -> None:
    async def main() -> None:
        async with probe("ablock"):
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(exporter.values(DUR, probe="ablock", clock="host")) == 1


def test_generator_range_spans_first_next_to_exhaustion(exporter: InMemoryExporter) -> None:
    import time

    @probe("gen")
    def gen(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            yield i
        return "done"

    g = gen(3)
    time.sleep(0.03)  # before the first next(): not part of the range
    assert exporter.values(DUR, probe="gen", clock="host") == []
    assert next(g) == 0
    time.sleep(0.02)  # consumer time between items: part of the range
    assert list(g) == [1, 2]
    (value,) = exporter.values(DUR, probe="gen", clock="host")
    assert 0.015 < value < 0.03


def test_generator_return_value_and_send_pass_through() -> None:
    @probe("echo")
    def echo():  # type: ignore[no-untyped-def]
        got = yield "ready"
        return got * 2

    g = echo()
    assert next(g) == "ready"
    with pytest.raises(StopIteration) as stop:
        g.send(21)
    assert stop.value.value == 42


def test_generator_closed_early_is_timed_and_not_an_error(exporter: InMemoryExporter) -> None:
    @probe("stream")
    def stream():  # type: ignore[no-untyped-def]
        yield from range(100)

    g = stream()
    next(g)
    g.close()
    assert len(exporter.values(DUR, probe="stream", clock="host")) == 1
    assert exporter.values("gpuprobe.probe.errors") == []


def test_async_generators_are_refused_with_a_clear_error() -> None:
    async def agen():  # type: ignore[no-untyped-def]
        yield 1

    with pytest.raises(TypeError, match="async with probe"):
        probe(agen)


def test_nested_probes_each_record(exporter: InMemoryExporter) -> None:
    @probe("inner")
    def inner() -> None:
        pass

    with probe("outer"):
        inner()
        inner()
    assert len(exporter.values(DUR, probe="outer", clock="host")) == 1
    assert len(exporter.values(DUR, probe="inner", clock="host")) == 2
    assert exporter.values(DUR, probe="outer", clock="host")[0] >= max(exporter.values(DUR, probe="inner", clock="host"))


def test_shared_context_manager_object_is_safe_across_threads(exporter: InMemoryExporter) -> None:
    shared = probe("shared")
    per_thread = 500
    barrier = threading.Barrier(4)

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            with shared:
                with shared:  # re-entered on the same thread: its own stack frame
                    pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(exporter.values(DUR, probe="shared", clock="host")) == 4 * per_thread * 2


def test_threads_never_mix_records(exporter: InMemoryExporter) -> None:
    calls = {f"t{i}": 300 + 17 * i for i in range(6)}

    def work(name: str, n: int) -> None:
        p = probe(name)
        for _ in range(n):
            with p:
                pass

    threads = [threading.Thread(target=work, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, n in calls.items():
        assert len(exporter.values(DUR, probe=name, clock="host")) == n


def test_sampling_every_n_records_one_call_in_n(exporter: InMemoryExporter) -> None:
    hits = []

    @probe("sampled", every=4)
    def sampled(i: int) -> int:
        hits.append(i)
        return i

    for i in range(40):
        assert sampled(i) == i
    assert len(hits) == 40  # every call runs
    assert len(exporter.values(DUR, probe="sampled", clock="host")) == 10


def test_runtime_disable_and_enable(exporter: InMemoryExporter) -> None:
    @probe("switch")
    def switch() -> int:
        return 1

    gpuprobe.disable()
    assert not gpuprobe.is_enabled()
    switch()
    with probe("switch"):
        pass
    assert exporter.values(DUR, probe="switch", clock="host") == []
    gpuprobe.enable()
    switch()
    assert len(exporter.values(DUR, probe="switch", clock="host")) == 1


def test_disabled_by_env_returns_the_function_itself() -> None:
    proc = run_python(
        """
        import gpuprobe
        def f(): return 1
        assert gpuprobe.probe(f) is f
        assert gpuprobe.probe("x", kind="step")(f) is f
        with gpuprobe.probe("block"):
            pass
        assert gpuprobe.collect() == []
        assert gpuprobe.info()["disabled_by_env"] is True
        print("ok")
        """,
        env={"GPUPROBE_DISABLE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_probe_inside_torch_compile_does_nothing(exporter: InMemoryExporter, device_backend) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if device_backend is not None:
        pytest.skip("Dynamo's own CUDA paths call torch._C CUDA bindings a CPU build lacks")

    @probe("inside_compiled")
    def scale(x):  # type: ignore[no-untyped-def]
        return x * 2

    def fn(x):  # type: ignore[no-untyped-def]
        return scale(x) + 1

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    out = compiled(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 3.0))
    assert exporter.values(DUR, probe="inside_compiled", clock="host") == []
    scale(torch.ones(1))  # eager call still records
    assert len(exporter.values(DUR, probe="inside_compiled", clock="host")) == 1


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"every": 0}, "every="),
        ({"every": 1.5}, "every="),
        ({"kind": ""}, "kind"),
        ({"attrs": {"k": object()}}, "attrs="),
        ({"attrs": {"probe": "x"}}, "reserved key 'probe'"),
        ({"attrs": ["a"]}, "attrs="),
    ],
)
def test_bad_arguments_raise_config_errors_naming_them(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        probe("bad", **kwargs)


def test_label_values_past_the_cap_fold_into_other() -> None:
    from gpuprobe._metrics import Registry

    fam = Registry(max_label_values=3).family(DUR)
    for i in range(6):
        fam.child(probe=f"p{i}", kind="user", clock="host").apply(1000)
    names = sorted(dict(c.labels)["probe"] for c in fam.series())
    assert names == ["other", "p0", "p1", "p2"]
    other = next(c for c in fam.series() if dict(c.labels)["probe"] == "other")
    assert other.count == 3  # type: ignore[attr-defined]


def test_a_zeroed_registry_gives_new_label_values_series_of_their_own_again() -> None:
    # A reset (and a forked child) starts a fresh budget: a process that once passed the cap must not
    # fold every later name into "other", and the series made before stay valid.
    from gpuprobe._metrics import Registry

    reg = Registry(max_label_values=2)
    fam = reg.family(DUR)
    first = fam.child(probe="a", kind="user", clock="host")
    for name in ("b", "c"):
        fam.child(probe=name, kind="user", clock="host")
    assert dict(fam.child(probe="c", kind="user", clock="host").labels)["probe"] == "other"
    reg.zero()
    assert dict(fam.child(probe="c", kind="user", clock="host").labels)["probe"] == "c"
    assert dict(fam.child(probe="d", kind="user", clock="host").labels)["probe"] == "d"
    assert dict(fam.child(probe="e", kind="user", clock="host").labels)["probe"] == "other"
    assert fam.child(probe="a", kind="user", clock="host") is first


def test_memory_readings_are_taken_when_asked(exporter: InMemoryExporter, device_backend) -> None:  # type: ignore[no-untyped-def]
    sim = device_backend
    if sim is None and cuda_present():
        pytest.skip("a process's RSS is read only where torch sees no CUDA device; the simcuda variant reads "
                    "the allocator")

    @probe("alloc", memory=True)
    def alloc() -> object:
        return bytearray(1 << 20) if sim is None else sim.allocate(1 << 20)

    alloc()
    device = "cpu" if sim is None else "cuda:0"
    (allocated,) = exporter.values("gpuprobe.memory.allocated", device=device)
    (peak,) = exporter.values("gpuprobe.memory.peak", device=device)
    assert 1 << 20 <= allocated <= peak
    if sim is None:
        # on CPU there is no allocator reservation to report
        assert exporter.values("gpuprobe.memory.reserved") == []
    else:
        (reserved,) = exporter.values("gpuprobe.memory.reserved", device=device)
        assert allocated == __import__("torch").cuda.memory_allocated(0) and reserved >= allocated


def test_memory_off_by_default(exporter: InMemoryExporter) -> None:
    with probe("nomem"):
        pass
    assert exporter.values("gpuprobe.memory.allocated") == []


def test_info_names_active_backends(device_backend) -> None:  # type: ignore[no-untyped-def]
    info = gpuprobe.info()
    assert info["nvtx"] in ("off", "nvtx", "torch.cuda.nvtx")
    assert info["enabled"] is True
    if device_backend is None and not cuda_present():
        assert info["timing"] == "host" and info["device"] == "cpu" and info["memory"] == "process-rss"
    else:  # simulated devices, or a machine with CUDA (where the cpu variant still gets CUDA's backends)
        assert info["timing"] == "host+cuda-events" and info["memory"] == "cuda-allocator"
        with probe("first_work"):
            pass
        # the device of the first work: cuda:0 on the simulated devices; "cuda" until the program initializes CUDA
        assert gpuprobe.info()["device"] == expected_device_label()
        assert device_backend is None or expected_device_label() == "cuda:0"


_SENTINEL = object()


def test_wrappers_keep_every_kind_of_parameter(exporter: InMemoryExporter) -> None:
    @probe
    def full(a, b=2, /, c=3, *rest, d, e=_SENTINEL, **extra):  # type: ignore[no-untyped-def]
        return a, b, c, rest, d, e, extra

    assert full(1, d=4) == (1, 2, 3, (), 4, _SENTINEL, {})
    assert full(1, 5, 6, 7, 8, d=9, e=10, z=11) == (1, 5, 6, (7, 8), 9, 10, {"z": 11})
    with pytest.raises(TypeError):
        full(1)  # d is required, as in the original
    with pytest.raises(TypeError):
        full(a=1, d=2)  # a is positional-only, as in the original
    assert len(exporter.values(DUR, probe=full.__qualname__, clock="host")) == 2  # the failed binds never entered


def test_wrappers_of_parameters_named_like_internals_still_work() -> None:
    @probe
    def odd(_gp_fn, fn=1, site=2):  # type: ignore[no-untyped-def]
        return _gp_fn + fn + site

    assert odd(1) == 4


def test_wrapping_a_builtin_or_callable_object_works(exporter: InMemoryExporter) -> None:
    wrapped = probe("len")(len)
    assert wrapped([1, 2, 3]) == 3

    class Scorer:
        def __call__(self, x: int) -> int:
            return x + 1

    scored = probe("scorer")(Scorer())
    assert scored(1) == 2
    assert len(exporter.values(DUR, probe="len", clock="host")) == 1 and len(exporter.values(DUR, probe="scorer", clock="host")) == 1
