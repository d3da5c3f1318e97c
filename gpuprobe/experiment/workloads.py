"""The workloads of an experiment: the caller's inputs, or the same prompts at other lengths and batch sizes.

A prompt is stretched to a length by repeating its own tokens (the prompt's real tokens, padding
dropped) and cut from the end; a batch is filled with the prompts given, each further copy rotated
by one token so no two rows are the same. What the profiling guides tabulate per context length is
then one table per (prompt length, batch size).

Example:
    >>> import torch
    >>> w = workloads({"input_ids": torch.tensor([[5, 6, 7]])}, prompt_lens=[5], batch_sizes=[2],
    ...               new_tokens=4, max_positions=None)[0][0]
    >>> w.kwargs["input_ids"].tolist(), w.prompt_len, w.batch_size
    ([[5, 6, 7, 5, 6], [6, 7, 5, 6, 7]], 5, 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprobe.errors import ConfigError

from .variants import NotRun

__all__ = ["Workload", "normalize_inputs", "workloads", "eos_ids", "is_sampling"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """One prompt length × batch size, as the keyword arguments of the baseline's ``generate()``."""

    prompt_len: int
    batch_size: int
    new_tokens: int
    kwargs: Mapping[str, Any]

    @property
    def tag(self) -> str:
        return f"prompt{self.prompt_len}-batch{self.batch_size}"

    @property
    def label(self) -> str:
        """How the result names it (:attr:`gpuprobe.experiment.WorkloadResult.label`)."""
        return f"prompt {self.prompt_len} tokens × batch {self.batch_size}, {self.new_tokens} new tokens"


def normalize_inputs(inputs: Any, new_tokens: int | None, default_new_tokens: int = 32) -> dict[str, Any]:
    """``inputs`` as generate() keyword arguments: a dict with ``input_ids`` (a 2-D tensor) and ``max_new_tokens``.

    Raises:
        ConfigError: no ``input_ids``, or not a tensor of token ids; the message says what was given.
    """
    import torch

    if isinstance(inputs, torch.Tensor):
        kwargs: dict[str, Any] = {"input_ids": inputs}
    elif isinstance(inputs, Mapping):
        kwargs = dict(inputs)
    else:
        raise ConfigError(f"inputs must be a dict of generate() keyword arguments or a tensor of token ids, "
                          f"got {type(inputs).__name__}")
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ConfigError("inputs need input_ids, a tensor of token ids (batch × prompt length), got "
                          f"{type(ids).__name__ if ids is not None else 'none'}")
    if ids.dim() == 1:
        kwargs["input_ids"] = ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ConfigError(f"input_ids must be batch × prompt length, got shape {tuple(ids.shape)}")
    if new_tokens is not None:
        kwargs["max_new_tokens"] = new_tokens
    elif kwargs.get("max_new_tokens") is None and kwargs.get("max_length") is None:
        kwargs["max_new_tokens"] = default_new_tokens
    return kwargs


def _rows(kwargs: Mapping[str, Any]) -> list[list[int]]:
    ids = kwargs["input_ids"]
    mask = kwargs.get("attention_mask")
    rows = []
    for i in range(ids.shape[0]):
        row = ids[i][mask[i].bool()] if mask is not None else ids[i]
        rows.append([int(t) for t in row.tolist()] or [int(ids[i][-1])])
    return rows


def _stretch(row: list[int], length: int) -> list[int]:
    reps = -(-length // len(row))
    return (row * reps)[:length] if length >= len(row) else row[-length:]


def workloads(kwargs: Mapping[str, Any], *, prompt_lens: Sequence[int] | None, batch_sizes: Sequence[int] | None,
              new_tokens: int, max_positions: int | None) -> tuple[list[Workload], list[NotRun]]:
    """The workloads to measure (the inputs as given when neither sweep is asked for), and those that cannot run."""
    import torch

    ids = kwargs["input_ids"]
    if not prompt_lens and not batch_sizes:
        return [Workload(int(ids.shape[1]), int(ids.shape[0]), new_tokens, kwargs)], []
    rows = _rows(kwargs)
    lens = list(prompt_lens or [])
    out: list[Workload] = []
    skipped: list[NotRun] = []
    for length in lens or [None]:  # type: ignore[list-item]
        for batch in batch_sizes or [len(rows)]:
            want = length if length is not None else max(len(r) for r in rows)
            tag = f"prompt {want} × batch {batch}"
            if max_positions is not None and want + new_tokens > max_positions:
                skipped.append(NotRun(tag, f"{want} + {new_tokens} new tokens exceed the model's {max_positions} "
                                           "positions"))
                continue
            made = []
            for i in range(batch):
                row = rows[i % len(rows)]
                shift = (i // len(rows)) % len(row)
                made.append(_stretch(row[shift:] + row[:shift], want))
            new = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask")}
            new["input_ids"] = torch.tensor(made, dtype=ids.dtype, device=ids.device)
            new["attention_mask"] = torch.ones_like(new["input_ids"])
            out.append(Workload(want, batch, new_tokens, new))
    return out, skipped


def eos_ids(model: Any, kwargs: Mapping[str, Any]) -> set[int]:
    """The end-of-sequence token ids generate() stops at (the keyword argument, else the generation config)."""
    eos = kwargs.get("eos_token_id", getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    if eos is None:
        return set()
    if isinstance(eos, int):
        return {eos}
    try:
        return {int(e) for e in (eos.tolist() if hasattr(eos, "tolist") else eos)}
    except TypeError:
        return {int(eos)}


def is_sampling(model: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether the baseline samples (``do_sample``, else the generation config's)."""
    if "do_sample" in kwargs:
        return bool(kwargs["do_sample"])
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    return bool(getattr(config, "do_sample", False))
