"""Class-wide instrumentation, for models created in code you do not own.

``instrument_all()`` instruments every transformers model the first time it calls generate();
``instrument_class(cls)`` does it for one class and its subclasses.

    python examples/transformers_instrument_all.py
"""

from __future__ import annotations

import torch

import gpuprobe
from gpuprobe.integrations.transformers import instrument_all, is_instrumented, uninstrument_all


def someone_elses_service(prompts: torch.Tensor) -> torch.Tensor:
    """Stands in for a library that loads and runs its own model."""
    from transformers import GemmaConfig, GemmaForCausalLM

    model = GemmaForCausalLM(GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                         pad_token_id=0, eos_token_id=None)).eval()
    out = model.generate(prompts, max_new_tokens=8)
    print("instrumented by instrument_all():", is_instrumented(model))
    return out


instrument_all(layers=True, layer_every=2)
someone_elses_service(torch.randint(3, 128, (1, 6)))
uninstrument_all()

for metric in gpuprobe.collect():
    if metric.spec.name in ("gen_ai.server.time_to_first_token", "gpuprobe.layer.duration"):
        for p in metric.points:
            model = p.labels.get("gen_ai.request.model") or p.labels.get("model")
            print(f"{metric.spec.name}: model={model} samples={p.count}")
