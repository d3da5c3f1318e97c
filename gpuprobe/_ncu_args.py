"""``gpuprobe ncu-args``: the Nsight Compute arguments that select the kernels of gpuprobe's ranges.

gpuprobe's NVTX push/pop ranges live in the ``gpuprobe`` domain; Nsight Compute's
``--nvtx-include "DOMAIN@MESSAGE/"`` matches a push/pop range by its message (seen with Nsight
Compute 2025.3.1 on an H200), so the filters name messages: ``prefill`` / ``decode`` for the steps,
``forward`` / ``stopping_criteria`` / ``streamer`` and each logits processor's class for the
components inside a step. The step index is the ranges' payload, which ncu's filter expressions
(domains and messages) cannot name: one step (or a window of steps) is chosen with a profile window
instead, which brackets those steps with ``cudaProfilerStart/Stop`` for ``ncu --profile-from-start off``.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from gpuprobe._nvtx import DOMAIN
from gpuprobe.config import parse_steps
from gpuprobe.errors import ConfigError

__all__ = ["STEP_RANGES", "COMPONENT_RANGES", "ncu_args", "window_environment", "main"]

#: The NVTX messages of gpuprobe's step ranges (category ``step``; payload: the step index).
STEP_RANGES: tuple[str, ...] = ("prefill", "decode")
#: The NVTX messages of the components inside a step that are not logits processors.
COMPONENT_RANGES: tuple[str, ...] = ("forward", "stopping_criteria", "streamer")


def ncu_args(step: str | None = None, component: str | None = None, steps: str | None = None,
             count: int | None = None) -> list[str]:
    """The ncu arguments selecting the kernels of one gpuprobe range (and/or a window of steps).

    Args:
        step: ``prefill`` or ``decode``: every kernel launched inside such steps.
        component: A range inside a step: ``forward``, ``stopping_criteria``, ``streamer`` or a
            logits processor's class name (e.g. ``TopKLogitsWarper``).
        steps: ``N`` or ``A-B``: only while a profile window records these steps
            (``--profile-from-start off``; the program needs ``GPUPROBE_PROFILE_STEPS``, see
            :func:`window_environment`).
        count: At most this many kernels (``--launch-count``): ncu replays each one.

    Returns:
        The arguments, one list item each.

    Raises:
        ValueError: Both ``step`` and ``component``, an unknown step, an empty name.
        ConfigError: A bad ``steps`` window.

    Example:
        >>> ncu_args(step="decode")
        ['--nvtx', '--nvtx-include', 'gpuprobe@decode/']
        >>> ncu_args(component="TopKLogitsWarper", count=20)
        ['--nvtx', '--nvtx-include', 'gpuprobe@TopKLogitsWarper/', '--launch-count', '20']
    """
    if step is not None and component is not None:
        raise ValueError("choose --step or --component: a component's range is inside a step already")
    out: list[str] = []
    if step is not None:
        if step not in STEP_RANGES:
            raise ValueError(f"--step must be one of {', '.join(STEP_RANGES)}, not {step!r}")
        out += ["--nvtx", "--nvtx-include", f"{DOMAIN}@{step}/"]
    if component is not None:
        name = component.strip()
        if not name or "/" in name or "@" in name:
            raise ValueError(f"--component needs a range name without '/' or '@', not {component!r}")
        out += ["--nvtx", "--nvtx-include", f"{DOMAIN}@{name}/"]
    if steps is not None:
        window_environment(steps)  # checks the window
        out += ["--profile-from-start", "off"]
    if count is not None:
        if count <= 0:
            raise ValueError(f"--count must be positive, not {count}")
        out += ["--launch-count", str(count)]
    return out


def window_environment(steps: str) -> dict[str, str]:
    """The environment that makes gpuprobe bracket steps ``A-B`` with ``cudaProfilerStart/Stop``.

    Example:
        >>> window_environment("5")["GPUPROBE_PROFILE_STEPS"]
        '5-5'
    """
    first, last = parse_steps(steps, "--steps")
    return {"GPUPROBE_PROFILE_STEPS": f"{first}-{last}", "GPUPROBE_PROFILE_NSYS": "1", "GPUPROBE_PROFILE_OUTPUT": "none"}


def main(argv: list[str] | None = None) -> int:
    """Run ``gpuprobe ncu-args``: print the arguments on stdout (and, with ``--steps``, the
    environment to set on stderr).

    Example:
        >>> main(["--step", "decode"])  # doctest: +SKIP
        --nvtx --nvtx-include gpuprobe@decode/
        0
    """
    parser = argparse.ArgumentParser(
        prog="gpuprobe ncu-args",
        description="Print the Nsight Compute arguments that select the kernels of gpuprobe's NVTX ranges, "
        "e.g. ncu $(gpuprobe ncu-args --step decode --count 50) -o decode python app.py",
    )
    parser.add_argument("--step", choices=STEP_RANGES, help="every kernel of the prefill or of the decode steps")
    parser.add_argument(
        "--component",
        metavar="NAME",
        help="the kernels of one range inside a step: forward, stopping_criteria, streamer, or a logits "
        "processor's class (e.g. RepetitionPenaltyLogitsProcessor)",
    )
    parser.add_argument(
        "--steps",
        metavar="N|A-B",
        help="only steps N to B (a profile window: --profile-from-start off; the environment to set is "
        "printed on stderr)",
    )
    parser.add_argument("--count", type=int, metavar="N", help="profile at most N kernels (--launch-count)")
    args = parser.parse_args(argv)
    if args.step is None and args.component is None and args.steps is None:
        parser.error("say what to select: --step, --component and/or --steps")
    try:
        out = ncu_args(step=args.step, component=args.component, steps=args.steps, count=args.count)
        env = window_environment(args.steps) if args.steps is not None else None
    except (ValueError, ConfigError) as exc:
        parser.error(str(exc))
    print(shlex.join(out))
    if env is not None:
        sys.stderr.write(
            "run the program with: " + " ".join(f"{k}={v}" for k, v in env.items())
            + " (gpuprobe calls cudaProfilerStart/Stop around those steps)\n"
        )
    return 0
