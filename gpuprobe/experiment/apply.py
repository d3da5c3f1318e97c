"""Applying a variant: run its code, exactly as printed, against the model and the keyword arguments.

Example:
    >>> scope = run_code('generate_kwargs["max_new_tokens"] = 4', model=None, kwargs={"max_new_tokens": 16})
    >>> scope["generate_kwargs"]
    {'max_new_tokens': 4}
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gpuprobe.errors import ConfigError

from .variants import COPY, Variant

__all__ = ["Prepared", "prepare", "run_code", "fresh_kwargs"]


def fresh_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the keyword arguments whose lists are copies too (the tensors and processors are shared)."""
    return {k: (type(v)(v) if isinstance(v, list) else v) for k, v in kwargs.items()}


def run_code(code: str, model: Any, kwargs: Mapping[str, Any], *, what: str = "variant") -> dict[str, Any]:
    """Run ``code`` with ``model``, ``generate_kwargs``, ``torch`` and ``transformers`` in scope; returns the scope.

    Raises:
        ConfigError: the code does not compile or raises; the message names the variant.
    """
    import torch
    import transformers

    scope: dict[str, Any] = {"model": model, "generate_kwargs": fresh_kwargs(kwargs), "torch": torch,
                             "transformers": transformers}
    try:
        exec(compile(code, f"<{what}>", "exec"), scope)  # the variant's code is the change measured
    except Exception as exc:
        raise ConfigError(f"{what}: its code failed: {type(exc).__name__}: {exc}\n{code}") from exc
    if not isinstance(scope.get("generate_kwargs"), dict):
        raise ConfigError(f"{what}: its code must leave generate_kwargs a dict")
    return scope


@dataclasses.dataclass
class Prepared:
    """A variant made ready once: :meth:`call_args` gives what to call for each call."""

    variant: Variant
    model: Any
    kwargs: Mapping[str, Any]

    def call_args(self, overrides: Mapping[str, Any] | None = None) -> tuple[Callable[..., Any], dict[str, Any]]:
        """Apply the variant's code (``call`` scope: every call, on fresh keyword arguments).

        Args:
            overrides: keyword arguments set before the code runs (``do_sample=False`` for the greedy
                comparison of a sampling baseline).
        """
        kwargs = {**self.kwargs, **overrides} if overrides else self.kwargs
        if self.variant.scope == COPY:
            return self.model.generate, fresh_kwargs(kwargs)
        scope = run_code(self.variant.code, self.model, kwargs, what=self.variant.name)
        generate = scope.get("generate") or scope["model"].generate
        return generate, scope["generate_kwargs"]

    def restore(self) -> None:
        """Undo what the code changed on the shared model (an attention switch)."""
        if self.variant.restore and self.variant.scope != COPY:
            run_code(self.variant.restore, self.model, self.kwargs, what=f"{self.variant.name} (restore)")


def prepare(variant: Variant, model: Any, kwargs: Mapping[str, Any]) -> Prepared:
    """Make ``variant`` ready: a ``copy`` variant's code runs now, once, on a deep copy of the model.

    The copy is taken from the model as it is (call :func:`prepare` before instrumenting it).
    """
    if variant.scope != COPY:
        return Prepared(variant, model, kwargs)
    scope = run_code(variant.code, copy.deepcopy(model), kwargs, what=variant.name)
    return Prepared(variant, scope["model"], scope["generate_kwargs"])
