"""The non_gemm section: the top kernels that are not matrix multiplications."""

from __future__ import annotations

from gpuprobe.report._tables import format_ns
from gpuprobe.report.sections._kernel_rows import kernel_section

__all__ = ["SECTION"]

SECTION = kernel_section(
    "non_gemm", "Non-GEMM kernels", lambda category: category != "gemm",
    lambda n: f"{n.count:,} kernels, {format_ns(n.total_ns)} in all",
)
