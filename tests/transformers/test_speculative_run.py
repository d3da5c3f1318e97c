"""``gpuprobe run -- python app.py``: a program that runs assisted decoding and prompt lookup, with no gpuprobe
code in it, gets the speculative-decoding metrics on /metrics (the draft model runs inside the steps)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _hfkit import ROOT, Scrape

APP = """
    import os, urllib.request
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    torch.manual_seed(0)
    draft = LlamaForCausalLM(config).eval()  # the same weights: its drafts are accepted
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    # min_new_tokens: a randomly initialised model may pick its end-of-sequence token early
    a = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, assistant_model=draft)
    b = model.generate(torch.cat([ids, ids], 1), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                       prompt_lookup_num_tokens=2)
    assert a.shape[1] == 6 + 8 and b.shape[1] == 12 + 8
    port = os.environ["GPUPROBE_PROMETHEUS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        print(resp.read().decode())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.subprocess_only  # the program runs under gpuprobe run, in a process of its own
def test_gpuprobe_run_exports_the_speculative_metrics(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "run", "--port", str(_free_port()), "--",
                           sys.executable, str(app)], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    scrape = Scrape(done.stdout.decode())
    model = {"model": "llama"}  # gpuprobe run names a model by its config (model_type): the draft model too
    # Two calls: the draft model, instrumented as every model is, made no requests of its own.
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model="llama") == 2
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 16
    spec = {"method": "draft_model", **model}
    steps = scrape.value("gpuprobe_speculative_emitted_tokens_count", **spec)
    drafted = scrape.value("gpuprobe_speculative_draft_tokens_total", **spec)
    # The draft model has the main model's weights: every draft token is accepted, and each of the steps
    # emits its accepted tokens and one of the main model's own.
    assert drafted > 0
    assert scrape.value("gpuprobe_speculative_accepted_tokens_total", **spec) == drafted == 8 - steps
    assert scrape.value("gpuprobe_speculative_emitted_tokens_sum", **spec) == 8
    assert scrape.value("gpuprobe_speculative_drafts_total", **spec) == steps
    per_position = scrape.find("gpuprobe_speculative_accepted_tokens_per_position_total", **spec)
    assert sum(s.value for s in per_position) == drafted
    assert scrape.value("gpuprobe_speculative_emitted_tokens_sum", method="prompt_lookup", **model) == 8
    assert scrape.value("gpuprobe_step_component_duration_seconds_count", component="draft", **model) == (
        steps + scrape.value("gpuprobe_speculative_emitted_tokens_count", method="prompt_lookup", **model))
    assert scrape.value("gpuprobe_inter_token_duration_seconds_count", clock="host", **model) == 2 * 7
