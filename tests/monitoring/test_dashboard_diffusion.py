"""The overview's Diffusion pipelines row: what each panel reads and why it may be empty, and every one of its
queries against a real Prometheus (Debian's package) scraping a process that runs a tiny diffusers pipeline
(tests/diffusers/_pipes.py: random weights, a tokenizer trained there)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from gpuprobe import dashboards as dash
from gpuprobe.dashboards.model import NO_DIFFUSION_PIPELINE, SYNC_AUDIT_OFF

from .promstack import ROOT, Proc, ensure_prometheus, free_port, http_ok, shipped_dashboards, start_prometheus, \
    temp_dir, wait_until

ROW = next(r for r in dash.overview().rows if r.title == "Diffusion pipelines")
TITLES = [p.title for p in ROW.panels]
CALLS, STEPS = 8, 2

APP = """
    import sys, time
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {pipes!r})
    import _pipes
    import gpuprobe
    from gpuprobe.integrations.diffusers import instrument
    pipe = instrument(_pipes.sd(), model_name="tiny-sd")
    server = gpuprobe.serve({port})
    print("serving", flush=True)
    time.sleep(3)  # scraped before its first call: no diffusion series yet
    for _ in range({calls}):
        pipe(**_pipes.inputs("sd", steps={steps}))
        # Why a pause: each scrape then sees about one call more, so Prometheus' rate() extrapolates every
        # series of the row alike (a series' first value is never near the limit of its extrapolation).
        time.sleep(1.0)
    print("done", flush=True)
    time.sleep(600)
"""


def test_the_row_waits_for_a_pipeline_and_its_syncs_panel_for_the_sync_audit() -> None:
    reasons = {p.title: p.no_data for p in ROW.panels}
    assert reasons.pop("Host syncs per denoising step by component") is SYNC_AUDIT_OFF
    assert set(reasons.values()) == {NO_DIFFUSION_PIPELINE}
    assert not any(p.gpu_only or p.generate_only for p in ROW.panels)


def test_the_row_reads_the_diffusion_series_and_leaves_the_model_variable_to_generate() -> None:
    for panel in ROW.panels:
        for target in panel.targets:
            names = dash.metric_names(target.expr)
            assert names and all(n.startswith("gpuprobe_diffusion_") for n in names), (panel.title, names)
            # The model variable offers generate()'s models; a pipeline's name is never among them.
            assert "$model" not in target.expr and '$rank' in target.expr and '$instance' in target.expr


@pytest.fixture(scope="module")
def scraped() -> Iterator[str]:
    """The URL of a Prometheus (1 s scrapes) over a process that ran ``CALLS`` pipeline calls, once they ran."""
    ensure_prometheus()
    with temp_dir() as work, contextlib.ExitStack() as cleanup:
        port, prom_port = free_port(), free_port()
        app = os.path.join(work, "app.py")
        with open(app, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(APP.format(pipes=os.path.join(ROOT, "tests", "diffusers"), port=port, calls=CALLS,
                                               steps=STEPS)))
        proc = Proc("pipeline", [sys.executable, app], os.path.join(work, "pipeline.log"),
                    env={"GPUPROBE_SYNC_AUDIT": "2"})
        cleanup.callback(proc.stop)
        prom = start_prometheus(dash.scrape_config(base_port=port, interval="1s"), work, prom_port)
        cleanup.callback(prom.stop)
        url = f"http://127.0.0.1:{prom_port}"
        wait_until("Prometheus to be ready", lambda: http_ok(f"{url}/-/ready"), 60, (proc, prom))
        wait_until("the pipeline's calls", lambda: "done" in proc.log_tail(), 300, (proc, prom))
        client = dash.Prometheus(url)
        count = 'sum(gpuprobe_diffusion_step_duration_seconds_count{clock="host"})'
        wait_until("Prometheus to scrape the last call", lambda: _value(client.query(count)) == CALLS * STEPS, 60,
                   (proc, prom))
        yield url


def _value(samples: list[dict[str, Any]]) -> float:
    (sample,) = samples
    return float(sample["value"][1])


def _diffusion_board() -> dict[str, Any]:
    board = next(b for b in shipped_dashboards() if b["uid"] == "gpuprobe-overview")
    return {**board, "panels": [p for p in dash.json_panels(board) if p["title"] in TITLES]}


@pytest.mark.prometheus_server
@pytest.mark.slow
def test_every_query_of_the_row_has_data_once_a_pipeline_ran(scraped: str) -> None:
    board = _diffusion_board()
    assert sorted(p["title"] for p in board["panels"]) == sorted(TITLES)
    results = dash.verify(scraped, [board])
    assert len(results) == sum(len(p.targets) for p in ROW.panels)
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


@pytest.mark.prometheus_server
@pytest.mark.slow
def test_the_stacked_components_add_up_to_the_mean_step_and_the_counts_are_the_calls(scraped: str) -> None:
    client = dash.Prometheus(scraped)
    panels = {p["title"]: p for p in _diffusion_board()["panels"]}

    def ask(title: str, ref: str) -> list[dict[str, Any]]:
        target = next(t for t in panels[title]["targets"] if t["refId"] == ref)
        return client.query(dash.fill(target["expr"], {"rank": ".*", "instance": ".*"}, "1m"))

    parts = ask("Denoising step time by component", "A")
    assert {(s["metric"]["component"], s["metric"].get("branch", "")) for s in parts} == {
        ("denoiser", "batched"), ("scheduler", ""), ("other", "")}  # Stable Diffusion's guidance: one forward
    (mean,) = [s for s in ask("Denoising step time", "A") if s["metric"]["clock"] == "host"]
    # Equal for the same steps; the panels' rates read the window from its first scrape in, which may fall
    # between a step's components and the step itself on a slow machine (5 % off seen): 15 % of slack.
    assert math.isclose(sum(float(s["value"][1]) for s in parts), float(mean["value"][1]), rel_tol=0.15)
    assert _value(client.query("sum(gpuprobe_diffusion_images_total)")) == CALLS
    outside = {(s["metric"]["component"], s["metric"]["module"]) for s in ask("Pipeline components outside the steps",
                                                                              "A")}
    assert outside == {("text_encoder", "text_encoder"), ("vae_decode", "vae")}
    syncs = ask("Host syncs per denoising step by component", "A")
    assert {s["metric"]["component"] for s in syncs} == {"scheduler"}  # DDIM's step reads its timestep
