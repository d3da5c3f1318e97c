"""Command line: ``gpuprobe try MODEL``: measure the remedies gpuprobe's findings name, on this machine.

Exit status: 0 done; 2 bad input (MODEL, an option, an output that cannot be written, a missing
package) or an error of MODEL's own (its folder, factory, model or generate() call: what failed, the
exception and the line of your code; the rounds measured before it are printed or written as asked),
one line on stderr naming it; 1 an internal error of gpuprobe (``--debug`` for the traceback); 130
interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from gpuprobe._files import write_file_atomic
from gpuprobe.config import parse_duration
from gpuprobe.errors import ConfigError, GpuprobeError, MissingDependencyError

from .faults import ModelFailed
from .variants import GROUPS, Variant

if TYPE_CHECKING:
    from .result import TryResult

__all__ = ["main"]

EXIT_OK, EXIT_INTERNAL_ERROR, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
PROG = "gpuprobe try"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _positive_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be positive whole numbers: {text!r}")
    return values


def _positive(text: str) -> int:
    values = _positive_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"one whole number, not a list: {text!r}")
    return values[0]


def _budget(text: str) -> float:
    try:
        return parse_duration(text, "--budget")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _custom(text: str) -> Variant:
    name, sep, code = text.partition("=")
    if not sep or not name.strip() or not code.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=CODE, got {text!r}")
    return Variant(name.strip(), f"your change: {code.strip()}", code.strip().replace("\\n", "\n"))


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Measure the baseline and each remedy that applies to this model on this "
                                       "machine (static cache, compile, attention, dtype, without a slow logits "
                                       "processor, continuous batching), interleaved, with spreads and output "
                                       "checks.")
    p.add_argument("model", metavar="MODEL", help="a local Hugging Face model folder, or module:factory / "
                                                  "file.py:factory returning (model, generate_kwargs)")
    p.add_argument("--budget", type=_budget, default=120.0, metavar="DURATION",
                   help="the experiment's time, every workload and variant (warm-ups, rounds, traces), once the "
                        "model is loaded (default: 120s)")
    p.add_argument("--variants", default="auto", metavar="LIST",
                   help=f"variants or groups to run (default: auto, all that apply); groups: {', '.join(GROUPS)}; "
                        "names: static-cache, static-cache+compile, attn:IMPL, dtype:DTYPE, "
                        "no-logits-processor:CLASS, no-stopping-criterion:CLASS, continuous-batching (processors "
                        "are a factory's own: a model folder passes none)")
    p.add_argument("--variant", type=_custom, action="append", default=[], metavar="NAME=CODE",
                   help="a change of your own, as Python on model and generate_kwargs (repeatable)")
    p.add_argument("--prompt-lens", type=_positive_list, metavar="LIST", help="prompt lengths to sweep, e.g. 128,512")
    p.add_argument("--batch-sizes", type=_positive_list, metavar="LIST", help="batch sizes to sweep, e.g. 1,4,16")
    p.add_argument("--new-tokens", type=_positive, metavar="N", help="max_new_tokens (default: the factory's, else 32)")
    p.add_argument("--rounds", type=_positive, default=30, metavar="N", help="at most N rounds per workload "
                                                                              "(default: 30; the budget may stop sooner)")
    p.add_argument("--device", metavar="DEVICE", help="a model folder's device (default: cuda when there is one)")
    p.add_argument("--trace", metavar="DIR", help="keep a kineto trace of one call per variant in DIR")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="output format (default: text; json on stdout)")
    p.add_argument("--output", "-o", metavar="PATH", help="write here (atomically) instead of stdout")
    p.add_argument("--plot", metavar="PATH.png", help="also save a PNG of the gains (matplotlib: the report extra)")
    progress = p.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="say what runs on stderr (default: when stderr is a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--debug", action="store_true", help="on an error of MODEL's or an internal one, show the "
                                                        "traceback")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``gpuprobe try``; returns the exit status.

    Example:
        >>> main(["./my-model", "--budget", "60s"])  # doctest: +SKIP
        0
    """
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()

    shown = args.progress if args.progress is not None else sys.stderr.isatty()

    def say(message: str) -> None:
        if shown:
            print(f"{PROG}: {message}", file=sys.stderr, flush=True)

    loading: float | None = None
    try:
        from .load import load
        from .runner import check_folder_variants, check_variants, try_remedies

        asked = check_variants(args.variants.split(","), args.variant)
        if os.path.isdir(args.model):  # said before loading: a folder passes no processor of the user's
            check_folder_variants(asked)
        say(f"loading {args.model}")
        loaded = load(args.model, device=args.device)
        loading = time.perf_counter() - started
        result = try_remedies(loaded.model, loaded.kwargs, budget=args.budget, variants=args.variants.split(","),
                              extra=args.variant, prompt_lens=args.prompt_lens, batch_sizes=args.batch_sizes,
                              new_tokens=args.new_tokens, trace_dir=args.trace, max_rounds=args.rounds,
                              model_label=loaded.label, progress=say)
        result.notes.append(f"Loading the model took {loading:.1f} s, before the budget.")
        _show(result, args)
        return EXIT_OK
    except ModelFailed as exc:
        if args.debug and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        kept = ""
        if exc.partial is not None:
            if loading is not None:
                exc.partial.notes.append(f"Loading the model took {loading:.1f} s, before the budget.")
            rounds = sum(w.rounds for w in exc.partial.workloads)
            try:
                _show(exc.partial, args)
                kept = (f"; the {rounds} round{'s' if rounds != 1 else ''} measured before it "
                        + (f"are in {args.output}" if args.output else "are shown above"))
            except Exception as cannot:  # an output that cannot be written, no matplotlib: said on the same line
                kept = f"; the rounds measured before it are not kept: {' '.join(str(cannot).split())}"
        print(f"{PROG}: error: {exc}{kept}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ConfigError, MissingDependencyError, _CannotWrite) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except GpuprobeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"{PROG}: internal error in gpuprobe: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}\n"
              "If MODEL's own generate() fails the same way without gpuprobe, the error is there; else please "
              f"report it with the command line{'' if args.debug else ' (and --debug for the traceback)'}.",
              file=sys.stderr)
        return EXIT_INTERNAL_ERROR


class _CannotWrite(Exception):
    pass


def _show(result: TryResult, args: argparse.Namespace) -> None:
    """Render ``result`` as asked: on stdout or atomically to ``--output``, and the ``--plot``."""
    from .rendering import render

    text = render(result, args.format)
    if args.output:
        _write(args.output, lambda path: write_file_atomic(path, text))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if args.plot:  # after the text: a plot that cannot be drawn (no matplotlib) loses nothing else
        from .plotting import plot

        _write(args.plot, lambda path: plot(result, path))


def _write(path: str, write: Callable[[str], object]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise _CannotWrite(f"{path}: cannot write: {exc.strerror or exc}") from None
