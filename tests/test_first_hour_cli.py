"""The command line says what it does: help for ``gpuprobe info --help``, one program name in every usage,
``gpuprobe run``'s own line before the command starts, where a profile window wrote its trace, Ctrl-C in
the demo as one line with exit status 130, and the demo's plot only where asked for.

Commands run as child interpreters in folders of their own (the console script ``gpuprobe`` of the
virtual environment, or ``python -m gpuprobe``); a real profile window over ``gpuprobe.step()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprobe import cli

ROOT = Path(__file__).resolve().parents[1]
BIN = os.path.dirname(sys.executable)
GPUPROBE = os.path.join(BIN, "gpuprobe")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------ help and usage

def test_info_help_prints_help_not_the_info(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--help", "-h"):
        assert cli.main(["info", flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: gpuprobe info\n") and "JSON" in out
        with pytest.raises(json.JSONDecodeError):
            json.loads(out)
    assert cli.main(["info"]) == 0
    assert "version" in json.loads(capsys.readouterr().out)


def test_info_with_an_argument_it_does_not_take_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuprobe info: unknown argument(s) --json")


@pytest.mark.parametrize("command", sorted(cli._COMMANDS))
def test_every_commands_usage_names_the_gpuprobe_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = cli.main([command, "--help"])
    except SystemExit as exc:  # argparse's --help
        status = exc.code
    assert status in (0, None)
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gpuprobe {command}"), out[:200]
    assert "python -m gpuprobe" not in out.splitlines()[0]


def test_the_commands_list_names_gpuprobe(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: gpuprobe [--version] COMMAND")


# ------------------------------------------------------------------------------------ gpuprobe run's own line

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_gpuprobe_run_says_where_metrics_and_traces_go_before_the_command_starts(tmp_path: Path) -> None:
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([GPUPROBE, "run", "--port", str(port), "--", sys.executable, "-c",
                           "import os, sys; print(os.getpid()); sys.stderr.write('the command\\n')"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    lines = done.stderr.splitlines()
    assert lines[1:] == ["the command"]  # one line of gpuprobe run's, first; then the command's own
    line = lines[0]
    assert line.startswith("gpuprobe run: once the program imports transformers or diffusers, ")
    assert f"/metrics at http://127.0.0.1:{port}/metrics, the live page at http://127.0.0.1:{port}/" in line
    # the command is the same process: the pid the line names for a capture is the command's own
    assert f"kill -USR2 {pid} captures the next 5 steps to {tmp_path / 'gpuprobe-traces'}/" in line


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_gpuprobe_run_names_the_trace_of_profile_steps(tmp_path: Path) -> None:
    done = subprocess.run([GPUPROBE, "run", "--port", "0", "--profile-steps", "3-4", "--", sys.executable, "-c",
                           "pass"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "/metrics and the live page on a free port" in done.stderr
    assert f"steps 3-4 are traced to {tmp_path / 'gpuprobe-steps-3-4-rank0.json.gz'}" in done.stderr


# ------------------------------------------------------------------------------------ a profile window's trace

WINDOW = """
import sys
import gpuprobe

window = gpuprobe.profile("1-2", output=sys.argv[1])
for _ in range(5):
    gpuprobe.step()
asked = gpuprobe.profile("1-1", output=sys.argv[2])
gpuprobe.step()
asked.stop()  # ended by its caller, who has the path: nothing said
print(window.path, asked.path)
"""


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_profile_window_says_on_stderr_where_it_wrote_its_trace(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "window.py").write_text(WINDOW)
    first, second = tmp_path / "steps.json", tmp_path / "asked.json"
    done = subprocess.run([sys.executable, "window.py", str(first), str(second)], cwd=tmp_path,
                          env=_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(first), str(second)] and first.is_file() and second.is_file()
    said = [line for line in done.stderr.splitlines() if "trace written" in line]
    assert said == [f"gpuprobe: profile window steps 1-2: trace written to {first} (gpuprobe report {first} reads it)"]


# ------------------------------------------------------------------------------------ the demo

def _plots(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".png")


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_the_demo_writes_no_plot_unless_asked_and_to_the_current_folder_when_asked(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    plain = subprocess.run([sys.executable, "-m", "gpuprobe", "demo", "--quick", "--port", "0"], cwd=tmp_path,
                           env=_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr
    assert _plots(tmp_path) == [] and "--plot draws" in plain.stdout
    asked = subprocess.run([sys.executable, "-m", "gpuprobe", "demo", "--quick", "--port", "0", "--plot"],
                           cwd=tmp_path, env=_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=180)
    assert asked.returncode == 0, asked.stderr
    assert _plots(tmp_path) == ["gpuprobe-demo.png"]
    assert (tmp_path / "gpuprobe-demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {tmp_path / 'gpuprobe-demo.png'}" in asked.stdout


def test_the_demos_plot_is_ignored_by_git_in_the_repository() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "-q", "gpuprobe-demo.png"], cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_ctrl_c_during_the_demos_requests_is_one_line_and_exit_130(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    proc = subprocess.Popen([sys.executable, "-m", "gpuprobe", "demo", "--requests", "1000", "--port", "0"],
                            cwd=tmp_path, env=_env(PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("request 1/1000"):
                break
        else:
            pytest.fail("the demo made no request: " + "".join(seen))
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    said = [line for line in rest.splitlines() if not line.startswith("request ")]
    assert len(said) == 1, rest
    assert said[0].startswith("gpuprobe demo: interrupted (Ctrl-C) after ") and said[0].endswith(" of 1000 requests")
