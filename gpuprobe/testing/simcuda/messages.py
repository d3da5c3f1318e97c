"""What the simulated CUDA raises and warns, in torch's words: messages verbatim, CUDA runtime errors with
their codes, and how torch formats device indices and sizes in them."""

from __future__ import annotations

import os

from ._torch_compat import import_torch

# Messages torch raises, verbatim.
# torch/cuda/__init__.py _lazy_init:
_FORK_MESSAGE = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the 'spawn' start method"
)
# CUDA runtime error strings (cudaGetErrorString), with their cudaError_t codes.
_CUDA_ERRORS: dict[str, tuple[int, str]] = {
    "cudaErrorInvalidValue": (1, "invalid argument"),
    "cudaErrorNotReady": (34, "device not ready"),
    "cudaErrorInvalidDevice": (101, "invalid device ordinal"),
    "cudaErrorInvalidResourceHandle": (400, "invalid resource handle"),
    "cudaErrorStreamCaptureUnsupported": (900, "operation not permitted when stream is capturing"),
    "cudaErrorStreamCaptureInvalidated": (901, "operation failed due to a previous error during capture"),
    "cudaErrorCapturedEvent": (907, "operation not permitted on an event last recorded in a capturing stream"),
    "cudaErrorStreamCaptureWrongThread": (
        908,
        "attempt to terminate a thread-local capture sequence from another thread",
    ),
}
_SYNC_MESSAGE = "called a synchronizing CUDA operation"  # c10/cuda/CUDAFunctions.cpp warn_or_error_on_sync
_SYNC_PROTOTYPE_WARNING = (  # torch/csrc/cuda/Module.cpp THCPModule_cudaSetSyncDebugMode (TORCH_WARN_ONCE)
    "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations"
)


def _check_suffix() -> str:
    """The tail c10_cuda_check_implementation appends (c10/cuda/CUDAMiscFunctions get_cuda_check_suffix)."""
    flag = os.environ.get("CUDA_LAUNCH_BLOCKING", "")
    blocking = flag not in ("", "0")
    tail = "" if blocking else (
        "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )
    return tail + "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"


def _cuda_error(name: str) -> Exception:
    """The exception ``C10_CUDA_CHECK`` raises for a CUDA error: ``torch.AcceleratorError`` (a RuntimeError)."""
    torch = import_torch()
    code, text = _CUDA_ERRORS[name]
    exc_type: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)
    exc = exc_type("CUDA error: " + text + _check_suffix())
    # torch sets error_code (the cudaError_t) on the AcceleratorError it raises (torch/csrc/Exceptions.cpp);
    # torch/_C/__init__.pyi declares the class without the attribute.
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


def _cuda_error_code(name: str) -> int:
    """The ``cudaError_t`` of a CUDA error, as the runtime's C functions return it."""
    return _CUDA_ERRORS[name][0]


def _c10_index(index: int) -> str:
    """How ``c10::str`` prints a ``DeviceIndex``: it is an ``int8_t`` (c10/core/Device.h), which an
    ``std::ostream`` writes as a character (c10/util/StringUtil.h has no overload for it)."""
    return chr(index % 256)


def _format_size(size: int) -> str:
    """Bytes as the caching allocator's ``format_size`` writes them in OOM messages."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"
