"""Decoder layers: finding them without a hand-kept list of architectures, and timing them on sampled steps.

Which modules are layers (:func:`find_layers`), in order, looked for in the part of the model that runs
in a decoding step (:func:`~..compat.decoding_module`: ``get_decoder()`` of an encoder-decoder or a
vision-language model, whose encoders run once, before the first step; else the whole model), then in
the whole model if nothing is found there:

1. ``model._no_split_modules`` names the block classes that must stay on one device; every
   ``nn.ModuleList`` whose members all belong to those classes is a stack of decoder blocks. Lists
   nested inside a block already picked are skipped, so no time is counted twice.
2. Otherwise, the ``nn.ModuleList`` of identical blocks holding the most parameters.

Timing (:class:`LayerTiming`, a part of :class:`~.state.ModelState`): forward hooks are added for one
decode step in ``layer_every`` and removed after it; each layer's time is its host time on the CPU, or
the device span of its CUDA events, consecutive layers of a stack sharing their boundary event. A
sampled step in which none of the layers ran (modules that are not the decoder's blocks) is said once
per model, in a warning that names them.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any

from ...._placement import tensor_device
from ....runtime import Runtime
from ..compat import block_class_names, decoding_module
from . import steps

__all__ = ["find_layers", "LayerTiming"]

_NO_SPAN = object()  # a layer on a CUDA device whose device span could not be taken


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
    block_names = block_class_names(model)
    root = decoding_module(model)
    found = _stacks(root, block_names | block_class_names(root))
    if not found and root is not model:
        found = _stacks(model, block_names)
    return found


def _stacks(model: Any, block_names: set[str]) -> list[tuple[Any, int]]:
    lists = [(name, mod) for name, mod in model.named_modules() if _is_module_list(mod)]
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


class LayerTiming:
    """The layer hooks of one model, for :class:`~.state.ModelState` (which holds ``rt`` and ``tls``)."""

    rt: Runtime
    tls: threading.local
    nvtx: Any
    model_name: str

    def prepare_layers(self, layers: list[tuple[Any, int]], ml: dict[str, str], layer_index: bool) -> None:
        """Prepare the layers' series and messages (once, when the model is instrumented)."""
        self._lock = threading.Lock()
        self.layer_device: dict[Any, int | None] = {}
        # Layers: one series per block class (and index when asked), prepared here.
        lay = self.rt.family("gpuprobe.layer.duration")
        self.layers = [m for m, _ in layers]
        self.layer_children: dict[Any, Any] = {}
        self.layer_messages: dict[Any, str] = {}
        # The block that runs right after each one in its stack: their spans may share a boundary event.
        self.layer_after: dict[Any, Any] = {
            m: n for (m, i), (n, j) in zip(layers, layers[1:]) if j == i + 1}
        for m, i in layers:
            labels = {**ml, "layer.type": type(m).__name__}
            if layer_index:
                labels["layer.index"] = str(i)
            self.layer_children[m] = lay.child(**labels)
            self.layer_messages[m] = f"{type(m).__name__} {i}"
        self._hook_users = 0
        self._hooks: list[Any] = []
        # Where the layers' parameters are is read again at the first sampled step of each call: a model
        # is not moved while it generates. Why not at every sampled step: ~22 Python calls per layer
        # (+19.6 -> +14.1 Python calls per greedy step with layers every 8, benchmarks/step_calls.py).
        self.layers_moved = True

    def no_layer_ran(self) -> None:
        """A sampled decode step ran none of the timed layers: a warning, once per model."""
        kinds = ", ".join(sorted({type(m).__name__ for m in self.layers}))
        self.rt.warn_once(
            f"layers-idle:{id(self)}",
            f"gpuprobe: none of the {len(self.layers)} timed layers of model {self.model_name!r} ({kinds}) ran during "
            "a sampled decode step, so gpuprobe.layer.duration stays empty: they are not the blocks a decoding "
            "step runs (pass those as instrument(model, layers=[...])), or the forward is compiled (a compiled "
            "forward runs without the layers' hooks)")

    def module_device(self, module: Any) -> int | None:
        """The CUDA device of ``module``'s parameters (cached), or None when they are not on CUDA."""
        try:
            return self.layer_device[module]
        except KeyError:
            pass
        index = None
        for param in module.parameters():
            dev = tensor_device(param)
            index = dev.index if dev.type == "cuda" else None
            break
        self.layer_device[module] = index
        return index

    def acquire_layers(self) -> None:
        # Why hooks only on sampled steps: a hooked module call costs ~6 us more (11.7 -> 17.8 us
        # for a small Linear on the test CPU), while adding and removing both hooks costs 6.7 us
        # once per sampled step.
        with self._lock:
            self._hook_users += 1
            if self._hook_users == 1:
                if self.layers_moved:  # modules may have moved since the last call
                    self.layers_moved = False
                    self.layer_device.clear()
                    for m in self.layers:
                        self.module_device(m)
                for m in self.layers:
                    self._hooks.append(m.register_forward_pre_hook(self._layer_pre))
                    self._hooks.append(m.register_forward_hook(self._layer_post, always_call=True))

    def release_layers(self) -> None:
        with self._lock:
            self._hook_users -= 1
            if self._hook_users <= 0:
                self._hook_users = 0
                for h in self._hooks:
                    h.remove()
                self._hooks.clear()

    def remove_hooks(self) -> None:
        """Remove every layer hook now (uninstrument)."""
        with self._lock:
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            self._hook_users = 0

    def _layer_pre(self, module: Any, args: Any) -> None:
        if steps.compiling():  # Dynamo folds this to True while tracing: no graph break from the hook
            return None
        ctx = getattr(self.tls, "ctx", None)
        if ctx is None or not ctx.layers_on:
            return None
        nv = ctx.nv
        if nv is not None:
            nv.push(self.nvtx(nv, self.layer_messages[module], "layer", ctx.step))
        clock = ctx.clock
        token: Any = None
        if clock is not None:
            device = self.layer_device.get(module)
            chain = ctx.layer_next
            if chain is not None:
                ctx.layer_next = None
                if chain[0] is not module or device is None:  # not the block that follows: a fresh start
                    clock.drop(chain[1])
                    chain = None
            if device is not None:
                # On a GPU the host only queues kernels: without a device span (a capture is underway,
                # or no event was free) the layer gets no sample rather than its queuing time.
                token = (clock.start(device) if chain is None else clock.resume(chain[1], device)) or _NO_SPAN
        ctx.layer_stack.append((perf_counter_ns(), token))
        return None

    def _layer_post(self, module: Any, args: Any, output: Any) -> None:
        if steps.compiling():
            return None
        ctx = getattr(self.tls, "ctx", None)
        if ctx is None or not ctx.layers_on or not ctx.layer_stack:
            return None
        t0, tok = ctx.layer_stack.pop()
        dt = perf_counter_ns() - t0
        ctx.layers_ran += 1
        child = self.layer_children[module]
        if tok is None:
            ctx.records.append((child.apply, dt))  # the layer runs on the CPU: its host time
        elif tok is not _NO_SPAN:
            following = self.layer_after.get(module)
            if following is None:
                pending = ctx.clock.stop(tok)
            else:  # the next block of the stack starts at this one's end event
                pending, boundary = ctx.clock.split(tok)
                if boundary is not None:
                    if ctx.layer_next is not None:
                        ctx.clock.drop(ctx.layer_next[1])
                    ctx.layer_next = (following, boundary)
            ctx.records.append((self.rt.pending.apply, (child, pending)))
        if ctx.nv is not None:
            ctx.nv.pop()
        return None
