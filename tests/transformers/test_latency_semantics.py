"""Time to first token, inter-token latency and time per output token of generate(), on both clocks.

What is checked, and against what:

- On the simulated CUDA (``gpuprobe.testing.simcuda``) the GPU runs asynchronously: work queued by the
  forward ends later on the device's clock, and the host waits only where transformers' stop check
  waits (a copy to the host). Host and device share one timeline here: the integration's host clock
  reads the simulation's clock, which moves when the host spends time (``sim.advance``) or waits for
  the device. Expected values follow from the work queued (prefill, decode, copy) by hand.
- On the CPU, with transformers' deferred stop check forced on, expected values come from the moments
  a streamer (the client) receives each token, on a host clock the test moves in a logits processor.
- The time per output token is checked against the exported request duration and TTFT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

from gpuprobe.integrations.transformers import instrument
from gpuprobe.testing import InMemoryExporter
from helpers import patch_host_clock

MS = 1_000_000
US = 1_000
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
ITL = "gpuprobe.inter_token.duration"
REQUEST = "gen_ai.server.request.duration"
STEP = "gpuprobe.step.duration"
GENERATE = "gpuprobe.integrations._transformers.generate"  # the modules whose host clock the tests set

utils = transformers.generation.utils


def ns(values: list[float]) -> list[int]:
    """Exported seconds back to the integer nanoseconds they were recorded in."""
    return [round(v * 1e9) for v in values]


class CpuEvent:
    """``torch.Event`` for the CPU, where the deferred stop check's events have nothing to wait for
    (torch refuses CPU events: "cpu backend doesn't support events")."""

    def __init__(self, device: Any = None, blocking: bool = False, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def force_deferred_stop_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.23 defers its stop check on mps only; make it do so here, as it plans to on CUDA."""
    monkeypatch.setattr(utils.DeferredStopCheck, "is_supported", staticmethod(lambda *args, **kwargs: True))
    monkeypatch.setattr(torch, "Event", CpuEvent)


def first_eos(model: Any, ids: Any, at_least: int) -> tuple[int, int]:
    """A token the model generates greedily (uninstrumented) for the first time at index >= ``at_least``
    of its output: (token id, index). Used as the EOS token, generation stops right after it."""
    out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    for i in range(at_least, len(out)):
        if out[i] not in out[:i]:
            return out[i], i
    raise AssertionError(f"no new token after index {at_least} in {out}")


# -- (a) an asynchronous device: the simulated CUDA ------------------------------------------------

@pytest.fixture(autouse=True)
def _simcuda_installed_after_isolation(simcuda):  # type: ignore[no-untyped-def]
    yield  # tests call simcuda(...) themselves; this orders its teardown before the module's fixtures


def on_simulated_gpu(simcuda, monkeypatch, model, *, prefill: int, decode: int, launch: int,  # type: ignore[no-untyped-def]
                     copy: int) -> Any:
    """Run ``model`` on a simulated cuda:0: each forward queues ``prefill`` or ``decode`` ns of GPU work
    and takes the host ``launch`` ns to issue; transformers' stop checks copy to the host (``copy`` ns)
    and wait as they do on a GPU. The integration's host clock is the simulation's clock."""
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()  # the program has initialized CUDA
    patch_host_clock(monkeypatch, GENERATE, lambda: sim.now_ns(0))

    def forward_kernels(module, args, kwargs, output):  # type: ignore[no-untyped-def]
        ids = kwargs.get("input_ids")
        sim.launch(prefill if ids is not None and ids.shape[1] > 1 else decode)
        sim.advance(launch)  # the host issues the kernels while the GPU runs

    model.register_forward_hook(forward_kernels, with_kwargs=True)

    every_step, deferred_call, deferred_finish = (utils.StopCheck.__call__, utils.DeferredStopCheck.__call__,
                                                  utils.DeferredStopCheck.finish)

    def stop_check(self, unfinished, tokens, length):  # type: ignore[no-untyped-def]
        sim.memcpy_and_sync(ns=copy)  # bool(unfinished.max() == 0): a copy to the host, waited for
        return every_step(self, unfinished, tokens, length)

    def deferred_stop_check(self, unfinished, tokens, length):  # type: ignore[no-untyped-def]
        sim.launch(copy, "Memcpy DtoH (Device -> Pinned)", kind="gpu_memcpy")  # not waited for
        done = torch.cuda.Event()
        done.record()
        copies = self.__dict__.setdefault("_sim_copies", [])
        copies.append(done)
        if len(copies) > 1:
            copies[-2].synchronize()  # the previous step's flag and tokens: the host waits for those
        return deferred_call(self, unfinished, tokens, length)

    def finish(self):  # type: ignore[no-untyped-def]
        for done in self.__dict__.get("_sim_copies", [])[-2:]:  # both slots, as finish() does
            done.synchronize()
        return deferred_finish(self)

    monkeypatch.setattr(utils.StopCheck, "__call__", stop_check)
    monkeypatch.setattr(utils.DeferredStopCheck, "__call__", deferred_stop_check)
    monkeypatch.setattr(utils.DeferredStopCheck, "finish", finish)
    return sim


def test_host_ttft_includes_the_wait_behind_earlier_gpu_work_and_device_ttft_does_not(
        simcuda, monkeypatch, make_model) -> None:  # type: ignore[no-untyped-def]
    P, D, L, C, W = 30 * MS, 4 * MS, 100 * US, 10 * US, 50 * MS
    model = make_model("llama")
    sim = on_simulated_gpu(simcuda, monkeypatch, model, prefill=P, decode=D, launch=L, copy=C)
    instrument(model, model_name="m")
    with InMemoryExporter() as exp:
        sim.launch(W, "earlier work")  # queued before the call (another request, a copy): the GPU is busy
        start = sim.now_ns(0)
        model.generate(prompt(), max_new_tokens=5, min_new_tokens=5, do_sample=False)
        sim.finish()
        # The stop check waits for step 0's token: the host has it once the earlier work, the prefill and
        # the copy are done. The device counts from the moment it reached the call's start.
        assert ns(exp.values(TTFT, clock="host")) == [W - start + P + C]
        assert ns(exp.values(TTFT, clock="device")) == [P + C]
        # Every step waits for its token: both clocks see the GPU's decode step and the copy, per token.
        assert ns(exp.values(ITL, clock="host")) == [D + C] * 4
        assert ns(exp.values(ITL, clock="device")) == [D + C] * 4
        assert ns(exp.values(TPOT)) == [D + C]


def test_deferred_stop_check_the_host_holds_each_token_one_step_later(
        simcuda, monkeypatch, make_model) -> None:  # type: ignore[no-untyped-def]
    P, D, L, C = 30 * MS, 4 * MS, 500 * US, 10 * US
    force_deferred_stop_check(monkeypatch)
    model = make_model("llama")
    sim = on_simulated_gpu(simcuda, monkeypatch, model, prefill=P, decode=D, launch=L, copy=C)
    instrument(model, model_name="m")
    with InMemoryExporter() as exp:
        model.generate(prompt(), max_new_tokens=5, min_new_tokens=5, do_sample=False)
        sim.finish()
        steps = exp.values(STEP, clock="host")
        # Step 0 ended after the host had issued the prefill (L), long before the GPU selected the token:
        # the host first holds it in step 1, when it waits for step 0's copy.
        assert ns(steps)[0] == L
        assert ns(exp.values(TTFT, clock="host")) == [P + C]
        assert ns(exp.values(TTFT, clock="device")) == [P + C]
        # Token k reaches the host in step k + 1 (the last one in finish()): one decode step and a copy apart.
        assert ns(exp.values(ITL, clock="host")) == [D + C] * 4
        assert ns(exp.values(ITL, clock="device")) == [D + C] * 4
        assert ns(exp.values(TPOT)) == [D + C]
    assert sim.stats.host_syncs == 4 + 2  # the check's waits in steps 1-4 and in finish(): none added


def test_deferred_stop_check_the_step_undone_after_eos_has_no_inter_token_sample(
        simcuda, monkeypatch, make_model) -> None:  # type: ignore[no-untyped-def]
    P, D, L, C = 30 * MS, 4 * MS, 500 * US, 10 * US
    model = make_model("llama")
    eos, index = first_eos(model, prompt(), at_least=2)
    force_deferred_stop_check(monkeypatch)
    sim = on_simulated_gpu(simcuda, monkeypatch, model, prefill=P, decode=D, launch=L, copy=C)
    instrument(model, model_name="m")
    with InMemoryExporter() as exp:
        out = model.generate(prompt(), max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
        sim.finish()
        n_out = out.shape[1] - prompt().shape[1]
        assert n_out == index + 1 and out[0, -1] == eos
        # One more step ran (the stop flag is read a step late) and was undone: a step, not a token.
        assert len(exp.values(STEP, phase="decode", clock="device")) == n_out
        assert ns(exp.values(ITL, clock="device")) == [D + C] * (n_out - 1)
        assert ns(exp.values(ITL, clock="host")) == [D + C] * (n_out - 1)
        assert ns(exp.values(TTFT, clock="host")) == [P + C]
        (duration,) = ns(exp.values(REQUEST))
        assert ns(exp.values(TPOT)) == [(duration - (P + C)) // (n_out - 1)]


# -- (b) the deferred stop check on the CPU, against what a streamer receives ----------------------

class HostClock:
    """The integration's host clock, moved by the test only: ``advance`` in a logits processor."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class StepTime:
    """A logits processor that makes each step take a known, different time on the host clock."""

    def __init__(self, clock: HostClock, times: Callable[[int], int]) -> None:
        self.clock = clock
        self.times = times
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.clock.now += self.times(self.calls)
        self.calls += 1
        return scores


class Arrivals:
    """A streamer recording when each generated token reaches it (the prompt's put is skipped)."""

    def __init__(self, clock: HostClock) -> None:
        self.clock = clock
        self.times: list[int] = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(self.clock.now)  # one token per put (a batch of one)

    def end(self) -> None:
        pass


def step_times(i: int) -> int:
    return 20 * MS if i == 0 else (2 + i % 3) * MS  # a slow prefill, then decode steps of 3, 4, 2, 3, ... ms


@pytest.mark.parametrize("stop", ["length", "eos"])
@pytest.mark.parametrize("deferred", [False, True], ids=["stop-check-every-step", "deferred-stop-check"])
def test_latencies_follow_what_a_streamer_receives(monkeypatch, make_model, deferred: bool, stop: str) -> None:
    model = make_model("llama")
    ids = prompt()
    limits: dict[str, Any] = dict(max_new_tokens=6, min_new_tokens=6, eos_token_id=None)
    if stop == "eos":
        eos, index = first_eos(model, ids, at_least=2)
        limits = dict(max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    if deferred:
        force_deferred_stop_check(monkeypatch)
    clock = HostClock()
    patch_host_clock(monkeypatch, GENERATE, clock)
    instrument(model, model_name="m")
    timed = StepTime(clock, step_times)
    client = Arrivals(clock)
    with InMemoryExporter() as exp:
        start = clock.now
        out = model.generate(ids, do_sample=False, streamer=client,
                             logits_processor=transformers.LogitsProcessorList([timed]), **limits)
        end = clock.now
    n_out = out.shape[1] - ids.shape[1]
    assert n_out == (index + 1 if stop == "eos" else 6) and len(client.times) == n_out
    # With the deferred check, the step after the EOS token ran and was undone: one step more than tokens.
    assert timed.calls == n_out + (deferred and stop == "eos")
    arrivals = client.times
    if deferred:  # each token reached the client one step after the step that selected it
        assert arrivals[0] == step_times(0) + step_times(1)
    assert ns(exp.values(TTFT, clock="host")) == [arrivals[0] - start]
    assert ns(exp.values(ITL, clock="host")) == [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert ns(exp.values(REQUEST)) == [end - start]
    assert ns(exp.values(TPOT)) == [(end - start - (arrivals[0] - start)) // (n_out - 1)]
    assert exp.values(TTFT, clock="device") == exp.values(ITL, clock="device") == []  # the CPU has one clock


@pytest.mark.parametrize("deferred", [False, True], ids=["stop-check-every-step", "deferred-stop-check"])
def test_a_one_token_request_has_a_ttft_and_no_time_per_output_token(monkeypatch, make_model, deferred: bool) -> None:
    if deferred:
        force_deferred_stop_check(monkeypatch)
    clock = HostClock()
    patch_host_clock(monkeypatch, GENERATE, clock)
    model = instrument(make_model("llama"), model_name="m")
    client = Arrivals(clock)
    with InMemoryExporter() as exp:
        model.generate(prompt(), max_new_tokens=1, do_sample=False, streamer=client,
                       logits_processor=transformers.LogitsProcessorList([StepTime(clock, step_times)]))
    assert len(client.times) == 1
    assert ns(exp.values(TTFT, clock="host")) == [client.times[0]] == [step_times(0)]
    assert exp.values(ITL) == exp.values(TPOT) == []


# -- (c) time per output token: one sample per successful request ----------------------------------

class Raise:
    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("processor failed")
        return scores


def test_time_per_output_token_is_duration_minus_ttft_over_the_tokens_after_the_first(make_model) -> None:
    model = instrument(make_model("llama"), model_name="m")
    tokens = (5, 1, 2, 8)
    with InMemoryExporter() as exp:
        outs = [model.generate(prompt(), max_new_tokens=n, min_new_tokens=n, do_sample=False) for n in tokens]
        with pytest.raises(RuntimeError, match="processor failed"):
            model.generate(prompt(), max_new_tokens=6, min_new_tokens=6,
                           logits_processor=transformers.LogitsProcessorList([Raise(at=4)]))
        durations = ns([o.value for o in exp.observations(REQUEST) if "error.type" not in o.attrs])
        ttfts = ns(exp.values(TTFT, clock="host"))
        tpots = ns(exp.values(TPOT))
    assert [o.shape[1] - prompt().shape[1] for o in outs] == list(tokens)
    assert len(durations) == 4 and len(ttfts) == 5  # the failed call had its first token
    want = [(d - t) // (n - 1) for d, t, n in zip(durations, ttfts, tokens) if n > 1]
    assert tpots == want and len(tpots) == 3  # none for the one-token request, none for the failed one


def test_a_batch_is_one_request_whose_tokens_are_counted_per_sequence(make_model) -> None:
    model = instrument(make_model("llama"), model_name="m")
    with InMemoryExporter() as exp:
        out = model.generate(prompt(batch=3), max_new_tokens=4, min_new_tokens=4, do_sample=False)
        (duration,) = ns(exp.values(REQUEST))
        (ttft,) = ns(exp.values(TTFT, clock="host"))
        assert ns(exp.values(TPOT)) == [(duration - ttft) // (4 - 1)]
        assert len(exp.values(ITL, clock="host")) == 3  # one per decode step, whatever the batch size
    assert out.shape == (3, prompt().shape[1] + 4)
