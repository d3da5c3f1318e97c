"""``gpuprobe run -- transformers serve ./tiny`` (one ``generate()`` per request): concurrent chats from
the real OpenAI client, and what the server's /metrics says about them. One server for the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("accelerate")

from _servekit import Scrape, Served, concurrent_chats, start_served, wait_until  # noqa: E402

# The server runs in a process of its own (gpuprobe run -- transformers serve), which --simulate-gpu does not reach.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess_only]

MODEL = {"gen_ai_request_model": "tiny"}
REQUESTS = 6


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_served(tiny_model, tmp_path_factory.mktemp("serve-plain"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def traffic(served: Served) -> tuple[list[tuple[int, int]], Scrape]:
    """Six concurrent chats (three streaming); the scrape once every one of them is counted."""
    usages = concurrent_chats(served.serve_port, REQUESTS)

    def settled() -> Scrape | None:
        scrape = served.scrape()
        done = scrape.value("gen_ai_server_request_duration_seconds_count", **MODEL) == REQUESTS
        return scrape if done and scrape.value("gpuprobe_generate_active", model="tiny") == 0 else None

    return usages, wait_until("the requests on /metrics", settled, 30)


def test_every_request_is_one_generate_call(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert scrape.value("gen_ai_server_request_duration_seconds_count", **MODEL) == REQUESTS
    assert scrape.value("gen_ai_server_time_to_first_token_seconds_count", **MODEL) == REQUESTS
    assert scrape.value("gpuprobe_step_batch_size_count", model="tiny") == REQUESTS


def test_output_tokens_are_what_the_client_received(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    usages, scrape = traffic
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output", **MODEL) == \
        sum(completion for _, completion in usages)
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input", **MODEL) == \
        sum(prompt for prompt, _ in usages)


def test_streamed_requests_time_their_streamer(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert scrape.value("gpuprobe_step_component_duration_seconds_count", model="tiny", component="streamer") > 0


def test_no_continuous_batching_series_without_continuous_batching(
        traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert not scrape.has("gpuprobe_requests_running") and not scrape.has("gpuprobe_batch_tokens_count")
