"""Live memory-bandwidth utilization (MBU) and model FLOPs utilization (MFU): the arithmetic.

A leaf module (standard library only): the peak table and its matcher, the per-step byte and FLOP
counts of a decoder model, and the notes :func:`gpuprobe.info` shows. The transformers integration
measures a model once (:class:`ModelShape`) and, per step, hands this module four integers.

Per generation step, with ``B`` sequences, ``n`` new positions per sequence (the prompt length in the
prefill, 1 in a decode step) and ``c`` positions in the KV cache after the step::

    bytes = W + Σ_tables min(B·n, rows)·row_bytes + B · kv_token_bytes · Σ_layers min(c, window)
    FLOPs = 2·P_body·B·n + 2·P_head·B·n_logits + 4·H·B · Σ_layers Σ_{p=c-n+1..c} min(p, window)
    MBU   = bytes ÷ step time ÷ peak bytes/s
    MFU   = FLOPs ÷ step time ÷ peak FLOP/s

``W`` is the bytes of every parameter except the embedding tables (each table is read only at the
rows a step looks up; a table tied to the output head is read whole by the head, so it counts in
``W``); ``P_body`` the parameters except the embedding tables and the output head; ``P_head`` the
head's; ``n_logits`` is 1 when the forward computes the last position's logits only (transformers
passes ``logits_to_keep=1`` to models that accept it), else ``n``; ``H`` = attention heads × head
dimension; ``window`` is the sliding window of a sliding-window layer and unbounded otherwise. See
``docs/utilization.md`` for what is left out and why.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "GpuPeak",
    "PEAKS",
    "peaks_table",
    "match_device",
    "Peaks",
    "resolve_peaks",
    "ModelShape",
    "context_sum",
    "step_bytes",
    "step_flops",
    "MBU",
    "MFU",
    "register",
    "forget",
    "status",
]

MBU = "gpuprobe.step.memory_bandwidth.utilization"
MFU = "gpuprobe.step.flops.utilization"

BANDWIDTH_ENV = "GPUPROBE_PEAK_MEMORY_BANDWIDTH"
FLOPS_ENV = "GPUPROBE_PEAK_FLOPS"

T = 1e12
G = 1e9


@dataclasses.dataclass(frozen=True)
class GpuPeak:
    """One GPU's datasheet peaks.

    Attributes:
        name: how the table names it.
        tokens: words that must all be in the device name (lower case, split at non-alphanumerics).
        excludes: words that must not be.
        memory_bandwidth: bytes per second.
        flops: dense FLOP/s by parameter dtype (``bfloat16``, ``float16``, ``float32``); a dtype
            without a dense figure on the datasheet is absent.
        source: the vendor document the figures come from.
    """

    name: str
    tokens: tuple[str, ...]
    memory_bandwidth: float
    flops: Mapping[str, float]
    source: str
    excludes: tuple[str, ...] = ()


def _half(bf16: float, fp32: float) -> dict[str, float]:
    return {"bfloat16": bf16, "float16": bf16, "float32": fp32}


_H100 = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/v100/"

# First match wins: a more specific entry (H100 PCIe) comes before the general one (H100).
# FLOP/s are dense (NVIDIA datasheets print sparse figures with an asterisk; those are halved here).
# float32 is the rate PyTorch's default float32 matmul runs at: CUDA-core FP32 on NVIDIA (TF32 is
# off by default), the matrix-core FP32 rate on AMD Instinct.
PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("NVIDIA H200 NVL", ("h200", "nvl"), 4.8 * T, _half(835.5 * T, 60 * T), _H200),
    GpuPeak("NVIDIA H200 SXM", ("h200",), 4.8 * T, _half(989.5 * T, 67 * T), _H200),
    GpuPeak("NVIDIA H100 PCIe", ("h100", "pcie"), 2.0 * T, _half(756.5 * T, 51 * T), _H100),
    GpuPeak("NVIDIA H100 NVL", ("h100", "nvl"), 3.9 * T, _half(835.5 * T, 60 * T), _H100),
    GpuPeak("NVIDIA H100 SXM", ("h100",), 3.35 * T, _half(989.5 * T, 67 * T), _H100),
    GpuPeak("NVIDIA A100 80GB PCIe", ("a100", "80gb", "pcie"), 1935 * G, _half(312 * T, 19.5 * T), _A100),
    GpuPeak("NVIDIA A100 80GB SXM", ("a100", "80gb"), 2039 * G, _half(312 * T, 19.5 * T), _A100),
    GpuPeak("NVIDIA A100 40GB (SXM or PCIe)", ("a100",), 1555 * G, _half(312 * T, 19.5 * T), _A100),
    GpuPeak("NVIDIA L40S", ("l40s",), 864 * G, _half(362.05 * T, 91.6 * T),
            "NVIDIA L40S GPU datasheet, https://www.nvidia.com/en-us/data-center/l40s/"),
    GpuPeak("NVIDIA L40", ("l40",), 864 * G, _half(181.05 * T, 90.5 * T),
            "NVIDIA L40 GPU datasheet, https://www.nvidia.com/en-us/data-center/l40/"),
    GpuPeak("NVIDIA L4", ("l4",), 300 * G, _half(121 * T, 30.3 * T),
            "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"),
    GpuPeak("NVIDIA A10", ("a10",), 600 * G, _half(125 * T, 31.2 * T),
            "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    # NVIDIA publishes no A10G datasheet: the A10G (AWS G5) has the A10's 24 GB GDDR6 at 600 GB/s, but
    # other, unpublished tensor-core rates, so no FLOP/s are listed.
    GpuPeak("NVIDIA A10G", ("a10g",), 600 * G, {},
            "no vendor datasheet; bandwidth as the A10's, reported in "
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/"),
    GpuPeak("NVIDIA T4", ("t4",), 320 * G, {"float16": 65 * T, "float32": 8.1 * T},
            "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    GpuPeak("NVIDIA V100S PCIe", ("v100s",), 1134 * G, {"float16": 130 * T, "float32": 16.4 * T}, _V100),
    GpuPeak("NVIDIA V100 PCIe", ("v100", "pcie"), 900 * G, {"float16": 112 * T, "float32": 14 * T}, _V100),
    GpuPeak("NVIDIA V100 SXM2", ("v100",), 900 * G, {"float16": 125 * T, "float32": 15.7 * T}, _V100),
    GpuPeak("NVIDIA GeForce RTX 4090", ("rtx", "4090"), 1008 * G, _half(165.2 * T, 82.6 * T),
            "NVIDIA Ada GPU Architecture whitepaper, appendix A (FP16/BF16 tensor with FP32 accumulate), "
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            excludes=("laptop", "d")),
    GpuPeak("NVIDIA GeForce RTX 3090", ("rtx", "3090"), 936 * G, _half(71 * T, 35.6 * T),
            "NVIDIA Ampere GA102 GPU Architecture whitepaper (FP16/BF16 tensor with FP32 accumulate), "
            "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
            excludes=("ti", "laptop")),
    GpuPeak("AMD Instinct MI300X", ("mi300x",), 5.3 * T, _half(1307.4 * T, 163.4 * T),
            "AMD Instinct MI300X accelerator data sheet, "
            "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"),
    # PyTorch sees each of an MI250X's two dies (GCDs) as one device: half the package's figures.
    GpuPeak("AMD Instinct MI250X (one GCD)", ("mi250x",), 1.6384 * T, _half(191.5 * T, 47.85 * T),
            "AMD Instinct MI250X accelerator specifications (package figures halved per GCD), "
            "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"),
    GpuPeak("AMD Instinct MI210", ("mi210",), 1.6384 * T, _half(181 * T, 45.3 * T),
            "AMD Instinct MI210 accelerator specifications, "
            "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html"),
)

_WORD = re.compile(r"[a-z0-9]+")


def match_device(name: str) -> GpuPeak | None:
    """The table's entry for a device name as ``torch.cuda.get_device_name`` spells it, or None.

    A MIG slice (``... MIG 1g.10gb``) has a fraction of the GPU's bandwidth and compute, so it
    matches nothing.

    Example:
        >>> match_device("NVIDIA A100-SXM4-80GB").name
        'NVIDIA A100 80GB SXM'
        >>> match_device("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None
        True
    """
    words = set(_WORD.findall(name.lower()))
    if "mig" in words:
        return None
    for peak in PEAKS:
        if all(t in words for t in peak.tokens) and not any(x in words for x in peak.excludes):
            return peak
    return None


def peaks_table() -> str:
    """The Markdown table of :data:`PEAKS` (``docs/utilization.md`` holds a copy a test keeps current).

    Example:
        >>> peaks_table().splitlines()[0]
        '| GPU | device name contains | memory bandwidth | bf16 dense | fp16 dense | fp32 | source |'
    """
    def flops(peak: GpuPeak, dtype: str) -> str:
        value = peak.flops.get(dtype)
        return f"{value / T:g} TFLOP/s" if value else "—"

    lines = ["| GPU | device name contains | memory bandwidth | bf16 dense | fp16 dense | fp32 | source |",
             "|---|---|---|---|---|---|---|"]
    for p in PEAKS:
        words = " ".join(f"`{t}`" for t in p.tokens)
        if p.excludes:
            words += ", not " + " ".join(f"`{t}`" for t in p.excludes)
        lines.append(f"| {p.name} | {words} | {p.memory_bandwidth / G:g} GB/s | {flops(p, 'bfloat16')} | "
                     f"{flops(p, 'float16')} | {flops(p, 'float32')} | {p.source} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Peaks:
    """The peaks in force for one model on one device, and why each metric is exported or not.

    ``memory_bandwidth`` / ``flops`` are None when that metric is not exported; ``notes`` maps each
    metric name to one sentence for :func:`gpuprobe.info`.
    """

    memory_bandwidth: float | None
    flops: float | None
    notes: dict[str, str]


def _fmt(value: float, unit: str) -> str:
    return f"{value:.4g} {unit}"


def resolve_peaks(device: str, device_name: str | None, dtype: str | None, *,
                  memory_bandwidth: float | None = None, flops: float | None = None,
                  unsupported: str | None = None) -> Peaks:
    """The peaks for a model on a device: the overrides, else the table by device name and dtype.

    Args:
        device: the device as labels name it (``cpu``, ``cuda:0``).
        device_name: ``torch.cuda.get_device_name`` of a CUDA device; None on the CPU.
        dtype: the model's parameter dtype without ``torch.`` (``bfloat16``).
        memory_bandwidth: ``GPUPROBE_PEAK_MEMORY_BANDWIDTH`` (bytes/s), if set.
        flops: ``GPUPROBE_PEAK_FLOPS``, if set.
        unsupported: why the model's steps cannot be counted at all (then nothing is exported).

    Example:
        >>> resolve_peaks("cpu", None, "float32").notes[MBU]
        "not exported: no peak known for device 'cpu'; set GPUPROBE_PEAK_MEMORY_BANDWIDTH (bytes/s)"
        >>> resolve_peaks("cuda:0", "NVIDIA H100 80GB HBM3", "bfloat16").flops
        989500000000000.0
    """
    if unsupported is not None:
        note = f"not exported: {unsupported}"
        return Peaks(None, None, {MBU: note, MFU: note})
    entry = match_device(device_name) if device_name else None
    shown = repr(device_name) if device_name else repr(device)
    notes = {}
    bw: float | None
    if memory_bandwidth is not None:
        bw = memory_bandwidth
        notes[MBU] = f"exported: peak {_fmt(bw, 'B/s')} from {BANDWIDTH_ENV}"
    elif entry is not None:
        bw = entry.memory_bandwidth
        notes[MBU] = f"exported: peak {_fmt(bw, 'B/s')} of {entry.name} (device {shown})"
    else:
        bw = None
        notes[MBU] = f"not exported: no peak known for device {shown}; set {BANDWIDTH_ENV} (bytes/s)"
    fl: float | None
    if flops is not None:
        fl = flops
        notes[MFU] = f"exported: peak {_fmt(fl, 'FLOP/s')} from {FLOPS_ENV}"
    elif entry is not None and dtype is not None and dtype in entry.flops:
        fl = entry.flops[dtype]
        notes[MFU] = f"exported: dense {dtype} peak {_fmt(fl, 'FLOP/s')} of {entry.name} (device {shown})"
    elif entry is not None:
        fl = None
        notes[MFU] = (f"not exported: no dense {dtype} peak known for {entry.name} (device {shown}); "
                      f"set {FLOPS_ENV} (FLOP/s)")
    else:
        fl = None
        notes[MFU] = f"not exported: no peak known for device {shown}; set {FLOPS_ENV} (FLOP/s)"
    return Peaks(bw, fl, notes)


# -- a model's steps ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What a decoder model reads and computes per step, measured once when it is instrumented.

    Attributes:
        weight_bytes: bytes of the parameters read in full every step (all but embedding tables not
            tied to the output head).
        tables: ``(rows, bytes per row)`` of each embedding table read row by row.
        body_params: parameters doing 2 FLOPs per token (all but embedding tables and the output head).
        head_params: parameters of the output head (vocabulary projection).
        logits_all: the forward computes logits for every new position, not the last one only.
        full_layers: attention layers that see the whole context.
        window_layers: sliding-window attention layers, each seeing the last ``window`` positions.
        window: the sliding window (0 without such layers).
        attn_width: attention heads × head dimension (queries).
        kv_token_bytes: KV-cache bytes of one position in one layer of one sequence
            (2 × key-value heads × head dimension × element size).
        dtype: the dtype of most parameters, without ``torch.`` (picks the FLOP/s peak).
    """

    weight_bytes: int
    tables: tuple[tuple[int, int], ...]
    body_params: int
    head_params: int
    logits_all: bool
    full_layers: int
    window_layers: int
    window: int
    attn_width: int
    kv_token_bytes: int
    dtype: str


def context_sum(start: int, new: int, window: int = 0) -> int:
    """Σ over positions p = start+1 … start+new of min(p, window): the keys each new query attends to
    under a causal mask (``window`` 0: no window).

    Example:
        >>> context_sum(0, 4), context_sum(9, 1), context_sum(0, 4, window=2), context_sum(9, 1, window=4)
        (10, 10, 7, 4)
    """
    end = start + new
    if not window or end <= window:
        return (end * (end + 1) - start * (start + 1)) // 2
    if start >= window:
        return new * window
    return (window * (window + 1) - start * (start + 1)) // 2 + (end - window) * window


def step_bytes(shape: ModelShape, batch: int, start: int, new: int) -> int:
    """Bytes a step must read: weights, looked-up embedding rows, and the KV cache after the step.

    Args:
        shape: the model.
        batch: sequences in the step.
        start: positions in the KV cache before the step (0 for the prefill).
        new: positions each sequence adds in the step (the prompt length, or 1).
    """
    tokens = batch * new
    total = shape.weight_bytes
    for rows, row_bytes in shape.tables:
        total += (tokens if tokens < rows else rows) * row_bytes
    end = start + new
    held = shape.full_layers * end
    if shape.window_layers:
        held += shape.window_layers * (end if end < shape.window else shape.window)
    return total + batch * shape.kv_token_bytes * held


def step_flops(shape: ModelShape, batch: int, start: int, new: int) -> int:
    """FLOPs of a step: 2 per parameter per token, the head on the positions it projects, attention.

    Args: as :func:`step_bytes`.
    """
    tokens = batch * new
    flops = 2 * shape.body_params * tokens + 2 * shape.head_params * (tokens if shape.logits_all else batch)
    pairs = shape.full_layers * context_sum(start, new)
    if shape.window_layers:
        pairs += shape.window_layers * context_sum(start, new, shape.window)
    return flops + 4 * shape.attn_width * batch * pairs


# -- what gpuprobe.info() says -------------------------------------------------------------------------

class Subject(Protocol):
    def utilization_status(self) -> dict[str, dict[str, str]]: ...


_subjects: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def register(subject: Subject) -> None:
    """Show ``subject``'s notes in :func:`status` while it lives (an instrumented model)."""
    with _lock:
        _subjects.add(subject)


def forget(subject: Subject) -> None:
    """Stop showing ``subject`` (the model was uninstrumented)."""
    with _lock:
        _subjects.discard(subject)


def status() -> dict[str, dict[str, str]]:
    """``"<model> on <device>"`` → metric → whether it is exported, and why (for :func:`gpuprobe.info`).

    Example:
        >>> isinstance(status(), dict)
        True
    """
    with _lock:
        subjects = list(_subjects)
    out: dict[str, dict[str, str]] = {}
    for subject in subjects:
        try:
            out.update(subject.utilization_status())
        except Exception as exc:  # info() must answer even if one model cannot
            out[repr(subject)] = {MBU: f"unknown: {exc!r}", MFU: f"unknown: {exc!r}"}
    return dict(sorted(out.items()))


if __name__ == "__main__":
    print(peaks_table(), end="")
