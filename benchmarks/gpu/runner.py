"""The benchmarks of the GPU check, in a process of their own: one JSON line per event, flushed as it happens.

``check`` starts this module and reads its lines, so a benchmark that crashes the process or
outlives the time budget loses only itself. Lines: ``environment`` (the machine, first), then for each
part ``start`` and either ``result`` (its figures) or ``failed`` (the error); a part that started and
reported nothing took the process down.

Each part's rounds get a share of the time left until ``--deadline``, by weight, computed when the
part starts: a slow compilation or test run leaves the later parts less, never the whole check later.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from benchmarks.gpu import continuous_batching, generate, kernel_sampling, probe_cost, sync_audit
from benchmarks.gpu._ab import Budget


class Part:
    """One benchmark: what it measures, how it is called, its share of the time."""

    def __init__(self, title: str, measure: Callable[[str, Budget], dict[str, Any]], weight: float) -> None:
        self.title = title
        self.measure = measure
        self.weight = weight


# The order the parts run in. Why the compiled decode last: its compilation and captures take the
# longest and vary the most, so it runs on whatever time is left rather than taking the others' time.
PARTS: dict[str, Part] = {
    "generate.eager": Part("generate() tokens/s, eager decode: instrumented ÷ plain", generate.eager, 3),
    "probe_cost": Part("per-call cost: @probe with a device span vs NVTX + 2 events vs record_function vs bare",
                       probe_cost.measure, 1.5),
    "kernel_sampling": Part("kernel sampling at N=100: one sample's cost and the overhead at N=100",
                            kernel_sampling.measure, 2),
    "sync_audit": Part("sync audit at N=100 and N=1: tokens/s ÷ audit off", sync_audit.measure, 3),
    "continuous_batching": Part("continuous batching under generate_batch: tokens/s, instrumented ÷ plain",
                                continuous_batching.measure, 3),
    "generate.graph": Part("generate() tokens/s, CUDA-graph decode (static cache + reduce-overhead compile): "
                           "instrumented ÷ plain", generate.graph, 4),
}


def _nvidia_smi() -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not first:
        return {}
    name, driver, memory = (x.strip() for x in (first[0].split(",") + ["", "", ""])[:3])
    return {"name": name, "driver": driver, "memory": memory}


def environment() -> dict[str, Any]:
    """The machine and the software the figures were measured with."""
    import torch
    import transformers

    import gpuprobe

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "gpuprobe": gpuprobe.__version__,
                           "cuda_build": torch.version.cuda, "cpu_count": os.cpu_count(),
                           "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if env["cuda_devices"]:
        props = torch.cuda.get_device_properties(0)
        smi = _nvidia_smi()
        env.update(device=props.name, capability=f"sm_{props.major}{props.minor}",
                   memory_gib=round(props.total_memory / 2**30, 1), driver=smi.get("driver", "unknown (no nvidia-smi)"),
                   cudnn=torch.backends.cudnn.version())
    else:
        env.update(device=f"CPU ({platform.machine()}, no CUDA device)", driver="none")
    info = gpuprobe.info()
    env.update(nvtx_backend=str(info.get("nvtx")), timing_backend=str(info.get("timing")))
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", required=True, help="comma-separated names of PARTS, in order")
    ap.add_argument("--size", choices=("gpu", "tiny"), required=True)
    ap.add_argument("--deadline", type=float, required=True, help="time.time() by which the last round must end")
    ap.add_argument("--min-rounds", type=int, default=5)
    ap.add_argument("--max-rounds", type=int, default=10_000)
    args = ap.parse_args(argv)

    def emit(kind: str, **fields: Any) -> None:
        print(json.dumps({"kind": kind, **fields}), flush=True)

    import torch

    from gpuprobe.testing import reset

    emit("environment", environment=environment())
    if args.size == "tiny":
        torch.set_num_threads(1)  # a shared CPU machine: one thread keeps the dry run's neighbours quiet
    names = [n for n in args.parts.split(",") if n]
    for i, name in enumerate(names):
        part = PARTS[name]
        left = args.deadline - time.time()
        share = max(left, 0.0) * part.weight / sum(PARTS[n].weight for n in names[i:])
        emit("start", part=name, budget_s=share)
        reset()
        t0 = time.perf_counter()
        try:
            budget = Budget(share, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
                            limit=min(2 * share, max(left, share)))
            result = part.measure(args.size, budget)
        except Exception as exc:
            emit("failed", part=name, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:],
                 elapsed_s=time.perf_counter() - t0)
        else:
            emit("result", part=name, elapsed_s=time.perf_counter() - t0, **result)
        finally:
            reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
