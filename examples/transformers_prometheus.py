"""Serve live generation metrics for Prometheus while a model generates.

Point Prometheus at the printed URL (or curl it). Runs for a few seconds; pass --seconds to linger.

    python examples/transformers_prometheus.py [--port 9464] [--seconds 0]
"""

from __future__ import annotations

import argparse
import time
import urllib.request

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import gpuprobe
from gpuprobe.integrations.transformers import instrument

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
parser.add_argument("--seconds", type=float, default=0, help="keep serving this long at the end")
args = parser.parse_args()

server = gpuprobe.serve(port=args.port)
print("scrape me:", server.url)

model = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=128, pad_token_id=0, eos_token_id=None)).eval()
instrument(model, model_name="tiny-qwen2")
for _ in range(4):
    model.generate(torch.randint(3, 128, (1, 8)), max_new_tokens=12, do_sample=True, top_p=0.9)

# What Prometheus would see: a few of the series.
text = urllib.request.urlopen(server.url).read().decode()
for line in text.splitlines():
    if line.startswith(("gen_ai_server_time_to_first_token_seconds_count", "gen_ai_client_token_usage_sum",
                        "gpuprobe_step_duration_seconds_count", "gpuprobe_kv_cache_memory_bytes")):
        print(line)
time.sleep(args.seconds)
server.close()
