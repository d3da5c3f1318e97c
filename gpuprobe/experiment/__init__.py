"""``gpuprobe try``: measure the remedies gpuprobe's findings name, on this model and this machine.

The profiling guides' experiments as one call: the baseline and every variant that applies (static
KV cache, static cache + ``torch.compile``, each attention implementation, half precision, the run
without a logits processor or stopping criterion that syncs or takes time, continuous batching for a
batch of requests), at each prompt length and batch size asked for, warmed up, then interleaved in
rounds within a time budget; medians with their spread, a verdict only past the spread, greedy outputs
compared with the baseline's, and the exact code change of each variant.

Example:
    >>> from gpuprobe.experiment import render, try_remedies
    >>> result = try_remedies(model, {"input_ids": ids, "max_new_tokens": 32}, budget="60s")  # doctest: +SKIP
    >>> print(render(result, "text"))  # doctest: +SKIP

Nothing here is imported by ``import gpuprobe``; torch and transformers load when an experiment runs.
See ``docs/try.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuprobe.experiment.cli import main
    from gpuprobe.experiment.faults import Fault, ModelFailed
    from gpuprobe.experiment.outputs import OutputMatch
    from gpuprobe.experiment.plotting import plot
    from gpuprobe.experiment.rendering import render
    from gpuprobe.experiment.remedies import REMEDY_VARIANTS, RemedyVariants, remedy_line, try_command, \
        variant_for_sync_site
    from gpuprobe.experiment.result import TryResult, VariantResult, WorkloadResult
    from gpuprobe.experiment.runner import try_remedies
    from gpuprobe.experiment.variants import NotRun, Variant

# why: each name loads its module on first use, so the finding → variant table (remedies) can be read
# without loading the runner, torch or transformers
_LAZY = {
    "try_remedies": "gpuprobe.experiment.runner",
    "TryResult": "gpuprobe.experiment.result",
    "WorkloadResult": "gpuprobe.experiment.result",
    "VariantResult": "gpuprobe.experiment.result",
    "Variant": "gpuprobe.experiment.variants",
    "NotRun": "gpuprobe.experiment.variants",
    "Fault": "gpuprobe.experiment.faults",
    "ModelFailed": "gpuprobe.experiment.faults",
    "OutputMatch": "gpuprobe.experiment.outputs",
    "REMEDY_VARIANTS": "gpuprobe.experiment.remedies",
    "RemedyVariants": "gpuprobe.experiment.remedies",
    "remedy_line": "gpuprobe.experiment.remedies",
    "try_command": "gpuprobe.experiment.remedies",
    "variant_for_sync_site": "gpuprobe.experiment.remedies",
    "render": "gpuprobe.experiment.rendering",
    "plot": "gpuprobe.experiment.plotting",
    "main": "gpuprobe.experiment.cli",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuprobe.experiment' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
