"""``python -m gpuprobe COMMAND``, the same as ``gpuprobe COMMAND`` — see :mod:`gpuprobe.cli`."""

import sys

from .cli import main

sys.exit(main())
