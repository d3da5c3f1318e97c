"""Time each decoder layer, sampled on one decode step in four, with a per-layer index label.

    python examples/transformers_layers.py
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import gpuprobe
from gpuprobe.integrations.transformers import find_layers, instrument

model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=128, n_positions=128,
                                   pad_token_id=0, eos_token_id=None)).eval()
print("decoder layers found:", [f"{type(m).__name__}[{i}]" for m, i in find_layers(model)])
instrument(model, model_name="tiny-gpt2", layers=True, layer_every=4, layer_index=True)

model.generate(torch.randint(3, 128, (1, 8)), max_new_tokens=32, do_sample=False)

for metric in gpuprobe.collect():
    if metric.spec.name == "gpuprobe.layer.duration":
        for p in sorted(metric.points, key=lambda p: int(p.labels["layer.index"])):
            print(f"{p.labels['layer.type']} {p.labels['layer.index']}: {p.count} samples, "
                  f"mean {p.sum / p.count * 1e3:.3f} ms")
