"""``/requests`` (the live requests table) and the live page's history (``/gpuprobe/history``), over real
sockets and HTTP clients, whether a front process answers the port (the default) or the program's own
threads do: what they hold after real ``generate()`` calls of a tiny Llama and real continuous batching,
how often the program renders them under a flood of readers, and their bounds (rows, bytes, hostile
request ids)."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

import gpuprobe
from gpuprobe import RequestRecord
from gpuprobe.exporters import _page
from gpuprobe.exporters.prometheus import IN_FLIGHT_SHOWN, REQUESTS_SHOWN, Server, serve as serve_metrics
from gpuprobe.runtime import runtime
from gpuprobe.testing import reset

from helpers import cpu_continuous_batching_cannot_pin, wait_for

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from gpuprobe.integrations import transformers as hf  # noqa: E402

MODEL = "tiny-requests"


def get(server: Server, path: str = "/requests", method: str = "GET", headers: dict[str, str] | None = None,
        timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request from a real HTTP client."""
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def table(server: Server) -> dict[str, Any]:
    status, headers, body = get(server)
    assert status == 200 and headers["content-type"] == "application/json", (status, headers, body[:200])
    return json.loads(body)  # type: ignore[no-any-return]


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture
def model() -> Iterator[Any]:
    m = hf.instrument(tiny_llama(), model_name=MODEL)
    yield m
    hf.uninstrument(m)


@pytest.fixture(params=["front", "in_process"])
def serve(request: Any) -> Iterator[Any]:
    """Start a server the given way: answered by a front process (the default) or by the program's threads."""
    started: list[Server] = []

    def start() -> Server:
        server = serve_metrics(port=0, in_process=request.param == "in_process")
        assert (server.front_pid is None) == (request.param == "in_process")
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def generate(model: Any, new: int = 4, request_id: str | None = None, **kwargs: Any) -> Any:
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with gpuprobe.catch_requests(request_id=request_id):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                              pad_token_id=0, eos_token_id=None, **kwargs)


def continuous_batching() -> None:
    if not hasattr(transformers, "ContinuousBatchingConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no continuous batching as these tests use it")
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)


# -- what it holds -------------------------------------------------------------------------------------

def test_the_table_lists_finished_generate_calls_as_the_program_records_them(serve: Any, model: Any) -> None:
    server = serve()
    outputs = [generate(model, new=n, request_id=f"call-{n}") for n in (2, 3, 5)]
    found = table(server)
    expected = [r.as_dict() for r in gpuprobe.requests()]
    assert found["finished"] == expected  # oldest first, every field
    assert [r["request_id"] for r in found["finished"]] == ["call-2", "call-3", "call-5"]
    assert [r["output_tokens"] for r in found["finished"]] == [o.shape[1] - 5 for o in outputs]
    assert found["ended"] == 3 and found["kept"] == runtime().settings.requests_kept == 1000
    assert found["in_flight"] == [] and found["in_flight_total"] == 0
    assert server.requests_url == f"http://127.0.0.1:{server.port}/requests"


def test_a_running_generate_call_is_in_flight_with_its_tokens_so_far(serve: Any, model: Any) -> None:
    server = serve()
    seen = threading.Event()
    steps: list[int] = []

    class HoldAtTheThirdToken(transformers.LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            steps.append(input_ids.shape[1])
            if len(steps) == 3:
                seen.wait(60)  # the call stays in flight until the table has shown it
            return scores

    worker = threading.Thread(target=lambda: generate(model, new=6, request_id="live-1",
                                                      logits_processor=[HoldAtTheThirdToken()]))
    worker.start()
    try:
        row = wait_for(lambda: next((r for r in table(server)["in_flight"]
                                     if r["request_id"] == "live-1" and r["output_tokens"] >= 2), None),
                       "the running call in the table, decoding")
    finally:
        seen.set()
        worker.join(60)
    assert row["kind"] == "generate" and row["model"] == MODEL and row["state"] == "decode"
    # Held in the third token's logits processor: two tokens chosen, the third one's step under way.
    assert row["output_tokens"] in (2, 3)
    assert row["age_s"] > 0 and row["tokens_per_s"] > 0 and row["batch_size"] == 1
    after = wait_for(lambda: (t := table(server))["ended"] == 1 and t, "the call to end")
    assert after["in_flight"] == [] and after["finished"][0]["request_id"] == "live-1"


def test_continuous_batching_requests_are_listed_running_and_waiting_with_their_kv_blocks(serve: Any) -> None:
    continuous_batching()
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    server = serve()
    gen = transformers.GenerationConfig(max_new_tokens=200, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # 8 tokens a step: 8 requests decode at once, the others wait their turn (room for all in the cache).
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=8)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        ids = [manager.add_request([3 + i, 4, 5, 6, 7, 8, 9, 10, 11, 12], request_id=f"cb-{i}", max_new_tokens=200)
               for i in range(16)]
        found = wait_for(lambda: (t := table(server)) and {r["state"] for r in t["in_flight"]} >= {"decode", "waiting"}
                         and t, "requests decoding and waiting")
        rows = {r["request_id"]: r for r in found["in_flight"]}
        assert set(rows) <= set(ids) and found["in_flight_total"] == len(rows)
        decoding = [r for r in rows.values() if r["state"] == "decode"]
        assert all(r["kind"] == "continuous_batching" and r["kv_blocks"] >= 1 and r["output_tokens"] >= 1
                   for r in decoding)
        assert all(r["kv_blocks"] == 0 and r["output_tokens"] == 0 for r in rows.values() if r["state"] == "waiting")
        ages = [r["age_s"] for r in found["in_flight"]]
        assert ages == sorted(ages, reverse=True)  # the oldest first
        for rid in ids:
            manager.cancel_request(rid)
        ended = wait_for(lambda: (t := table(server))["ended"] >= len(ids) and t, "the cancelled requests to end", 60)
        assert {r["request_id"]: r["finish_reason"] for r in ended["finished"]} == dict.fromkeys(ids, "cancelled")
    finally:
        manager.stop(block=True, timeout=30)
        hf.uninstrument(model)


def test_head_and_gzip_answer_the_same_table(serve: Any, model: Any) -> None:
    reset(collect_interval=60.0)
    server = serve()
    generate(model)
    _, plain_headers, plain = get(server)
    _, gz_headers, gz = get(server, headers={"Accept-Encoding": "gzip"})
    assert gz_headers["content-encoding"] == "gzip" and gzip.decompress(gz) == plain
    status, head_headers, empty = get(server, method="HEAD")
    assert status == 200 and empty == b"" and int(head_headers["content-length"]) == len(plain)
    for headers in (plain_headers, gz_headers):
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
    assert get(server, "/requests?cache-buster=1")[2] == plain


# -- what it costs -----------------------------------------------------------------------------------

def test_a_flood_of_readers_costs_one_rendering_per_interval(serve: Any, model: Any) -> None:
    reset(collect_interval=0.5)
    server = serve()
    generate(model)
    statuses: list[int] = []
    t0 = time.monotonic()

    def reader() -> None:
        for _ in range(10):
            statuses.append(get(server)[0])

    readers = [threading.Thread(target=reader) for _ in range(20)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(120)
    elapsed = time.monotonic() - t0
    stats = server.stats()
    assert statuses.count(200) + statuses.count(503) == 200 and statuses.count(200) >= 100
    # The program rendered the table at most once per interval (and once more for a rendering under way).
    assert 1 <= stats["tables"] <= math.ceil(elapsed / 0.5) + 1, (stats, elapsed)
    assert stats["renders"] <= elapsed / _page.HISTORY_EVERY_S + 1  # the metrics: only the history's


def test_the_table_stays_bounded_however_many_requests_ended(serve: Any) -> None:
    server = serve()
    log = runtime().requests
    for i in range(10_000):
        log.add(RequestRecord(request_id=f"r{i}-" + "x" * 100, model="m" * 300, duration_s=0.1,
                              prefill_steps=tuple(range(500)), device_s=math.nan))
    status, _, body = get(server)
    found = json.loads(body)  # valid JSON: a NaN is written null
    assert status == 200 and found["ended"] == 10_000
    assert len(found["finished"]) == REQUESTS_SHOWN
    assert found["finished"][-1]["request_id"].startswith("r9999-")  # the newest last
    row = found["finished"][0]
    assert len(row["model"]) == 256 and len(row["prefill_steps"]) == 64 and row["device_s"] is None
    assert len(body) < 150_000


def test_in_flight_rows_are_capped_and_counted(serve: Any) -> None:
    continuous_batching()
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    server = serve()
    gen = transformers.GenerationConfig(max_new_tokens=200, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=16)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    many = IN_FLIGHT_SHOWN + 50
    try:
        ids = [manager.add_request([3, 4, 5, 6], request_id=f"q-{i}", max_new_tokens=200) for i in range(many)]
        found = wait_for(lambda: (t := table(server))["in_flight_total"] >= many - 8 and t, "the requests listed")
        assert len(found["in_flight"]) == IN_FLIGHT_SHOWN < found["in_flight_total"]
        for rid in ids:
            manager.cancel_request(rid)
    finally:
        manager.stop(block=True, timeout=30)
        hf.uninstrument(model)


# -- hostile request ids -----------------------------------------------------------------------------

HOSTILE = "\r\nSet-Cookie: a=b\x00\x1b[31m<img src=x onerror=alert(1)>\u2028" + "z" * (1 << 20)
CLEANED = "??Set-Cookie: a=b??[31m<img src=x onerror=alert(1)>?" + "z" * 76  # its first 128, each control one a ?


def test_a_megabyte_id_with_control_characters_is_never_echoed_raw(serve: Any, model: Any) -> None:
    server = serve()
    generate(model, request_id=HOSTILE)
    status, headers, body = get(server)
    assert status == 200 and len(body) < 20_000
    assert b"\r" not in body and b"\n" not in body and b"\x00" not in body and b"\x1b" not in body
    assert all(32 <= c < 127 for c in body)  # ASCII text only, whatever the id held
    (row,) = json.loads(body)["finished"]
    assert row["request_id"] == CLEANED and len(CLEANED) == 128
    assert "set-cookie" not in headers


def test_a_continuous_batching_request_id_is_cleaned_in_flight(serve: Any) -> None:
    continuous_batching()
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    server = serve()
    gen = transformers.GenerationConfig(max_new_tokens=300, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # 32 blocks of 16 hold its 304 tokens: with fewer, the request runs out of blocks and (transformers 5.18)
    # the generation loop fails, sometimes before the table was read
    cfg = transformers.ContinuousBatchingConfig(num_blocks=32, page_size=16, max_batch_tokens=16)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        rid = manager.add_request([3, 4, 5, 6], request_id=HOSTILE, max_new_tokens=300)
        found = wait_for(lambda: (t := table(server))["in_flight"] and t, "the request in flight")
        (row,) = found["in_flight"]
        assert row["request_id"] == CLEANED
        manager.cancel_request(rid)
    finally:
        manager.stop(block=True, timeout=30)
        hf.uninstrument(model)


# -- the page's history --------------------------------------------------------------------------------

def history(server: Server) -> tuple[dict[str, Any], dict[str, str]]:
    status, headers, body = get(server, _page.HISTORY_PATH, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-type"] == "application/json", (status, body[:200])
    return json.loads(gzip.decompress(body)), headers


def _value(body: str, key: str) -> float:
    for line in body.splitlines():
        if line.startswith(key + " "):
            return float(line.split(" ")[1])
    raise AssertionError(f"{key} not in the body")


def test_the_history_keeps_the_charted_series_of_recent_scrapes(serve: Any, monkeypatch: Any, model: Any) -> None:
    monkeypatch.setattr(_page, "HISTORY_EVERY_S", 0.3)
    server = serve()
    generate(model, new=3)
    found = wait_for(lambda: (h := history(server)[0]) and len(h["scrapes"]) >= 3 and h, "three scrapes kept", 60)
    assert found["every_s"] == 0.3 and found["kept_s"] == _page.HISTORY_KEPT_S
    series = found["series"]
    assert all(name.startswith(_page.CHARTED) for name in series) and len(set(series)) == len(series)
    assert not any(name.startswith("gpuprobe_build_info") for name in series)  # not charted: not kept
    times = [s["t"] for s in found["scrapes"]]
    assert times == sorted(times) and time.time() - 60 < times[0] <= times[-1] <= time.time()
    # The newest scrape holds what /metrics holds now (nothing was recorded since the call ended).
    body = get(server, "/metrics")[2].decode()
    last = dict(zip(series, found["scrapes"][-1]["values"]))
    key = next(k for k in series if k.startswith("gen_ai_client_token_usage_sum{") and 'token_type="output"' in k)
    assert last[key] == _value(body, key) == 3.0
    assert history(server)[1]["x-gpuprobe-now"]
    assert server.stats()["history"] >= 3


def test_the_history_reuses_a_body_a_scraper_caused(serve: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(_page, "HISTORY_EVERY_S", 0.5)
    reset(collect_interval=0.25)
    server = serve()
    with gpuprobe.probe("work"):
        pass
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # a scraper every 0.1 s
        assert get(server, "/metrics")[0] == 200
        time.sleep(0.1)
    stats = server.stats()
    assert stats["history"] >= 4
    # The scraper's renderings alone (one per interval): the history took the newest of them.
    assert stats["renders"] <= math.ceil((time.monotonic() - t0) / 0.25) + 1, stats


def test_the_history_is_bounded_in_bytes_time_and_series() -> None:
    body = "".join(f'gpuprobe_requests_running{{model="m{i}"}} {i}.0\n' for i in range(1000)).encode()
    h = _page.History(every=1.0, seconds=50.0, budget=200_000)
    for t in range(100):
        h.add(float(t), body)
    assert h.bytes <= 200_000 and 0 < len(h) < 100
    kept = json.loads(h.body())
    assert [s["t"] for s in kept["scrapes"]] == [float(t) for t in range(100 - len(h), 100)]  # the newest stay
    assert len(kept["series"]) == 1000 and kept["scrapes"][-1]["values"][999] == 999.0
    old = _page.History(every=1.0, seconds=10.0)
    for t in range(30):
        old.add(float(t), body)
    assert len(old) == 11  # 10 s back from the newest
    many = _page.History()
    many.add(0.0, "".join(f'gpuprobe_requests_running{{model="n{i}"}} 1\n' for i in range(10_000)).encode())
    assert len(json.loads(many.body())["series"]) == 8192 and many.left_out == 10_000 - 8192
    long = _page.History()
    long.add(0.0, f'gpuprobe_requests_running{{model="{"x" * 600}"}} 1\n'.encode())
    assert json.loads(long.body())["series"] == [] and long.left_out == 1


def test_every_series_the_page_reads_is_kept_in_the_history() -> None:
    script = resources.files("gpuprobe.exporters").joinpath("page", "page.js").read_text()
    read = set(re.findall(r'"((?:gpuprobe|gen_ai)_[a-z0-9_]+)', script))
    labels = {"gen_ai_token_type", "gpuprobe_rank", "gpuprobe_version"}  # label names, not series
    read -= labels | {"gpuprobe_build_info"}  # drawn from the page's own scrape, never charted
    assert read and not [name for name in read if not name.startswith(_page.CHARTED)]
    assert f'const ACCEPT = "{_page.PAGE_ACCEPT}";' in script  # the history shares the page's body
    assert f'const HISTORY_PATH = "{_page.HISTORY_PATH}";' in script
    assert f'const REQUESTS_PATH = "{_page.REQUESTS_PATH}";' in script
