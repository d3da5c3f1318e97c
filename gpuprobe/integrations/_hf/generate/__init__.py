"""``generate()`` seen from the inside: per-model state, per-call context, the step machine and the seams."""

from .state import GROUP_CALL, GROUP_STEPS, METHOD_SEAMS, STATE_KEY, MethodSeam, ModelState

__all__ = ["ModelState", "STATE_KEY", "METHOD_SEAMS", "MethodSeam", "GROUP_CALL", "GROUP_STEPS"]
