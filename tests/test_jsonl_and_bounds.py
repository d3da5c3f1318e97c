"""JSONL exporter output, and memory that stays bounded when an exporter is down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError, probe
from gpuprobe.exporters.jsonl import JsonlExporter

from helpers import ROOT, run_python


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


# -- a full disk: whole lines or none, the loss counted ------------------------------------------------

FILL_PROGRAM = """
import json, os, resource, shutil, sys, warnings
import gpuprobe
from gpuprobe.exporters.jsonl import JsonlExporter
from gpuprobe.runtime import runtime

path, limit, copy_to = sys.argv[1], int(sys.argv[2]), sys.argv[3]
exp = JsonlExporter(path).attach()
fill, after = gpuprobe.probe("fill"), gpuprobe.probe("after")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # writes past it fail with EFBIG
flushes = 0
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(3000):
        with fill:
            pass
        if i % 500 == 499:  # six batches: the later ones find no room
            runtime().drain()
            exp.flush()
            flushes += 1
    size_when_full = os.path.getsize(path)
    if limit:  # room again: the next batch is written
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for _ in range(50):
        with after:
            pass
    exp.close()
    flushes += 1
dropped = sum(p.value for md in gpuprobe.collect() if md.spec.name == "gpuprobe.telemetry.dropped"
              for p in md.points if p.labels["reason"] == "jsonl_write_failed")
if copy_to:
    shutil.copy(path, copy_to)  # out of the file system that goes with this process
print(json.dumps({"calls": 3050, "flushes": flushes, "dropped": dropped, "size_when_full": size_when_full,
                  "warnings": [str(w.message) for w in caught if "JSONL" in str(w.message)]}))
"""


def _can_mount_tmpfs() -> str | None:
    """Why a tmpfs of its own cannot be mounted for a process here, or None when it can."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "a tmpfs needs root and unshare(1) (the file size limit case runs everywhere)"
    probe_run = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True, text=True)
    return None if probe_run.returncode == 0 else f"cannot mount a tmpfs here: {probe_run.stderr.strip()}"


@pytest.mark.parametrize("full", ["tmpfs", "file_size_limit"])
def test_a_full_disk_leaves_whole_lines_and_the_loss_counted(full: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PYTHONPATH"] = ROOT
    env["GPUPROBE_COLLECT_INTERVAL"] = "3600"  # batches are written when the program flushes, not in between
    script = tmp_path / "fill.py"
    script.write_text(FILL_PROGRAM)
    if full == "tmpfs":
        why_not = _can_mount_tmpfs()
        if why_not:
            pytest.skip(why_not)
        disk = tmp_path / "disk"
        disk.mkdir()
        path, copy = disk / "run.jsonl", tmp_path / "copy.jsonl"
        # A 64 KiB tmpfs in a mount namespace of the child's own: ENOSPC once it is full.
        command = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" "$3" "$4" 0 "$5"',
                   "sh", str(disk), sys.executable, str(script), str(path), str(copy)]
        limit = 64 * 1024
    else:
        path = copy = tmp_path / "run.jsonl"
        limit = 40_000
        command = [sys.executable, str(script), str(path), str(limit), ""]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    raw = copy.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]  # every line whole
    kept = sum(1 for r in records if r["attrs"].get("probe") in ("fill", "after"))
    assert 0 < kept < out["calls"]
    # Every lost call is counted; the count may also hold the drop counter's own lost observations
    # (one per failed batch, at most one per flush).
    assert out["calls"] - kept <= out["dropped"] <= out["calls"] - kept + out["flushes"]
    (warning,) = out["warnings"]
    assert str(path) in warning and "jsonl_write_failed" in warning
    assert ("No space left" if full == "tmpfs" else "File too large") in warning
    # When full, the file ended with a whole line: the partial one at the limit was cut off again.
    assert out["size_when_full"] < limit and raw[out["size_when_full"] - 1:out["size_when_full"]] == b"\n"
    if full == "file_size_limit":
        # Once there is room again, the next batch is written, whole.
        assert sum(1 for r in records if r["attrs"].get("probe") == "after") == 50
