"""MBU and MFU of generation steps with real tiny models, checked against counts made here.

The oracle below counts from the model and its config, independently of gpuprobe's code: bytes are
the parameters' bytes (embedding tables only at the rows a step looks up), plus the KV cache at the
prompt length + the step index; FLOPs are 2 per non-embedding, non-head parameter per token, 2 per
head parameter per sequence (transformers computes the last position's logits only), and 4 × heads
× head dimension per (query, key) pair under the causal mask. Step times are the exported
``gpuprobe.step.duration`` samples.
"""

from __future__ import annotations

import gc
from unittest import mock

import pytest
from _hfkit import build, prompt, torch

import gpuprobe
from gpuprobe.integrations.transformers import instrument, uninstrument
from gpuprobe.integrations._transformers.generate.utilization import measure
from gpuprobe.testing import InMemoryExporter, reset

MBU = "gpuprobe.step.memory_bandwidth.utilization"
MFU = "gpuprobe.step.flops.utilization"
STEP = "gpuprobe.step.duration"
MS = 1_000_000
BW, FLOPS = 2e10, 1e12  # the peaks given on the CPU


class Oracle:
    """Bytes and FLOPs of one Llama step, counted from the model here."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        cfg = model.config
        params = list(model.parameters())
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        assert embed is not head  # the tiny Llama does not tie them
        self.param_bytes = sum(p.numel() * p.element_size() for p in params)
        self.embed_bytes = embed.numel() * embed.element_size()
        self.row_bytes = embed.shape[1] * embed.element_size()
        self.vocab = embed.shape[0]
        self.body = sum(p.numel() for p in params) - embed.numel() - head.numel()
        self.head = head.numel()
        self.layers = cfg.num_hidden_layers
        self.width = cfg.num_attention_heads * cfg.head_dim
        self.kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * embed.element_size()

    def bytes(self, batch: int, prompt_len: int, step: int) -> int:
        tokens = batch * (prompt_len if step == 0 else 1)
        cached = prompt_len + step  # positions in the cache after the step
        return (self.param_bytes - self.embed_bytes + min(tokens, self.vocab) * self.row_bytes
                + batch * cached * self.kv_per_token)

    def flops(self, batch: int, prompt_len: int, step: int) -> int:
        new = prompt_len if step == 0 else 1
        cached = prompt_len + step
        pairs = sum(range(cached - new + 1, cached + 1))  # each new query sees the positions up to its own
        return (2 * self.body * batch * new + 2 * self.head * batch
                + 4 * self.width * batch * self.layers * pairs)


def generate(model, batch: int, prompt_len: int, new_tokens: int):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model.generate(prompt(batch, prompt_len), max_new_tokens=new_tokens, min_new_tokens=new_tokens)


# -- CPU, with given peaks ------------------------------------------------------------------------------

def test_each_step_exports_mbu_and_mfu_from_its_host_step_time(make_model) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(peak_memory_bandwidth=BW, peak_flops=FLOPS)
    model = instrument(make_model("llama"), model_name="m")
    oracle = Oracle(model)
    batch, prompt_len, new = 2, 7, 5
    with InMemoryExporter() as exp:
        generate(model, batch, prompt_len, new)
        steps = {ph: exp.values(STEP, model="m", phase=ph, clock="host") for ph in ("prefill", "decode")}
        mbu = {ph: exp.values(MBU, model="m", phase=ph) for ph in ("prefill", "decode")}
        mfu = {ph: exp.values(MFU, model="m", phase=ph) for ph in ("prefill", "decode")}
    assert [len(steps["prefill"]), len(steps["decode"])] == [1, new - 1]
    durations = steps["prefill"] + steps["decode"]  # step 0, 1, 2, ... in order
    want_mbu = [oracle.bytes(batch, prompt_len, i) / d / BW for i, d in enumerate(durations)]
    want_mfu = [oracle.flops(batch, prompt_len, i) / d / FLOPS for i, d in enumerate(durations)]
    assert mbu["prefill"] + mbu["decode"] == pytest.approx(want_mbu, rel=1e-9)
    assert mfu["prefill"] + mfu["decode"] == pytest.approx(want_mfu, rel=1e-9)


def test_decode_reads_a_longer_cache_at_each_step(make_model) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(peak_memory_bandwidth=BW, peak_flops=FLOPS)
    model = instrument(make_model("llama"), model_name="m")
    oracle = Oracle(model)
    with InMemoryExporter() as exp:
        generate(model, 1, 4, 6)
        durations = exp.values(STEP, phase="decode", clock="host")
        mbu = exp.values(MBU, phase="decode")
    # utilization × step time × peak recovers the bytes of each step: one KV position more each time.
    read = [round(m * d * BW) for m, d in zip(mbu, durations, strict=True)]
    assert read == [oracle.bytes(1, 4, step) for step in range(1, 6)]
    assert [b - a for a, b in zip(read, read[1:])] == [oracle.kv_per_token] * 4


def test_the_histograms_reach_the_metrics_endpoint_by_model_and_phase(make_model, scrape) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(peak_memory_bandwidth="20G", peak_flops="1T")
    model = instrument(make_model("llama"), model_name="tiny")
    generate(model, 1, 5, 4)
    s = scrape()
    for name in ("gpuprobe_step_memory_bandwidth_utilization", "gpuprobe_step_flops_utilization"):
        assert s.value(name + "_count", model="tiny", phase="prefill") == 1
        assert s.value(name + "_count", model="tiny", phase="decode") == 3
        bounds = {x.labels["le"] for x in s.find(name + "_bucket", model="tiny", phase="decode")}
        assert {"0.001", "0.5", "1.0", "+Inf"} <= bounds
        assert s.label_values(name + "_count", "phase") == {"prefill", "decode"}


def test_peaks_from_the_environment_are_used(make_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    gc.collect()  # instrumented models other tests left behind (reference cycles) are gone from info()
    monkeypatch.setenv("GPUPROBE_PEAK_MEMORY_BANDWIDTH", "40G")
    reset()
    model = instrument(make_model("llama"), model_name="m")
    oracle = Oracle(model)
    with InMemoryExporter() as exp:
        generate(model, 1, 5, 2)
        prefill = exp.values(STEP, phase="prefill", clock="host")[0]
        assert exp.values(MBU, phase="prefill") == [pytest.approx(oracle.bytes(1, 5, 0) / prefill / 40e9, rel=1e-9)]
        assert exp.values(MFU) == []
    note = gpuprobe.info()["utilization"]["m on cpu"]
    assert note[MBU] == "exported: peak 4e+10 B/s from GPUPROBE_PEAK_MEMORY_BANDWIDTH"
    assert note[MFU] == "not exported: no peak known for device 'cpu'; set GPUPROBE_PEAK_FLOPS (FLOP/s)"


def test_without_peaks_nothing_is_exported_and_info_says_why(make_model) -> None:  # type: ignore[no-untyped-def]
    gc.collect()  # instrumented models other tests left behind (reference cycles) are gone from info()
    model = instrument(make_model("llama"), model_name="m")
    with InMemoryExporter() as exp:
        generate(model, 1, 5, 3)
        assert exp.values(STEP, clock="host")  # the steps ran and were timed
        assert exp.values(MBU) == [] and exp.values(MFU) == []
    names = {d.spec.name for d in gpuprobe.collect()}
    assert STEP in names and MBU not in names and MFU not in names
    assert gpuprobe.info()["utilization"] == {"m on cpu": {
        MBU: "not exported: no peak known for device 'cpu'; set GPUPROBE_PEAK_MEMORY_BANDWIDTH (bytes/s)",
        MFU: "not exported: no peak known for device 'cpu'; set GPUPROBE_PEAK_FLOPS (FLOP/s)",
    }}


def test_peaks_configured_after_a_call_apply_from_the_next_call(make_model) -> None:  # type: ignore[no-untyped-def]
    model = instrument(make_model("llama"), model_name="m")
    with InMemoryExporter() as exp:
        generate(model, 1, 5, 2)
        assert exp.values(MBU) == []
        gpuprobe.configure(peak_memory_bandwidth=BW)
        assert gpuprobe.info()["utilization"]["m on cpu"][MBU].startswith("exported")
        generate(model, 1, 5, 2)
        assert len(exp.values(MBU)) == 2
        gpuprobe.configure(peak_memory_bandwidth=None)
        generate(model, 1, 5, 2)
        assert len(exp.values(MBU)) == 2


def test_uninstrumented_models_leave_info(make_model) -> None:  # type: ignore[no-untyped-def]
    gc.collect()  # instrumented models other tests left behind (reference cycles) are gone from info()
    model = instrument(make_model("llama"), model_name="m")
    assert list(gpuprobe.info()["utilization"]) == ["m on cpu"]
    uninstrument(model)
    assert gpuprobe.info()["utilization"] == {}


# -- what counts, model by model ----------------------------------------------------------------------------

def test_llama_shape_counts_the_embedding_table_by_rows_and_the_head_apart(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    shape = measure(model)
    oracle = Oracle(model)
    assert shape.weight_bytes == oracle.param_bytes - oracle.embed_bytes
    assert shape.tables == ((128, 64 * 4),)
    assert (shape.body_params, shape.head_params) == (oracle.body, oracle.head)
    assert (shape.full_layers, shape.window_layers, shape.attn_width) == (2, 0, 4 * 16)
    assert shape.kv_token_bytes == 2 * 2 * 16 * 4  # one layer: keys and values of 2 KV heads of 16, float32
    assert shape.dtype == "float32" and not shape.logits_all


def test_a_tied_head_reads_its_table_whole_and_learned_positions_by_rows(make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("gpt2")
    shape = measure(model)
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    assert model.lm_head.weight is wte
    total = sum(p.numel() for p in model.parameters())
    assert shape.tables == ((256, 64 * 4),)  # only the position table is read by rows
    assert shape.weight_bytes == sum(p.numel() * 4 for p in model.parameters()) - wpe.numel() * 4
    assert shape.head_params == wte.numel()
    assert shape.body_params == total - wte.numel() - wpe.numel()
    assert shape.kv_token_bytes == 2 * 4 * 16 * 4  # GPT-2: as many KV heads as heads


def test_sliding_window_layers_are_found_from_the_config(make_model) -> None:  # type: ignore[no-untyped-def]
    mistral = measure(make_model("mistral"))  # sliding_window=64 on every layer
    assert (mistral.full_layers, mistral.window_layers, mistral.window) == (0, 2, 64)
    qwen2 = measure(make_model("qwen2"))  # layer_types: full_attention
    assert (qwen2.full_layers, qwen2.window_layers) == (2, 0)


def test_the_flops_peak_follows_the_parameters_dtype(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    simcuda(2, cpu_tensors_on=0)
    torch.cuda.current_device()
    model = instrument(make_model("llama").to(torch.bfloat16), model_name="m")
    assert measure(model).kv_token_bytes == 2 * 2 * 16 * 2
    note = gpuprobe.info()["utilization"]["m on cuda:0"]
    assert note[MFU] == ("exported: dense bfloat16 peak 9.895e+14 FLOP/s of NVIDIA H100 SXM "
                         "(device 'NVIDIA H100 80GB HBM3')")
    with mock.patch.object(torch.cuda, "get_device_name", lambda device=None: "Tesla T4"):
        t4 = instrument(make_model("llama").to(torch.bfloat16), model_name="t4")
        note = gpuprobe.info()["utilization"]["t4 on cuda:0"]
    assert note[MBU] == "exported: peak 3.2e+11 B/s of NVIDIA T4 (device 'Tesla T4')"
    assert note[MFU] == ("not exported: no dense bfloat16 peak known for NVIDIA T4 (device 'Tesla T4'); "
                         "set GPUPROBE_PEAK_FLOPS (FLOP/s)")
    uninstrument(t4)


def test_an_encoder_decoder_model_is_not_covered_and_info_says_so() -> None:
    t = pytest.importorskip("transformers")
    cfg = t.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=0)
    model = instrument(t.T5ForConditionalGeneration(cfg).eval(), model_name="t5")
    try:
        gpuprobe.configure(peak_memory_bandwidth=BW, peak_flops=FLOPS)
        note = gpuprobe.info()["utilization"]["t5 on cpu"]
        assert note == {MBU: "not exported: encoder-decoder models are not covered",
                        MFU: "not exported: encoder-decoder models are not covered"}
        with InMemoryExporter() as exp:
            with torch.no_grad():
                model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, min_new_tokens=3)
            assert exp.values(MBU) == [] and exp.values(MFU) == []
    finally:
        uninstrument(model)


# -- simulated CUDA: the device step time and the peak table -------------------------------------------------

def queue_kernels(module, sim, ns: int, device: int) -> None:  # type: ignore[no-untyped-def]
    """Each forward of ``module`` queues ``ns`` of GPU work on ``device``'s current stream."""
    module.register_forward_hook(lambda *args: sim.launch(ns, stream=torch.cuda.current_stream(device)) and None)


def test_on_cuda_the_device_step_time_and_the_gpus_table_peaks_are_used(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=0)  # simulated H100 SXM ("NVIDIA H100 80GB HBM3")
    torch.cuda.current_device()
    model = instrument(make_model("llama"), model_name="m")
    oracle = Oracle(model)
    queue_kernels(model, sim, 4 * MS, device=0)
    batch, prompt_len, new = 2, 6, 4
    with InMemoryExporter() as exp:
        generate(model, batch, prompt_len, new)
        assert exp.values(MBU) == []  # nothing waits for the device
        sim.finish()
        device = exp.values(STEP, clock="device")
        mbu = exp.values(MBU, phase="prefill") + exp.values(MBU, phase="decode")
        mfu = exp.values(MFU, phase="prefill") + exp.values(MFU, phase="decode")
    assert device == [pytest.approx(0.004)] * new
    assert mbu == pytest.approx([oracle.bytes(batch, prompt_len, i) / 0.004 / 3.35e12 for i in range(new)], rel=1e-9)
    assert mfu == pytest.approx([oracle.flops(batch, prompt_len, i) / 0.004 / 67e12 for i in range(new)], rel=1e-9)
    note = gpuprobe.info()["utilization"]["m on cuda:0"]
    assert note[MBU] == "exported: peak 3.35e+12 B/s of NVIDIA H100 SXM (device 'NVIDIA H100 80GB HBM3')"


def test_on_cuda_overrides_win_over_the_table(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=0)
    torch.cuda.current_device()
    gpuprobe.configure(peak_memory_bandwidth="1T", peak_flops="10T")
    model = instrument(make_model("llama"), model_name="m")
    oracle = Oracle(model)
    queue_kernels(model, sim, 2 * MS, device=0)
    with InMemoryExporter() as exp:
        generate(model, 1, 5, 2)
        sim.finish()
        mbu = exp.values(MBU, phase="prefill") + exp.values(MBU, phase="decode")
        mfu = exp.values(MFU, phase="prefill") + exp.values(MFU, phase="decode")
    assert mbu == pytest.approx([oracle.bytes(1, 5, i) / 0.002 / 1e12 for i in range(2)], rel=1e-9)
    assert mfu == pytest.approx([oracle.flops(1, 5, i) / 0.002 / 10e12 for i in range(2)], rel=1e-9)


def test_on_an_unknown_gpu_nothing_is_exported_until_peaks_are_given(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=0)
    torch.cuda.current_device()
    with mock.patch.object(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Mystery GPU"):
        model = instrument(make_model("llama"), model_name="m")
        queue_kernels(model, sim, MS, device=0)
        with InMemoryExporter() as exp:
            generate(model, 1, 5, 2)
            sim.finish()
            assert len(exp.values(STEP, clock="device")) == 2
            assert exp.values(MBU) == [] and exp.values(MFU) == []
            assert gpuprobe.info()["utilization"]["m on cuda:0"] == {
                MBU: "not exported: no peak known for device 'NVIDIA Mystery GPU'; set "
                     "GPUPROBE_PEAK_MEMORY_BANDWIDTH (bytes/s)",
                MFU: "not exported: no peak known for device 'NVIDIA Mystery GPU'; set GPUPROBE_PEAK_FLOPS (FLOP/s)",
            }
            gpuprobe.configure(peak_memory_bandwidth=1e12)
            generate(model, 1, 5, 2)
            sim.finish()
            assert len(exp.values(MBU)) == 2 and exp.values(MFU) == []


def test_on_cuda_a_step_without_a_device_span_gets_no_sample(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    simcuda(2, cpu_tensors_on=0)  # CUDA not initialized by the program: no device span is taken
    gpuprobe.configure(peak_memory_bandwidth=BW, peak_flops=FLOPS)
    model = instrument(make_model("llama"), model_name="m")
    with InMemoryExporter() as exp:
        generate(model, 1, 5, 3)
        assert exp.values(STEP, clock="host") and exp.values(STEP, clock="device") == []
        assert exp.values(MBU) == []  # the host time of a GPU step is not its device time
    assert not torch.cuda.is_initialized()  # and gpuprobe did not initialize it to ask the device's name
