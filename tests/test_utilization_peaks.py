"""MBU/MFU arithmetic without a model: the peak table and its matcher, the peak settings, the counts."""

from __future__ import annotations

import pytest

import gpuprobe
from gpuprobe import _utilization as u
from gpuprobe import config
from gpuprobe.errors import ConfigError

T = 1e12


# -- the table -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("device_name", "entry", "bandwidth", "bf16"), [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 3.35 * T, 989.5 * T),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 2.0 * T, 756.5 * T),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", 3.9 * T, 835.5 * T),
    ("NVIDIA H200", "NVIDIA H200 SXM", 4.8 * T, 989.5 * T),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 4.8 * T, 835.5 * T),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 2.039 * T, 312 * T),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", 1.935 * T, 312 * T),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB (SXM or PCIe)", 1.555 * T, 312 * T),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB (SXM or PCIe)", 1.555 * T, 312 * T),
    ("NVIDIA L4", "NVIDIA L4", 0.3 * T, 121 * T),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864 * T, 362.05 * T),
    ("NVIDIA A10", "NVIDIA A10", 0.6 * T, 125 * T),
    ("NVIDIA A10G", "NVIDIA A10G", 0.6 * T, None),
    ("Tesla T4", "NVIDIA T4", 0.32 * T, None),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2", 0.9 * T, None),
    ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2", 0.9 * T, None),
    ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe", 0.9 * T, None),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 1.008 * T, 165.2 * T),
    ("AMD Instinct MI300X", "AMD Instinct MI300X", 5.3 * T, 1307.4 * T),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (one GCD)", 1.6384 * T, 191.5 * T),
])
def test_known_device_names_find_their_datasheet_peaks(device_name: str, entry: str, bandwidth: float,
                                                       bf16: float | None) -> None:
    peak = u.match_device(device_name)
    assert peak is not None and peak.name == entry
    assert peak.memory_bandwidth == pytest.approx(bandwidth)
    assert peak.flops.get("bfloat16") == (pytest.approx(bf16) if bf16 else None)
    assert peak.source


@pytest.mark.parametrize("device_name", [
    "", "cpu", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GH200 480GB",
    "NVIDIA B200", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA A1000",
    "NVIDIA L20", "AMD Radeon RX 7900 XTX", "NVIDIA Mystery GPU",
])
def test_unknown_names_and_mig_slices_match_nothing(device_name: str) -> None:
    assert u.match_device(device_name) is None


def test_every_entry_has_dense_figures_only_below_its_bandwidth_sanity_bounds_and_a_source() -> None:
    for peak in u.PEAKS:
        assert 1e11 <= peak.memory_bandwidth <= 1e13, peak.name
        assert set(peak.flops) <= {"bfloat16", "float16", "float32"}, peak.name
        for dtype, flops in peak.flops.items():
            assert 1e12 <= flops <= 2e15, (peak.name, dtype)
        if "float32" in peak.flops and "float16" in peak.flops:
            assert peak.flops["float32"] < peak.flops["float16"], peak.name
        assert "http" in peak.source, peak.name


def test_each_entry_is_reachable_by_its_own_words() -> None:
    for peak in u.PEAKS:
        assert u.match_device(" ".join(peak.tokens)) is peak, peak.name


# -- peaks in force ---------------------------------------------------------------------------------------

def test_without_a_known_peak_nothing_is_exported_and_the_note_says_what_to_set() -> None:
    peaks = u.resolve_peaks("cpu", None, "float32")
    assert peaks.memory_bandwidth is None and peaks.flops is None
    assert peaks.notes[u.MBU] == ("not exported: no peak known for device 'cpu'; set "
                                  "GPUPROBE_PEAK_MEMORY_BANDWIDTH (bytes/s)")
    assert peaks.notes[u.MFU] == "not exported: no peak known for device 'cpu'; set GPUPROBE_PEAK_FLOPS (FLOP/s)"


def test_the_table_picks_the_flops_of_the_parameters_dtype() -> None:
    name = "NVIDIA A100-SXM4-80GB"
    assert u.resolve_peaks("cuda:0", name, "bfloat16").flops == pytest.approx(312 * T)
    assert u.resolve_peaks("cuda:0", name, "float32").flops == pytest.approx(19.5 * T)
    t4 = u.resolve_peaks("cuda:0", "Tesla T4", "bfloat16")
    assert t4.flops is None and t4.memory_bandwidth == pytest.approx(320e9)
    assert t4.notes[u.MFU] == ("not exported: no dense bfloat16 peak known for NVIDIA T4 (device 'Tesla T4'); "
                               "set GPUPROBE_PEAK_FLOPS (FLOP/s)")


def test_overrides_win_over_the_table() -> None:
    peaks = u.resolve_peaks("cuda:0", "NVIDIA H100 80GB HBM3", "bfloat16", memory_bandwidth=1e12, flops=5e14)
    assert (peaks.memory_bandwidth, peaks.flops) == (1e12, 5e14)
    assert "GPUPROBE_PEAK_MEMORY_BANDWIDTH" in peaks.notes[u.MBU] and "GPUPROBE_PEAK_FLOPS" in peaks.notes[u.MFU]


def test_an_unsupported_model_exports_nothing_whatever_the_peaks() -> None:
    peaks = u.resolve_peaks("cuda:0", "NVIDIA H100 80GB HBM3", "bfloat16", memory_bandwidth=1e12,
                            unsupported="encoder-decoder models are not covered")
    assert peaks.memory_bandwidth is None and peaks.flops is None
    assert peaks.notes[u.MBU] == "not exported: encoder-decoder models are not covered"


# -- settings ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "value"), [
    ("3.35e12", 3.35e12), ("3.35T", 3.35e12), ("3.35t", 3.35e12), (" 900 G ", 900e9), ("1.5P", 1.5e15),
    ("2039000000000", 2.039e12), ("64k", 64e3), ("7M", 7e6), (".5T", 0.5e12),
])
def test_peak_variables_accept_numbers_and_decimal_suffixes(raw: str, value: float) -> None:
    cfg = config.load({"GPUPROBE_PEAK_MEMORY_BANDWIDTH": raw, "GPUPROBE_PEAK_FLOPS": raw})
    assert cfg.peak_memory_bandwidth == pytest.approx(value) and cfg.peak_flops == pytest.approx(value)


@pytest.mark.parametrize("raw", ["0", "-1", "-3.35T", "fast", "3.35 TB/s", "nan", "inf", "1e999", "T", "3.35X"])
@pytest.mark.parametrize("variable", ["GPUPROBE_PEAK_MEMORY_BANDWIDTH", "GPUPROBE_PEAK_FLOPS"])
def test_bad_peak_variables_raise_a_config_error_naming_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=f"{variable} must be a number of .* > 0 such as .*, got {raw!r}"):
        config.load({variable: raw})


def test_an_empty_peak_variable_means_not_set() -> None:
    assert config.load({"GPUPROBE_PEAK_FLOPS": ""}).peak_flops is None


@pytest.mark.parametrize("value", [0, -5, True, float("nan"), "many"])
def test_configure_rejects_bad_peaks_naming_the_keyword(value: object) -> None:
    with pytest.raises(ConfigError, match="peak_flops must be a number of FLOP/s > 0"):
        gpuprobe.configure(peak_flops=value)


def test_configure_takes_peaks_as_numbers_or_text_and_none_unsets_them() -> None:
    assert gpuprobe.configure(peak_memory_bandwidth=2.039e12).peak_memory_bandwidth == 2.039e12
    assert gpuprobe.configure(peak_flops="312T").peak_flops == pytest.approx(312e12)
    cfg = gpuprobe.configure(peak_memory_bandwidth=None, peak_flops=None)
    assert cfg.peak_memory_bandwidth is None and cfg.peak_flops is None


# -- counts -----------------------------------------------------------------------------------------------

def _shape(**changes: object) -> u.ModelShape:
    base = dict(weight_bytes=1000, tables=((50, 8),), body_params=300, head_params=100, logits_all=False,
                full_layers=2, window_layers=0, window=0, attn_width=16, kv_token_bytes=4, dtype="float32")
    base.update(changes)
    return u.ModelShape(**base)  # type: ignore[arg-type]


def _brute_context(start: int, new: int, window: int) -> int:
    return sum(min(p, window) if window else p for p in range(start + 1, start + new + 1))


@pytest.mark.parametrize("window", [0, 1, 3, 8, 20])
def test_context_sum_counts_causal_pairs_within_the_window(window: int) -> None:
    for start in range(0, 25):
        for new in range(1, 12):
            assert u.context_sum(start, new, window) == _brute_context(start, new, window), (start, new, window)


def test_prefill_bytes_and_flops_follow_the_documented_formula() -> None:
    shape = _shape()
    batch, prompt = 3, 5
    assert u.step_bytes(shape, batch, 0, prompt) == 1000 + 15 * 8 + batch * 4 * 2 * prompt
    assert u.step_flops(shape, batch, 0, prompt) == (2 * 300 * 15 + 2 * 100 * batch
                                                     + 4 * 16 * batch * 2 * (prompt * (prompt + 1) // 2))


def test_decode_bytes_read_the_whole_cache_and_rows_are_capped_at_the_table() -> None:
    shape = _shape(tables=((2, 8),))
    batch, cached = 4, 9  # 9 positions before the step, 10 after
    assert u.step_bytes(shape, batch, cached, 1) == 1000 + 2 * 8 + batch * 4 * 2 * 10
    assert u.step_flops(shape, batch, cached, 1) == 2 * 300 * 4 + 2 * 100 * 4 + 4 * 16 * batch * 2 * 10


def test_logits_of_every_position_count_the_head_per_token() -> None:
    shape = _shape(logits_all=True, full_layers=0)
    assert u.step_flops(shape, 2, 0, 6) == 2 * 300 * 12 + 2 * 100 * 12


def test_sliding_window_layers_read_and_attend_to_the_window_only() -> None:
    shape = _shape(full_layers=1, window_layers=2, window=4, tables=())
    batch, cached = 1, 9
    assert u.step_bytes(shape, batch, cached, 1) == 1000 + 4 * (10 + 2 * 4)
    assert u.step_flops(shape, batch, cached, 1) == 2 * 300 + 2 * 100 + 4 * 16 * (10 + 2 * 4)


def test_status_is_empty_without_instrumented_models() -> None:
    import gc

    gc.collect()  # models of earlier tests that were dropped without uninstrument()
    assert gpuprobe.info()["utilization"] == {}


def test_the_peaks_table_in_the_docs_is_current() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "utilization.md").read_text(encoding="utf-8")
    start = doc.index("<!-- peaks table: generated, do not edit -->\n") + len("<!-- peaks table: generated, do not edit -->\n")
    end = doc.index("<!-- end peaks table -->")
    assert doc[start:end] == u.peaks_table(), "docs/utilization.md: refresh with python -m gpuprobe._utilization"
