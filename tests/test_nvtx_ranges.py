"""NVTX ranges of probes, captured for real by an injection library (NVTX_INJECTION64_PATH).

Each test runs its code in a fresh interpreter with the capture library attached before the first
NVTX call, then checks the exact sequence of calls the NVTX runtime delivered.
"""

from __future__ import annotations

import pytest

from gpuprobe.testing.nvtx_capture import build_injection_library, run_captured


@pytest.fixture(scope="module")
def lib():  # type: ignore[no-untyped-def]
    try:
        return build_injection_library()
    except Exception as exc:  # pragma: no cover - gcc is part of the test set-up
        pytest.fail(f"cannot build the NVTX injection library: {exc}")


def ours(cap):  # type: ignore[no-untyped-def]
    return [e for e in cap.events if e.domain == "gpuprobe" and e.kind in ("push", "pop", "range_start", "range_end")]


def test_sync_function_and_block_ranges_nest_in_the_gpuprobe_domain(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import gpuprobe
        assert gpuprobe.info()["nvtx"] == "nvtx", gpuprobe.info()
        @gpuprobe.probe("inner", kind="layer")
        def inner(): pass
        with gpuprobe.probe("outer", kind="step"):
            inner()
            inner()
        """,
        library=lib,
    )
    seq = [(e.kind, e.message, e.category_name) for e in ours(cap)]
    assert seq == [
        ("push", "outer", "step"),
        ("push", "inner", "layer"),
        ("pop", None, None),
        ("push", "inner", "layer"),
        ("pop", None, None),
        ("pop", None, None),
    ]
    ranges = cap.ranges("gpuprobe")
    assert [r.path for r in ranges] == [("outer",), ("outer", "inner"), ("outer", "inner")]
    assert cap.is_balanced("gpuprobe")
    # messages are registered strings, not copied text per call
    pushes = [e for e in ours(cap) if e.kind == "push"]
    assert {e.message_type for e in pushes} == {"registered"}


def test_range_is_closed_after_an_exception(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import gpuprobe
        @gpuprobe.probe("fails")
        def fails(): raise ValueError("x")
        for _ in range(3):
            try:
                with gpuprobe.probe("around"):
                    fails()
            except ValueError:
                pass
        """,
        library=lib,
    )
    ranges = cap.ranges("gpuprobe")
    assert [r.path for r in ranges] == [("around",), ("around", "fails")] * 3
    assert all(r.closed for r in ranges) and cap.is_balanced("gpuprobe")


def test_threads_keep_their_own_stacks(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import threading, gpuprobe
        barrier = threading.Barrier(2)
        def work(name):
            barrier.wait()
            for _ in range(50):
                with gpuprobe.probe(name):
                    with gpuprobe.probe(name + ".child"):
                        pass
        ts = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
        [t.start() for t in ts]; [t.join() for t in ts]
        """,
        library=lib,
    )
    ranges = cap.ranges("gpuprobe")
    by_thread: dict[int, set] = {}
    for r in ranges:
        by_thread.setdefault(r.thread, set()).add(r.path)
    assert sorted(map(sorted, by_thread.values())) == [
        [("a",), ("a", "a.child")],
        [("b",), ("b", "b.child")],
    ]
    assert len(ranges) == 200 and cap.is_balanced("gpuprobe")


def test_async_and_generator_probes_use_start_end_ranges(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import asyncio, gpuprobe
        @gpuprobe.probe("fetch")
        async def fetch(i):
            await asyncio.sleep(0.001 * i)
            return i
        async def main():
            await asyncio.gather(fetch(1), fetch(2), fetch(3))  # interleaved on one thread
            async with gpuprobe.probe("ablock"):
                await asyncio.sleep(0)
        asyncio.run(main())
        @gpuprobe.probe("gen")
        def gen():
            yield 1
            yield 2
        assert list(gen()) == [1, 2]
        """,
        library=lib,
    )
    assert [e for e in ours(cap) if e.kind in ("push", "pop")] == []  # nothing on the thread stack
    ranges = cap.start_end_ranges("gpuprobe")
    assert sorted(r.message for r in ranges) == ["ablock", "fetch", "fetch", "fetch", "gen"]
    assert all(r.closed for r in ranges)


def test_generator_closed_early_and_failing_async_close_their_ranges(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import asyncio, gpuprobe
        @gpuprobe.probe("stream")
        def stream():
            yield from range(10)
        g = stream(); next(g); g.close()
        @gpuprobe.probe("afail")
        async def afail():
            raise KeyError("k")
        try:
            asyncio.run(afail())
        except KeyError:
            pass
        """,
        library=lib,
    )
    ranges = cap.start_end_ranges("gpuprobe")
    assert sorted(r.message for r in ranges) == ["afail", "stream"] and all(r.closed for r in ranges)


def test_disabled_probes_emit_no_ranges(lib) -> None:  # type: ignore[no-untyped-def]
    cap = run_captured(
        """
        import gpuprobe
        @gpuprobe.probe("quiet")
        def quiet(): pass
        gpuprobe.disable()
        quiet()
        with gpuprobe.probe("quiet2"):
            pass
        """,
        library=lib,
    )
    assert ours(cap) == []
