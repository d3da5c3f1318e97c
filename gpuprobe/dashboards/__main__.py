"""``python -m gpuprobe.dashboards``, the same as ``python -m gpuprobe dashboard``."""

import sys

from .cli import main

sys.exit(main())
