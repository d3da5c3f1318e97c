"""``gpuprobe run -- transformers serve ./tiny --continuous-batching``: concurrent chats from the real
OpenAI client, and what the server's /metrics says about them. One server for the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("accelerate")

from _servekit import Scrape, Served, answer, concurrent_chats, start_served, wait_until  # noqa: E402

# The server runs in a process of its own (gpuprobe run -- transformers serve), which --simulate-gpu does not reach.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess_only]

MODEL = {"gen_ai_request_model": "tiny"}
REQUESTS = 6


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # A small paged cache: on a CPU, sizing it from free memory takes most of a minute.
    server = start_served(tiny_model, tmp_path_factory.mktemp("serve-cb"), "--continuous-batching",
                                "--cb-num-blocks", "64", "--cb-max-batch-tokens", "64")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def traffic(served: Served) -> tuple[list[tuple[int, int]], Scrape]:
    """Six concurrent chats (three streaming); the scrape once every one of them is counted."""
    usages = concurrent_chats(served.serve_port, REQUESTS)

    def settled() -> Scrape | None:
        scrape = served.scrape()
        done = scrape.value("gen_ai_server_request_duration_seconds_count", **MODEL) == REQUESTS
        idle = scrape.value("gpuprobe_requests_running", model="tiny") == 0
        return scrape if done and idle else None

    return usages, wait_until("the requests on /metrics", settled, 30)


def test_every_request_is_counted_once(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert scrape.value("gen_ai_server_request_duration_seconds_count", **MODEL) == REQUESTS
    assert scrape.value("gen_ai_server_time_to_first_token_seconds_count", **MODEL) == REQUESTS
    assert scrape.value("gpuprobe_request_queue_duration_seconds_count", model="tiny") == REQUESTS
    assert scrape.value("gpuprobe_requests_finished_total", model="tiny") == REQUESTS
    assert scrape.find("gen_ai_server_request_duration_seconds_count", error_type="cancelled") == []


def test_output_tokens_are_what_the_client_received(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    usages, scrape = traffic
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output", **MODEL) == \
        sum(completion for _, completion in usages)
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input", **MODEL) == \
        sum(prompt for prompt, _ in usages)


def test_time_per_output_token_has_one_sample_per_request_of_two_tokens_or_more(
        traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    usages, scrape = traffic
    assert scrape.value("gen_ai_server_time_per_output_token_seconds_count", **MODEL) == \
        sum(1 for _, completion in usages if completion > 1)


def test_running_and_waiting_are_back_to_zero(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert scrape.find("gpuprobe_requests_running", model="tiny")[0].value == 0
    assert scrape.find("gpuprobe_requests_waiting", model="tiny")[0].value == 0


def test_kv_cache_usage_is_a_fraction_of_the_blocks(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    _, scrape = traffic
    assert 0 <= scrape.value("gpuprobe_kv_cache_usage_ratio", model="tiny") <= 1
    total = scrape.value("gpuprobe_kv_cache_blocks", model="tiny", state="total")
    assert total > 0 and 0 <= scrape.value("gpuprobe_kv_cache_blocks", model="tiny", state="used") <= total


def test_steps_batch_the_prompts_and_the_decodes(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    usages, scrape = traffic
    assert scrape.value("gpuprobe_batch_tokens_sum", model="tiny", phase="prefill") == sum(p for p, _ in usages)
    assert scrape.value("gpuprobe_batch_tokens_sum", model="tiny", phase="decode") == \
        sum(c - 1 for _, c in usages)
    assert scrape.value("gpuprobe_step_duration_seconds_count", model="tiny", clock="host") == \
        scrape.value("gpuprobe_batch_requests_count", model="tiny") > 0


def test_no_label_holds_a_request_id_or_prompt_text(traffic: tuple[list[tuple[int, int]], Scrape]) -> None:
    from _servekit import PROMPTS

    _, scrape = traffic
    words = {w for p in PROMPTS for w in p.split() if len(w) > 3}
    for sample in scrape.samples:
        for key, value in sample.labels.items():
            assert "request_id" not in key and not any(w in value for w in words), (sample.name, key, value)


def test_answers_are_those_of_the_server_without_gpuprobe(
        served: Served, traffic: tuple[list[tuple[int, int]], Scrape], tiny_model: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """gpuprobe never changes what the program does: the same chats, greedy, give the same answers."""
    plain = start_served(tiny_model, tmp_path_factory.mktemp("serve-cb-plain"), "--continuous-batching",
                         "--cb-num-blocks", "64", "--cb-max-batch-tokens", "64", plain=True)
    try:
        expected = [answer(plain.serve_port, i) for i in range(3)]  # type: ignore[arg-type]
    finally:
        plain.stop()
    assert [answer(served.serve_port, i) for i in range(3)] == expected  # type: ignore[arg-type]
    assert any(expected)  # the answers hold text to compare
