"""The attention section: the top attention kernels."""

from __future__ import annotations

from gpuprobe.report._tables import format_ns
from gpuprobe.report.sections._kernel_rows import kernel_section

__all__ = ["SECTION"]

SECTION = kernel_section(
    "attention", "Attention kernels", lambda category: category == "attention",
    lambda a: f"{a.count:,} kernels, {format_ns(a.total_ns)} in all",
)
