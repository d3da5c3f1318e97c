"""JSONL exporter output, and memory that stays bounded when an exporter is down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.exporters.jsonl import JsonlExporter

from helpers import run_python


def test_jsonl_writes_one_whole_line_per_observation(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    exp = JsonlExporter(path).attach()

    @probe("write_me", kind="step")
    def work() -> None:
        pass

    for _ in range(25):
        work()
    exp.close()
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    # The host clock's lines (once the program has initialized CUDA, device spans get lines of their own).
    ours = [r for r in records if r["metric"] == "gpuprobe.probe.duration" and r["attrs"]["probe"] == "write_me"
            and r["attrs"]["clock"] == "host"]
    assert len(ours) == 25
    assert all(r["unit"] == "s" and r["value"] > 0 and r["attrs"]["kind"] == "step" for r in ours)
    assert all(isinstance(r["ts"], int) for r in ours)


def test_jsonl_from_settings_is_flushed_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "env.jsonl"
    proc = run_python(
        """
        import gpuprobe
        @gpuprobe.probe("at_exit")
        def f(): pass
        for _ in range(10): f()
        """,
        env={"GPUPROBE_JSONL": str(path)},
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(1 for r in records if r["attrs"].get("probe") == "at_exit") == 10


def test_unwritable_jsonl_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write the JSONL file .*no-such-dir"):
        gpuprobe.configure(jsonl=str(tmp_path / "no-such-dir" / "x.jsonl"))


def test_memory_stays_bounded_with_the_exporter_down() -> None:
    proc = run_python(
        """
        import socket, warnings
        warnings.simplefilter("ignore")
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        import gpuprobe
        gpuprobe.configure(otlp_endpoint=f"http://127.0.0.1:{port}/v1/metrics", otlp_interval=0.05,
                           otlp_timeout=0.2)
        def rss():
            with open("/proc/self/statm") as f:
                import os
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        @gpuprobe.probe("hot")
        def hot(): pass
        for _ in range(10_000): hot()
        before = rss()
        for _ in range(100_000): hot()
        after = rss()
        import time; time.sleep(0.3)  # at least one push (every 0.05 s) has failed by now
        dropped = [p.value for md in gpuprobe.collect() if md.spec.name == "gpuprobe.telemetry.dropped"
                   for p in md.points]
        print((after - before) / 2**20, sum(dropped))
        """
    )
    assert proc.returncode == 0, proc.stderr
    growth_mib, dropped = map(float, proc.stdout.split())
    print(f"RSS growth over 100,000 probed calls with the OTLP endpoint down: {growth_mib:.2f} MiB")
    assert growth_mib < 10
    assert dropped >= 1  # the failed pushes were counted
