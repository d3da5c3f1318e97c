"""Instrument a transformers model's generate() and read what gpuprobe measured.

Runs on CPU in seconds: a tiny Llama built from a config (random weights, nothing downloaded).

    python examples/transformers_generate.py
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import gpuprobe
from gpuprobe.integrations.transformers import instrument, uninstrument

config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, pad_token_id=0, eos_token_id=None)
model = LlamaForCausalLM(config).eval()
instrument(model, model_name="tiny-llama")

prompt = torch.randint(3, 128, (2, 8))
for _ in range(3):
    model.generate(prompt, max_new_tokens=16, do_sample=True, temperature=0.8, top_k=20, repetition_penalty=1.2)

for metric in gpuprobe.collect():
    for point in metric.points:
        labels = {k: v for k, v in point.labels.items() if not k.startswith("gpuprobe.")}
        if point.count:  # a histogram: show the mean
            print(f"{metric.spec.name:40s} mean {point.sum / point.count:10.5f} {metric.spec.unit:8s} n={point.count:<4d} {labels}")
        else:
            print(f"{metric.spec.name:40s} value {point.value:12.0f} {metric.spec.unit:8s} {labels}")

uninstrument(model)  # the model is exactly as before
