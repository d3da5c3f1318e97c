"""A real trace backend a user would run: Arize Phoenix (``phoenix serve``, from PyPI, in a virtual environment of
its own: ``scripts/test-trace-backend`` makes it), fed over OTLP/HTTP by a real tiny model's requests, then
asked for the spans through its own REST API.

Skipped where that environment is missing (``.venv-phoenix``; ``PHOENIX_COMMAND`` may name another
``phoenix`` command).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT

PHOENIX = os.environ.get("PHOENIX_COMMAND") or str(Path(ROOT) / ".venv-phoenix" / "bin" / "phoenix")
pytestmark = pytest.mark.skipif(not os.path.exists(PHOENIX),
                                reason="no Arize Phoenix here: scripts/test-trace-backend installs it and runs this")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env.update(PHOENIX_WORKING_DIR=str(work), PHOENIX_PORT=str(port), PHOENIX_GRPC_PORT=str(grpc),
               PHOENIX_HOST="127.0.0.1")
    proc = subprocess.Popen([PHOENIX, "serve"], env=env, cwd=work, stdout=subprocess.DEVNULL,
                            stderr=open(work / "phoenix.log", "w"), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if urllib.request.urlopen(f"{base}/healthz", timeout=2).status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"phoenix serve did not come up:\n{(work / 'phoenix.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield base
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_phoenix_holds_each_request_s_spans_with_the_conventions_attributes(phoenix: str, tmp_path: Path) -> None:
    """A program of its own (as a user's would be) sends the spans of three requests; Phoenix gives them back."""
    program = f"""
import os, sys, json
sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {ROOT + '/tests/transformers'!r})
import torch, gpuprobe, gpuprobe.testing
from _hfkit import build
from gpuprobe.integrations.transformers import instrument
model = instrument(build("llama").eval(), model_name="phoenix-tiny")
out = []
for i in range(3):
    with gpuprobe.catch_requests(request_id=f"phoenix-{{i}}") as caught:
        ids = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=4 + i, min_new_tokens=4 + i, pad_token_id=0)
    out.append({{"trace_id": caught.record.trace_id, "span_id": caught.record.span_id, "tokens": ids.shape[1] - 4}})
gpuprobe.testing.reset()  # what is queued is sent
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{phoenix}/v1/traces"
    env["OTEL_RESOURCE_ATTRIBUTES"] = "service.name=phoenix-check"
    done = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sent = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 60
    while True:
        spans = _get(f"{phoenix}/v1/projects/default/spans?limit=100")["data"]
        if len([s for s in spans if s["name"] == "text_completion phoenix-tiny"]) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    by_id = {s["context"]["span_id"]: s for s in spans}
    for request in sent:
        span = by_id[request["span_id"]]
        assert span["name"] == "text_completion phoenix-tiny"
        assert span["context"]["trace_id"] == request["trace_id"]
        attributes = span["attributes"]
        flat = {**attributes, **{f"{k}.{kk}": vv for k, v in attributes.items() if isinstance(v, dict)
                                 for kk, vv in v.items()}}
        usage = flat.get("gen_ai.usage.output_tokens", attributes.get("gen_ai", {}).get("usage", {}).get(
            "output_tokens"))
        assert usage == request["tokens"]
        children = {s["name"] for s in spans if s.get("parent_id") == request["span_id"]}
        assert children == {"prefill", "decode"}
