"""A generation workload for the monitoring tests: serves gpuprobe's /metrics and generates until stopped.

Modes:

- default: a tiny Llama built from a config (no download), instrumented with
  ``gpuprobe.integrations.transformers.instrument(model, layers=True)``, generating with sampling and a
  repetition penalty. Every few calls it also makes calls that fail (a token id past the vocabulary),
  inside a probe, so the error panels have real errors; and it pushes OTLP to a port nobody listens on,
  so the telemetry-drop panel has real drops (``otlp_export_failed``). Kernel sampling is on
  (``kernel_sampling``), which on a CPU categorizes the profiled step's operators. Peak bandwidth and
  FLOP/s are given, so the step's MBU and MFU are exported on the CPU. The sync audit counts one step
  in 4 (on a CPU: what would synchronise on a GPU, e.g. transformers' stop check). Every few calls it
  also runs continuous batching (``generate_batch``) with a KV cache too small for its requests, so
  the serving panels have queued, waiting and preempted requests, and speculative decoding (a draft
  model, and prompt lookup), so the speculative-decoding panels have drafts, accepted tokens and their
  draft and verification times. Service-level goals are set, so the goal panels count its requests.
  Every few calls it also runs a tiny Stable Diffusion pipeline built from configs
  (tests/diffusers/_pipes.py), instrumented with ``gpuprobe.integrations.diffusers.instrument(pipe)``, so the
  diffusion panels have denoising steps, their components, images and syncs.
- ``--distributed``: the same under torchrun: ``init_process_group("gloo")``, one all-reduce per
  call, /metrics on ``--port`` + ``LOCAL_RANK`` (gpuprobe's own rule).
- ``--gpu-fixture``: no model; pushes synthetic values through gpuprobe's real runtime for the series
  only a GPU produces (device-clock step times, time to first token and inter-token latency, the
  caching allocator's reserved memory), labelled as a GPU run would label them, and reads the GPU
  health gauges with the real NVML sampler from a simulated NVML of two GPUs
  (gpuprobe.testing.simnvml). The GPU-only panels are checked against this process.

Stops on SIGTERM/SIGINT or after ``--seconds``. Prints one line ``serving <url>`` once /metrics is up.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import sys
import threading
from typing import Any

import gpuprobe
from gpuprobe.runtime import runtime

MODEL_NAME = "tiny-llama"
PIPELINE_NAME = "tiny-sd"


def _closed_port() -> int:
    """A local port with nothing listening on it (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_event(seconds: float) -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    return stop


def _simulated_nvml() -> Any:
    """Two GPUs with GPM for the GPU health gauges (a simulated NVML: no GPU or driver here), the second
    throttling."""
    from gpuprobe.testing.simnvml import REASON_BITS, SimGpu, SimulatedNvml

    gpus = [SimGpu(uuid=f"GPU-{i}0000000-1111-2222-3333-444455556666", pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                   memory_used=(20 + 30 * i) * 2**30, clocks_event_reasons=REASON_BITS["SwPowerCap"] * i, gpm=True)
            for i in range(2)]
    return SimulatedNvml(gpus)


def _gpu_fixture(args: argparse.Namespace, stop: threading.Event) -> None:
    # The simulated GPUs are this process's (the monitoring tests hide real ones: CUDA_VISIBLE_DEVICES="").
    # Nothing here imports torch, so only the NVML sampler reads the variable.
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    with _simulated_nvml().install() as nvml:
        # The GPU health gauges as GPUPROBE_NVML=1 reads them: the real sampler on the background thread.
        gpuprobe.configure(nvml=True, collect_interval=0.25)
        _gpu_series(args, stop, nvml)


def _gpu_series(args: argparse.Namespace, stop: threading.Event, nvml: Any) -> None:
    rt = runtime()
    rt.registry.const_labels["gpuprobe.device"] = "cuda:0"  # as a process on a GPU labels its series
    server = gpuprobe.serve(args.port)
    print(f"serving {server.url}", flush=True)
    step = rt.family("gpuprobe.step.duration")
    children = {phase: step.child(model=MODEL_NAME, phase=phase, clock="device") for phase in ("prefill", "decode")}
    gen = {"gen_ai.request.model": MODEL_NAME, "gen_ai.provider.name": "transformers",
           "gen_ai.operation.name": "text_completion"}
    ttft = rt.family("gen_ai.server.time_to_first_token").child(**gen, clock="device")
    itl = rt.family("gpuprobe.inter_token.duration").child(model=MODEL_NAME, clock="device")
    mem = {name: rt.family(f"gpuprobe.memory.{name}").child(device="cuda:0") for name in ("allocated", "reserved")}
    rng = random.Random(0)
    while not stop.wait(0.05):
        # Durations are recorded in integer nanoseconds, like every timing gpuprobe takes.
        prefill = int(rng.uniform(8e6, 12e6))
        rt.emit(children["prefill"], prefill)
        rt.emit(ttft, prefill + 50_000)  # the device's time to first token: the prefill and token selection
        for _ in range(8):
            decode = int(rng.uniform(2.5e6, 4e6))
            rt.emit(children["decode"], decode)
            rt.emit(itl, decode)  # a decode step's device span is its token's inter-token latency
        allocated = 6.0e9 + rng.uniform(0, 5e8)
        rt.emit(mem["allocated"], allocated)
        rt.emit(mem["reserved"], allocated + 1.5e9)
        for gpu in nvml.gpus:  # what NVML will answer at the next sample
            gpu.utilization = rng.randint(60, 100)
            gpu.power_mw = rng.randint(300_000, 650_000)
            gpu.temperature_c = rng.randint(55, 80)
            gpu.sm_activity, gpu.tensor_activity = rng.uniform(50, 95), rng.uniform(10, 60)


def _model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gpuprobe.integrations.transformers import instrument

    torch.set_num_threads(1)  # two CPU cores are shared with the test's other processes
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    model = LlamaForCausalLM(cfg).eval()
    return instrument(model, model_name=MODEL_NAME, layers=True, layer_every=2, memory_every=2)


def _generate(model: Any, rng: random.Random, bad: bool) -> None:
    import torch

    batch, prompt = rng.randint(1, 3), rng.randint(4, 12)
    high = 1000 if bad else 128  # ids past the vocabulary make the embedding raise IndexError
    ids = torch.randint(1, high, (batch, prompt))
    with gpuprobe.probe("workload.request"), torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=rng.randint(8, 20),
                       do_sample=True, top_k=20, temperature=0.9, repetition_penalty=1.3, pad_token_id=0)


def _assistant(model: Any) -> Any:
    """A draft model for assisted decoding: the model's weights, its head a little disturbed (most of its
    drafts are accepted, not all). Not instrumented: a draft runs inside the main model's steps."""
    import copy

    import torch

    assistant = copy.deepcopy(model)  # a deep copy of an instrumented model is a plain one
    with torch.no_grad():
        assistant.lm_head.weight.add_(torch.randn_like(assistant.lm_head.weight) * 0.02)
    return assistant


def _speculate(model: Any, assistant: Any, rng: random.Random) -> None:
    """Speculative decoding: assisted decoding with a draft model, and prompt lookup on a prompt that repeats
    itself (its n-grams are the drafts)."""
    import torch

    ids = torch.randint(3, 128, (1, rng.randint(4, 8)))
    ids = torch.cat([ids, ids, ids], dim=1)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=rng.randint(8, 16), do_sample=False, assistant_model=assistant,
                       pad_token_id=0)
        model.generate(ids, max_new_tokens=rng.randint(8, 16), do_sample=False, prompt_lookup_num_tokens=3,
                       pad_token_id=0)


def _serve_batch(model: Any, rng: random.Random) -> None:
    """Continuous batching: 6 requests of 24 tokens and a cache of 8 blocks of 16 tokens, so requests
    wait for room and some are preempted (their cache offloaded or dropped, and redone later)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    prompts = [[rng.randint(3, 127) for _ in range(rng.randint(6, 14))] for _ in range(6)]
    gen = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cache = ContinuousBatchingConfig(num_blocks=8, page_size=16, max_batch_tokens=16)
    model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cache)


def _pipeline() -> Any:
    """A tiny Stable Diffusion pipeline (random weights, a tokenizer trained here), instrumented."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "diffusers"))
    import _pipes

    from gpuprobe.integrations.diffusers import instrument

    return instrument(_pipes.sd(), model_name=PIPELINE_NAME)


def _diffuse(pipe: Any) -> None:
    import _pipes

    pipe(**_pipes.inputs("sd", steps=2))


def _generation(args: argparse.Namespace, stop: threading.Event) -> None:
    # Peaks for the CPU (none are known for it), so the MBU and MFU panels have data; service-level goals, so
    # the goal panels do (the failing calls count as errors).
    gpuprobe.configure(kernel_sampling=16, sync_audit=4, otlp_endpoint=f"http://127.0.0.1:{_closed_port()}/v1/metrics",
                       otlp_interval=1.0, otlp_timeout=0.5, peak_memory_bandwidth="20G", peak_flops="200G",
                       slo_ttft=2.0, slo_e2e=30.0)
    dist = None
    if args.distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    model = _model()
    assistant = _assistant(model)
    pipe = _pipeline()
    server = gpuprobe.serve(args.port)  # args.port + LOCAL_RANK under torchrun
    print(f"serving {server.url}", flush=True)
    rng = random.Random(int(os.environ.get("RANK", "0")))
    calls = 0
    while not stop.is_set():
        bad = calls % 8 == 3
        try:
            _generate(model, rng, bad)
        except IndexError:
            if not bad:
                raise
        if dist is not None:
            import torch

            dist.all_reduce(torch.ones(1))
        if calls % 5 == 1:
            _serve_batch(model, rng)
        if calls % 3 == 2:
            _speculate(model, assistant, rng)
        if calls % 4 == 0:
            _diffuse(pipe)
        calls += 1
        stop.wait(args.pause)
    if dist is not None:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the workload until SIGTERM or ``--seconds``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="/metrics port (plus LOCAL_RANK under torchrun)")
    p.add_argument("--seconds", type=float, default=240.0, help="stop by itself after this long")
    p.add_argument("--pause", type=float, default=0.15, help="seconds between generate() calls")
    p.add_argument("--distributed", action="store_true", help="init_process_group('gloo') (under torchrun)")
    p.add_argument("--gpu-fixture", action="store_true", help="synthetic GPU-only series, no model")
    args = p.parse_args(argv)
    stop = _stop_event(args.seconds)
    if args.gpu_fixture:
        _gpu_fixture(args, stop)
    else:
        _generation(args, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
