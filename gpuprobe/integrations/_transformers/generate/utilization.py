"""MBU and MFU of a transformers model's generation steps (see :mod:`gpuprobe._utilization`).

When a model is instrumented, :func:`measure` reads what is constant — parameter bytes and counts,
embedding tables, the output head, layers, heads, head dimension, sliding windows — into a
:class:`~gpuprobe._utilization.ModelShape`. At the first call on a device (and again after
``configure()``), :meth:`Utilization.for_call` decides whether the device has known peaks. Per step
the hot path appends one record of four integers; the byte and FLOP counts and the divisions run
when the runtime drains its buffers (device steps once the step's CUDA events are read).
"""

from __future__ import annotations

import sys
from typing import Any

from ...._utilization import (
    MBU,
    MFU,
    ModelShape,
    Peaks,
    forget,
    register,
    resolve_peaks,
    step_bytes,
    step_flops,
)
from ...._placement import tensor_device
from ....runtime import Runtime
from ..compat import computes_all_logits, output_embeddings, text_config_fields

__all__ = ["Utilization", "StepUtilization", "measure", "UnsupportedShape"]


class UnsupportedShape(Exception):
    """The model's steps cannot be counted (the message says why)."""


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def measure(model: Any) -> ModelShape:
    """Measure what a decoder model reads and computes per step (once, when it is instrumented).

    Raises:
        UnsupportedShape: an encoder-decoder model, or a config without layers and heads.
    """
    import torch

    text = text_config_fields(model)
    if text is None:
        raise UnsupportedShape(f"{type(model).__name__} has no config")
    if text["is_encoder_decoder"]:
        raise UnsupportedShape("encoder-decoder models are not covered")
    layers = _positive_int(text["num_hidden_layers"])
    heads = _positive_int(text["num_attention_heads"])
    if layers is None or heads is None:
        raise UnsupportedShape(f"the config of {type(model).__name__} names no num_hidden_layers and "
                               "num_attention_heads")
    kv_heads = _positive_int(text["num_key_value_heads"]) or heads
    head_dim = _positive_int(text["head_dim"])
    if head_dim is None:
        hidden = _positive_int(text["hidden_size"])
        if hidden is None:
            raise UnsupportedShape(f"the config of {type(model).__name__} names no head_dim or hidden_size")
        head_dim = hidden // heads

    # Which layers attend, and over how much: layer_types where the config has them.
    window = _positive_int(text["sliding_window"]) or 0
    types = text["layer_types"]
    if isinstance(types, (list, tuple)) and len(types) == layers:
        names = [str(t) for t in types]
        attending = [t for t in names if t.endswith("attention") and not t.startswith("linear")]
        window_layers = sum(1 for t in attending if t.startswith("sliding")) if window else 0
        full_layers = len(attending) - window_layers
    else:
        window_layers = layers if window else 0
        full_layers = layers - window_layers

    # Parameters (model.parameters() yields a shared one once).
    total_bytes = total_params = 0
    floating: dict[Any, list[int]] = {}  # dtype -> [elements, element size]
    everything: dict[Any, int] = {}
    for p in model.parameters():
        n = p.numel()
        size = p.element_size()
        total_params += n
        total_bytes += n * size
        everything[p.dtype] = everything.get(p.dtype, 0) + n
        if p.dtype.is_floating_point:
            entry = floating.setdefault(p.dtype, [0, size])
            entry[0] += n
    if not total_params:
        raise UnsupportedShape(f"{type(model).__name__} has no parameters")
    head = output_embeddings(model)
    head_weight = getattr(head, "weight", None)
    head_params = 0
    if head_weight is not None:
        head_params = head_weight.numel()
        bias = getattr(head, "bias", None)
        if bias is not None:
            head_params += bias.numel()
    tables: list[tuple[int, int]] = []
    table_bytes = table_params = 0
    seen: set[int] = set()
    for module in model.modules():
        if not isinstance(module, torch.nn.Embedding):
            continue
        w = module.weight
        if id(w) in seen or w is head_weight:  # a table tied to the head is read whole by the head
            continue
        seen.add(id(w))
        rows, dim = int(w.shape[0]), int(w.shape[1])
        tables.append((rows, dim * w.element_size()))
        table_bytes += w.numel() * w.element_size()
        table_params += w.numel()

    dtype, kv_size = None, 2
    if floating:
        dtype = max(floating, key=lambda d: floating[d][0])
        kv_size = floating[dtype][1]
    else:
        dtype = max(everything, key=lambda d: everything[d])
    logits_all = computes_all_logits(model)
    return ModelShape(
        weight_bytes=total_bytes - table_bytes,
        tables=tuple(tables),
        body_params=max(0, total_params - table_params - head_params),
        head_params=head_params,
        logits_all=logits_all,
        full_layers=full_layers,
        window_layers=window_layers,
        window=window if window_layers else 0,
        attn_width=heads * head_dim,
        kv_token_bytes=2 * kv_heads * head_dim * kv_size,
        dtype=_dtype_name(dtype),
    )


class _DeviceStep:
    """A step's device timing target: the step-duration series, then the step's utilization."""

    __slots__ = ("util", "child", "batch", "prompt_len", "step")

    def __init__(self, util: StepUtilization, child: Any, batch: int, prompt_len: int, step: int) -> None:
        self.util = util
        self.child = child
        self.batch = batch
        self.prompt_len = prompt_len
        self.step = step

    def apply(self, ns: int) -> None:
        self.child.apply(ns)
        self.util.observe(ns, self.batch, self.prompt_len, self.step)


class StepUtilization:
    """One model on one device whose peaks are known: record targets that turn steps into samples.

    Both targets run when the runtime drains (never on the generating thread's step).
    """

    __slots__ = ("shape", "bandwidth", "flops", "mbu", "mfu", "pending")

    def __init__(self, shape: ModelShape, peaks: Peaks, mbu: tuple[Any, Any], mfu: tuple[Any, Any],
                 pending: Any) -> None:
        self.shape = shape
        self.bandwidth = peaks.memory_bandwidth
        self.flops = peaks.flops
        self.mbu = mbu  # (prefill, decode) bound apply methods
        self.mfu = mfu
        self.pending = pending

    def host_step(self, value: tuple[int, int, int, int]) -> None:
        """Record target of a step timed on the host: ``(ns, batch, prompt length, step index)``."""
        ns, batch, prompt_len, step = value
        self.observe(ns, batch, prompt_len, step)

    def device_step(self, value: tuple[Any, Any, int, int, int]) -> None:
        """Record target of a step timed on the device: ``(step series, pending token, batch, prompt
        length, step index)``; the pair waits with the other device timings until its events are done."""
        child, token, batch, prompt_len, step = value
        # Why built here and not on the step: the object costs 0.29 us (test CPU), paid by the drain
        # rather than the generating thread.
        self.pending.apply((_DeviceStep(self, child, batch, prompt_len, step), token))

    def observe(self, ns: int, batch: int, prompt_len: int, step: int) -> None:
        """One step of ``ns`` nanoseconds: step 0 is the prefill of ``prompt_len`` positions, step k
        a decode step with ``prompt_len + k`` positions in the cache after it."""
        if ns <= 0 or batch <= 0 or prompt_len <= 0:
            return
        if step:
            start, new, decode = prompt_len + step - 1, 1, 1
        else:
            start, new, decode = 0, prompt_len, 0
        if self.bandwidth is not None:
            self.mbu[decode](step_bytes(self.shape, batch, start, new) * 1e9 / (ns * self.bandwidth))
        if self.flops is not None:
            self.mfu[decode](step_flops(self.shape, batch, start, new) * 1e9 / (ns * self.flops))


class Utilization:
    """MBU and MFU of one instrumented model: its shape, its series, and the peaks of each device."""

    def __init__(self, model: Any, rt: Runtime, name: str) -> None:
        self.model_name = name
        self.rt = rt
        self.shape: ModelShape | None = None
        self.unsupported: str | None = None
        try:
            self.shape = measure(model)
        except UnsupportedShape as exc:
            self.unsupported = str(exc)
        except Exception as exc:  # an unusual model must not stop instrument()
            self.unsupported = f"the model could not be measured ({exc!r})"
        mbu, mfu = rt.family(MBU), rt.family(MFU)
        self.mbu = (mbu.child(model=name, phase="prefill").apply, mbu.child(model=name, phase="decode").apply)
        self.mfu = (mfu.child(model=name, phase="prefill").apply, mfu.child(model=name, phase="decode").apply)
        # device index (None: the CPU) -> (backends generation, target or None, peaks)
        self._devices: dict[int | None, tuple[int, StepUtilization | None, Peaks]] = {}
        self._names: dict[int, str | None] = {}
        self._home: int | None = None  # where the parameters are, for info() before the first call
        try:
            first = next(iter(model.parameters()), None)
            dev = tensor_device(first) if first is not None else None
            if dev is not None and dev.type == "cuda":
                self._home = dev.index if dev.index is not None else 0
        except Exception:
            pass
        register(self)

    def close(self) -> None:
        """The model is uninstrumented: info() stops listing it."""
        forget(self)

    def for_call(self, device: int | None) -> StepUtilization | None:
        """The record targets for a call on ``device`` (None: the CPU), or None if nothing is exported.

        Decided at the first call on a device and again after each reconfiguration, not per step.
        """
        generation = self.rt.backends.generation
        found = self._devices.get(device)
        if found is not None and found[0] == generation:
            return found[1]
        peaks = self._peaks(device)
        target = None
        if self.shape is not None and (peaks.memory_bandwidth is not None or peaks.flops is not None):
            target = StepUtilization(self.shape, peaks, self.mbu, self.mfu, self.rt.pending)
        if device is None or device in self._names or self.unsupported is not None:
            self._devices[device] = (generation, target, peaks)  # else: the name is asked at the next call
        return target

    def _device_name(self, device: int) -> str | None:
        if device in self._names:
            return self._names[device]
        torch = sys.modules.get("torch")
        try:
            # Asking a name initializes CUDA: never before the program has (asked again later).
            if torch is None or not torch.cuda.is_initialized():
                return None
            name = str(torch.cuda.get_device_name(device))
        except Exception:
            name = None
        self._names[device] = name
        return name

    def _peaks(self, device: int | None) -> Peaks:
        cfg = self.rt.settings
        label = "cpu" if device is None else f"cuda:{device}"
        name = None if device is None or self.unsupported is not None else self._device_name(device)
        return resolve_peaks(label, name, self.shape.dtype if self.shape is not None else None,
                             memory_bandwidth=cfg.peak_memory_bandwidth, flops=cfg.peak_flops,
                             unsupported=self.unsupported)

    def utilization_status(self) -> dict[str, dict[str, str]]:
        """``"<model> on <device>"`` → metric → exported or not, and why, under the settings in force."""
        devices = set(self._devices) or {self._home}
        out = {}
        for device in sorted(devices, key=lambda d: -1 if d is None else d):
            label = "cpu" if device is None else f"cuda:{device}"
            out[f"{self.model_name} on {label}"] = self._peaks(device).notes
        return out

    def __repr__(self) -> str:
        return f"Utilization({self.model_name!r})"
