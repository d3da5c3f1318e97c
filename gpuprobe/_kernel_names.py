"""Kernel names: short names, categories, families; runtime API and memcpy classification.

Shared by the live SDK (kernel categories of profiled steps) and the offline report, so it is a
leaf: standard library only, nothing imported from gpuprobe. Everything here is pure and cached,
because the same few hundred names repeat millions of times in a trace.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

__all__ = [
    "CATEGORIES",
    "RULES",
    "KernelRule",
    "matching_rule",
    "categorize_kernel",
    "kernel_family",
    "short_kernel_name",
    "launch_api_kind",
    "host_sync_api",
    "graph_launch_api",
    "categorize_cpu_op",
    "WOULD_SYNC_OPS",
    "CONCAT_OPS",
    "memcpy_direction",
    "strip_api_version",
]

#: Every category :func:`categorize_kernel` can return, in report order; ``memcpy`` and ``memset``
#: are the categories of copy and set operations recorded as such (not kernels).
CATEGORIES: tuple[str, ...] = (
    "gemm",
    "attention",
    "conv",
    "communication",
    "triton",
    "softmax",
    "norm",
    "copy",
    "sort",
    "reduction",
    "index",
    "elementwise",
    "memcpy",
    "memset",
    "other",
)

class KernelRule(NamedTuple):
    """One rule of the kernel categorizer.

    Attributes:
        category: The category a match gives (one of :data:`CATEGORIES`).
        pattern: A regular expression searched in the lower-cased short kernel name.
        source: Where such kernels come from (a library, a vendor).
        example: A real kernel name this rule, and no rule before it, categorizes (tested).
    """

    category: str
    pattern: str
    source: str
    example: str


#: The categorizer: the first rule whose pattern is found in the lower-cased short name wins, so
#: the order matters (a communication kernel named ``..._gemm`` is communication). A test checks
#: each rule's example against the rule.
RULES: tuple[KernelRule, ...] = (
    KernelRule("communication", r"nccl|rccl|nvshmem", "NCCL, RCCL, NVSHMEM", "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"),
    KernelRule(
        "communication",
        r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|cross_device_reduce|multimem",
        "custom collectives (vLLM, SGLang, symmetric memory)",
        "void vllm::cross_device_reduce_1stage<c10::BFloat16, 8>(vllm::RankData*, vllm::RankSignals, int)",
    ),
    KernelRule("triton", r"triton", "Triton (torch.compile, vLLM, SGLang)", "triton_poi_fused_add_mul_0"),
    KernelRule(
        "attention",
        r"flash|fmha|sdpa|attention|attn|xformers|mha_|_mha|flashinfer|mla_",
        "FlashAttention, cuDNN/CK fMHA, xFormers, FlashInfer, aiter, paged attention",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 64, 4, cutlass::half_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    ),
    KernelRule(
        "conv",
        r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_gemm|im2col|igemm_(?:fwd|bwd|wrw)|miopen",
        "cuDNN, MIOpen, Composable Kernel grouped convolutions (not type *conv*ersions)",
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28GridwiseGemm_xdl_cshuffle_v3E",
    ),
    KernelRule(
        "gemm",
        r"gemm|gemv|nvjet|cutlass|xmma|cublas|matmul|splitkreduce|dot_kernel|bmm|_mm_|cutensor",
        "cuBLAS, cuBLASLt, CUTLASS, CK GEMMs",
        "nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT",
    ),
    KernelRule(
        "gemm",
        r"^cijk_|hipblaslt|tensile|wvsplitk",
        "AMD Tensile and hipBLASLt (Cijk_...), ROCm skinny GEMMs",
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1",
    ),
    KernelRule("softmax", r"softmax", "PyTorch, cuDNN", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"),
    KernelRule(
        "norm",
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_norm|l2norm|rowwisemoments|gammabeta",
        "PyTorch, vLLM, aiter norms",
        "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
    ),
    KernelRule("sort", r"sort|topk|radix|bitonic", "CUB, PyTorch", "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<int>(int*)"),
    KernelRule(
        "copy",
        r"copy|catarray|concat|cat_kernel|memcpy|transpose|store_kvcache|reshape_and_cache",
        "copies, concatenation, KV-cache writes",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>(float*, int)",
    ),
    KernelRule(
        "index",
        r"index|indices|gather|scatter|embedding|take_|masked_select|nonzero",
        "PyTorch indexing",
        "void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(float*)",
    ),
    KernelRule(
        "reduction",
        r"reduce|scan|cumsum|argmax|argmin|sum_kernel|mean_kernel|norm_kernel|max_pool|avg_pool",
        "PyTorch reductions and pooling",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float> > >(at::native::ReduceOp<float>)",
    ),
    KernelRule(
        "elementwise",
        r"elementwise|pointwise|fill|foreach|multi_tensor_apply|silu|gelu|relu|act_and_mul|rotary|sigmoid|tanh"
        r"|where_kernel|clamp|subtensorop",
        "PyTorch, vLLM activations, MIOpen tensor ops",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> >(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)",
    ),
)
_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple((r.category, re.compile(r.pattern)) for r in RULES)

_TILE = re.compile(r"_?\d+x\d+(?:x\d+)*")
_TRAILING_INDEX = re.compile(r"_\d+$")
_API_SUFFIX = re.compile(r"(?:_v\d+)$")
_DIRECTION = re.compile(r"\b([HDAP])to([HDAP])\b")
_ANON = "(anonymous namespace)::"
_GENERIC_WRAPPERS = ("kernel", "kernel2", "device_kernel")


def _match(text: str) -> str:
    text = text.replace("fbgemm", "fb")  # a library namespace, not a GEMM
    for category, pattern in _COMPILED:
        if pattern.search(text):
            return category
    return "other"


def matching_rule(name: str) -> KernelRule | None:
    """The rule that categorizes a kernel name (on its short name, else its full name); None if none.

    Example:
        >>> matching_rule("Cijk_Alik_Bljk_BBS_BH_MT64x32x64_MI16x16x1").source
        'AMD Tensile and hipBLASLt (Cijk_...), ROCm skinny GEMMs'
    """
    for text in (short_kernel_name(name).lower(), name.lower()):
        text = text.replace("fbgemm", "fb")
        for rule, (_, pattern) in zip(RULES, _COMPILED):
            if pattern.search(text):
                return rule
    return None


@functools.lru_cache(maxsize=16384)
def short_kernel_name(name: str) -> str:
    """Strip the return type, template arguments and parameter list of a (demangled) kernel name.

    A wrapper such as ``cutlass::Kernel<cutlass_80_..._gemm_128x128_32x5_tn_align4>`` keeps its
    single plain template argument, since that argument is the real kernel.

    Args:
        name: A kernel name as the profiler records it.

    Returns:
        The qualified function name alone.

    Example:
        >>> short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(int)")
        'at::native::vectorized_elementwise_kernel'
        >>> short_kernel_name("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT")
        'nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT'
    """
    text = name.replace(_ANON, "").replace("<unnamed>::", "")
    if "<" not in text and "(" not in text:
        return text.strip()
    out: list[str] = []
    angle = 0  # depth of template arguments
    paren = 0  # depth of parentheses inside template arguments, where < and > are comparisons
    start = 0
    arg_start = 0
    kept_arg = ""
    for i, ch in enumerate(text):
        if paren:
            if ch == "(":
                paren += 1
            elif ch == ")":
                paren -= 1
            continue
        if ch == "(":
            if angle == 0:  # the first top-level parenthesis opens the parameter list
                out.append(text[start:i])
                break
            paren = 1
        elif ch == "<":
            if angle == 0:
                out.append(text[start:i])
                arg_start = i + 1
            angle += 1
        elif ch == ">":
            angle -= 1
            if angle == 0:
                arg = text[arg_start:i]
                kept_arg = arg if arg and all(c.isalnum() or c in "_:" for c in arg) else ""
                start = i + 1
            elif angle < 0:
                return name.strip()
    else:
        out.append(text[start:])
    joined = "".join(out).strip()
    # drop the return type ("void ", "std::enable_if::type ")
    base = joined.rsplit(" ", 1)[-1] if " " in joined else joined
    if not base:
        return name.strip()
    if kept_arg and base.rsplit("::", 1)[-1].lower() in _GENERIC_WRAPPERS:
        return f"{base}<{kept_arg}>"
    return base


@functools.lru_cache(maxsize=16384)
def categorize_kernel(name: str) -> str:
    """Return the category of a GPU kernel from its name.

    The decision uses the short name (no template arguments or parameters), then two refinements:
    generic element-wise wrappers whose functor is a copy are ``copy``, and a name with no known
    keyword is checked once more in full (``cublasLt`` epilogues, for instance). Categories are
    listed in :data:`CATEGORIES`. Pure and cached, so it is cheap on a hot path.

    Args:
        name: A kernel name as the profiler records it (mangled names are not demangled).

    Returns:
        One of :data:`CATEGORIES` (never ``memcpy`` or ``memset``).

    Example:
        >>> categorize_kernel("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT")
        'gemm'
        >>> categorize_kernel("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)")
        'softmax'
        >>> categorize_kernel("my_custom_kernel")
        'other'
    """
    short = short_kernel_name(name).lower()
    category = _match(short)
    if category == "elementwise" and "copy" in name.lower():
        return "copy"
    if category == "other" and short != name.lower():
        category = _match(name.lower())
        if category == "elementwise" and "copy" in name.lower():
            return "copy"
    return category


@functools.lru_cache(maxsize=16384)
def kernel_family(name: str) -> str:
    """Return the family of a kernel: its short name without tile-shape suffixes.

    Tile, cluster and warp shapes (``64x8``, ``128x128x64``) are removed, as is the trailing
    index of a Triton kernel (``_0``), so variants that a library picks per problem size compare
    as one kernel across two traces.

    Args:
        name: A kernel name as the profiler records it.

    Returns:
        The family name.

    Example:
        >>> kernel_family("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT")
        'nvjet_tst_v_bz_splitK_TNT'
        >>> kernel_family("nvjet_tst_128x16_64x8_1x2_v_bz_splitK_TNT")
        'nvjet_tst_v_bz_splitK_TNT'
    """
    short = short_kernel_name(name)
    family = _TILE.sub("", short)
    if family.startswith("triton"):
        family = _TRAILING_INDEX.sub("", family)
    return family or short


@functools.lru_cache(maxsize=4096)
def strip_api_version(name: str) -> str:
    """Remove the version suffix Nsight Systems adds to CUDA API names.

    Example:
        >>> strip_api_version("cudaLaunchKernel_v7000")
        'cudaLaunchKernel'
    """
    return _API_SUFFIX.sub("", name)


_LAUNCH_NAMES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaLaunchDevice",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernelMultiDevice",
        "cudaGraphLaunch",
        "cuGraphLaunch",
        "cuLaunchGrid",
        "cuLaunchGridAsync",
        # HIP (ROCm): kineto records them as runtime calls, linked to their kernels by correlation
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipLaunchCooperativeKernel",
        "hipLaunchCooperativeKernelMultiDevice",
        "hipExtLaunchMultiKernelMultiDevice",
        "hipGraphLaunch",
    }
)


@functools.lru_cache(maxsize=4096)
def launch_api_kind(name: str) -> str:
    """Classify a CUDA runtime or driver API call.

    Args:
        name: The API name, with or without a version or ``_ptsz`` suffix.

    Returns:
        ``"kernel"`` for kernel and graph launches, ``"memcpy"``, ``"memset"``, ``"sync"`` for
        calls that block the host, else ``"other"``; CUDA runtime and driver calls and their HIP
        (ROCm) counterparts alike.

    Example:
        >>> launch_api_kind("cudaLaunchKernel_v7000"), launch_api_kind("cudaStreamSynchronize")
        ('kernel', 'sync')
        >>> launch_api_kind("hipExtModuleLaunchKernel"), launch_api_kind("hipMemcpyWithStream")
        ('kernel', 'memcpy')
    """
    base = strip_api_version(name)
    for suffix in ("_ptsz", "_ptds"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if base in _LAUNCH_NAMES or base.startswith(("cudaLaunchKernel", "cuLaunchKernel", "hipLaunchKernel")):
        return "kernel"
    if base.startswith(("cudaMemcpy", "cuMemcpy", "hipMemcpy")):
        return "memcpy"
    if base.startswith(("cudaMemset", "cuMemset", "cuMemsetD", "hipMemset")):
        return "memset"
    if "Synchronize" in base:
        return "sync"
    return "other"


def _api_base(name: str) -> str:
    base = strip_api_version(name)
    for suffix in ("_ptsz", "_ptds"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


# Copies that return only once the data has arrived: the host waits for the device.
# hipMemcpyWithStream is synchronous too (HIP: "returns once the copy is complete").
_SYNC_COPIES = frozenset(
    {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "hipMemcpy", "hipMemcpyWithStream", "cuMemcpyDtoH", "cuMemcpyHtoD"}
)
_GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})


@functools.lru_cache(maxsize=4096)
def host_sync_api(name: str) -> bool:
    """Whether a runtime or driver API call blocks the host until the device catches up.

    True for every ``cuda*``, ``cu*`` and ``hip*`` call whose name (version suffix stripped) ends in
    ``Synchronize``, and for the synchronous copies ``cudaMemcpy``, ``cudaMemcpy2D``,
    ``cudaMemcpy3D``, ``hipMemcpy``, ``hipMemcpyWithStream``, ``cuMemcpyDtoH`` and ``cuMemcpyHtoD``.

    Example:
        >>> host_sync_api("cudaStreamSynchronize"), host_sync_api("cuMemcpyDtoH_v2"), host_sync_api("cudaMemcpyAsync")
        (True, True, False)
    """
    base = _api_base(name)
    if not base.startswith(("cuda", "cu", "hip")):
        return False
    return base.endswith("Synchronize") or base in _SYNC_COPIES


@functools.lru_cache(maxsize=1024)
def graph_launch_api(name: str) -> bool:
    """Whether an API call replays a CUDA (or HIP) graph.

    Example:
        >>> graph_launch_api("cudaGraphLaunch_v10000"), graph_launch_api("cudaLaunchKernel")
        (True, False)
    """
    return _api_base(name) in _GRAPH_LAUNCHES


#: ATen operators that force a device-to-host synchronization when their input lives on an
#: accelerator: the result (a scalar, or a shape that depends on the data) must reach the host.
WOULD_SYNC_OPS: frozenset[str] = frozenset(
    {
        "aten::item",  # holds aten::_local_scalar_dense; nested ones count once
        "aten::is_nonzero",  # bool(t)
        "aten::_local_scalar_dense",  # .item(), bool(t), int(t), float(t)
        "aten::nonzero",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::repeat_interleave",
    }
)

#: ATen operators that concatenate (a dynamic KV cache grows by concatenation every step).
CONCAT_OPS: frozenset[str] = frozenset({"aten::cat", "aten::_cat", "aten::concat", "aten::concatenate"})

_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "_int_mm"})
_POINTWISE_OPS = frozenset(
    {
        "add", "add_", "mul", "mul_", "sub", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "silu", "gelu",
        "relu", "tanh", "sigmoid", "where", "masked_fill", "masked_fill_", "clamp", "lt", "gt", "eq", "ne",
        "ge", "le", "bitwise_and", "bitwise_or", "bitwise_not", "fill_", "zero_", "logical_and", "cos", "sin",
    }
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def categorize_cpu_op(name: str) -> str:
    """The category of the GPU work an ATen operator stands for (``aten::mm`` is ``gemm``).

    Example:
        >>> categorize_cpu_op("aten::addmm"), categorize_cpu_op("aten::mul"), categorize_cpu_op("aten::_softmax")
        ('gemm', 'elementwise', 'softmax')
    """
    short = name.split("::", 1)[-1]
    if short in _GEMM_OPS:
        return "gemm"
    category = categorize_kernel(name)
    if category == "other" and short in _POINTWISE_OPS:
        return "elementwise"
    return category


@functools.lru_cache(maxsize=1024)
def memcpy_direction(name: str) -> str:
    """Return the direction of a kineto memcpy event from its name.

    Example:
        >>> memcpy_direction("Memcpy DtoH (Device -> Pinned)")
        'DtoH'
        >>> memcpy_direction("Memcpy PtoP (Device -> Device)")
        'PtoP'
    """
    m = _DIRECTION.search(name)
    return f"{m.group(1)}to{m.group(2)}" if m else "unknown"
