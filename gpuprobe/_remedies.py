"""Which ``gpuprobe try`` variant measures the remedy a finding names: the other half of the loop.

``gpuprobe report`` and the live findings (the sync audit's first sightings) say what to change;
``gpuprobe try`` measures the change. This module is the table between them: pure data and string
formatting, importing nothing (a leaf: the live sync audit and the report read it without loading torch,
transformers or :mod:`gpuprobe.experiment`, which re-exports its names).

A remedy in the user's own ``generate()`` arguments (running without one of their logits processors) can
only be measured on a factory, which passes them (``file.py:factory`` returning ``(model,
generate_kwargs)``): a model folder carries none. Its command names the factory form.

Example:
    >>> try_command("kv_cache_concat", "./my-model")
    'gpuprobe try ./my-model --variants static-cache'
    >>> remedy_line("attention_impl")
    'Measure it: gpuprobe try MODEL --variants attention'
    >>> try_command("host_sync")
    'gpuprobe try myfile.py:make --variants processors'
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["RemedyVariants", "REMEDY_VARIANTS", "FACTORY_EXAMPLE", "FACTORY_WORDS", "try_command", "remedy_line",
           "variant_for_sync_site"]

#: How the commands name MODEL where it must be a factory of the user's (``file.py:factory``).
FACTORY_EXAMPLE = "myfile.py:make"
#: What such a factory is, said after its command.
FACTORY_WORDS = "make() in myfile.py returns (model, generate_kwargs), your logits processors in them"


@dataclasses.dataclass(frozen=True)
class RemedyVariants:
    """The ``gpuprobe try`` variants that measure one finding's remedy.

    Attributes:
        variants: what ``--variants`` takes: variant names (``static-cache``) or groups (``attention``,
            ``processors``: every logits processor and stopping criterion that syncs or takes time).
        measures: what the run compares, for people.
        factory: the variants change the user's own ``generate()`` arguments (their logits processors and
            stopping criteria), which only a factory passes: MODEL must be ``file.py:factory``, not a folder.
    """

    variants: tuple[str, ...]
    measures: str
    factory: bool = False

    @property
    def option(self) -> str:
        """The ``--variants`` value."""
        return ",".join(self.variants)


#: Finding id (``gpuprobe report``'s rules, ``docs/diagnosis.md``) → the variants that measure its remedy.
#: Findings whose remedy is not a change ``gpuprobe try`` can make (pinned copies, unknown kernels) are absent.
REMEDY_VARIANTS: Mapping[str, RemedyVariants] = MappingProxyType({
    "host_sync": RemedyVariants(("processors",), "the run without each logits processor and stopping criterion "
                                                 "that syncs", factory=True),
    "logits_processor_share": RemedyVariants(("processors",), "the run without each slow logits processor",
                                             factory=True),
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
        model: what the command names as MODEL: a local model folder or ``module:factory``; left as
            ``MODEL``, a remedy that needs a factory names :data:`FACTORY_EXAMPLE`.

    Example:
        >>> try_command("launch_bound")
        'gpuprobe try MODEL --variants static-cache+compile'
        >>> try_command("pageable_memcpy") is None
        True
    """
    entry = REMEDY_VARIANTS.get(finding_id)
    if entry is None:
        return None
    if model == "MODEL" and entry.factory:
        model = FACTORY_EXAMPLE
    shown = model if model in ("MODEL", FACTORY_EXAMPLE) else shlex.quote(model)
    return f"gpuprobe try {shown} --variants {entry.option}"


def remedy_line(finding_id: str, model: str = "MODEL") -> str:
    """One sentence to end a finding's remedy with (empty when no variant measures it).

    Example:
        >>> remedy_line("kv_cache_concat")
        'Measure it: gpuprobe try MODEL --variants static-cache'
        >>> print(remedy_line("host_sync"))  # doctest: +NORMALIZE_WHITESPACE
        Measure it: gpuprobe try myfile.py:make --variants processors (make() in myfile.py returns (model,
        generate_kwargs), your logits processors in them)
        >>> remedy_line("other_category")
        ''
    """
    command = try_command(finding_id, model)
    if not command:
        return ""
    entry = REMEDY_VARIANTS[finding_id]
    return f"Measure it: {command}" + (f" ({FACTORY_WORDS})" if entry.factory and FACTORY_EXAMPLE in command else "")


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
