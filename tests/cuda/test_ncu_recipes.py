"""The Nsight Compute recipes of docs/profiling.md, run for real (skipped without CUDA or ``ncu``).

A tiny Llama generates under ``ncu``; the raw CSV ncu prints is read by ``gpuprobe report``. On CPU
the same reading is tested on real exports and on a raw export built in the format ncu 2025.3.1
writes (tests/report/test_ncu.py); here the filters, the NVTX stack and the window are real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuprobe._ncu_args import ncu_args, window_environment
from gpuprobe.report._ncu_analysis import analyze_ncu

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("nvtx")  # gpuprobe's ranges are in the gpuprobe domain only with the nvtx package

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu)")]

SCRIPT = textwrap.dedent("""
    import torch, transformers
    from gpuprobe.integrations.transformers import instrument
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = instrument(transformers.LlamaForCausalLM(config).eval().to("cuda"))
    ids = torch.randint(3, 128, (1, 6), device="cuda")
    model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=20, repetition_penalty=1.1)
    torch.cuda.synchronize()
""")


def _profile(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> Path:
    script = tmp_path / "generate.py"
    script.write_text(SCRIPT)
    out = tmp_path / "kernels.csv"
    with open(out, "w") as f:
        subprocess.run(["ncu", *args, "--csv", "--page", "raw", sys.executable, str(script)], stdout=f, check=True,
                       cwd=tmp_path, env={**os.environ, **(env or {})}, timeout=900)
    return out


def test_the_decode_filter_selects_the_kernels_of_decode_steps_only(tmp_path: Path) -> None:
    report = analyze_ncu(_profile(tmp_path, ncu_args(step="decode", count=30)))
    assert report.has_nvtx and 0 < report.launches <= 30
    assert [s.name for s in report.steps] == ["decode"]
    assert report.steps[0].launches == report.launches


def test_the_prefill_filter_selects_the_prefill(tmp_path: Path) -> None:
    report = analyze_ncu(_profile(tmp_path, ncu_args(step="prefill", count=30)))
    assert [s.name for s in report.steps] == ["prefill"]


def test_a_processor_filter_selects_that_logits_processor(tmp_path: Path) -> None:
    report = analyze_ncu(_profile(tmp_path, ncu_args(component="TopKLogitsWarper", count=20)))
    assert [p.name for p in report.processors] == ["TopKLogitsWarper"]
    assert report.processors[0].launches == report.launches


def test_a_profile_window_selects_one_step(tmp_path: Path) -> None:
    path = _profile(tmp_path, ncu_args(step="decode", steps="3"), env=window_environment("3"))
    report = analyze_ncu(path)
    assert report.steps[0].evidence["steps"] == "3"
