"""``transformers serve`` in the test process: its own ``Serve`` (the CLI's class) on a free port, over a tiny
Llama saved with a trained tokenizer (tests/serving/_servekit.py), answering real HTTP from ``http.client``.

For the tests that need the app in this process: what gpuprobe's serving seams do to it, and that they
fail open (tests/test_fail_open.py, scenario ``serve``).
"""

from __future__ import annotations

import atexit
import http.client
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SERVING = Path(__file__).resolve().parent / "serving"
if str(SERVING) not in sys.path:
    sys.path.insert(0, str(SERVING))

from _servekit import build_tiny_model, free_port  # noqa: E402

_model: list[Path] = []


def tiny_model() -> Path:
    """A tiny model folder made once per process (removed at exit)."""
    if not _model:
        folder = Path(tempfile.mkdtemp(prefix="gpuprobe-serve-"))
        atexit.register(shutil.rmtree, folder, True)
        _model.append(build_tiny_model(folder / "tiny"))
    return _model[0]


class Answer:
    """One HTTP answer: status, headers (lower-case names), body."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k.lower() == name]
        return found[0] if found else None

    def json(self) -> Any:
        return json.loads(self.body)

    def streamed_text(self) -> str:
        """The content deltas of an event stream of chat completion chunks, joined."""
        text = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
        return "".join(text)


class InProcessServer:
    """A running ``Serve``: :meth:`chat` posts a chat completion to it."""

    def __init__(self, serve: Any, port: int, model: Path) -> None:
        self.serve = serve
        self.port = port
        self.model = model

    @property
    def app(self) -> Any:
        """The ASGI app uvicorn serves (the one ``build_server`` returned)."""
        return self.serve.server.config.app

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return Answer(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], resp.read())
        finally:
            conn.close()

    def chat_body(self, stream: bool = False, max_tokens: int = 5, content: str = "hello world") -> bytes:
        return json.dumps({"model": str(self.model), "messages": [{"role": "user", "content": content}],
                           "max_tokens": max_tokens, "stream": stream}).encode()

    def chat(self, stream: bool = False, request_id: str | None = None, max_tokens: int = 5) -> Answer:
        headers = {"content-type": "application/json"}
        if request_id is not None:
            headers["x-request-id"] = request_id
        return self.request("POST", "/v1/chat/completions", self.chat_body(stream, max_tokens), headers)


@contextmanager
def serving(*, continuous_batching: bool = False) -> Iterator[InProcessServer]:
    """``transformers serve`` of the tiny model in this process, on a free port, until the block ends."""
    from transformers.cli.serve import Serve

    model = tiny_model()
    port = free_port()
    options: dict[str, Any] = {}
    if continuous_batching:  # a small paged cache: sizing it from free memory takes most of a minute on a CPU
        options = {"continuous_batching": True, "cb_num_blocks": 64, "cb_max_batch_tokens": 64}
    serve = Serve(force_model=str(model), device="cpu", host="127.0.0.1", port=port, non_blocking=True,
                  log_level="error", **options)
    server = InProcessServer(serve, port, model)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if server.request("GET", "/health").status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("transformers serve did not answer /health within 60 s")
            time.sleep(0.05)
        yield server
    finally:
        serve.kill_server()
