"""Continuous batching on a GPU's clock: time to first token and inter-token latency from CUDA events.

What is checked, and against what:

- On the simulated CUDA (``gpuprobe.testing.simcuda``) the GPU runs asynchronously: a forward queues
  its work and returns, the work ends later on the device's clock, and the host waits only where
  transformers waits (a stream synchronization, a copy to the host). Host and device share one
  timeline: the integration's host clock reads the simulation's clock, which moves when the host
  spends time (``sim.advance``) or waits for the device, and the arrivals are set on it.
- Expected values come from the simulation's timeline as the test observes it — when each forward
  was launched, when the GPU reached that launch (after the work queued before it), when it finished
  the forward, when the host held the tokens — and from transformers' own batches (which requests a
  forward carries, and whether it selects a token for each); never from gpuprobe's code.
- The definitions (``docs/serving.md``, "Latencies and their clocks"): the device TTFT is the
  request's wait from its arrival to the launch of its first step's forward (host clock), plus the
  device time from reaching that launch to finishing the forward that selected its first token; the
  device inter-token latency is the device span of a decoding step's forward.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from _servekit import tiny_llama

from gpuprobe.integrations import transformers as hf
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

from helpers import cpu_continuous_batching_cannot_pin, patch_host_clock

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.generation.continuous_batching import input_outputs  # noqa: E402
from transformers.generation.continuous_batching.continuous_api import BackgroundThreadStatus  # noqa: E402
from transformers.generation.continuous_batching.requests import (  # noqa: E402
    FutureRequestState,
    RequestState,
    RequestStatus,
)

MS = 1_000_000
US = 1_000
MODEL = "tiny-cb"
TTFT = "gen_ai.server.time_to_first_token"
ITL = "gpuprobe.inter_token.duration"
STEP = "gpuprobe.step.duration"


def ns(values: list[float]) -> list[int]:
    """Exported seconds back to the integer nanoseconds they were recorded in."""
    return [round(v * 1e9) for v in values]


@pytest.fixture(autouse=True)
def _simcuda_installed_after_isolation(simcuda):  # type: ignore[no-untyped-def]
    yield  # tests call simcuda(...) themselves; this orders its teardown before the module's fixtures


@pytest.fixture
def model() -> Any:
    m = hf.instrument(tiny_llama(), model_name=MODEL)
    yield m
    hf.uninstrument(m)


@dataclasses.dataclass
class Forward:
    """One forward of the loop as the simulated GPU ran it (all times on the simulation's clock)."""

    batch: list[tuple[str, bool]]  # (request id, whether this forward selects a token for it)
    launched: int  # the host launched the forward
    reached: int  # the GPU reached that launch (after the work queued before it)
    ended: int = 0  # the GPU finished the forward (its tokens exist on the device)
    held: int = 0  # the host holds its tokens (end of the update that reads them)


class Timeline:
    """The forwards in order, and the arrivals; what a request's latencies are, read from them."""

    def __init__(self) -> None:
        self.forwards: list[Forward] = []
        self.arrivals: dict[str, int] = {}
        self.busy = 0  # the end of the last work queued on the stream
        self.syncs_before = -1  # the host's synchronizations before the first forward
        self.batch: Any = None  # () -> the running batch: (request id, selects a token, query tokens)

    def first_step(self, rid: str) -> int:
        return next(k for k, f in enumerate(self.forwards) if any(r == rid for r, _ in f.batch))

    def first_token_step(self, rid: str) -> int:
        return next(k for k, f in enumerate(self.forwards) if (rid, True) in f.batch)

    def decoding_steps(self) -> list[int]:
        """Forwards that select a next token for a request that already had its first one."""
        return [k for k, f in enumerate(self.forwards)
                if any(tok and self.first_token_step(r) < k for r, tok in f.batch)]

    def next_tokens(self) -> list[tuple[int, str]]:
        """(forward, request) for each token after a request's first: one inter-token sample each."""
        return [(k, r) for k, f in enumerate(self.forwards) for r, tok in f.batch
                if tok and self.first_token_step(r) < k]

    def host_gaps(self, rid: str) -> list[int]:
        """The times between the moments the host held consecutive tokens of ``rid``."""
        held = [f.held for f in self.forwards if (rid, True) in f.batch]
        return [b - a for a, b in zip(held, held[1:])]

    def device_ttft(self, rid: str) -> int:
        s, f = self.first_step(rid), self.first_token_step(rid)
        return (self.forwards[s].launched - self.arrivals[rid]) + (self.forwards[f].ended - self.forwards[s].reached)

    def device_span(self, k: int) -> int:
        return self.forwards[k].ended - self.forwards[k].reached


def _arrive(manager: Any, sim: Any, timeline: Timeline, rid: str, ids: list[int], new: int) -> None:
    """``add_request``, with the request's arrival set on the simulation's clock."""
    manager.add_request(ids, request_id=rid, max_new_tokens=new)
    state = next(s for s in manager.input_queue.queue if s.request_id == rid)
    timeline.arrivals[rid] = sim.now_ns(0)
    state.created_time = timeline.arrivals[rid] / 1e9


def on_simulated_gpu(simcuda: Any, monkeypatch: pytest.MonkeyPatch, model: Any, *, base: int, per_token: int,
                     launch: int, copy: int) -> tuple[Any, Timeline]:
    """Run continuous batching of ``model`` as on a simulated cuda:0 in transformers' synchronous mode:
    each forward queues ``base + per_token × tokens`` ns of GPU work and takes the host ``launch`` ns to
    issue; the step then waits for the compute stream, and the update copies the tokens to the host
    (``copy`` ns) and waits for them, as ``ContinuousBatchingIOs`` does on a GPU."""
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()  # the program has initialized CUDA
    patch_host_clock(monkeypatch, "gpuprobe.integrations._transformers.continuous", lambda: sim.now_ns(0))
    # A CPU build of torch cannot pin host memory; transformers pins its host buffers when it sees a GPU.
    monkeypatch.setattr(input_outputs, "get_available_devices", lambda: ("cpu",))
    timeline = Timeline()
    io = input_outputs.ContinuousBatchingIOs
    read_tokens = io.prepare_batch_update

    def forward_kernels(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if timeline.syncs_before < 0:
            timeline.syncs_before = sim.stats.host_syncs
        batch = timeline.batch()
        t = sim.now_ns(0)
        work = sim.launch(base + per_token * sum(q for _, _, q in batch))
        timeline.forwards.append(Forward([(r, tok) for r, tok, _ in batch], launched=t, reached=max(t, timeline.busy)))
        timeline.busy = work.end_ns
        sim.advance(launch)  # the host issues the kernels while the GPU runs

    def retrieve_device_outputs(self: Any) -> None:
        torch.cuda.current_stream(0).synchronize()  # compute_stream.synchronize()
        timeline.forwards[-1].ended = sim.now_ns(0)

    def prepare_batch_update(self: Any) -> Any:
        sim.memcpy_and_sync(ns=copy)  # output_ids.tolist(): a copy to the host, waited for
        timeline.busy = timeline.forwards[-1].held = sim.now_ns(0)
        return read_tokens(self)

    monkeypatch.setattr(io, "retrieve_device_outputs", retrieve_device_outputs)
    monkeypatch.setattr(io, "prepare_batch_update", prepare_batch_update)
    model.register_forward_hook(forward_kernels, with_kwargs=True)
    return sim, timeline


def _manager(model: Any, timeline: Timeline, *, new: int, max_batch_tokens: int) -> Any:
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=max_batch_tokens)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    # What the forward hook reads: the requests of the batch being run, as transformers prepared them.
    timeline.batch = lambda: [(fs.state.request_id, fs.has_new_token, fs.query_length)
                              for fs in manager.batch_processor.inputs_and_outputs.requests_in_batch]
    return manager


def _stop_when_done(manager: Any) -> None:
    """The loop stops once every request it has is done (no request is accepted after this)."""
    manager.background_thread_status.request_stop(BackgroundThreadStatus.FLUSH_AND_STOP, 0)


def _run_loop(manager: Any) -> None:
    """The manager's generation loop, on this thread (deterministic), until a stop asked for is done."""
    # transformers >= 5.24 passes use_inference_mode; earlier 5.x take no argument.
    loop = type(manager)._run_generation_loop
    takes_mode = "use_inference_mode" in inspect.signature(loop).parameters
    manager._run_generation_loop(**({"use_inference_mode": True} if takes_mode else {}))


def test_device_ttft_and_inter_token_latency_follow_the_gpus_timeline(
        simcuda: Any, monkeypatch: pytest.MonkeyPatch, model: Any) -> None:
    """Three requests: ``a`` prefilled in one step; ``b``, whose prompt is split over two steps (16 tokens
    a step); ``late``, which arrives while the second forward runs and joins the decoding ones."""
    C = 20 * US
    sim, timeline = on_simulated_gpu(simcuda, monkeypatch, model, base=2 * MS, per_token=50 * US, launch=300 * US,
                                     copy=C)
    manager = _manager(model, timeline, new=4, max_batch_tokens=16)
    late_joined = []

    def arrive_late(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if len(timeline.forwards) == 2 and not late_joined:
            late_joined.append(True)
            _arrive(manager, sim, timeline, "late", [5, 6, 7, 8], new=3)
            _stop_when_done(manager)

    model.register_forward_hook(arrive_late, with_kwargs=True)
    with InMemoryExporter() as exp:
        _arrive(manager, sim, timeline, "a", [3, 4, 5, 6, 7], new=4)
        sim.advance(700 * US)
        _arrive(manager, sim, timeline, "b", list(range(10, 30)), new=4)
        sim.advance(1 * MS)
        _run_loop(manager)
        syncs = sim.stats.host_syncs - timeline.syncs_before
        sim.finish()
        forwards = timeline.forwards
        assert timeline.first_step("b") == 0 and timeline.first_token_step("b") == 1  # its prompt was split
        assert timeline.first_step("late") == timeline.first_token_step("late") == 2
        rids = ("a", "b", "late")
        assert sorted(ns(exp.values(TTFT, clock="device"))) == sorted(timeline.device_ttft(r) for r in rids)
        # The host's TTFT runs to the end of the update that read the token; the device's to the GPU's end of
        # the forward that selected it, which the host then waited for: here they differ by the copy.
        held = {r: forwards[timeline.first_token_step(r)].held - timeline.arrivals[r] for r in rids}
        assert sorted(ns(exp.values(TTFT, clock="host"))) == sorted(held.values())
        assert all(held[r] - timeline.device_ttft(r) == C for r in rids)
        decoding = timeline.decoding_steps()
        assert len(decoding) >= 3
        # One sample per request and token after its first: the device span of the forward that selected
        # it, and on the host the time since the host held that request's previous token.
        tokens = timeline.next_tokens()
        assert len(tokens) == (4 - 1) + (4 - 1) + (3 - 1)  # each request's output tokens less its first
        assert sorted(ns(exp.values(ITL, clock="device"))) == sorted(timeline.device_span(k) for k, _ in tokens)
        assert sorted(ns(exp.values(ITL, clock="host"))) == sorted(g for r in rids for g in timeline.host_gaps(r))
        assert ns(exp.values(STEP, clock="device")) == [timeline.device_span(k) for k in range(len(forwards))]
    # The host waited only where transformers waits: once for the compute stream and once for the copy, per step.
    assert syncs == 2 * len(forwards)
    assert runtime().backends.device_clock.in_flight == 0  # every event read and given back


def test_the_first_token_of_a_one_token_request_is_counted_once_on_each_clock(
        simcuda: Any, monkeypatch: pytest.MonkeyPatch, model: Any) -> None:
    """Its first token is also its last: the update delivers it, and gpuprobe sees it finish there."""
    sim, timeline = on_simulated_gpu(simcuda, monkeypatch, model, base=3 * MS, per_token=0, launch=100 * US,
                                     copy=10 * US)
    manager = _manager(model, timeline, new=1, max_batch_tokens=64)
    with InMemoryExporter() as exp:
        _arrive(manager, sim, timeline, "a", [3, 4, 5, 6], new=1)
        _arrive(manager, sim, timeline, "b", [7, 8, 9], new=1)
        _stop_when_done(manager)
        _run_loop(manager)
        sim.finish()
        assert len(timeline.forwards) == 1
        assert ns(exp.values(TTFT, clock="device")) == [timeline.device_ttft("a"), timeline.device_ttft("b")]
        assert len(exp.values(TTFT, clock="host")) == 2
        assert exp.values(ITL) == []
    assert runtime().backends.device_clock.in_flight == 0


def test_on_the_cpu_there_is_no_device_sample(model: Any) -> None:
    reason = cpu_continuous_batching_cannot_pin()  # the tests above tell transformers there is no accelerator
    if reason:
        pytest.skip(reason)
    gen = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=64)
    with InMemoryExporter() as exp:
        model.generate_batch([[3, 4, 5], [6, 7, 8, 9]], generation_config=gen, continuous_batching_config=cfg)
        assert len(exp.values(TTFT, clock="host")) == 2 and len(exp.values(ITL, clock="host")) >= 3
        assert exp.values(TTFT, clock="device") == exp.values(ITL, clock="device") == []
        assert exp.values(STEP, clock="device") == []


# -- asynchronous batching: the update of a turn reads the previous forward's tokens -------------------

class _Obj:
    """Attributes given as keywords (stands in for transformers' continuous-batching objects)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class AsyncProcessor:
    """Stands in for a ``ContinuousBatchProcessor`` with ``ContinuousBatchingAsyncIOs`` on a simulated GPU:
    the forward is queued on the compute stream, the copy of its tokens on a copy stream that waits for
    it, and the host goes on; the update of a turn waits for the previous forward's copy, then hands
    that forward's tokens over.

    ``plan[k]``: the requests of forward k as (request id, prompt tokens it carries, whether it selects a
    token). Requests arrive when the test says; the scheduler takes what ``plan`` says."""

    def __init__(self, sim: Any, plan: list[list[tuple[str, int, bool]]], *, work: int, launch: int, copy: int,
                 states: dict[str, RequestState]) -> None:
        self.sim, self.plan, self.work, self.launch, self.copy = sim, plan, work, launch, copy
        self.states = states
        self.compute, self.d2h = torch.cuda.Stream(0), torch.cuda.Stream(0)
        self.turn = -1
        self.batches: list[list[Any]] = []
        self.copies: list[Any] = []
        self.timeline = Timeline()
        self.scheduler = _Obj(active_requests=states, waiting_requests={}, schedule_batch=self._schedule,
                              set_request_cancellation=lambda request_id: None)
        pool = _Obj(free_sectors=[1, 2], count_free_blocks=lambda index: 0)
        self.cache = _Obj(pool=pool, num_sectors=4, bytes_per_sector=64, num_blocks=4,
                          cache_allocators={"full": _Obj(index=0, bytes_per_block=64, ledger=None)})
        self.model_device = torch.device("cuda", 0)
        self.inputs_and_outputs = _Obj(compute_stream=self.compute)

    def _schedule(self, *args: Any) -> tuple[list[Any], bool, int, int]:
        batch = []
        for rid, prompt_tokens, token in self.plan[self.turn]:
            state = self.states[rid]
            q = prompt_tokens or 1
            state.position_offset += q
            batch.append(FutureRequestState(state, token, {}, q))
        self.batches.append(batch)
        return batch, False, sum(fs.query_length for fs in batch), 0

    def prepare_next_batch(self) -> bool:
        self.turn += 1
        if self.turn >= len(self.plan):
            return False
        self.scheduler.schedule_batch(64, 0)
        return True

    def _generation_step(self, model: Any) -> None:
        sim, timeline = self.sim, self.timeline
        t = sim.now_ns(0)
        batch = self.batches[-1]
        reached = max(t, timeline.busy)
        forward = sim.launch(self.work, "forward", stream=self.compute)
        compute_over, d2h_over = torch.cuda.Event(), torch.cuda.Event()
        self.compute.record_event(compute_over)
        self.d2h.wait_event(compute_over)
        sim.launch(self.copy, "Memcpy DtoH (Device -> Pinned)", stream=self.d2h, kind="gpu_memcpy")
        self.d2h.record_event(d2h_over)
        self.copies.append(d2h_over)
        timeline.busy = forward.end_ns
        timeline.forwards.append(Forward([(fs.state.request_id, fs.has_new_token) for fs in batch], launched=t,
                                         reached=reached, ended=forward.end_ns))
        sim.advance(self.launch)  # issuing the forward; the GPU runs on

    def update_batch(self) -> None:
        k = len(self.copies) - 2  # the previous forward's tokens
        self.copies[k].synchronize()  # d2h_over.synchronize()
        self.timeline.forwards[k].held = self.sim.now_ns(0)
        for fs in self.batches[k]:
            if fs.has_new_token:
                fs.state.generated_tokens.append(7)
                fs.state._status = RequestStatus.DECODING

    def last_update(self) -> None:
        """After the loop: the last forward's tokens (transformers switches the IO pair and updates once more)."""
        self.copies.append(None)
        self.update_batch()


def test_with_asynchronous_batching_the_first_token_is_confirmed_a_turn_later(
        simcuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The update of a turn reads the previous forward's tokens; a forward launched while the previous one
    still runs is reached by the GPU only after it, and that wait is in neither part of the device TTFT."""
    from gpuprobe.integrations._transformers.continuous import ServingState
    from gpuprobe.integrations._transformers.series import RequestSeries

    W, L, C = 4 * MS, 300 * US, 20 * US
    sim = simcuda(1)
    torch.cuda.current_device()
    patch_host_clock(monkeypatch, "gpuprobe.integrations._transformers.continuous", lambda: sim.now_ns(0))
    states = {rid: RequestState(request_id=rid, initial_tokens=[3] * n, max_new_tokens=100)
              for rid, n in (("a", 6), ("b", 5))}
    plan = [[("a", 6, True)], [("a", 0, True)], [("a", 0, True), ("b", 5, True)], [("a", 0, True), ("b", 0, True)]]
    bp = AsyncProcessor(sim, plan, work=W, launch=L, copy=C, states=states)
    timeline = bp.timeline
    router = _Obj(deliver=lambda output: None, deliver_batch=lambda outputs: None)
    manager = _Obj(output_router=router, _create_batch_processor=lambda: bp, _run_generation_loop=lambda: None)
    serving = ServingState(runtime(), MODEL, RequestSeries(runtime(), MODEL))
    serving.observe(manager)
    loop = manager._gpuprobe_loop
    with InMemoryExporter() as exp:
        timeline.arrivals["a"] = sim.now_ns(0)
        states["a"].created_time = timeline.arrivals["a"] / 1e9
        manager._create_batch_processor()
        loop.begin()
        bp.prepare_next_batch()  # the bootstrap turn: a forward, no update
        bp._generation_step(None)
        for turn in range(1, len(plan)):
            if turn == 2:  # b arrives while forward 1 runs; the loop takes it in at its next preparation
                sim.advance(100 * US)
                timeline.arrivals["b"] = sim.now_ns(0)
                states["b"].created_time = timeline.arrivals["b"] / 1e9
                sim.advance(50 * US)
            assert bp.prepare_next_batch()
            bp._generation_step(None)
            if turn == 1:
                # Forward 0 is done on the GPU, but no update has read its token yet: its step is timed,
                # its device TTFT waits for the update that confirms the token was the request's first.
                sim.advance(5 * MS)
                assert len(exp.values(STEP, clock="device")) == 1
                assert exp.values(TTFT, clock="device") == []
            bp.update_batch()
        bp.last_update()
        loop.end()
        sim.finish()
        forwards = timeline.forwards
        # b's forward (2) was launched while forward 1 still ran: the GPU reached it only after that one.
        assert forwards[2].reached > forwards[2].launched
        assert ns(exp.values(TTFT, clock="device")) == [timeline.device_ttft("a"), timeline.device_ttft("b")]
        assert timeline.device_ttft("b") < forwards[2].ended - timeline.arrivals["b"]
        assert ns(exp.values(TTFT, clock="host")) == [forwards[0].held - timeline.arrivals["a"],
                                                      forwards[2].held - timeline.arrivals["b"]]
        # a's next tokens come from forwards 1, 2 and 3, b's from forward 3
        assert sorted(ns(exp.values(ITL, clock="device"))) == sorted(timeline.device_span(k) for k in (1, 2, 3, 3))
        assert sorted(ns(exp.values(ITL, clock="host"))) == sorted(timeline.host_gaps("a") + timeline.host_gaps("b"))
        assert len(exp.values(ITL, clock="host")) == 4
    assert sim.stats.host_syncs == len(plan)  # the updates' waits for the copies, and nothing else
    assert runtime().backends.device_clock.in_flight == 0
    serving.close()


def test_a_request_that_never_gets_its_first_token_gives_its_events_back(simcuda: Any) -> None:
    """A prompt split over steps holds an open event from its first forward; the loop ends before its last chunk."""
    from gpuprobe.integrations._transformers.continuous import ServingState
    from gpuprobe.integrations._transformers.series import RequestSeries

    sim = simcuda(1)
    torch.cuda.current_device()
    states = {"long": RequestState(request_id="long", initial_tokens=[3] * 40, max_new_tokens=4)}
    plan = [[("long", 16, False)], [("long", 16, False)]]
    bp = AsyncProcessor(sim, plan, work=1 * MS, launch=100 * US, copy=10 * US, states=states)
    manager = _Obj(output_router=_Obj(deliver=lambda output: None, deliver_batch=lambda outputs: None),
                   _create_batch_processor=lambda: bp, _run_generation_loop=lambda: None)
    serving = ServingState(runtime(), MODEL, RequestSeries(runtime(), MODEL))
    serving.observe(manager)
    loop = manager._gpuprobe_loop
    clock = runtime().backends.device_clock
    with InMemoryExporter() as exp:
        manager._create_batch_processor()
        loop.begin()
        bp.prepare_next_batch()
        bp._generation_step(None)
        bp.prepare_next_batch()
        bp._generation_step(None)
        bp.update_batch()
        assert clock.in_flight > 0
        loop.end()
        sim.finish()
        assert exp.values(TTFT) == []
        assert len(exp.values(STEP, clock="device")) == 2
    assert clock.in_flight == 0
    serving.close()
