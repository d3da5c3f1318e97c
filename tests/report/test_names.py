"""Kernel names: short names, categories, families; API and memcpy classification."""

from __future__ import annotations

import pytest

import gpuprobe._kernel_names
import gpuprobe.report
from gpuprobe._kernel_names import (
    CATEGORIES,
    categorize_kernel,
    kernel_family,
    launch_api_kind,
    memcpy_direction,
    short_kernel_name,
    strip_api_version,
)

CASES = [
    ("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT", "gemm"),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4>(cutlass_80_tensorop_s1688gemm_"
        "128x128_32x5_tn_align4::Params)",
        "gemm",
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas",
        "gemm",
    ),
    ("ampere_sgemm_32x128_tn", "gemm"),
    ("void epilogue::impl::globalKernel<float, float, float, true, true>(int, cublasLtEpilogue_t, float*)", "gemm"),
    (
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
        "cutlass::bfloat16_t>, false>(flash::Flash_fwd_params)",
        "attention",
    ),
    (
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t>::Params)",
        "attention",
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>(pytorch_flash::Params)",
        "attention",
    ),
    ("sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "conv"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton"),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        "softmax",
    ),
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*)",
        "norm",
    ),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)", "norm"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*)", "copy"),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
        "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const>(at::TensorIteratorBase&)>(int)",
        "copy",
    ),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float>)", "sort"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, long, int>::Policy900>(int*)", "sort"),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>"
        "(at::native::ReduceOp<float>)",
        "reduction",
    ),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<>>(long)", "index"),
    (
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>"
        "(at::cuda::detail::TensorInfo<float>)",
        "index",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, at::detail::Array<char*, 1> >"
        "(int, at::native::FillFunctor<int>, at::detail::Array<char*, 1>)",
        "elementwise",
    ),
    (
        "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(c10::BFloat16*)",
        "elementwise",
    ),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)", "other"),
    ("my_custom_kernel", "other"),
]


@pytest.mark.parametrize(("name", "category"), CASES)
def test_categorize_kernel_puts_known_kernels_in_their_category(name: str, category: str) -> None:
    assert categorize_kernel(name) == category


@pytest.mark.parametrize("name", ["CATEGORIES", "categorize_kernel", "kernel_family", "short_kernel_name"])
def test_the_report_re_exports_the_kernel_naming_the_live_sdk_uses(name: str) -> None:
    assert getattr(gpuprobe.report, name) is getattr(gpuprobe._kernel_names, name)


def test_every_category_returned_is_a_declared_category() -> None:
    assert {categorize_kernel(name) for name, _ in CASES} <= set(CATEGORIES)


def test_categorize_kernel_is_cached() -> None:
    name = "void some::kernel_for_the_cache_test<int>(int)"
    categorize_kernel(name)
    hits = categorize_kernel.cache_info().hits
    categorize_kernel(name)
    assert categorize_kernel.cache_info().hits == hits + 1


def test_short_kernel_name_drops_return_type_template_arguments_and_parameters() -> None:
    name = (
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, false, true>"
        "(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, float>)"
    )
    assert short_kernel_name(name) == "internal::gemvx::kernel"


def test_short_kernel_name_keeps_the_real_kernel_of_a_generic_wrapper() -> None:
    name = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4>(Params)"
    assert short_kernel_name(name) == "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4>"


def test_short_kernel_name_drops_anonymous_namespaces() -> None:
    name = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)"
    assert short_kernel_name(name) == "at::native::cunn_SoftMaxForward"


def test_kernel_family_merges_tile_size_variants() -> None:
    assert kernel_family("nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT") == kernel_family(
        "nvjet_tst_128x16_64x8_1x2_v_bz_splitK_TNT"
    )
    assert kernel_family("ampere_sgemm_32x128_tn") == kernel_family("ampere_sgemm_128x64_tn") == "ampere_sgemm_tn"


def test_kernel_family_keeps_different_kernels_apart() -> None:
    assert kernel_family("nvjet_tst_64x8_64x16_2x1_v_bz_TNT") != kernel_family("nvjet_tst_64x8_64x16_2x1_h_bz_TNN")


def test_kernel_family_drops_the_index_of_a_triton_kernel() -> None:
    assert kernel_family("triton_poi_fused_add_cos_sin_0") == kernel_family("triton_poi_fused_add_cos_sin_1")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cudaLaunchKernel", "kernel"),
        ("cudaLaunchKernel_v7000", "kernel"),
        ("cudaLaunchKernelExC_v11060", "kernel"),
        ("cuLaunchKernel", "kernel"),
        ("cudaGraphLaunch_v10000", "kernel"),
        ("cudaMemcpyAsync_v3020", "memcpy"),
        ("cuMemcpyHtoDAsync_v2", "memcpy"),
        ("cudaMemsetAsync", "memset"),
        ("cudaStreamSynchronize_v3020", "sync"),
        ("cudaDeviceSynchronize", "sync"),
        ("cudaEventRecord", "other"),
    ],
)
def test_launch_api_kind_classifies_runtime_and_driver_calls(name: str, kind: str) -> None:
    assert launch_api_kind(name) == kind


def test_strip_api_version_removes_the_nsys_suffix_only() -> None:
    assert strip_api_version("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert strip_api_version("cudaLaunchKernel") == "cudaLaunchKernel"


@pytest.mark.parametrize(
    ("name", "direction"),
    [
        ("Memcpy HtoD (Pageable -> Device)", "HtoD"),
        ("Memcpy DtoH (Device -> Pinned)", "DtoH"),
        ("Memcpy DtoD (Device -> Device)", "DtoD"),
        ("Memcpy PtoP (Device -> Device)", "PtoP"),
        ("Memcpy", "unknown"),
    ],
)
def test_memcpy_direction_reads_the_kineto_name(name: str, direction: str) -> None:
    assert memcpy_direction(name) == direction
