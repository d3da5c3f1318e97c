"""A setting read from the environment never stops the program: a value gpuprobe cannot use is warned once,
naming the variable and the value, and its default is used; RANK / LOCAL_RANK of -1 mean "no rank".

Each case runs a real program (a probed function and a probed block) in its own Python process, as a user's
program meets these variables: it must exit 0 with its own output.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprobe import config

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

PROGRAM = """\
import gpuprobe
from gpuprobe import probe


@probe
def add(a, b):
    return a + b

with probe("block"):
    total = add(1, 2)
print("result", total, len(gpuprobe.info()["settings_problems"]))
"""

_SWITCH = ["maybe", "2", "-1"]
_COUNT = ["0", "many", "-4"]
_BLANK = ["   ", "\t", " \t "]

# Values each variable's documented meaning rules out (docs/quickstart.md's settings table): three per
# variable, tried in three rounds with every variable set at once.
GARBAGE: dict[str, list[str]] = {
    "GPUPROBE_DISABLE": _SWITCH,
    "GPUPROBE_MEMORY": ["2.5", "yes please", "10"],
    "GPUPROBE_MEMORY_PEAK_RESET": _SWITCH,
    "GPUPROBE_DEVICE_TIMING": ["gpu", "cuda:0", "1"],
    "GPUPROBE_PROMETHEUS_PORT": ["-5", "70000", "abc"],
    "GPUPROBE_PROMETHEUS_ADDR": _BLANK,
    "GPUPROBE_ALLOWED_HOSTS": ["a b", "evil.example/x", "-start"],
    "GPUPROBE_PORT_BY_LOCAL_RANK": _SWITCH,
    "GPUPROBE_OTLP_ENDPOINT": ["ftp://collector", "localhost:4318", "http://"],
    "GPUPROBE_OTLP_INTERVAL": ["soon", "0", "1e300"],
    "GPUPROBE_OTLP_TIMEOUT": ["-1", "nan", "inf"],
    "GPUPROBE_JSONL": ["   ", "/proc/nope/x.jsonl", "\t"],
    "GPUPROBE_MAX_LABEL_VALUES": ["0", "many", "1e3"],
    "GPUPROBE_BUFFER_SIZE": ["1", "abc", "99999999999"],
    "GPUPROBE_COLLECT_INTERVAL": ["0", "-1", "x"],
    "GPUPROBE_SNAPSHOT_AT_STEP": ["-1", "x", "1.5"],
    "GPUPROBE_SNAPSHOT_ON_OOM": _SWITCH,
    "GPUPROBE_SNAPSHOT_DIR": _BLANK,
    "GPUPROBE_SNAPSHOT_STACKS": ["cpp", "1", "x"],
    "RANK": ["x", "1.5", "9" * 5000],
    "LOCAL_RANK": ["x", "70000", "0x1"],
    "GPUPROBE_PROFILE_STEPS": ["9-3", "a-b", "-1"],
    "GPUPROBE_PROFILE_OUTPUT": ["trace.txt", "   ", "x.json.bz2"],
    "GPUPROBE_PROFILE_NSYS": _SWITCH,
    "GPUPROBE_PROFILE_ENDPOINT": ["maybe", "2", "x"],
    "GPUPROBE_PROFILE_SIGNAL": ["SIGKILL", "SIGINT", "9"],
    "GPUPROBE_PROFILE_ON_DEMAND_STEPS": _COUNT,
    "GPUPROBE_PROFILE_MAX_STEPS": _COUNT,
    "GPUPROBE_PROFILE_DIR": _BLANK,
    "GPUPROBE_PROFILE_NAME": ["{rank:>999999999}.json", "a/b.json", "{nope}.json"],
    "GPUPROBE_PROFILE_KEEP": ["-1", "x", "1.5"],
    "GPUPROBE_PROFILE_SLOW_STEP": ["p0", "p100", "slow"],
    "GPUPROBE_PROFILE_SLOW_STEP_INTERVAL": ["0", "-1s", "x"],
    "GPUPROBE_PROFILE_SLOW_STEP_STEPS": _COUNT,
    "GPUPROBE_KERNEL_SAMPLING": ["-1", "x", "0.5"],
    "GPUPROBE_SYNC_AUDIT": ["-1", "x", "0.5"],
    "GPUPROBE_PEAK_MEMORY_BANDWIDTH": ["0", "-1", "fast"],
    "GPUPROBE_PEAK_FLOPS": ["0", "x", "1e999"],
    "GPUPROBE_NVML": _SWITCH,
    "GPUPROBE_TRACES": ["maybe", "1", "otlp"],
    "GPUPROBE_REQUESTS_KEPT": ["-1", "x", "2000000"],
    "GPUPROBE_SLO_TTFT": ["0", "-1s", "soon"],
    "GPUPROBE_SLO_TPOT": ["0", "x", "-5ms"],
    "GPUPROBE_SLO_E2E": ["0", "x", "1e999"],
    "GPUPROBE_LOG_INTERVAL": ["-1", "x", "0"],
    "GPUPROBE_DEVICE_EVERY": ["abc", "0", "-2"],
}

_VARIABLE = re.compile(r"\b(GPUPROBE_[A-Z0-9_]+|LOCAL_RANK|RANK)\b")


def _clean_env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_") and k not in ("RANK", "LOCAL_RANK")}
    env.update(extra)
    return env


def _run(tmp_path: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    return subprocess.run([sys.executable, *flags, str(program)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def _warnings_by_variable(stderr: str) -> dict[str, int]:
    """How many warning lines name each variable first (a line may name another one in passing)."""
    counts: dict[str, int] = {}
    for line in stderr.splitlines():
        if "RuntimeWarning" not in line:
            continue
        found = _VARIABLE.search(line.split("RuntimeWarning", 1)[1])
        if found:
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return counts


def test_every_setting_has_garbage_to_try() -> None:
    assert set(GARBAGE) == {s.env for s in config.SETTINGS.values()}


@pytest.mark.parametrize("round_", [0, 1, 2])
@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "warnings-as-errors"])
def test_every_variable_set_to_garbage_at_once_warns_each_once_and_the_program_runs(
        tmp_path: Path, round_: int, flags: tuple[str, ...]) -> None:
    env = _clean_env(**{variable: values[round_] for variable, values in GARBAGE.items()})
    done = _run(tmp_path, env, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"result 3 {len(GARBAGE)}\n"
    assert _warnings_by_variable(done.stderr) == {variable: 1 for variable in GARBAGE}, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("variable", sorted(GARBAGE))
def test_one_bad_variable_names_itself_its_value_and_what_is_used(tmp_path: Path, variable: str) -> None:
    value = GARBAGE[variable][0]
    done = _run(tmp_path, _clean_env(**{variable: value}))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "result 3 1\n"
    warned = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1, done.stderr
    assert variable in warned[0] and ("instead" in warned[0] or "runs without" in warned[0])


@pytest.mark.parametrize("value", ["-1", "-2"])
@pytest.mark.parametrize("variable", ["RANK", "LOCAL_RANK"])
def test_a_negative_rank_means_no_rank_without_a_word(tmp_path: Path, variable: str, value: str) -> None:
    done = _run(tmp_path, _clean_env(**{variable: value}))
    assert done.returncode == 0 and done.stdout == "result 3 0\n"
    assert "Warning" not in done.stderr


def test_a_port_another_program_holds_is_warned_and_the_program_runs_without_metrics(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _run(tmp_path, _clean_env(GPUPROBE_PROMETHEUS_PORT=str(port)))
    assert done.returncode == 0 and done.stdout == "result 3 1\n", done.stderr
    warned = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1 and f"port {port}" in warned[0] and "runs without /metrics" in warned[0]


@pytest.mark.parametrize(("variables", "named"), [
    ({"GPUPROBE_PROMETHEUS_PORT": "0", "GPUPROBE_PROMETHEUS_ADDR": "no-such-host.invalid"}, "no-such-host.invalid"),
    ({"GPUPROBE_JSONL": "/proc/nope/x.jsonl"}, "/proc/nope/x.jsonl"),
    ({"GPUPROBE_JSONL": "."}, "'.'"),
])
def test_a_valid_value_that_cannot_be_used_here_is_warned_once(tmp_path: Path, variables: dict[str, str],
                                                               named: str) -> None:
    done = _run(tmp_path, _clean_env(**variables))
    assert done.returncode == 0 and done.stdout == "result 3 1\n", done.stderr
    warned = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1 and named in warned[0], done.stderr


def test_the_gpu_health_gauges_without_a_gpu_leave_the_program_alone(tmp_path: Path) -> None:
    done = _run(tmp_path, _clean_env(GPUPROBE_NVML="1", GPUPROBE_KERNEL_SAMPLING="1", GPUPROBE_SYNC_AUDIT="1"))
    assert done.returncode == 0 and done.stdout.startswith("result 3 "), done.stderr
    assert "Traceback" not in done.stderr


def test_an_explicit_configure_call_still_raises_naming_the_keyword(tmp_path: Path) -> None:
    import gpuprobe
    from gpuprobe.testing import reset

    try:
        with pytest.raises(gpuprobe.ConfigError, match="jsonl"):
            gpuprobe.configure(jsonl=str(tmp_path / "missing" / "x.jsonl"))
        with pytest.raises(gpuprobe.ConfigError, match="local_rank must be between 0 and 65535"):
            gpuprobe.configure(local_rank=10**30)
        with pytest.raises(gpuprobe.ConfigError, match="profile_name may pad a field to at most 99"):
            gpuprobe.configure(profile_name="{rank:>999999999}.json")
    finally:
        reset()


def test_doctor_still_fails_the_settings_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "doctor"], cwd=tmp_path,
                          env=_clean_env(GPUPROBE_DEVICE_EVERY="abc"), capture_output=True, text=True, timeout=120)
    line = next(line for line in done.stdout.splitlines() if line.split()[1:2] == ["settings"])
    assert line.startswith("fail") and "GPUPROBE_DEVICE_EVERY" in line
