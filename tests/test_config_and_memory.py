"""Settings are parsed strictly; memory readings and snapshots fail clearly without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError, GpuprobeError, config, memory
from gpuprobe._files import atomic_write

from helpers import cuda_present, expected_device_label, run_python


@pytest.mark.parametrize(
    "var, value",
    [
        ("GPUPROBE_DISABLE", "maybe"),
        ("GPUPROBE_MEMORY", "2"),
        ("GPUPROBE_PROMETHEUS_PORT", "http"),
        ("GPUPROBE_PROMETHEUS_PORT", "70000"),
        ("GPUPROBE_OTLP_ENDPOINT", "localhost:4318"),
        ("GPUPROBE_OTLP_INTERVAL", "0"),
        ("GPUPROBE_OTLP_INTERVAL", "nan"),
        ("GPUPROBE_DEVICE_TIMING", "gpu"),
        ("GPUPROBE_MAX_LABEL_VALUES", "0"),
        ("GPUPROBE_BUFFER_SIZE", "many"),
        ("LOCAL_RANK", "x"),
        ("RANK", "70000000000"),
    ],
)
def test_bad_environment_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load({var: value})
    assert var in str(info.value) and repr(value) in str(info.value)


def test_bad_environment_value_is_one_clear_warning_and_the_program_runs() -> None:
    proc = run_python("import gpuprobe\n@gpuprobe.probe\ndef f():\n    return 7\nprint(f())",
                      env={"GPUPROBE_DISABLE": "perhaps"})
    assert proc.returncode == 0 and proc.stdout == "7\n"
    (line,) = [line for line in proc.stderr.splitlines() if "Warning" in line]
    assert "GPUPROBE_DISABLE='perhaps' cannot be used (must be one of 1/0/true/false" in line
    assert "using the default (off) instead" in line


def test_minus_one_ranks_mean_no_rank_even_when_read_strictly() -> None:
    cfg = config.load({"RANK": "-1", "LOCAL_RANK": "-1"})
    assert cfg.rank == 0 and cfg.local_rank == 0


def test_good_environment_values_are_read() -> None:
    cfg = config.load({"GPUPROBE_MEMORY": "yes", "GPUPROBE_PROMETHEUS_PORT": "9500", "RANK": "3", "LOCAL_RANK": "1",
                       "GPUPROBE_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/metrics"})
    assert cfg.memory is True and cfg.prometheus_port == 9500 and cfg.rank == 3 and cfg.local_rank == 1
    assert cfg.otlp_endpoint == "http://127.0.0.1:4318/v1/metrics"


def test_configure_rejects_unknown_and_bad_keywords() -> None:
    with pytest.raises(ConfigError, match="unknown gpuprobe setting 'memroy'"):
        gpuprobe.configure(memroy=True)
    with pytest.raises(ConfigError, match="otlp_interval"):
        gpuprobe.configure(otlp_interval=-1)


def test_rank_and_device_label_every_series() -> None:
    from gpuprobe.testing import reset

    reset(rank=2, local_rank=0)
    with gpuprobe.probe("ranked"):
        pass
    (md,) = [m for m in gpuprobe.collect() if m.spec.name == "gpuprobe.probe.duration"]
    device = expected_device_label()  # cpu without CUDA
    assert md.points and all(p.labels["gpuprobe.rank"] == "2" and p.labels["gpuprobe.device"] == device
                             for p in md.points)


@pytest.mark.no_cuda
def test_snapshot_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GpuprobeError, match=r"memory.snapshot\(\) needs PyTorch with a CUDA device"):
        memory.snapshot(tmp_path / "snap.pickle")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.no_cuda
def test_snapshot_trigger_without_cuda_warns_once_and_never_raises(tmp_path: Path) -> None:
    from gpuprobe.testing import reset

    reset(snapshot_at_step=2, snapshot_dir=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="memory snapshot \\(step2\\) not written"):
        for _ in range(4):
            gpuprobe.step()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_leaves_nothing_half_written(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")

    def failing(tmp: str) -> None:
        Path(tmp).write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, failing)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    atomic_write(target, lambda tmp: Path(tmp).write_bytes(b"new"))
    assert target.read_bytes() == b"new"


def test_cpu_memory_reading_is_process_rss() -> None:
    # Without CUDA, read() is the process reading; with it, read() reads the CUDA allocator.
    device, allocated, reserved, peak = memory.process_reading() if cuda_present() else memory.read()
    assert device == "cpu" and reserved is None
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert abs(allocated - rss_kb * 1024) < 16 * 2**20
    assert peak >= allocated


@pytest.mark.cuda
def test_cuda_snapshot_is_written_atomically(tmp_path: Path) -> None:
    import pickle

    import torch

    memory.record_history()
    x = torch.empty(1 << 20, device="cuda")
    path = memory.snapshot(tmp_path / "snap.pickle")
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert "segments" in snap and x.numel() == 1 << 20
    assert [p.name for p in tmp_path.iterdir()] == ["snap.pickle"]
    memory.record_history(False)


def test_env_is_not_leaking_into_tests() -> None:
    assert not any(k.startswith("GPUPROBE_") for k in os.environ)


def test_the_settings_table_in_the_docs_is_current() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "quickstart.md").read_text()
    start = doc.index("<!-- settings table: generated, do not edit -->\n") + len("<!-- settings table: generated, do not edit -->\n")
    end = doc.index("\n<!-- end settings table -->")
    assert doc[start:end] == config.settings_table()


def test_every_setting_has_a_variable_a_parser_and_a_meaning() -> None:
    import dataclasses

    fields = dataclasses.fields(config.Config)
    assert {f.name for f in fields} == set(config.SETTINGS)
    envs = [s.env for s in config.SETTINGS.values()]
    assert len(envs) == len(set(envs))
    for f in fields:
        setting = config.SETTINGS[f.name]
        assert setting.doc and setting.env
        if f.default is not None:  # the default survives its own parser
            assert setting.parse(setting.env, f.default) == f.default
