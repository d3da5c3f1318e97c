"""The live page's diffusion charts in a real headless Chromium: absent until a diffusers pipeline has run, then
every number they show is the one computed here from the /metrics bodies the page received
(tests/page/_expected.py: prometheus_client's parsers, nothing shared with the page's JavaScript)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import gpuprobe

from ._browser import browser
from .test_live_page import Page, check_against_bodies, check_stays_home

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diffusers"))
import _pipes  # noqa: E402 (tiny pipelines built from configs, tokenizers trained there)

pytestmark = pytest.mark.slow

DIFFUSION_CHARTS = {"denoise", "diffusion_components", "diffusion_rates", "diffusion_parts", "diffusion_memory"}


def test_the_diffusion_charts_appear_once_a_pipeline_ran_and_show_what_metrics_holds() -> None:
    from gpuprobe.integrations.diffusers import instrument, uninstrument

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few KB of tensors on a shared 2-core machine
    pipe = instrument(_pipes.sd(), model_name="tiny-sd")
    server = gpuprobe.serve(port=0)
    try:
        with browser() as b:
            page = Page(b, f"{server.page_url}#window=30")
            before = page.until("a window before any pipeline call", lambda s: s["base"] >= 1, 60)
            assert not DIFFUSION_CHARTS & set(before["tables"]), sorted(before["tables"])
            for _ in range(3):
                pipe(**_pipes.inputs("sd", steps=3))

            def drawn(s: dict[str, Any]) -> bool:
                steps = s["tables"].get("diffusion_rates", {}).get("steps tiny-sd", {})
                return DIFFUSION_CHARTS <= set(s["tables"]) and steps.get("run") == "9"

            state = page.until("the diffusion charts with the three calls", drawn, 60)
            check_against_bodies(page, state)
            tables = state["tables"]
            # The classifier-free guidance of Stable Diffusion: one batched denoiser forward per step.
            assert {"tiny-sd/denoiser/batched", "tiny-sd/scheduler/", "tiny-sd/other/"} <= set(
                tables["diffusion_components"])
            shares = [float(v["share"]) for v in tables["diffusion_components"].values()]
            assert sum(shares) == pytest.approx(1.0)  # the parts of a step add up to it
            assert {"tiny-sd/text_encoder/text_encoder", "tiny-sd/vae_decode/vae"} <= set(tables["diffusion_parts"])
            assert tables["diffusion_rates"]["images tiny-sd"]["run"] == "3"
            assert {"tiny-sd p95", "tiny-sd mean"} <= set(tables["denoise"])
            check_stays_home(page, server.page_url.rstrip("/"))
    finally:
        server.close()
        uninstrument(pipe)
        torch.set_num_threads(threads)
