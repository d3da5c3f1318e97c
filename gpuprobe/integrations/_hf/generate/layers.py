"""Finding the decoder layers of a transformers model without a hand-kept list of architectures.

Rule, in order:

1. ``model._no_split_modules`` names the block classes that must stay on one device; every
   ``nn.ModuleList`` whose members all belong to those classes is a stack of decoder (or encoder)
   blocks. Lists nested inside a block already picked are skipped, so no time is counted twice.
2. Otherwise, the ``nn.ModuleList`` of identical blocks holding the most parameters.

Vision-language models may yield two stacks (vision encoder and text decoder); the ``layer.type``
label keeps them apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["find_layers"]


def _is_module_list(module: Any) -> bool:
    import torch.nn as nn

    return isinstance(module, nn.ModuleList) and len(module) > 0


def find_layers(model: Any) -> list[tuple[Any, int]]:
    """The decoder blocks of ``model`` as ``(module, index in its stack)``, in execution order.

    Args:
        model: a ``torch.nn.Module`` (usually a transformers ``PreTrainedModel``).

    Returns:
        One entry per block; empty when nothing looks like a stack of blocks.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
        >>> [(type(b).__name__, i) for b, i in find_layers(m)]
        [('LlamaDecoderLayer', 0), ('LlamaDecoderLayer', 1)]
    """
    lists = [(name, mod) for name, mod in model.named_modules() if _is_module_list(mod)]
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    picked: list[tuple[str, Any]] = []
    if block_names:
        for name, ml in lists:
            if any(name.startswith(p + ".") for p, _ in picked):
                continue  # a list inside a block already picked
            if all(type(m).__name__ in block_names for m in ml):
                picked.append((name, ml))
    if not picked:
        same = [(name, ml) for name, ml in lists if len({type(m) for m in ml}) == 1 and len(ml) > 1]
        if same:
            best = max(same, key=lambda item: (sum(p.numel() for p in item[1].parameters()), len(item[1])))
            picked = [best]
    return [(block, i) for _, ml in picked for i, block in enumerate(ml)]
