"""Whether torch has a CUDA device, asked without touching the CUDA driver where torch allows it.

``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which initializes the driver (``cuInit``):
from then on a forked child cannot use CUDA ("Cannot re-initialize CUDA in forked subprocess").
``torch.cuda.device_count()`` asks NVML first and does not poison fork when NVML answers, so gpuprobe
asks that. A leaf module: it imports nothing of gpuprobe.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["torch_with_cuda"]


def torch_with_cuda(*, import_torch: bool = False) -> Any | None:
    """``torch`` when it is imported (or ``import_torch``) and sees a CUDA device, else None.

    Never initializes CUDA; never raises (a broken install counts as no device).

    Example:
        >>> torch_with_cuda() is None or torch_with_cuda().cuda.device_count() > 0
        True
    """
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch  # noqa: F811 - asked for explicitly
        except ImportError:
            return None
    if torch is None:
        return None
    try:
        return torch if torch.cuda.device_count() > 0 else None
    except Exception:
        return None
