"""Checks that need a real CUDA device: marked ``cuda``, skipped where there is none (tests/conftest.py).

They are the list a GPU run must make; everything they check is also checked on the simulated CUDA
(tests/test_gpu_paths.py, tests/transformers/test_gpu_paths.py), which models CUDA's semantics but not
a real driver, real kernels, nsys or CUPTI.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transformers"))
