"""The settings of on-demand captures (docs/capture.md): what they accept, what they refuse and how the
refusal reads, and the profile endpoint's answers that need no generation."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import pytest

import gpuprobe
from gpuprobe import ConfigError, config
from gpuprobe._on_demand import respond
from gpuprobe.runtime import runtime
from gpuprobe.testing import reset


@pytest.mark.parametrize("raw, kept", [
    ("p99", "p99"), ("P99.9", "p99.9"), ("p50", "p50"),
    ("250ms", "0.25s"), ("0.25", "0.25s"), ("2s", "2s"), ("1m", "60s"), ("500us", "0.0005s"),
])
def test_a_slow_step_threshold_is_a_percentile_or_a_time(raw, kept):
    assert config.load({"GPUPROBE_PROFILE_SLOW_STEP": raw}).profile_slow_step == kept


@pytest.mark.parametrize("raw", ["p0", "p100", "p101", "fast", "-1", "0", "250 parsecs", "p"])
def test_a_bad_slow_step_threshold_is_refused_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=f"GPUPROBE_PROFILE_SLOW_STEP must be .*got '{raw}'"):
        config.load({"GPUPROBE_PROFILE_SLOW_STEP": raw})


@pytest.mark.parametrize("raw, seconds", [("10m", 600.0), ("600", 600.0), ("30s", 30.0), ("1h", 3600.0),
                                          ("250ms", 0.25)])
def test_the_slow_step_interval_is_a_time(raw, seconds):
    assert config.load({"GPUPROBE_PROFILE_SLOW_STEP_INTERVAL": raw}).profile_slow_step_interval == seconds


def test_the_interval_is_refused_when_not_a_positive_time():
    with pytest.raises(ConfigError, match="profile_slow_step_interval must be a time > 0"):
        gpuprobe.configure(profile_slow_step_interval="0")


@pytest.mark.parametrize("raw, kept", [("SIGUSR1", "SIGUSR1"), ("usr2", "SIGUSR2"), ("off", "off"), ("0", "off")])
def test_the_signal_is_sigusr1_sigusr2_or_off(raw, kept):
    if kept != "off" and not hasattr(signal, kept):
        pytest.skip(f"no {kept} on this platform")
    assert config.load({"GPUPROBE_PROFILE_SIGNAL": raw}).profile_signal == kept


@pytest.mark.parametrize("raw", ["SIGTERM", "INT", "SIGKILL", "9"])
def test_a_signal_the_program_relies_on_is_refused(raw):
    with pytest.raises(ConfigError, match="GPUPROBE_PROFILE_SIGNAL must be one of SIGUSR1, SIGUSR2 or off"):
        config.load({"GPUPROBE_PROFILE_SIGNAL": raw})


@pytest.mark.parametrize("raw, problem", [
    ("sub/x-{first}.json", "must be a file name"), ("{step}.json", "the fields {first} {last}"),
    ("trace-{first}.txt", "must end in .json or .json.gz"), ("{first", "the fields"),
])
def test_a_bad_trace_name_is_refused(raw, problem):
    with pytest.raises(ConfigError, match="GPUPROBE_PROFILE_NAME"):
        config.load({"GPUPROBE_PROFILE_NAME": raw})
    with pytest.raises(ConfigError) as err:
        config.load({"GPUPROBE_PROFILE_NAME": raw})
    assert problem in str(err.value)


def test_auto_answers_only_on_a_loopback_address():
    reset(profile_signal="off")
    rt = runtime()
    status, body, _ = respond(rt, "POST", "steps=2", loopback=False, confirmed=True)
    assert status == 404
    assert "non-loopback" in body["error"] and "GPUPROBE_PROFILE_ENDPOINT=on" in body["error"]
    reset(profile_signal="off", profile_endpoint="on")
    status, _, _ = respond(runtime(), "GET", "", loopback=False)
    assert status == 405  # on: answered whatever the address


def test_a_capture_is_refused_while_probes_are_disabled():
    reset(profile_signal="off")
    server = gpuprobe.serve(port=0)
    gpuprobe.disable()
    try:
        url = server.url.replace("/metrics", "/gpuprobe/profile?steps=2")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST",
                                                          headers={"X-Gpuprobe-Capture": "1"}), timeout=10)
    finally:
        gpuprobe.enable()
        server.close()
    assert err.value.code == 503
    assert "disabled" in json.loads(err.value.read())["error"]


@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGUSR2"), reason="needs os.fork and SIGUSR2")
def test_a_forked_child_gets_the_default_handler_back():
    reset(profile_signal="SIGUSR2")  # installs the SIGUSR2 handler in this process
    assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's runs here, so no capture could answer the signal
        os._exit(0 if signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL  # the parent keeps its own
