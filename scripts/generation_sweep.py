"""Every architecture of the sweep in every generation mode, plain against instrumented: a result table.

Each of transformers' architectures in ``tests/transformers/_sweep.py`` (built from small configs, no
download) generates in greedy, sampling, beam search, logits processors, streamer, static cache,
assisted decoding, prompt lookup, a padded batch of two and under ``instrument_all()``; the instrumented
output must be the plain one and gpuprobe's counts exact (the module's docstring lists the checks).
``tests/transformers/test_architecture_sweep.py`` runs a sample of it in CI.

Usage::

    python scripts/generation_sweep.py [--arch llama --arch t5 ...] [--mode assisted ...] [--markdown out.md]

Exits 1 when a check failed; a mode an architecture does not support (transformers raises, plain and
instrumented alike) is ``n/a``.
"""

from __future__ import annotations

import argparse
import collections
import platform
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "transformers")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", default=[], help="an architecture of the sweep (repeatable; all by default)")
    p.add_argument("--mode", action="append", default=[], help="a mode (repeatable; all by default)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table to this file")
    args = p.parse_args(argv)

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    import _sweep
    import gpuprobe

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    unknown = [a for a in args.arch if a not in _sweep.BY_NAME] + [m for m in args.mode if m not in _sweep.MODES]
    if unknown:
        p.error(f"unknown architecture or mode: {', '.join(unknown)} (architectures: {', '.join(_sweep.BY_NAME)}; "
                f"modes: {', '.join(_sweep.MODES)})")
    archs = [_sweep.BY_NAME[a] for a in args.arch] or list(_sweep.ARCHS)
    modes = tuple(args.mode) or _sweep.MODES
    t0 = time.perf_counter()
    results = []
    for arch in archs:
        got = _sweep.sweep_arch(arch, modes)
        results += got
        line = " ".join(f"{r.mode}={r.status}" for r in got)
        print(f"{arch.name:16s} {sum(r.seconds for r in got):6.1f}s {line}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0

    by_arch = collections.defaultdict(dict)
    for r in results:
        by_arch[r.arch][r.mode] = r
    mark = {"ok": "ok", "unsupported": "n/a", "FAILED": "**FAILED**"}
    lines = [
        f"gpuprobe {gpuprobe.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}; {len(archs)} architectures × {len(modes)} modes, "
        f"{_sweep.NEW} new tokens per call; {elapsed:.0f} s.",
        "",
        "| architecture | category | " + " | ".join(modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for arch in archs:
        row = by_arch[arch.name]
        if "build" in row:
            cells = [mark["FAILED"]] * len(modes)
        else:
            cells = [mark[row[m].status] for m in modes]
        lines.append(f"| {arch.name} | {arch.category} | " + " | ".join(cells) + " |")
    counted = collections.Counter(r.status for r in results)
    categories = collections.Counter(a.category for a in archs)
    lines += ["", f"ok: {counted['ok']}, n/a: {counted['unsupported']}, failed: {counted['FAILED']}; "
              + ", ".join(f"{n} {c}" for c, n in categories.items()) + "."]
    notes = [r for r in results if r.status != "ok" or r.mode in ("assisted", "prompt_lookup")]
    if notes:
        lines += ["", "| architecture | mode | result | detail |", "|---|---|---|---|"]
        lines += [f"| {r.arch} | {r.mode} | {mark.get(r.status, r.status)} | {r.detail.replace('|', '/')} |"
                  for r in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 1 if counted["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
