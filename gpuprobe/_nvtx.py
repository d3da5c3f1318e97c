"""NVTX ranges, with the backend picked once: the ``nvtx`` package → ``torch.cuda.nvtx`` → no-op.

With the ``nvtx`` package, ranges go to the ``gpuprobe`` domain, with one category per kind
(generate, step, logits_processor, layer, user, ...), registered message strings and, where one is
known, the step index as payload. When no NVTX tool (nsys, ncu, an injection library) is attached,
``nvtx`` hands back a dummy domain and gpuprobe uses the no-op backend, as ``nvtx.annotate`` does.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

__all__ = ["NvtxBackend", "pick", "DOMAIN", "CATEGORIES"]

DOMAIN = "gpuprobe"
CATEGORIES = ("generate", "step", "component", "logits_processor", "stopping_criterion", "layer", "user")
_COLORS = {
    "generate": 0x4E79A7, "step": 0xF28E2B, "component": 0x59A14F, "logits_processor": 0xE15759,
    "layer": 0x76B7B2, "user": 0xB07AA1,
}


class NvtxBackend:
    """No-op ranges; the base of the real backends. ``prepare`` runs once per probe, not per call."""

    name = "off"
    enabled = False

    def prepare(self, message: str, kind: str, payload: int | None = None) -> Any:
        """Build what ``push``/``start`` take for this message (a registered, attributed range)."""
        return None

    def push(self, handle: Any) -> None:
        """Open a thread-local (push/pop) range."""

    def pop(self) -> None:
        """Close the innermost range of this thread."""

    def start(self, handle: Any) -> Any:
        """Open a process-wide range (for async code and generators); returns its id."""
        return None

    def end(self, range_id: Any) -> None:
        """Close a range opened by :meth:`start`."""


class _PackageBackend(NvtxBackend):
    name = "nvtx"
    enabled = True

    def __init__(self, domain: Any) -> None:
        self._domain = domain
        self._cats = {kind: domain.get_category_id(kind) for kind in CATEGORIES}
        self._lock = threading.Lock()
        # Bound once: the hot path calls these directly (no attribute lookups per call).
        self.push = domain.push_range  # type: ignore[method-assign]
        self.pop = domain.pop_range  # type: ignore[method-assign]
        self.start = domain.start_range  # type: ignore[method-assign]
        self.end = domain.end_range  # type: ignore[method-assign]

    def prepare(self, message: str, kind: str, payload: int | None = None) -> Any:
        # get_event_attributes registers the message (nvtxDomainRegisterStringA) and caches it.
        cat = self._cats.get(kind)
        if cat is None:
            with self._lock:
                cat = self._cats.setdefault(kind, self._domain.get_category_id(kind))
        return self._domain.get_event_attributes(message=message, color=_COLORS.get(kind, 0x9C755F),
                                                 category=cat, payload=payload)


class _TorchBackend(NvtxBackend):
    name = "torch.cuda.nvtx"
    enabled = True

    def __init__(self, nvtx: Any) -> None:
        self.push = nvtx.range_push  # type: ignore[method-assign]
        self.pop = nvtx.range_pop  # type: ignore[method-assign]
        self.start = nvtx.range_start  # type: ignore[method-assign]
        self.end = nvtx.range_end  # type: ignore[method-assign]

    def prepare(self, message: str, kind: str, payload: int | None = None) -> Any:
        return message if payload is None else f"{message} {payload}"


def pick() -> NvtxBackend:
    """Choose the NVTX backend (called once, when the first probe is prepared)."""
    if os.environ.get("NVTX_DISABLE"):
        return NvtxBackend()
    try:
        import nvtx  # optional dependency: gpuprobe[nvtx]
    except ImportError:
        nvtx = None
    if nvtx is not None:
        domain = nvtx.get_domain(DOMAIN)
        if type(domain).__name__ == "DummyDomain":  # no tool attached: nothing would record ranges
            return NvtxBackend()
        return _PackageBackend(domain)
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("NVTX_INJECTION64_PATH"):
        try:
            if torch.cuda.device_count() > 0:  # not is_available(): that would poison fork
                torch.cuda.nvtx.range_push("gpuprobe")  # raises on builds without NVTX
                torch.cuda.nvtx.range_pop()
                return _TorchBackend(torch.cuda.nvtx)
        except Exception:
            pass
    return NvtxBackend()
