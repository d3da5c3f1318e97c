"""Continuous batching seen from the inside: requests, scheduler steps and the paged KV cache."""

from .loop import FINISH_REASONS, PHASES, ServingState, owner_classes

__all__ = ["ServingState", "PHASES", "FINISH_REASONS", "owner_classes"]
