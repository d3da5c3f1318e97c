"""Where tensors live for gpuprobe: a CPU build holds no tensor on a device, so tests mark tensors and
modules as living on a simulated device (:meth:`PlacementMixin.place`), and the simulation answers
gpuprobe's device resolver (``gpuprobe._placement``) while installed."""

from __future__ import annotations

import weakref
from typing import Any

from ._torch_compat import import_torch

__all__ = ["PlacementMixin"]


class PlacementMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` that says where tensors live."""

    def place(self, obj: Any, device: Any) -> Any:
        """Mark a tensor, or every parameter and buffer of an ``nn.Module``, as living on ``cuda:device``.

        Only for gpuprobe's view (``gpuprobe._placement.tensor_device``); the tensors stay on the CPU.
        References are weak. Views, ``.data`` and ``detach()`` of a placed tensor share its storage
        and are placed too. Returns ``obj``.

        Example:
            >>> import torch
            >>> from gpuprobe._placement import tensor_device
            >>> from gpuprobe.testing.simcuda import simulated_cuda
            >>> with simulated_cuda() as sim:
            ...     layer = sim.place(torch.nn.Linear(2, 2), 1)
            ...     tensor_device(layer.weight)
            device(type='cuda', index=1)
        """
        torch = import_torch()
        index = self._device_index_arg(device)
        if isinstance(obj, torch.nn.Module):
            tensors = list(obj.parameters()) + list(obj.buffers())
        elif isinstance(obj, torch.Tensor):
            tensors = [obj]
        else:
            raise TypeError(f"simulated CUDA: place() takes a tensor or an nn.Module, got {type(obj).__name__}")
        with self._lock:
            for t in tensors:
                self._place_one(t, index)
        return obj

    def device_of(self, x: Any) -> Any:
        """Where gpuprobe sees ``x``: ``cuda:k`` if placed, ``cuda:cpu_tensors_on`` for other CPU tensors
        when set, else ``x.device``. Installed as gpuprobe's device resolver."""
        torch = import_torch()
        if isinstance(x, torch.Tensor):
            index = self._placed_index(x)
            if index is not None:
                return torch.device("cuda", index)
            if self.cpu_tensors_on is not None and x.device.type == "cpu":
                return torch.device("cuda", self.cpu_tensors_on)
        return x.device

    def _device_index_arg(self, device: Any) -> int:
        torch = import_torch()
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"simulated CUDA: expected a cuda device, got {device}")
            device = 0 if device.index is None else device.index
        return self._check_device(int(device))

    def _place_one(self, t: Any, index: int) -> None:
        key, ptr = id(t), self._storage_ptr(t)

        def forget(ref: weakref.ref[Any]) -> None:
            with self._lock:
                if self._placed.get(key, (None,))[0] is ref:
                    del self._placed[key]
                if ptr and self._placed_storage.get(ptr, (None,))[0] is ref:
                    del self._placed_storage[ptr]

        ref = weakref.ref(t, forget)
        self._placed[key] = (ref, index)
        if ptr:
            self._placed_storage[ptr] = (ref, index)

    @staticmethod
    def _storage_ptr(t: Any) -> int:
        try:
            return int(t.untyped_storage().data_ptr())
        except Exception:  # meta tensors, tensor subclasses without storage
            return 0

    def _placed_index(self, t: Any) -> int | None:
        with self._lock:
            entry = self._placed.get(id(t))
            if entry is not None and entry[0]() is t:
                return entry[1]
            if not self._placed_storage:
                return None
        ptr = self._storage_ptr(t)
        if not ptr:
            return None
        with self._lock:
            entry = self._placed_storage.get(ptr)
        if entry is None:
            return None
        owner = entry[0]()
        if owner is None or self._storage_ptr(owner) != ptr:
            return None
        return entry[1]
