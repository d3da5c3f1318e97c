"""The live page's requests table and history in a real headless Chromium, under continuous batching of a tiny
Llama (``init_continuous_batching``, requests added to its manager while the page watches): the table holds
the very /requests answers the page received, "requests in flight" is running + waiting, memory is charted,
generate()'s own KV-cache chart stays hidden, a client's id is shown as text and never as HTML; and a page
opened after every request ended still lists them and charts the run from the server's history."""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import gpuprobe
from gpuprobe.exporters import _page
from gpuprobe.exporters.prometheus import Server
from gpuprobe.runtime import runtime

from helpers import cpu_continuous_batching_cannot_pin

from ._browser import Browser, browser
from ._expected import Pair, in_flight, same
from .test_live_page import Page, check_stays_home

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from gpuprobe.integrations import transformers as hf  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "tiny-table"
TOKENS = 30  # per request; 8 decode at a time, the others wait their turn
# An id as a client may send it: markup and control characters. Kept cleaned (printable ASCII, 128 at most).
HOSTILE = '<img src=x onerror="window.__pwned=1">\r\n\x1b[1m' + "<b>" * 100
CLEANED = ('<img src=x onerror="window.__pwned=1">' + "???[1m" + "<b>" * 100)[:128]  # each control character a ?

READ_REQUESTS = """(() => {
  const rows = (sel) => [...document.querySelectorAll(sel + " tr[data-request]")].map((tr) => ({
    id: tr.dataset.request,
    cols: Object.fromEntries([...tr.querySelectorAll("td[data-col]")].map((td) => [td.dataset.col, td.dataset.value])),
    text: Object.fromEntries([...tr.querySelectorAll("td[data-col]")].map((td) => [td.dataset.col, td.textContent])),
  }));
  const box = document.querySelector("#requests");
  return {reads: Number(document.body.dataset.requests || 0), history: Number(document.body.dataset.history || -1),
          ended: Number(box.dataset.ended || 0),
          shown: !box.hidden, in_flight: rows("#in-flight"), finished: rows("#finished"),
          markup: document.querySelectorAll("#requests img, #requests b").length, pwned: window.__pwned === 1};
})()"""


class RequestsPage(Page):
    """The page, and besides what :class:`Page` keeps: its /requests answers in order, its history answer."""

    def __init__(self, b: Browser, url: str) -> None:
        self.tables: list[str] = []  # request ids of the 200 answers of /requests
        self.history: str | None = None
        super().__init__(b, url)

    def pump(self) -> None:
        while True:  # as Page.pump, and the answers of /requests and of the history
            try:
                method, params = self.b.events.get_nowait()
            except queue.Empty:
                return
            if method == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif method == "Network.responseReceived" and params["response"]["status"] == 200:
                url = params["response"]["url"]
                if url.endswith("/metrics"):
                    self.metrics.append((params["requestId"], params["timestamp"]))
                elif url.endswith(_page.REQUESTS_PATH):
                    self.tables.append(params["requestId"])
                elif url.endswith(_page.HISTORY_PATH):
                    self.history = params["requestId"]
            elif method == "Runtime.exceptionThrown":
                self.errors.append(str(params["exceptionDetails"])[:2000])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                self.errors.append(params["entry"]["text"])
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                self.errors.append(str(params["args"])[:2000])

    def requests_state(self) -> dict[str, Any]:
        found: dict[str, Any] = self.b.evaluate(READ_REQUESTS)
        self.pump()
        return found

    def table(self, read: int) -> dict[str, Any]:
        """The /requests answer number ``read`` (1 = the page's first)."""
        assert 1 <= read <= len(self.tables), (read, len(self.tables))
        return json.loads(self.b.body(self.tables[read - 1]))  # type: ignore[no-any-return]


def check_table(shown: dict[str, Any], answer: dict[str, Any]) -> None:
    """The page's two tables hold the rows of ``answer``: in flight as sent, finished newest first."""
    assert [r["id"] for r in shown["in_flight"]] == [r["request_id"] for r in answer["in_flight"]]
    for row, sent in zip(shown["in_flight"], answer["in_flight"]):
        assert row["cols"]["state"] == sent["state"] and row["cols"]["model"] == sent["model"]
        for col in ("age_s", "output_tokens", "tokens_per_s", "kv_blocks"):
            assert same(row["cols"][col], sent[col]), (col, row, sent)
    finished = answer["finished"][::-1]
    assert [r["id"] for r in shown["finished"]] == [r["request_id"] for r in finished]
    for row, sent in zip(shown["finished"], finished):
        assert row["cols"]["finish_reason"] == sent["finish_reason"]
        for col in ("ttft_s", "tpot_s", "duration_s", "input_tokens", "output_tokens"):
            assert same(row["cols"][col], sent[col]), (col, row, sent)


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture
def batching(monkeypatch: Any) -> Iterator[tuple[Any, Server]]:
    """A tiny Llama's continuous-batching manager, started, and a server (the history every second)."""
    if not hasattr(transformers, "ContinuousBatchingConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no continuous batching as this test uses it")
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(_page, "HISTORY_EVERY_S", 1.0)
    model = hf.instrument(tiny_llama(), model_name=MODEL)
    server = gpuprobe.serve(port=0)
    gen = transformers.GenerationConfig(max_new_tokens=TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # 8 tokens a step: 8 requests decode at once, the others wait their turn (room for all in the cache).
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=8)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    manager.start()
    try:
        yield manager, server
    finally:
        manager.stop(block=True, timeout=60)
        server.close()
        hf.uninstrument(model)


def _memory_lines(pair: Pair) -> set[str]:
    return {f"{name[len('gpuprobe_memory_'):-len('_bytes')].replace('_', ' ')} {labels.get('device', '')}"
            for name, found in pair.new.items() if name.startswith("gpuprobe_memory_") and name.endswith("_bytes")
            for labels, _ in found}


def test_the_requests_table_in_flight_and_memory_follow_continuous_batching_and_a_late_page_has_the_run(
        batching: tuple[Any, Server]) -> None:
    manager, server = batching
    origin = server.page_url.rstrip("/")
    with browser() as b:
        page = RequestsPage(b, f"{origin}/#window=30")
        page.until("the page's first scrape", lambda s: s["scrape"] >= 1, 60)
        ids: list[str] = []
        stop = threading.Event()

        def feed() -> None:  # requests keep coming: 8 decode, at least 8 more wait, until the checks are done
            while not stop.is_set():
                if len(ids) - runtime().requests.ended < 16:  # added and not ended yet
                    n = len(ids)
                    ids.append(manager.add_request([3 + n % 100, 4, 5, 6, 7, 8, 9, 10], request_id=f"cb-{n}",
                                                   max_new_tokens=TOKENS))
                else:
                    time.sleep(0.02)

        feeder = threading.Thread(target=feed, name="requests-feeder")
        feeder.start()
        try:
            watch(page, ids)
        finally:
            stop.set()
            feeder.join(30)
        ids.append(manager.add_request([9, 8, 7, 6], request_id=HOSTILE, max_new_tokens=TOKENS))
        ended(page, ids)
        finished_at = time.time()
        time.sleep(2.5)  # two more of the history's scrapes, after the last request
        late(b, page, origin, ids, finished_at)


def watch(page: RequestsPage, ids: list[str]) -> None:
    """While requests run and wait: the tile, the charts and the table."""

    def busy(s: dict[str, Any]) -> bool:
        if not s["scrape"]:
            return False
        pair = Pair(page.body(s["scrape"]), None, None)
        running = pair.gauge("gpuprobe_requests_running", ()).get((), 0)
        waiting = pair.gauge("gpuprobe_requests_waiting", ()).get((), 0)
        return bool(running and waiting and s["tiles"].get("in_flight") and "serving" in s["tables"]
                    and _memory_lines(pair))  # read at the loop's first step, drained with a scrape after it

    state = page.until("requests running and waiting, and memory", busy, 120)
    pair = Pair(page.body(state["scrape"]), None, None)
    running = pair.gauge("gpuprobe_requests_running", ())[()]
    waiting = pair.gauge("gpuprobe_requests_waiting", ())[()]
    # Requests in flight: running + waiting (no generate() call runs), on the tile and the requests chart.
    assert same(state["tiles"]["in_flight"], running + waiting) and in_flight(pair) == running + waiting
    assert same(state["tables"]["requests"]["active"]["value"], running + waiting)
    assert "kv" not in state["tables"]  # generate()'s KV cache: no generate() call was made
    memory = state["tables"]["memory"]
    assert memory and set(memory) == _memory_lines(pair)  # every memory gauge under continuous batching
    for key, cols in memory.items():
        what, device = key.rsplit(" ", 1)
        metric = f"gpuprobe_memory_{what.replace(' ', '_')}_bytes"
        assert same(cols["value"], pair.gauge(metric, ("device",))[(device,)]) and float(cols["value"]) > 0

    # The table: requests decoding and waiting, as the /requests answer the page read says.
    def listed(s: dict[str, Any]) -> bool:
        return s["reads"] >= 1 and {r["cols"]["state"] for r in s["in_flight"]} >= {"decode", "waiting"}

    deadline = time.monotonic() + 60
    shown = page.requests_state()
    while not listed(shown):
        assert time.monotonic() < deadline, shown
        time.sleep(0.3)
        shown = page.requests_state()
    answer = page.table(shown["reads"])
    check_table(shown, answer)
    assert shown["shown"] and {r["id"] for r in shown["in_flight"]} <= set(ids)
    decoding = [r for r in shown["in_flight"] if r["cols"]["state"] == "decode"]
    assert all(float(r["cols"]["kv_blocks"]) >= 1 and float(r["cols"]["output_tokens"]) >= 1 for r in decoding)



def ended(page: RequestsPage, ids: list[str]) -> None:
    """Every request ends; the table lists the newest, newest first, the last one's markup as text."""
    page.until("every request to end", lambda s: float(s["tiles"].get("in_flight") or 1) == 0, 240)
    deadline = time.monotonic() + 60
    while (done := page.requests_state())["ended"] < len(ids):
        assert time.monotonic() < deadline, done
        time.sleep(0.3)
    check_table(done, page.table(done["reads"]))
    newest = [r.request_id for r in gpuprobe.requests()][::-1][:100]
    assert [r["id"] for r in done["finished"]] == newest and newest[0] == CLEANED
    assert done["in_flight"] == [] and {r["cols"]["finish_reason"] for r in done["finished"]} == {"length"}
    assert done["finished"][0]["text"]["request_id"] == CLEANED  # shown as the text it is
    assert done["markup"] == 0 and not done["pwned"]  # never read as HTML
    check_stays_home(page, page.url.split("/#")[0])


def late(b: Browser, page: RequestsPage, origin: str, ids: list[str], finished_at: float) -> None:
    """A page opened after every request ended: the recent requests, and the run from the history."""
    b.send("Page.navigate", {"url": "about:blank"})  # the first page closes (its last events read here)
    time.sleep(1.0)
    page.pump()
    opened = time.time()
    late = RequestsPage(b, f"{origin}/#window=30")
    late.until("the late page's first scrape", lambda s: s["scrape"] >= 1, 60)
    deadline = time.monotonic() + 30
    while (seen := late.requests_state())["reads"] < 1:
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)
    expected = [r.request_id for r in gpuprobe.requests()][::-1][:100]
    assert [r["id"] for r in seen["finished"]] == expected and seen["ended"] == len(ids)
    check_table(seen, late.table(seen["reads"]))
    assert late.history is not None and seen["history"] >= 5
    check_history(late, b, seen["history"], opened, finished_at)
    check_stays_home(late, origin)


def check_history(page: RequestsPage, b: Browser, drawn: int, opened: float, finished_at: float) -> None:
    """The late page's first points are the history it read: the gauges as the server's scrapes hold them, the
    token rate over the window computed here from the same scrapes."""
    assert page.history is not None
    answer = json.loads(b.body(page.history))
    scrapes = answer["scrapes"]
    assert len(scrapes) == drawn and scrapes[-1]["t"] >= finished_at and scrapes[0]["t"] < opened
    series = answer["series"]

    def total(scrape: dict[str, Any], test: Any) -> float | None:
        values = [v for k, v in zip(series, scrape["values"]) if test(k) and v is not None]
        return sum(values) if values else None

    charts = b.evaluate("window.gpuprobeLive.charts()")
    xs = charts["serving"]["x"]
    assert all(x < opened + 1 for x in xs[:drawn]) and xs[:drawn] == sorted(xs[:drawn])
    running = [total(s, lambda k: k.startswith("gpuprobe_requests_running{")) for s in scrapes]
    drawn_running = charts["serving"]["lines"]["running"][:drawn]
    assert drawn_running == running and max(r or 0 for r in running) > 0  # the run is in the history

    def output(scrape: dict[str, Any]) -> float | None:
        return total(scrape, lambda k: k.startswith("gen_ai_client_token_usage_sum{")
                     and 'gen_ai_token_type="output"' in k)

    rates: list[float | None] = []
    for i, cur in enumerate(scrapes):  # the page's window: the oldest scrape within 30 s (and 0.25 s) before
        base = next((s for s in scrapes[:i] if s["t"] >= cur["t"] - 30.25), None)
        now = output(cur)
        rates.append(None if base is None or now is None else (now - (output(base) or 0.0)) / (cur["t"] - base["t"]))
    drawn_rates = charts["tokens"]["lines"]["output"][:drawn]
    assert rates[0] is None and drawn_rates[0] is None
    for shown, expected in zip(drawn_rates, rates):
        assert (shown is None and expected is None) or (
            shown is not None and expected is not None and math.isclose(shown, expected, rel_tol=1e-6)), (
            drawn_rates, rates)
    assert max(r or 0.0 for r in drawn_rates) > 0  # tokens flowed in the window of some scrape of the run
