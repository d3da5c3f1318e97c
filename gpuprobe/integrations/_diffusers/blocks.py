"""The denoiser's blocks as layers: found once per pipeline, timed on one denoising step in N.

Each block (a UNet's down, mid and up blocks; a transformer's blocks) gets a forward pre-hook and a
forward hook for the sampled step only (why: a hooked module call costs ~6 us more on the test CPU, adding
and removing the hooks ~7 us once per sampled step; a step of a tiny UNet's 5 blocks runs ~2 ms). A
block's time is a sample of ``gpuprobe.layer.duration{model, layer.type, layer.index}`` (``layer.index``,
opt-in, is the block's path: ``down_blocks.1``): its host time on a CPU, its device span on a GPU (the
device of the block's parameters). Hooks step aside while Dynamo traces, so a compiled denoiser compiles
without a graph break; inside compiled code nothing is hooked (the compiled region is one call).
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any

from ... import _seams
from ..._placement import tensor_device
from ...runtime import Runtime
from . import compat

__all__ = ["BlockTiming", "find_blocks"]

_NO_SPAN = object()  # a block on a CUDA device whose device span could not be taken


def find_blocks(denoiser: Any) -> list[tuple[Any, str]]:
    """The denoiser's blocks as ``(module, path)``, in the order of its children (see :func:`.compat.blocks`).

    Example:
        >>> from diffusers import UNet2DModel
        >>> unet = UNet2DModel(sample_size=8, block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=2,
        ...                    down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
        >>> [path for _, path in find_blocks(unet)]
        ['down_blocks.0', 'down_blocks.1', 'up_blocks.0', 'up_blocks.1', 'mid_block']
    """
    return compat.blocks(denoiser)


class BlockTiming:
    """The block hooks of one pipeline's denoisers (installed for a sampled step, removed after it)."""

    def __init__(self, rt: Runtime, labels: dict[str, str], block_index: bool, current: Any, compiling: Any,
                 nvtx: Any, seam: _seams.Seam) -> None:
        self.rt = rt
        self._seam = seam  # its guard is written out here: torch calls the hooks, not a seam's replacement
        self._labels = labels
        self._index = block_index
        self._current = current  # () -> the call running on this thread, or None
        self._compiling = compiling
        self._nvtx = nvtx  # (backend, message, kind, payload) -> a prepared range
        self._lock = threading.Lock()
        self._children: dict[Any, Any] = {}
        self._messages: dict[Any, str] = {}
        self._devices: dict[Any, int | None] = {}
        self.blocks: list[Any] = []
        self._hooks: list[Any] = []
        self._users = 0

    def add(self, found: list[tuple[Any, str]]) -> None:
        """Time these blocks too (a denoiser met for the first time); their series are prepared now."""
        family = self.rt.family("gpuprobe.layer.duration")
        for block, path in found:
            if block in self._children:
                continue
            labels = {**self._labels, "layer.type": type(block).__name__}
            if self._index:
                labels["layer.index"] = path
            self._children[block] = family.child(**labels)
            self._messages[block] = f"{type(block).__name__} {path}"
            self.blocks.append(block)

    def acquire(self) -> None:
        """Hook every block (the first user of a sampled step; where their parameters are is read again)."""
        with self._lock:
            self._users += 1
            if self._users != 1:
                return
            self._devices.clear()
            for block in self.blocks:
                index = None
                for param in block.parameters():
                    dev = tensor_device(param)
                    index = dev.index if dev.type == "cuda" else None
                    if index is None and dev.type == "cuda":
                        index = 0
                    break
                self._devices[block] = index
                self._hooks.append(block.register_forward_pre_hook(self._pre))
                self._hooks.append(block.register_forward_hook(self._post, always_call=True))

    def release(self) -> None:
        """The sampled step ended: its user of the hooks is gone (the last one removes them)."""
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._remove()

    def remove(self) -> None:
        """Remove every hook now (uninstrument)."""
        with self._lock:
            self._users = 0
            self._remove()

    def _remove(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _pre(self, module: Any, args: Any) -> None:
        # Dynamo folds compiling() to True while tracing: no graph break from the hook.
        if self._compiling() or not self._seam.switch.on:
            return None
        try:
            self._start(module)
        except Exception as exc:  # gpuprobe's own failure: the steps' seams go off, the block runs on
            self._seam.fail(exc)
        return None

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling() or not self._seam.switch.on:
            return None
        try:
            self._stop(module)
        except Exception as exc:
            self._seam.fail(exc)
        return None

    def _start(self, module: Any) -> None:
        ctx = self._current()
        if ctx is None or not ctx.blocks_on:
            return
        nv = ctx.nv
        if nv is not None:
            nv.push(self._nvtx(nv, self._messages[module], "layer", ctx.step))
        token: Any = None
        clock = ctx.clock
        if clock is not None:
            device = self._devices.get(module)
            if device is not None:
                # On a GPU the host only queues kernels: without a device span the block gets no sample.
                token = clock.start(device) or _NO_SPAN
        ctx.block_stack.append((perf_counter_ns(), token))

    def _stop(self, module: Any) -> None:
        ctx = self._current()
        if ctx is None or not ctx.blocks_on or not ctx.block_stack:
            return
        t0, token = ctx.block_stack.pop()
        dt = perf_counter_ns() - t0
        child = self._children.get(module)
        if child is not None:
            if token is None:
                ctx.records.append((child.apply, dt))  # the block runs on the CPU: its host time
            elif token is not _NO_SPAN:
                ctx.records.append((self.rt.pending.apply, (child, ctx.clock.stop(token))))
        if ctx.nv is not None:
            ctx.nv.pop()
