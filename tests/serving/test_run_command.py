"""``gpuprobe run -- COMMAND``: the command runs as itself (exit status, signals, output, process id)
with gpuprobe switched on inside its Python process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _servekit import GPUPROBE, Scrape, child_env, free_port, http_get, wait_until

from gpuprobe import run
from gpuprobe._sitecustomize.sitecustomize import _AfterImport

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

PY = sys.executable


def _script(tmp_path: Path, body: str, name: str = "app.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _run(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([GPUPROBE, "run", *args], cwd=cwd, env=child_env(**env), capture_output=True,
                          timeout=timeout)


# -- the command runs as itself ------------------------------------------------------------------

def test_the_exit_status_is_the_commands(tmp_path: Path) -> None:
    app = _script(tmp_path, "import sys; sys.exit(3)")
    assert _run(["--", PY, str(app)], tmp_path).returncode == 3


def test_python_dash_m_gpuprobe_run_passes_the_exit_status_too(tmp_path: Path) -> None:
    app = _script(tmp_path, "raise SystemExit(41)")
    done = subprocess.run([PY, "-m", "gpuprobe", "run", "--port", "0", PY, str(app)], cwd=tmp_path,
                          env=child_env(), capture_output=True, timeout=60)
    assert done.returncode == 41, done.stderr


def test_stdout_and_stderr_are_byte_for_byte_what_the_command_writes_after_one_line_of_its_own(tmp_path: Path) -> None:
    app = _script(tmp_path, """
        import sys
        sys.stdout.write("out ünïcode\\n" + "x" * 70000 + "\\n")
        sys.stderr.write("err line\\n")
        sys.stdout.buffer.write(bytes(range(256)))
    """)
    direct = subprocess.run([PY, str(app)], cwd=tmp_path, env=child_env(), capture_output=True, timeout=60)
    wrapped = _run(["--", PY, str(app)], tmp_path)
    # gpuprobe run's own line (where /metrics will answer) comes first, before the command starts
    own, _, rest = wrapped.stderr.partition(b"\n")
    assert own.startswith(b"gpuprobe run: once the program imports transformers or diffusers, /metrics at http://127.0.0.1:9464/")
    assert (wrapped.stdout, rest, wrapped.returncode) == (direct.stdout, direct.stderr, 0)


def test_the_command_replaces_gpuprobe_run_and_receives_its_signals(tmp_path: Path) -> None:
    app = _script(tmp_path, """
        import os, signal, sys, time
        def on(sig, frame):
            print(f"got {signal.Signals(sig).name}", flush=True)
            sys.exit(7 if sig == signal.SIGTERM else 8)
        signal.signal(signal.SIGTERM, on)
        signal.signal(signal.SIGINT, on)
        print(f"ready {os.getpid()}", flush=True)
        time.sleep(60)
    """)
    for sig, status in ((signal.SIGTERM, 7), (signal.SIGINT, 8)):
        proc = subprocess.Popen([GPUPROBE, "run", "--", PY, str(app)], cwd=tmp_path, env=child_env(),
                                stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line == f"ready {proc.pid}\n"  # the same process: gpuprobe run exec'd the command
            proc.send_signal(sig)
            assert proc.wait(30) == status
            assert proc.stdout.read() == f"got {sig.name}\n"  # type: ignore[union-attr]
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_command_not_found_exits_127(tmp_path: Path) -> None:
    done = _run(["--", "no-such-command-here"], tmp_path)
    assert done.returncode == 127
    assert b"gpuprobe run: no-such-command-here: command not found" in done.stderr


# -- gpuprobe inside the command -------------------------------------------------------------------

_GENERATE = """
    import os, sys, urllib.request
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=128)).eval()
    # min_new_tokens: a randomly initialised model may pick its end-of-sequence token early
    model.generate(torch.randint(3, 100, (1, 5)), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    port = os.environ["GPUPROBE_PROMETHEUS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        sys.stdout.write(resp.read().decode())
"""


def test_a_python_program_gets_its_models_instrumented_and_metrics_served(tmp_path: Path) -> None:
    app = _script(tmp_path, _GENERATE)
    port = free_port()
    done = _run(["--port", str(port), "--layers", "1", "--", "python", str(app)], tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    scrape = Scrape(done.stdout.decode())
    assert scrape.value("gen_ai_server_time_to_first_token_seconds_count") == 1
    assert scrape.value("gpuprobe_step_duration_seconds_count", phase="decode", clock="host") == 3
    assert scrape.value("gpuprobe_layer_duration_seconds_count") > 0  # --layers 1: every decode step
    # nothing of gpuprobe's own on the command's stderr but gpuprobe run's one line, before the command
    assert done.stderr.startswith(f"gpuprobe run: once the program imports transformers or diffusers, /metrics at "
                                  f"http://127.0.0.1:{port}/metrics".encode())
    assert done.stderr.count(b"\n") == 1


def test_a_console_script_gets_gpuprobe_too(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tiny-generate"
    script.write_text(f"#!{PY}\n" + textwrap.dedent(_GENERATE))
    script.chmod(0o755)
    port = free_port()
    env = child_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run([GPUPROBE, "run", "--port", str(port), "--", "tiny-generate"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert Scrape(done.stdout.decode()).value("gen_ai_server_request_duration_seconds_count") == 1


def test_flags_become_the_commands_settings(tmp_path: Path) -> None:
    app = _script(tmp_path, """
        import os
        for name in sorted(os.environ):
            if name.startswith("GPUPROBE_"):
                print(name, os.environ[name])
    """)
    done = _run(["--port=9600", "--addr", "0.0.0.0", "--otlp", "http://127.0.0.1:4318/v1/metrics", "--jsonl",
                 "obs.jsonl", "--layers", "8", "--profile-steps", "10-12", PY, str(app)], tmp_path)
    assert done.stdout.decode().splitlines() == [
        "GPUPROBE_JSONL obs.jsonl",
        "GPUPROBE_OTLP_ENDPOINT http://127.0.0.1:4318/v1/metrics",
        "GPUPROBE_PROFILE_SIGNAL SIGUSR2",  # a served program takes the capture signal unless told otherwise
        "GPUPROBE_PROFILE_STEPS 10-12",
        "GPUPROBE_PROMETHEUS_ADDR 0.0.0.0",
        "GPUPROBE_PROMETHEUS_PORT 9600",
        "GPUPROBE_RUN_LAYERS 8",
    ]


def test_metrics_port_comes_from_the_flag_then_the_environment_then_9464() -> None:
    assert run.child_environment({}, {})["GPUPROBE_PROMETHEUS_PORT"] == "9464"
    assert run.child_environment({}, {"GPUPROBE_PROFILE_SIGNAL": "off"})["GPUPROBE_PROFILE_SIGNAL"] == "off"
    assert run.child_environment({}, {"GPUPROBE_PROMETHEUS_PORT": "9700"})["GPUPROBE_PROMETHEUS_PORT"] == "9700"
    env = run.child_environment({"GPUPROBE_PROMETHEUS_PORT": "9800"}, {"GPUPROBE_PROMETHEUS_PORT": "9700"})
    assert env["GPUPROBE_PROMETHEUS_PORT"] == "9800"


def test_the_sitecustomize_directory_goes_first_on_pythonpath_once() -> None:
    env = run.child_environment({}, {"PYTHONPATH": f"/a{os.pathsep}{run.SITECUSTOMIZE_DIR}{os.pathsep}/b"})
    assert env["PYTHONPATH"].split(os.pathsep) == [run.SITECUSTOMIZE_DIR, "/a", "/b"]


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("MARK = 'theirs ran'\n")
    app = _script(tmp_path, """
        import sys, sitecustomize
        print(sitecustomize.MARK, any(type(f).__name__ == "_AfterImport" for f in sys.meta_path))
    """)
    done = _run(["--", PY, str(app)], tmp_path, PYTHONPATH=str(theirs))
    own, _, rest = done.stderr.partition(b"\n")  # gpuprobe run's one line, then the command's stderr
    assert own.startswith(b"gpuprobe run: ") and (done.stdout, rest) == (b"theirs ran True\n", b"")


def test_a_process_that_never_imports_transformers_binds_no_port(tmp_path: Path) -> None:
    port = free_port()
    app = _script(tmp_path, f"""
        import socket, sys
        s = socket.socket(); s.bind(("127.0.0.1", {port})); s.close()
        print(any(type(f).__name__ == "_AfterImport" for f in sys.meta_path),
              [m for m in ("gpuprobe", "transformers", "torch") if m in sys.modules])
    """)
    done = _run(["--port", str(port), "--", PY, str(app)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"True []\n"  # the hook waits; nothing of gpuprobe is imported


@pytest.mark.parametrize("flag", ["-I", "-E", "-S"])
def test_python_flags_that_skip_pythonpath_or_site_run_the_program_without_gpuprobe(tmp_path: Path,
                                                                                      flag: str) -> None:
    app = _script(tmp_path, "import sys; print(any(type(f).__name__ == '_AfterImport' for f in sys.meta_path)); "
                            "sys.exit(5)")
    done = _run(["--", PY, flag, str(app)], tmp_path)
    assert (done.returncode, done.stdout) == (5, b"False\n")


def test_a_python_without_gpuprobe_is_told_on_stderr_and_runs_on(tmp_path: Path) -> None:
    # Another Python: the interpreter this virtual environment was made from, which has no gpuprobe
    # (a folder named gpuprobe ahead of the real one is told apart: see the shadowing test).
    other = Path(sys.base_prefix) / "bin" / Path(sys.executable).name
    if not other.exists() or sys.base_prefix == sys.prefix:
        pytest.skip("needs a virtual environment and the Python it was made from")
    probe = subprocess.run([str(other), "-c", "import gpuprobe"], cwd=tmp_path, capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{other} has gpuprobe installed")
    # gpuprobe switches on when the program imports transformers' generation module; that Python has no
    # transformers either, so the program brings a module of that name (a stand-in: only its name matters).
    (tmp_path / "transformers" / "generation").mkdir(parents=True)
    for init in ("transformers/__init__.py", "transformers/generation/__init__.py", "transformers/generation/utils.py"):
        (tmp_path / init).write_text("")
    app = _script(tmp_path, "import transformers.generation.utils; print('still runs')")
    done = _run(["--", str(other), str(app)], tmp_path)
    assert done.returncode == 0 and done.stdout == b"still runs\n", done.stderr
    assert b"cannot import gpuprobe" in done.stderr and b"the program runs without it" in done.stderr


def test_a_bad_layers_variable_is_said_on_stderr_and_nothing_is_switched_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprobe import _bootstrap
    from gpuprobe.integrations.transformers import _class_patches

    assert _bootstrap.switch_on({"GPUPROBE_RUN_LAYERS": "every"}) is False
    assert capsys.readouterr().err == ("gpuprobe run: GPUPROBE_RUN_LAYERS must be an integer, got 'every'; "
                                       "the program runs without gpuprobe\n")
    assert not _class_patches


def test_a_bad_gpuprobe_variable_is_named_once_and_the_command_runs_with_its_default(tmp_path: Path) -> None:
    app = _script(tmp_path, "import gpuprobe, os\n"
                            "print('started', os.environ.get('GPUPROBE_OTLP_INTERVAL'),"
                            " gpuprobe.info()['settings_problems'])")
    done = _run(["--port", "0", "--", PY, str(app)], tmp_path, GPUPROBE_OTLP_INTERVAL="soon")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"started None []\n"  # left out of the command's environment: its default applies
    lines = [line for line in done.stderr.splitlines() if b"GPUPROBE_OTLP_INTERVAL" in line]
    assert lines == [b"gpuprobe run: GPUPROBE_OTLP_INTERVAL='soon' cannot be used (must be a number, got 'soon'); "
                     b"using the default 5.0 instead"]


# -- bad command lines ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--port", "x", "python"], "--port must be an integer, got 'x'"),
    (["--port", "70000", "python"], "--port must be between 0 and 65535, got '70000'"),
    (["--otlp", "ftp://collector", "python"], "--otlp must be an http:// or https:// URL, got 'ftp://collector'"),
    (["--layers", "0", "python"], "--layers must be >= 1, got '0'"),
    (["--profile-steps", "9-3", "python"], "--profile-steps must have A <= B in 'A-B', got '9-3'"),
    (["--jsonl=", "python"], "--jsonl must not be empty"),
    (["--verbose", "python"], "unknown option --verbose; known: --port, --addr"),
    (["--port"], "--port needs a value"),
    (["--port", "9000"], "no command given"),
    ([], "no command given"),
])
def test_a_bad_command_line_is_refused_naming_the_flag(args: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(args, execvpe=_never) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuprobe run: ") and message in err and err.count("\n") == 1  # one line, no usage
    assert "gpuprobe run --help" in err


def test_the_real_cli_says_which_flag_is_wrong(tmp_path: Path) -> None:
    done = _run(["--port", "http", "--", PY, "-c", "print(1)"], tmp_path)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.startswith(b"gpuprobe run: --port must be an integer, got 'http'")


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--help"], execvpe=_never) == 0
    out = capsys.readouterr().out
    for flag in ("--port", "--addr", "--otlp", "--jsonl", "--layers", "--profile-steps"):
        assert flag in out


def _never(*args: object) -> None:
    raise AssertionError("the command must not start")


# -- the post-import hook ----------------------------------------------------------------------------

def test_the_hook_runs_once_after_its_module_is_imported_then_leaves(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gp_hooked_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    hook = _AfterImport("gp_hooked_mod", lambda: seen.append(sys.modules["gp_hooked_mod"].VALUE))
    sys.meta_path.insert(0, hook)
    try:
        import gp_hooked_mod  # noqa: F401

        assert seen == [42]
        assert hook not in sys.meta_path
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        sys.modules.pop("gp_hooked_mod", None)


def test_metrics_answer_while_transformers_serve_starts(tmp_path: Path, tiny_model: Path) -> None:
    """/metrics is up as soon as the command has imported transformers, before any request."""
    port, serve_port = free_port(), free_port()
    proc = subprocess.Popen([GPUPROBE, "run", "--port", str(port), "--", "transformers", "serve", "./tiny",
                             "--device", "cpu", "--host", "127.0.0.1", "--port", str(serve_port)],
                            cwd=tiny_model.parent, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until("/metrics", lambda: http_get(f"http://127.0.0.1:{port}/metrics") is not None, 120, proc)
        wait_until("the server", lambda: http_get(f"http://127.0.0.1:{serve_port}/health"), 120, proc)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches uvicorn, which shuts down
        proc.wait(30)
        assert "Finished server process" in proc.stdout.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_gpuprobe_folder_beside_the_script_that_shadows_the_package_is_named(tmp_path: Path) -> None:
    (tmp_path / "gpuprobe" / "docs").mkdir(parents=True)  # a checkout of the repository: no __init__.py
    app = _script(tmp_path, "import transformers.generation.utils\nprint('ran')")
    probe_import = subprocess.run([PY, "-c", "import gpuprobe; print(hasattr(gpuprobe, 'info'))"], cwd=tmp_path,
                                  env=child_env(), capture_output=True, text=True, timeout=60)
    shadowed = probe_import.stdout.strip() == "False"  # an editable install loses to the folder; a wheel does not
    done = _run(["--port", "0", "--", PY, str(app)], tmp_path)
    assert done.returncode == 0 and done.stdout == b"ran\n"
    named = f"the folder {tmp_path / 'gpuprobe'} shadows the installed gpuprobe".encode()
    assert (named in done.stderr) == shadowed, done.stderr
    assert b"Traceback" not in done.stderr
