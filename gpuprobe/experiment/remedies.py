"""Which ``gpuprobe try`` variant measures the remedy a finding names: the table lives in :mod:`gpuprobe._remedies`.

A leaf of its own, so that the live sync audit reads it without importing ``gpuprobe try``; its names are
the same objects here, and public through :mod:`gpuprobe.experiment`.

Example:
    >>> from gpuprobe.experiment.remedies import try_command
    >>> try_command("kv_cache_concat", "./my-model")
    'gpuprobe try ./my-model --variants static-cache'
"""

from __future__ import annotations

from gpuprobe._remedies import (FACTORY_EXAMPLE, FACTORY_WORDS, REMEDY_VARIANTS, RemedyVariants, remedy_line,
                                try_command, variant_for_sync_site)

__all__ = ["RemedyVariants", "REMEDY_VARIANTS", "FACTORY_EXAMPLE", "FACTORY_WORDS", "try_command", "remedy_line",
           "variant_for_sync_site"]
