"""``python -m gpuprobe demo|report|diff|info`` — see :mod:`gpuprobe.cli`."""

import sys

from .cli import main

sys.exit(main())
