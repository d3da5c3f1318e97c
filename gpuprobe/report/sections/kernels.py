"""The kernels section: the top kernels by total time (``share`` of all kernel time)."""

from __future__ import annotations

from gpuprobe.report._tables import format_ns
from gpuprobe.report.sections._kernel_rows import KernelsSection, KernelStat, kernel_section

__all__ = ["KernelStat", "KernelsSection", "SECTION"]

SECTION = kernel_section(
    "kernels", "Top kernels", lambda category: True,
    lambda k: f"{k.count:,} kernels of {k.distinct:,} names, {format_ns(k.total_ns)} in all",
)
