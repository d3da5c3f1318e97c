"""Greedy outputs of a variant against the baseline's: ``identical`` or ``differs from token k``.

What each call returned is reduced to the new tokens of each sequence, cut after the first
end-of-sequence token (``generate()`` pads finished sequences, continuous batching stops them), so
the two ways of generating compare token for token.

Example:
    >>> match([[5, 6, 7]], [[5, 6, 7]]).text
    'identical'
    >>> match([[5, 6, 7], [1, 2]], [[5, 6, 7], [1, 3]]).text
    'differs from token 2 of 3'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["OutputMatch", "match", "new_tokens"]


@dataclasses.dataclass(frozen=True)
class OutputMatch:
    """How a variant's greedy output compares with the baseline's.

    Attributes:
        identical: every sequence has the same new tokens.
        first_difference: the first position (1 = the first new token) where some sequence differs,
            in its token or in having one at all; None when identical.
        tokens: the longest sequence compared, in new tokens.
    """

    identical: bool
    first_difference: int | None
    tokens: int

    @property
    def text(self) -> str:
        if self.identical:
            return "identical"
        return f"differs from token {self.first_difference} of {self.tokens}"

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "first_difference": self.first_difference, "tokens": self.tokens,
                "text": self.text}


def match(baseline: Sequence[Sequence[int]], variant: Sequence[Sequence[int]]) -> OutputMatch:
    """Compare the new tokens of each sequence, position by position across the batch."""
    longest = max([len(s) for s in baseline] + [len(s) for s in variant] + [0])
    if len(baseline) != len(variant):
        return OutputMatch(False, 1, longest)
    for k in range(longest):
        for a, b in zip(baseline, variant):
            if (a[k] if k < len(a) else None) != (b[k] if k < len(b) else None):
                return OutputMatch(False, k + 1, longest)
    return OutputMatch(True, None, longest)


def new_tokens(output: Any, prompt_lengths: Sequence[int], eos: Iterable[int]) -> list[list[int]]:
    """Each sequence's new tokens, cut after the first end-of-sequence token.

    Args:
        output: what ``generate()`` returned (a tensor of prompt + new tokens, or an object with
            ``sequences``), or what ``generate_batch()`` returned (a dict of results with
            ``generated_tokens``, in the order of the requests).
        prompt_lengths: the padded prompt length of each row (``generate()``); unused for
            ``generate_batch()``.
        eos: the end-of-sequence token ids.
    """
    stops = set(eos)
    if isinstance(output, dict):
        rows = [list(getattr(r, "generated_tokens", None) or []) for r in output.values()]
    else:
        seq = getattr(output, "sequences", output)
        rows = [list(map(int, row[n:].tolist())) for row, n in zip(seq, prompt_lengths)]
    out = []
    for row in rows:
        for i, tok in enumerate(row):
            if tok in stops:
                row = row[: i + 1]
                break
        out.append(row)
    return out
