"""The runtime's parts and its seams: reconfiguration, switches, exact counts under threads, fork,
exporter lifecycle. Each test pins a defect the older single-object runtime had."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import urllib.request
import warnings

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter, reset

from helpers import run_python, scrape, use_cuda_if_present

DUR = "gpuprobe.probe.duration"


def _dropped(reason: str) -> float:
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.telemetry.dropped":
            return sum(p.value for p in md.points if p.labels["reason"] == reason)
    return 0.0


# -- probes -------------------------------------------------------------------------------------------

def test_overlapping_async_blocks_on_one_loop_each_record_their_own_time(exporter: InMemoryExporter) -> None:
    p = probe("overlap")

    async def block(delay_before: float, hold: float) -> None:
        await asyncio.sleep(delay_before)
        async with p:
            await asyncio.sleep(hold)

    async def main() -> None:
        # Two tasks whose blocks overlap: A holds 0.30 s from t=0, B holds 0.30 s from t=0.10.
        await asyncio.gather(block(0.0, 0.30), block(0.10, 0.30))

    asyncio.run(main())
    values = sorted(exporter.values(DUR, probe="overlap"))
    assert len(values) == 2
    # Each block lasted ~0.30 s. With one shared stack, A's exit would pop B's frame (0.20 s) and
    # B's exit A's (0.40 s).
    assert all(0.28 < v < 0.38 for v in values), values


def test_nested_async_blocks_in_one_task_stay_lifo(exporter: InMemoryExporter) -> None:
    outer, inner = probe("outer_a"), probe("inner_a")

    async def main() -> None:
        async with outer:
            await asyncio.sleep(0.02)
            async with inner:
                await asyncio.sleep(0.05)

    asyncio.run(main())
    (o,), (i,) = exporter.values(DUR, probe="outer_a"), exporter.values(DUR, probe="inner_a")
    assert 0.045 < i < o


def test_a_block_without_a_name_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="needs a name"):
        with probe():
            pass


def test_an_async_block_without_a_name_is_a_clear_error() -> None:
    async def main() -> None:
        async with probe():
            pass

    with pytest.raises(ConfigError, match="needs a name"):
        asyncio.run(main())


def test_configure_disable_switches_probes_off_and_on(exporter: InMemoryExporter) -> None:
    @probe("switched")
    def f() -> None:
        pass

    assert gpuprobe.configure(disable=True).disable is True
    assert gpuprobe.is_enabled() is False
    f()
    with probe("switched_block"):
        pass
    assert exporter.values(DUR, probe="switched") == [] and exporter.values(DUR, probe="switched_block") == []
    gpuprobe.configure(disable=False)
    assert gpuprobe.is_enabled() is True
    f()
    assert len(exporter.values(DUR, probe="switched", clock="host")) == 1


def test_configure_disable_false_under_env_disable_is_refused() -> None:
    proc = run_python(
        """
        import gpuprobe
        try:
            gpuprobe.configure(disable=False)
        except gpuprobe.ConfigError as exc:
            print("refused:", exc)
        """,
        env={"GPUPROBE_DISABLE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "GPUPROBE_DISABLE=1" in proc.stdout


def test_a_wrapper_made_before_configure_follows_the_new_settings(exporter: InMemoryExporter) -> None:
    device = use_cuda_if_present()  # with CUDA, memory is read once the program has initialized it

    @probe("early")
    def early() -> None:
        pass

    early()
    assert exporter.values("gpuprobe.memory.allocated") == []  # memory readings off by default
    gpuprobe.configure(memory=True)
    early()
    assert len(exporter.values("gpuprobe.memory.allocated", device=device)) == 1
    gpuprobe.configure(memory=False)
    early()
    assert len(exporter.values("gpuprobe.memory.allocated", device=device)) == 1
    assert len(exporter.values(DUR, probe="early", clock="host")) == 3


def test_a_wrapper_made_before_configure_drains_at_the_new_buffer_size() -> None:
    @probe("buffered")
    def f() -> None:
        pass

    f()  # the wrapper's queue exists, with the default limit of 4096
    gpuprobe.configure(buffer_size=16)
    rt = runtime()
    seen: list[int] = []
    rt.add_sink(lambda name, labels, value: seen.append(1) if dict(labels).get("probe") == "buffered" else None)
    for _ in range(16):
        f()
    # The 16th call reached the new limit and aggregated on its own thread, with no collect().
    assert len(seen) >= 16


# -- counts stay exact under threads ------------------------------------------------------------------

def test_drops_counted_from_many_threads_are_exact() -> None:
    rt = runtime()

    def hammer() -> None:
        for _ in range(5_000):
            rt.drop("test_reason")

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _dropped("test_reason") == 8 * 5_000


def test_queued_sink_overflow_counted_from_many_threads_is_exact() -> None:
    from gpuprobe.exporters._queued import QueuedSink

    class Stuck(QueuedSink):
        name = "stuck"

        def write_batch(self, batch, rt):  # type: ignore[no-untyped-def]
            pass

    sink = Stuck(max_queue=0)  # every observation overflows

    def hammer() -> None:
        for _ in range(5_000):
            sink._receive("gpuprobe.probe.duration", (), 1.0)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink._rt = runtime()
    sink.flush()
    assert _dropped("stuck_queue_full") == 8 * 5_000


def test_steps_counted_from_many_threads_are_exact_and_unique() -> None:
    rt = runtime()
    seen: list[int] = []
    rt.add_step_hook(seen.append)

    def hammer() -> None:
        for _ in range(2_000):
            gpuprobe.step()

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(16_000))
    assert rt.steps.index == 15_999


def test_warn_once_warns_exactly_once_across_threads() -> None:
    rt = runtime()
    barrier = threading.Barrier(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def hammer() -> None:
            barrier.wait()
            for _ in range(200):
                rt.warn_once("race", "gpuprobe: once only")

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum("once only" in str(w.message) for w in caught) == 1


# -- exporters -----------------------------------------------------------------------------------------

def test_otlp_push_leaves_the_sdk_loggers_level_alone() -> None:
    from gpuprobe.exporters.otlp import OtlpExporter

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}/v1/metrics"
    s.close()
    log = logging.getLogger("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    log.setLevel(logging.INFO)
    levels: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # another thread of the program, reading the shared logger's level
        while not stop.is_set():
            levels.append(log.level)

    watcher = threading.Thread(target=watch)
    watcher.start()
    exp = OtlpExporter(url, interval=60, timeout=0.5).attach()
    with probe("w"):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            exp.push()
    stop.set()
    watcher.join()
    exp.stop()
    assert set(levels) == {logging.INFO}
    assert log.filters == []  # the filter is removed with the exporter
    log.setLevel(logging.NOTSET)


def test_reset_closes_every_handle_on_a_port_served_twice() -> None:
    first = gpuprobe.serve(port=0)
    port = first.port
    second = gpuprobe.exporters.prometheus.serve(port=port)  # type: ignore[attr-defined]
    assert second.port == port
    reset()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    s = socket.socket()
    s.bind(("127.0.0.1", port))  # the port is free again
    s.close()


def test_configure_keeps_what_the_user_started() -> None:
    server = gpuprobe.serve(port=0)
    gpuprobe.configure(memory=True)
    with probe("kept"):
        pass
    assert any(s.labels.get("probe") == "kept" for s in scrape(server.url)["gpuprobe_probe_duration_seconds_count"])
    server.close()


def test_background_thread_survives_configure_with_no_exporter() -> None:
    rt = runtime()
    rt.lifecycle.keep_running = True  # as with a device clock
    rt.lifecycle.ensure_thread()
    gpuprobe.configure(memory=False)
    rt.lifecycle.keep_running = True
    assert rt.lifecycle.needs_thread()
    names = {t.name for t in threading.enumerate()}
    assert "gpuprobe-background" in names


# -- fork -----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_records_and_serves_and_the_parent_is_unaffected() -> None:
    parent = gpuprobe.serve(port=0)
    with probe("before_fork"):
        pass
    gpuprobe.collect()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must start empty, record, and serve on a port of its own
        code = 1
        try:
            os.close(read)
            with probe("in_child"):
                pass
            server = gpuprobe.serve(port=0)
            samples = scrape(server.url)["gpuprobe_probe_duration_seconds_count"]
            names = {s.labels["probe"] for s in samples}
            os.write(write, (",".join(sorted(names)) + f"|{server.port}").encode())
            server.close()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    names, child_port = data.decode().split("|")
    assert names == "in_child"  # nothing inherited from the parent
    assert int(child_port) != parent.port
    with probe("after_fork"):
        pass
    parent_names = {s.labels["probe"] for s in scrape(parent.url)["gpuprobe_probe_duration_seconds_count"]}
    assert parent_names == {"before_fork", "after_fork"}
    parent.close()


def test_child_at_exit_does_not_flush_the_parents_jsonl_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.jsonl"
    proc = run_python(
        f"""
        import os, gpuprobe
        gpuprobe.configure(jsonl={str(path)!r})
        with gpuprobe.probe("parent_probe"):
            pass
        gpuprobe.collect()
        pid = os.fork()
        if pid == 0:
            with gpuprobe.probe("child_probe"):
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        """
    )
    assert proc.returncode == 0, proc.stderr
    text = path.read_text()
    assert text.count('"parent_probe"') == 1 and "child_probe" not in text


def test_every_wrapper_variant_has_the_same_cells() -> None:
    from gpuprobe import _probe

    layouts = set()
    for every in (1, 2):
        for memory in (False, True):
            for timed in (False, True):
                @probe(f"layout_{every}_{memory}_{timed}", every=every, memory=memory)
                def f(a, b=1, *c, d, e=2, **g):  # type: ignore[no-untyped-def]
                    return a

                site = f.__gpuprobe__
                site._b.timed = timed  # as under a device clock
                site._b.nvtx = timed  # and an NVTX tool
                _probe._regenerate(f, site)
                layouts.add(f.__code__.co_freevars)
                assert f(5, d=0) == 5
    assert layouts == {("_gp_fn", "_gp_limit", "_gp_local", "_gp_site")}
