"""The models the GPU check measures, built from configs (no download), and where they run.

``gpu``: a 4 × 2048 Llama in bf16 (a CUDA-graph decode step takes ~1.2 ms on an H200), sized so that
gpuprobe's per-step work is a visible share of a step. ``tiny``: the same shape scaled down for the
dry run on a CPU, in float32.
"""

from __future__ import annotations

import functools
from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "gpu": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4, "num_attention_heads": 16,
            "num_key_value_heads": 8, "vocab_size": 32000, "dtype": "bfloat16"},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "dtype": "float32"},
}


def device() -> str:
    """``cuda`` where torch sees a CUDA device, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def describe(size: str) -> str:
    s = SIZES[size]
    return (f"Llama {s['num_hidden_layers']} layers x {s['hidden_size']} hidden, vocab {s['vocab_size']}, "
            f"{s['dtype']}, random weights")


@functools.lru_cache(maxsize=None)
def llama(size: str) -> Any:
    """The model of ``size`` on :func:`device`, in eval mode; built once per process."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = dict(SIZES[size])
    dtype = getattr(torch, spec.pop("dtype"))
    torch.manual_seed(0)
    cfg = LlamaConfig(**spec, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device()):  # weights made where they run: no host copy of a 0.3 B model
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def prompt(model: Any, length: int, batch: int = 1) -> Any:
    """Random prompt ids on the model's device (seeded)."""
    import torch

    ids = torch.randint(3, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))
    return ids.to(model.device)


def synchronize() -> None:
    """Wait for the device (nothing on a CPU): a timed run ends when its work has."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
