"""Write a large synthetic kineto trace of LLM decode steps, streaming.

The event mix follows a real PyTorch profiler capture of ``generate()``: per step a
``gpuprobe.step`` range with a nested ``forward`` range, per layer a handful of ``cpu_op``
events each launching one kernel through ``cudaLaunchKernel`` (with correlation ids and ``ac2g``
flows), kernels with long templated names, a ``sampling`` range with a DtoH memcpy and a memset.
As kineto does, CPU-side events of a step come first, then runtime calls and GPU activities.
Times are written in microseconds with three decimals.

The file is written event by event, so memory stays flat whatever the size.

Example:
    python benchmarks/report/make_synthetic_trace.py /tmp/big.json --size-gb 1.0
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import sys
from typing import IO

__all__ = ["write_trace"]

_KERNELS = [
    # (name, mean duration in ns)
    ("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT", 18_000),
    ("nvjet_tst_128x16_64x8_1x2_h_bz_TNN", 24_000),
    (
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
        "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
        15_000,
    ),
    (
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, true, true, false, false>(flash::Flash_fwd_params)",
        9_000,
    ),
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
        "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
        "c10::BFloat16*)",
        2_500,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, "
        "c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, "
        "at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
        "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)",
        1_600,
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
        "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, "
        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
        "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>"
        "(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
        "{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
        "{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})",
        1_300,
    ),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 2_100),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        9_100,
    ),
]
_CPU_OPS = ["aten::mm", "aten::linear", "aten::mul", "aten::add", "aten::copy_", "aten::_softmax", "aten::cat"]
_LAYERS = 24
_KERNELS_PER_LAYER = 8


def _us(ns: int) -> str:
    """Format integer nanoseconds as kineto does: microseconds with three decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def write_trace(out: IO[str], target_bytes: int, seed: int = 0, rank: int | None = None, world_size: int = 1) -> tuple[int, int]:
    """Write a trace of at least ``target_bytes`` characters to ``out``.

    Args:
        out: A text stream.
        target_bytes: Stop after the step that crosses this size.
        seed: Random seed; the same seed gives the same file.
        rank: Write a rank of a distributed run: ``distributedInfo`` in the header, and per step
            an NCCL all-reduce on its own stream that overlaps the end of the forward (a slower
            rank the higher its number).
        world_size: The number of ranks (``distributedInfo.world_size``).

    Returns:
        ``(steps, events)`` written.

    Example:
        >>> import io
        >>> buf = io.StringIO()
        >>> write_trace(buf, 10_000)[0] >= 1
        True
    """
    rng = random.Random(seed)
    pid, tid = 4242, 4242
    written = 0

    def emit(text: str) -> None:
        nonlocal written
        out.write(text)
        written += len(text)

    emit(
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", '
        '"totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0, "numSms": 132}],\n'
        '  "record_shapes": 1,\n'
        + (f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world_size}}},\n' if rank is not None else "")
        + '  "traceEvents": [\n'
    )
    t = 1_000_000_000  # ns
    corr = 1
    ext = 1
    step = 0
    events = 0
    first = True
    while written < target_bytes:
        cpu: list[str] = []
        gpu: list[str] = []
        step_start = t
        gpu_t = t + 20_000
        for layer in range(_LAYERS):
            for k in range(_KERNELS_PER_LAYER):
                name, mean = _KERNELS[(layer + k) % len(_KERNELS)]
                op = _CPU_OPS[k % len(_CPU_OPS)]
                op_dur = 6_000 + rng.randrange(4_000)
                launch_ts = t + 1_500
                launch_dur = 2_000 + rng.randrange(3_000)
                cpu.append(
                    f'  {{"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {pid}, "tid": {tid}, '
                    f'"ts": {_us(t)}, "dur": {_us(op_dur)}, "args": {{"External id": {ext}, '
                    f'"Record function id": 0, "Ev Idx": {ext}, "Input Dims": [[1, 4096], [4096, 4096]], '
                    f'"Input type": ["c10::BFloat16", "c10::BFloat16"]}}}}'
                )
                kdur = max(800, int(rng.gauss(mean, mean * 0.1)))
                gpu_t = max(gpu_t, launch_ts + 4_000) + 300
                gpu.append(
                    f'  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                    f'"tid": {tid}, "ts": {_us(launch_ts)}, "dur": {_us(launch_dur)}, '
                    f'"args": {{"External id": {ext}, "cbid": 211, "correlation": {corr}}}}}'
                )
                gpu.append(
                    f'  {{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {_us(launch_ts)}, '
                    f'"cat": "ac2g", "name": "ac2g"}}'
                )
                gpu.append(
                    f'  {{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7, '
                    f'"ts": {_us(gpu_t)}, "dur": {_us(kdur)}, "args": {{"External id": {ext}, "queued": 0, '
                    f'"device": 0, "context": 1, "stream": 7, "correlation": {corr}, '
                    f'"registers per thread": 168, "shared memory": 213248, "blocks per SM": 0.484848, '
                    f'"warps per SM": 1.939394, "grid": [64, 1, 1], "block": [128, 1, 1], '
                    f'"est. achieved occupancy %": 3}}}}'
                )
                gpu.append(
                    f'  {{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {_us(gpu_t)}, '
                    f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}'
                )
                gpu_t += kdur
                t += op_dur + 500
                corr += 1
                ext += 1
        forward_end = t
        if rank is not None:  # an all-reduce on stream 20, started before the compute stream drains
            launch_ts = t + 500
            comm_t = max(gpu_t - 30_000, launch_ts + 4_000)
            comm_dur = 60_000 + rng.randrange(20_000) + rank * 1_000
            gpu.append(
                f'  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                f'"tid": {tid}, "ts": {_us(launch_ts)}, "dur": 3.000, '
                f'"args": {{"External id": {ext}, "cbid": 211, "correlation": {corr}}}}}'
            )
            gpu.append(
                f'  {{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, '
                f'unsigned long, ncclWork*)", "pid": 0, "tid": 20, "ts": {_us(comm_t)}, "dur": {_us(comm_dur)}, '
                f'"args": {{"External id": {ext}, "device": 0, "context": 1, "stream": 20, "correlation": {corr}, '
                f'"grid": [4, 1, 1], "block": [512, 1, 1]}}}}'
            )
            corr += 1
            ext += 1
            gpu_t = max(gpu_t, comm_t + comm_dur)
            t += 4_000
        # sampling: a DtoH copy of the next token, then a memset
        sampling_start = t + 1_000
        launch_ts = sampling_start + 1_000
        gpu_t = max(gpu_t, launch_ts + 4_000) + 300
        gpu.append(
            f'  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(launch_ts)}, "dur": 5.000, "args": {{"External id": {ext}, "cbid": 41, '
            f'"correlation": {corr}}}}}'
        )
        gpu.append(
            f'  {{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, '
            f'"tid": 7, "ts": {_us(gpu_t)}, "dur": 1.376, "args": {{"External id": {ext}, "device": 0, '
            f'"context": 1, "stream": 7, "correlation": {corr}, "bytes": 8, '
            f'"memory bandwidth (GB/s)": 0.005813953488372093}}}}'
        )
        corr += 1
        gpu_t += 1_376
        t = gpu_t + 2_000
        gpu.append(
            f'  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": {pid}, '
            f'"tid": {tid}, "ts": {_us(launch_ts + 5_000)}, "dur": {_us(t - launch_ts - 5_000)}, '
            f'"args": {{"External id": {ext}, "cbid": 131, "correlation": {corr}}}}}'
        )
        corr += 1
        ext += 1
        sampling_end = t
        t += 3_000
        step_end = t
        cpu.append(
            f'  {{"ph": "X", "cat": "user_annotation", "name": "gpuprobe.step", "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(step_start - 500)}, "dur": {_us(step_end - step_start + 500)}, '
            f'"args": {{"External id": {ext}, "Record function id": 0, "Ev Idx": {ext}}}}}'
        )
        cpu.append(
            f'  {{"ph": "X", "cat": "user_annotation", "name": "forward", "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(step_start - 200)}, "dur": {_us(forward_end - step_start + 200)}, '
            f'"args": {{"External id": {ext + 1}, "Record function id": 0, "Ev Idx": {ext + 1}}}}}'
        )
        cpu.append(
            f'  {{"ph": "X", "cat": "user_annotation", "name": "sampling", "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(sampling_start)}, "dur": {_us(sampling_end - sampling_start)}, '
            f'"args": {{"External id": {ext + 2}, "Record function id": 0, "Ev Idx": {ext + 2}}}}}'
        )
        ext += 3
        chunk = ",\n".join(cpu + gpu)
        emit(chunk if first else ",\n" + chunk)
        first = False
        events += len(cpu) + len(gpu)
        step += 1
    emit(
        '\n  ],\n  "traceName": "synthetic.pt.trace.json",\n  "displayTimeUnit": "ms",\n'
        '  "baseTimeNanoseconds": 1727743122000000000\n}\n'
    )
    return step, events


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="output file (.json or .json.gz)")
    parser.add_argument("--size-gb", type=float, default=1.0, help="uncompressed size (default 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target = int(args.size_gb * 1e9)
    tmp = args.path + ".tmp"
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        steps, events = write_trace(out, target, args.seed)
    os.replace(tmp, args.path)
    print(f"wrote {args.path}: {steps} steps, {events} events, {target / 1e9:.2f}+ GB uncompressed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
