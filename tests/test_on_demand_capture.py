"""On-demand captures while a real tiny Llama generates: by HTTP request, by signal, by a slow step.

Requests go over real HTTP to a real ``gpuprobe.serve(port=0)``; the signal is a real SIGUSR2 sent
to this process; slow steps come from a logits processor that sleeps on purpose. Every trace is read
back with ``gpuprobe.report.analyze``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "transformers"))  # the tiny models' kit
from _hfkit import prompt, transformers  # noqa: E402
from _model_fixtures import isolated_models, make_model  # noqa: E402,F401 (fixtures)

import gpuprobe  # noqa: E402
from gpuprobe.integrations.transformers import instrument  # noqa: E402
from gpuprobe.report import analyze  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402
from gpuprobe.testing import reset  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs SIGUSR2")


# -- helpers -----------------------------------------------------------------------------------------

class Generating:
    """Generates with ``model`` on a thread, call after call, until the block ends."""

    def __init__(self, model: Any, tokens: int = 30) -> None:
        self.model = model
        self.tokens = tokens
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-generate")

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.model.generate(prompt(), max_new_tokens=self.tokens, min_new_tokens=self.tokens)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def __enter__(self) -> Generating:
        self.thread.start()
        wait_for(lambda: runtime().steps.index >= 3, "the first steps")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``condition`` (the main thread keeps running Python, so signal handlers run meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def request(server: Any, query: str = "", method: str = "POST") -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, JSON body) of a real HTTP request to the profile endpoint."""
    url = server.url.replace("/metrics", "/gpuprobe/profile") + (f"?{query}" if query else "")
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method,
                                 headers={"X-Gpuprobe-Capture": "1"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def captures() -> list[dict[str, Any]]:
    return gpuprobe.info()["profile"]["captures"]


def written(path: str) -> bool:
    return any(c["path"] == path and c["state"] == "done" for c in captures()) and Path(path).exists()


def step_indexes(path: str) -> list[int]:
    """The steps a trace holds, as ``gpuprobe report`` finds them (its ranges are ``gpuprobe.step#N``)."""
    rows = analyze(path).to_dict()["steps"]["rows"]
    assert all(row["name"].startswith("gpuprobe.step#") for row in rows)
    return [int(row["name"].split("#")[1]) for row in rows]


@pytest.fixture
def served(make_model: Callable[..., Any], tmp_path: Path) -> Any:
    """(instrumented tiny Llama, /metrics server) with traces going to ``tmp_path``."""
    reset(profile_dir=str(tmp_path))
    model = instrument(make_model("llama"), model_name="m")
    server = gpuprobe.serve(port=0)
    yield model, server
    server.close()


# -- the endpoint --------------------------------------------------------------------------------------

def test_a_post_captures_the_next_n_steps_into_a_trace_the_report_reads(served, tmp_path):
    model, server = served
    with Generating(model):
        status, headers, body = request(server, "steps=4")
        assert status == 202, body
        wait_for(lambda: written(body["path"]), "the trace")
    assert headers["Content-Type"] == "application/json"
    assert body["steps"] == 4 and body["reason"] == "request"
    assert body["last_step"] - body["first_step"] == 3
    assert Path(body["path"]).parent == tmp_path
    assert Path(body["path"]).name == f"gpuprobe-steps-{body['first_step']}-{body['last_step']}-rank0.json.gz"
    assert step_indexes(body["path"]) == list(range(body["first_step"], body["last_step"] + 1))


def test_a_post_while_a_capture_runs_is_refused_with_409_and_accepted_again_after(served):
    model, server = served
    with Generating(model):
        status, _, first = request(server, "steps=30")
        assert status == 202, first
        status, _, refused = request(server, "steps=2")
        assert status == 409, refused
        assert "already running" in refused["error"]
        assert f"steps {first['first_step']}-{first['last_step']}" in refused["error"]
        assert refused["running"]["path"] == first["path"] and refused["running"]["reason"] == "request"
        wait_for(lambda: written(first["path"]), "the first trace")
        status, _, again = request(server, "steps=2")
        assert status == 202, again
        wait_for(lambda: written(again["path"]), "the second trace")
    assert len(step_indexes(first["path"])) == 30
    assert len(step_indexes(again["path"])) == 2


@pytest.mark.parametrize("query, named", [
    ("steps=0", "'0'"), ("steps=abc", "'abc'"), ("steps=101", "'101'"), ("steps=-3", "'-3'"),
    ("steps=2.5", "'2.5'"), ("steps=1&steps=2", "['1', '2']"), ("step=3", "step"), ("steps", "steps=N"),
    ("steps=" + "9" * 5000, "between 1 and 100"),
])
def test_a_bad_request_is_refused_with_400_naming_the_problem(served, query, named):
    _, server = served
    status, _, body = request(server, query)
    assert status == 400, body
    assert named in body["error"]
    assert captures() == []


def test_a_post_without_steps_captures_the_default_number(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_on_demand_steps=2)
    model = instrument(make_model("llama"), model_name="m")
    server = gpuprobe.serve(port=0)
    try:
        with Generating(model):
            status, _, body = request(server)
            assert status == 202, body
            wait_for(lambda: written(body["path"]), "the trace")
    finally:
        server.close()
    assert body["steps"] == 2 and len(step_indexes(body["path"])) == 2


def test_only_post_captures_and_metrics_are_served_as_before(served):
    _, server = served
    status, headers, body = request(server, "steps=3", method="GET")
    assert status == 405 and headers["Allow"] == "POST"
    assert "POST /gpuprobe/profile" in body["error"]
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    assert captures() == []


def test_the_endpoint_can_be_turned_off(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_endpoint="off")
    server = gpuprobe.serve(port=0)
    try:
        status, _, body = request(server, "steps=3")
    finally:
        server.close()
    assert status == 404
    assert "GPUPROBE_PROFILE_ENDPOINT=off" in body["error"]
    assert list(tmp_path.iterdir()) == []


# -- the signal ----------------------------------------------------------------------------------------

def test_sigusr2_captures_the_next_default_number_of_steps(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_on_demand_steps=3, profile_signal="SIGUSR2")
    model = instrument(make_model("llama"), model_name="m")
    with Generating(model):
        os.kill(os.getpid(), signal.SIGUSR2)
        capture = wait_for(lambda: [c for c in captures() if c["state"] == "done"], "the capture")[0]
    assert capture["reason"] == "signal"
    assert Path(capture["path"]).parent == tmp_path
    assert step_indexes(capture["path"]) == list(range(capture["first_step"], capture["first_step"] + 3))


def test_a_handler_of_the_program_is_never_replaced(tmp_path):
    received: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    try:
        with pytest.warns(RuntimeWarning, match="handles SIGUSR2 itself"):
            reset(profile_dir=str(tmp_path), profile_signal="SIGUSR2")
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        assert "not installed" in gpuprobe.info()["profile"]["signal"]
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for(lambda: received, "the program's handler")
        assert received == [signal.SIGUSR2] and captures() == []
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_no_signal_is_taken_unless_asked():
    reset()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert gpuprobe.info()["profile"]["signal"] == "off"


def test_the_previous_handler_is_back_once_the_signal_is_turned_off():
    reset(profile_signal="SIGUSR2")
    assert getattr(signal.getsignal(signal.SIGUSR2), "__self__", None) is not None  # gpuprobe's
    reset(profile_signal="off")
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert gpuprobe.info()["profile"]["signal"] == "off"


def test_the_handler_is_installed_from_the_main_thread_only():
    reset(profile_signal="off")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        thread = threading.Thread(target=gpuprobe.configure, kwargs={"profile_signal": "SIGUSR2"})
        thread.start()
        thread.join()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert any("main thread" in str(w.message) for w in seen)
    assert "not installed" in gpuprobe.info()["profile"]["signal"]


# -- slow steps ----------------------------------------------------------------------------------------

class SlowAt(transformers.LogitsProcessor):
    """Sleeps ``seconds`` in the step of each ``generate()`` call given in ``calls`` (by call number,
    counted from 0) at the call's step ``at``; records the global index of each slow step."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seconds: dict[int, float] = {}  # call number -> sleep
        self.call = -1
        self.step = 0
        self.slow_steps: list[int] = []

    def begin(self, seconds: float = 0.0) -> SlowAt:
        self.call += 1
        self.step = 0
        if seconds:
            self.seconds[self.call] = seconds
        return self

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.step == self.at and self.call in self.seconds:
            self.slow_steps.append(runtime().steps.index)
            time.sleep(self.seconds[self.call])
        self.step += 1
        return scores


def generate(model: Any, slow: SlowAt, tokens: int = 12, seconds: float = 0.0) -> None:
    model.generate(prompt(), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                   logits_processor=transformers.LogitsProcessorList([slow.begin(seconds)]))


def test_a_step_slower_than_a_time_captures_the_steps_after_it_once_per_interval(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_slow_step="150ms", profile_slow_step_interval="10m",
          profile_slow_step_steps=3)
    model = instrument(make_model("llama"), model_name="m")
    slow = SlowAt(at=4)
    generate(model, slow, seconds=0.3)
    generate(model, slow)  # no slow step
    generate(model, slow, seconds=0.3)  # slow, but within the interval: no capture
    assert len(slow.slow_steps) == 2
    (capture,) = captures()
    assert capture["reason"] == "slow_step" and capture["state"] == "done"
    first = slow.slow_steps[0] + 1
    assert (capture["first_step"], capture["last_step"]) == (first, first + 2)
    assert step_indexes(capture["path"]) == [first, first + 1, first + 2]
    assert [p.name for p in tmp_path.iterdir()] == [Path(capture["path"]).name]
    assert gpuprobe.info()["profile"]["slow_step"]["captures"] == 1


def test_a_slow_step_after_the_interval_captures_again(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_slow_step="0.15", profile_slow_step_interval="1ms",
          profile_slow_step_steps=2)
    model = instrument(make_model("llama"), model_name="m")
    slow = SlowAt(at=4)
    generate(model, slow, seconds=0.3)
    generate(model, slow, seconds=0.3)
    assert [c["first_step"] for c in captures()] == [s + 1 for s in slow.slow_steps]
    assert all(c["state"] == "done" for c in captures())
    assert len(list(tmp_path.iterdir())) == 2


def test_neither_the_prefill_nor_the_last_step_of_a_call_is_judged(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_slow_step="150ms", profile_slow_step_interval="1ms")
    model = instrument(make_model("llama"), model_name="m")
    prefill, last = SlowAt(at=0), SlowAt(at=11)
    generate(model, prefill, seconds=0.3)
    generate(model, last, seconds=0.3)
    assert prefill.slow_steps and last.slow_steps
    assert captures() == []


def test_a_percentile_of_recent_steps_captures_after_a_step_slower_than_it(make_model, tmp_path):
    reset(profile_dir=str(tmp_path), profile_slow_step="p99", profile_slow_step_interval="10m",
          profile_slow_step_steps=2, collect_interval=0.05)
    model = instrument(make_model("llama"), model_name="m")
    slow = SlowAt(at=10)
    # 150 judged steps (52 tokens a call: neither the prefill nor the last step is judged), two of them
    # slowed to 150 ms before the 100th step (no threshold before 100 steps, see docs/capture.md). From
    # the 100th on, p99 (nearest rank: the 99th of 100 ... the 149th of 150) is the first of those two.
    generate(model, slow, tokens=52, seconds=0.15)
    generate(model, slow, tokens=52, seconds=0.15)
    generate(model, slow, tokens=52)
    assert captures() == []
    threshold = wait_for(lambda: gpuprobe.info()["profile"]["slow_step"]["threshold_s"], "the p99 threshold")
    assert 0.15 <= threshold < 0.6
    generate(model, slow, tokens=16, seconds=0.6)
    (capture,) = captures()
    assert capture["reason"] == "slow_step"
    assert (capture["first_step"], capture["last_step"]) == (slow.slow_steps[-1] + 1, slow.slow_steps[-1] + 2)
    assert len(step_indexes(capture["path"])) == 2


def test_a_slow_step_capture_waits_one_step_for_a_kernel_sample_under_way(make_model, tmp_path):
    # Kernel sampling at every step: the step after the slow one is already being sampled when the
    # slow one is judged, so the capture starts one step later (torch.profiler runs one session at a time).
    reset(profile_dir=str(tmp_path), profile_slow_step="150ms", profile_slow_step_steps=3, kernel_sampling=1)
    model = instrument(make_model("llama"), model_name="m")
    slow = SlowAt(at=4)
    generate(model, slow, tokens=14, seconds=0.3)
    (capture,) = captures()
    assert capture["state"] == "done", capture["error"]
    first = slow.slow_steps[0] + 2
    assert step_indexes(capture["path"]) == [first, first + 1, first + 2]


# -- what a capture says ---------------------------------------------------------------------------------

def test_a_capture_says_on_stderr_where_its_trace_goes_and_when_it_is_written(served, capfd):
    model, server = served
    with Generating(model):
        status, _, body = request(server, "steps=2")
        assert status == 202, body
        wait_for(lambda: written(body["path"]), "the trace")
    err = capfd.readouterr().err
    steps = f"steps {body['first_step']}-{body['last_step']}"
    assert f"gpuprobe: capturing {steps} (asked for by POST /gpuprobe/profile) to {body['path']}\n" in err
    assert f"gpuprobe: capture of {steps} written to {body['path']}\n" in err


def _planted_steps(seconds: float, n: int) -> None:
    rt = runtime()
    series = rt.family("gpuprobe.step.duration").child(model="planted", phase="decode", clock="host")
    for _ in range(n):
        rt.emit(series, int(seconds * 1e9))


@pytest.mark.parametrize(("before_ms", "during_ms", "warned"), [(10, 50, True), (10, 15, False)])
def test_a_capture_whose_steps_run_over_twice_as_slow_is_warned_with_the_figures(before_ms, during_ms, warned):
    from gpuprobe._on_demand import _CaptureCost, _step_seconds

    reset()
    _planted_steps(before_ms / 1e3, 20)
    cost = _CaptureCost(runtime(), "request", _step_seconds(runtime()))

    class Window:  # what _CaptureCost reads of a profile window
        first, last, error, path, output = 5, 8, None, "/tmp/x.json.gz", "/tmp/x.json.gz"

    cost.started(Window)
    _planted_steps(during_ms / 1e3, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cost.finished(Window)
    said = [str(w.message) for w in seen if "capturing made" in str(w.message)]
    if warned:
        ratio = during_ms / before_ms
        assert said == [f"gpuprobe: capturing made the captured steps {ratio:.1f}x slower ({during_ms:.3g} ms a step "
                        f"against {before_ms:.3g} ms before): their times in the trace and in the metrics include "
                        "the profiler's own cost"]
    else:
        assert said == []


def test_on_demand_traces_go_to_a_folder_of_their_own_by_default():
    from gpuprobe.config import Config

    assert Config().profile_dir == "gpuprobe-traces"
