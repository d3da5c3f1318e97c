"""Continuous batching seen from the inside: requests, scheduler steps and the paged KV cache.

- :mod:`.seams`: the seams table (every method replaced on an observed manager's objects).
- :mod:`.serving`: a model's series, prepared once, and the managers it observes.
- :mod:`.loop`: one manager's generation loop: its steps, the KV cache's gauges, device spans.
- :mod:`.requests`: what is kept of each request, and its samples.
"""

from .seams import owner_classes
from .serving import FINISH_REASONS, PHASES, ServingState

__all__ = ["ServingState", "PHASES", "FINISH_REASONS", "owner_classes"]
