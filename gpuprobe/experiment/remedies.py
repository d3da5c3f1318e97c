"""Which ``gpuprobe try`` variant measures the remedy a finding names: the other half of the loop.

``gpuprobe report`` and the live findings (the sync audit's first sightings) say what to change;
``gpuprobe try`` measures the change. This module is the table between them: pure data and string
formatting, importing nothing (the report may read it without loading torch, transformers or the rest
of :mod:`gpuprobe.experiment`).

Example:
    >>> try_command("kv_cache_concat", "./my-model")
    'gpuprobe try ./my-model --variants static-cache'
    >>> remedy_line("attention_impl")
    'Measure it: gpuprobe try MODEL --variants attention'
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["RemedyVariants", "REMEDY_VARIANTS", "try_command", "remedy_line", "variant_for_sync_site"]


@dataclasses.dataclass(frozen=True)
class RemedyVariants:
    """The ``gpuprobe try`` variants that measure one finding's remedy.

    Attributes:
        variants: what ``--variants`` takes: variant names (``static-cache``) or groups (``attention``,
            ``processors``: every logits processor and stopping criterion that syncs or takes time).
        measures: what the run compares, for people.
    """

    variants: tuple[str, ...]
    measures: str

    @property
    def option(self) -> str:
        """The ``--variants`` value."""
        return ",".join(self.variants)


#: Finding id (``gpuprobe report``'s rules, ``docs/diagnosis.md``) → the variants that measure its remedy.
#: Findings whose remedy is not a change ``gpuprobe try`` can make (pinned copies, unknown kernels) are absent.
REMEDY_VARIANTS: Mapping[str, RemedyVariants] = MappingProxyType({
    "host_sync": RemedyVariants(("processors",), "the run without each logits processor and stopping criterion "
                                                 "that syncs"),
    "logits_processor_share": RemedyVariants(("processors",), "the run without each slow logits processor"),
    "kv_cache_concat": RemedyVariants(("static-cache",), "a static KV cache against the dynamic one"),
    "launch_bound": RemedyVariants(("static-cache+compile",), "a static cache with the forward compiled "
                                                              "(CUDA graphs on a GPU)"),
    "cuda_graphs": RemedyVariants(("static-cache+compile",), "a static cache with the forward compiled "
                                                             "(CUDA graphs on a GPU)"),
    "small_kernels": RemedyVariants(("static-cache+compile",), "the forward compiled (fused kernels)"),
    "attention_impl": RemedyVariants(("attention",), "every attention implementation the model and the machine "
                                                     "have"),
})


def try_command(finding_id: str, model: str = "MODEL") -> str | None:
    """The ``gpuprobe try`` command line that measures ``finding_id``'s remedy, or None when none does.

    Args:
        finding_id: a finding's ``id`` (``kv_cache_concat``, ``host_sync``, ...).
        model: what the command names as MODEL: a local model folder or ``module:factory``.

    Example:
        >>> try_command("launch_bound")
        'gpuprobe try MODEL --variants static-cache+compile'
        >>> try_command("pageable_memcpy") is None
        True
    """
    entry = REMEDY_VARIANTS.get(finding_id)
    if entry is None:
        return None
    shown = model if model == "MODEL" else shlex.quote(model)
    return f"gpuprobe try {shown} --variants {entry.option}"


def remedy_line(finding_id: str, model: str = "MODEL") -> str:
    """One sentence to end a finding's remedy with (empty when no variant measures it).

    Example:
        >>> remedy_line("host_sync")
        'Measure it: gpuprobe try MODEL --variants processors'
        >>> remedy_line("other_category")
        ''
    """
    command = try_command(finding_id, model)
    return f"Measure it: {command}" if command else ""


def variant_for_sync_site(component: str, processor: str | None) -> str | None:
    """The variant that measures the run without what the sync audit caught synchronising.

    A live finding of the sync audit names a component and, for logits processors and stopping
    criteria, the class (``gpuprobe.info()["sync_sites"]``, ``docs/sync-audit.md``).

    Example:
        >>> variant_for_sync_site("logits_processor", "BanRepeats")
        'no-logits-processor:BanRepeats'
        >>> variant_for_sync_site("other", None) is None
        True
    """
    if not processor:
        return None
    if component == "logits_processor":
        return f"no-logits-processor:{processor}"
    if component == "stopping_criteria":
        return f"no-stopping-criterion:{processor}"
    return None
