"""A simulated CUDA for machines without a GPU: ``torch.cuda`` with the semantics of torch 2.13."""

from __future__ import annotations

from .profiler import (
    CUDA_RUNTIME,
    CUDA_SYNC,
    GPU_MEMCPY,
    GPU_MEMSET,
    GPU_USER_ANNOTATION,
    KERNEL,
    KernelRecord,
    SimCUDAGraph,
    SimDeviceProperties,
    SimEvent,
    SimStats,
    SimStream,
    SimulatedCuda,
    simulated_cuda,
)

__all__ = [
    "KernelRecord",
    "SimEvent",
    "SimCUDAGraph",
    "SimDeviceProperties",
    "SimStats",
    "SimStream",
    "SimulatedCuda",
    "simulated_cuda",
]
