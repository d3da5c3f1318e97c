"""``python -m gpuprobe.report._rank_worker PATH SPEC``: one rank of a multi-rank report, in its own
process; the result is pickled on stdout (see :mod:`gpuprobe.report._ranks`). A module of its own, so
that what it pickles names ``gpuprobe.report._ranks``, not ``__main__``."""

from __future__ import annotations

import sys

from gpuprobe.report._ranks import worker_main

if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:]))
