"""``gpuprobe try`` when MODEL fails or the budget is short: MODEL's own errors are bad input (exit 2, what
failed and where, the rounds measured before it kept); only gpuprobe's own are internal errors; no call
starts that cannot finish in the budget, and no verdict comes from fewer rounds than the rule needs.

Real tiny Llamas built from configs (a folder written with ``save_pretrained``, factories in files), the
command line run as a child interpreter (``python -I -m gpuprobe try``) with its exit status checked.
The slow model sleeps in a module's forward: sleeping is the one cost a busy shared CPU does not stretch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuprobe.experiment import ModelFailed, Variant, render, try_remedies  # noqa: E402
from gpuprobe.experiment.faults import is_gpuprobes, user_frame  # noqa: E402
from gpuprobe.experiment.stats import MIN_ROUNDS  # noqa: E402

SLEEP_S = 3.0
BUDGET_S = 5.0

_CONFIG = """transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)"""

# A model whose prefill raises from its BROKEN_FROM-th generate() call on (each call has one prefill).
FLAKY = f"""
import torch
import transformers

BROKEN_FROM = {{broken_from}}


class Flaky(transformers.LlamaForCausalLM):
    prefills = 0

    def forward(self, input_ids=None, **kwargs):
        if input_ids is not None and input_ids.shape[1] > 1:
            Flaky.prefills += 1
            if Flaky.prefills >= BROKEN_FROM:
                raise RuntimeError("the device fell off the bus")
        return super().forward(input_ids=input_ids, **kwargs)


def flaky():
    torch.manual_seed(0)
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    return Flaky({_CONFIG}).eval(), {{"input_ids": ids, "max_new_tokens": 2, "do_sample": False}}
"""

# A module whose forward sleeps; each forward's start and end (and when the factory returned) go to a log.
SLOW = f"""
import os
import time
import torch
import transformers

LOG = os.environ["SLOW_FORWARD_LOG"]


def note(what):
    with open(LOG, "a") as f:
        f.write(f"{{what}} {{time.time()!r}}\\n")


class Sleep(torch.nn.Module):
    def forward(self, x):
        note("start")
        time.sleep({SLEEP_S!r})
        note("end")
        return x


def slow():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM({_CONFIG}).eval()
    model.model.norm = torch.nn.Sequential(model.model.norm, Sleep())
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    note("made")
    return model, {{"input_ids": ids, "max_new_tokens": 1, "do_sample": False}}
"""


# The baseline and one variant: the documented set-up is an audited call and a warm-up call each (the baseline
# first), then each round calls both, the baseline first in odd rounds. Its call in round 3 is the 9th.
BASELINE_IN_ROUND_3 = 2 * 2 + 2 * 2 + 1


def _flaky(broken_from: int) -> str:
    return FLAKY.replace("{broken_from}", str(broken_from))


def _tiny_llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpuprobe_try(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuprobe try ARGS`` in a child interpreter, isolated, in ``cwd``; returns the finished process."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    full.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run([sys.executable, "-I", "-m", "gpuprobe", "try", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=180)


def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: a second torch thread only adds noise
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- MODEL's errors

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_damaged_weights_file_is_named_as_models_error_and_leaves_the_output_file_alone(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    _tiny_llama().save_pretrained(folder)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # cut short, as by a full disk or an interrupted copy
    out = tmp_path / "out.txt"
    out.write_text("the last run's table\n")

    done = _gpuprobe_try(str(folder), "--device", "cpu", "--budget", "5s", "--output", str(out), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "internal error" not in lines[0]
    assert "SafetensorError" in lines[0] and str(weights) in lines[0]
    assert out.read_text() == "the last run's table\n"  # nothing measured: nothing overwritten


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_forward_that_raises_in_the_third_round_is_models_error_and_the_two_rounds_before_it_are_written(
        tmp_path: Path) -> None:
    factory = tmp_path / "mine.py"
    factory.write_text(_flaky(BASELINE_IN_ROUND_3))
    out = tmp_path / "out.json"
    out.write_text("the last run's result\n")

    done = _gpuprobe_try(f"{factory}:flaky", "--budget", "60s", "--variant", "nothing=pass", "--variants", "nothing",
                         "--format", "json", "--output", str(out), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and "internal error" not in line, line
    raised_at = _line_of(FLAKY, 'raise RuntimeError("the device fell off the bus")')
    for part in ("the baseline's call in round 3", "RuntimeError: the device fell off the bus",
                 f"{factory}:{raised_at}, in forward", f"the 2 rounds measured before it are in {out}"):
        assert part in line, (part, line)
    doc = json.loads(out.read_text())  # the whole document, replacing the old file
    assert doc["fault"]["variant"] == "baseline" and doc["fault"]["round"] == 3
    assert doc["fault"]["error_type"] == "RuntimeError"
    w = doc["workloads"][0]
    assert w["rounds"] == 2 and w["ended_by"] == "fault"
    assert w["baseline"]["figures"]["tokens_per_s"]["n"] == 2
    assert [(v["name"], v["rounds"]) for v in w["variants"]] == [("nothing", 2)]
    assert w["variants"][0]["verdict"] == "too few rounds"
    assert w["no_verdict"] == f"not enough rounds for a verdict: 2 measured before the baseline failed, the rule " \
                              f"needs {MIN_ROUNDS}"


def test_the_rounds_before_models_error_are_shown_as_a_table(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    from gpuprobe.cli import main

    (tmp_path / "mine.py").write_text(_flaky(BASELINE_IN_ROUND_3))
    rc = main(["try", f"{tmp_path / 'mine.py'}:flaky", "--budget", "60s", "--variant", "nothing=pass",
               "--variants", "nothing"])
    out, err = capsys.readouterr()
    assert rc == 2 and "the 2 rounds measured before it are shown above" in err
    assert "Stopped early: the baseline's call in round 3 (prompt 6 tokens × batch 1, 2 new tokens) raised " \
           "RuntimeError: the device fell off the bus" in out
    assert "prompt 6 tokens × batch 1, 2 new tokens (greedy): 2 rounds" in out
    assert re.search(r"^   baseline  \d", out, re.M) and re.search(r"^1  nothing   ", out, re.M), out
    assert "Not enough rounds for a verdict: 2 measured before the baseline failed" in out
    assert "No variant is faster" not in out


def test_a_factory_that_raises_is_models_error_with_its_line(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    from gpuprobe.cli import main

    source = "def broken():\n    return {}['model']\n"
    (tmp_path / "mine.py").write_text(source)
    rc = main(["try", f"{tmp_path / 'mine.py'}:broken", "--budget", "5s"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.strip() == (f"gpuprobe try: error: the factory {tmp_path / 'mine.py'}:broken raised KeyError: "
                           f"'model' (at {tmp_path / 'mine.py'}:2, in broken)")


def test_an_error_in_gpuprobes_own_code_is_still_an_internal_error(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path, monkeypatch: Any) -> None:
    from gpuprobe.cli import main
    from gpuprobe.experiment.measure import Meter

    def broken(self: Any, obs: Any) -> Any:  # a planted bug in gpuprobe's reading of a call's figures
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(Meter, "_figures", broken)
    (tmp_path / "mine.py").write_text(_flaky(10**9))
    rc = main(["try", f"{tmp_path / 'mine.py'}:flaky", "--budget", "10s", "--variants", "processors"])
    _, err = capsys.readouterr()
    assert rc == 1 and "internal error in gpuprobe: ZeroDivisionError: division by zero" in err


def test_an_exception_is_placed_in_the_users_file_and_told_from_gpuprobes(tmp_path: Path) -> None:
    import importlib.util

    import gpuprobe

    source = "import torch\n\ndef forward(x):\n    return torch.matmul(x, x)\n"
    (tmp_path / "theirs.py").write_text(source)
    spec = importlib.util.spec_from_file_location("theirs_for_the_fault_test", tmp_path / "theirs.py")
    assert spec is not None and spec.loader is not None
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    with pytest.raises(RuntimeError) as raised:
        theirs.forward(torch.ones(2, 3))  # the shapes do not multiply: torch raises, from the user's line
    assert user_frame(raised.value) == f"{tmp_path / 'theirs.py'}:4, in forward"
    assert not is_gpuprobes(raised.value)
    with pytest.raises(gpuprobe.ConfigError) as ours:
        gpuprobe.configure(sync_audit="often")
    assert is_gpuprobes(ours.value) and user_frame(ours.value) is not None  # this test's own line calls it
    assert user_frame(ours.value).startswith(f"{__file__}:")


def test_the_python_api_raises_models_error_with_the_rounds_before_it() -> None:
    model = _tiny_llama()
    calls = {"n": 0}
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:  # the user's own forward, failing from the 4th call on
        calls["n"] += 1
        if calls["n"] >= 4:
            raise ValueError("NaN in the logits")
        return original(*args, **kwargs)

    model.forward = forward
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ModelFailed) as failed:
        try_remedies(model, {"input_ids": ids, "max_new_tokens": 1, "do_sample": False}, budget="30s",
                     variants=["processors"])
    fault = failed.value.fault
    # one forward per call: the audited call, the warm-up call, round 1, then round 2's call fails
    assert (fault.variant, fault.round, fault.error_type, fault.message) == ("baseline", 2, "ValueError",
                                                                             "NaN in the logits")
    assert fault.where == f"{__file__}:{forward.__code__.co_firstlineno + 3}, in forward"
    partial = failed.value.partial
    assert partial is not None and partial.fault == fault and partial.workloads[0].rounds == 1
    assert "Stopped early" in render(partial)


# ---------------------------------------------------------------------------------------------- the budget

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_call_slower_than_the_budget_allows_runs_once_and_gives_no_verdict(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    log = tmp_path / "forward.log"

    done = _gpuprobe_try(f"{tmp_path / 'slow.py'}:slow", "--budget", f"{BUDGET_S:g}s", cwd=tmp_path,
                         env={"SLOW_FORWARD_LOG": str(log)})
    ended = time.time()

    assert done.returncode == 0, done.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    made = next(float(t) for what, t in events if what == "made")
    starts = [float(t) for what, t in events if what == "start"]
    ends = [float(t) for what, t in events if what == "end"]
    # the audited call ran; a second 3 s call would not have finished in the 2 s the budget had left
    assert len(starts) == len(ends) == 1, events
    call_s = ends[0] - starts[0]
    assert ended - made <= BUDGET_S + call_s + 2.0  # budget + one call (+ rendering and the interpreter's exit)
    out = done.stdout
    assert f"of a {BUDGET_S:g} s budget" in out and ": 0 rounds" in out
    found = re.search(rf"Not enough rounds for a verdict: 0 measured in the budget, the rule needs {MIN_ROUNDS}; "
                      r"raise --budget \(one round takes ~([\d.]+) s\)\.", out)
    assert found, out
    assert float(found.group(1)) >= SLEEP_S
    assert "No variant is faster" not in out and "Winner" not in out


def test_a_variant_slower_than_the_budget_allows_is_called_once_and_left_out() -> None:
    model = _tiny_llama()
    slow = Variant("slow", "a generate() that sleeps", "import time\n_plain = model.generate\n"
                   "model.slow_calls = 0\n"
                   "def generate(**kwargs):\n"
                   "    model.slow_calls += 1\n"
                   f"    time.sleep({SLEEP_S!r})\n"
                   "    return _plain(**kwargs)\n")
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    result = try_remedies(model, {"input_ids": ids, "max_new_tokens": 1, "do_sample": False}, budget=BUDGET_S,
                          variants=["slow"], extra=[slow], max_rounds=MIN_ROUNDS)
    elapsed = time.perf_counter() - started
    assert model.slow_calls == 1  # its audited call; its warm-up (another 3 s) would outlast the budget
    reasons = {n.name: n.reason for n in result.workloads[0].not_run}
    assert "no time left in the budget for its warm-up" in reasons["slow"]
    assert elapsed <= BUDGET_S + SLEEP_S + 1.0
