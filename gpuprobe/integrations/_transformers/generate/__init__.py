"""``generate()`` seen from the inside.

- :mod:`.seams`: the seams table (every seam on an instrumented model, its hooks, :data:`METHOD_SEAMS`).
- :mod:`.state`: the model's state, prepared once; a call's beginning and end.
- :mod:`.call`: what one call knows while it runs.
- :mod:`.steps`: the step machine (steps open and close; latencies of the tokens).
- :mod:`.timed`, :mod:`.streamer`: logits processors, stopping criteria and the streamer timed in a step.
- :mod:`.layers`: decoder layers found and timed on sampled steps.
- :mod:`.marks`, :mod:`.utilization`: traced or audited steps; MBU and MFU.
"""

from .seams import GROUP_CALL, GROUP_STEPS, METHOD_SEAMS, STATE_KEY, MethodSeam
from .state import ModelState

__all__ = ["ModelState", "STATE_KEY", "METHOD_SEAMS", "MethodSeam", "GROUP_CALL", "GROUP_STEPS"]
