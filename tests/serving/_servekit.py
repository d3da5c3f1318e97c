"""Helpers of the serving tests: a tiny Llama with a tokenizer trained here, processes started through
``gpuprobe run`` and stopped by process group, and a parsed /metrics scrape.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few sentences, the model has
random weights; both are saved with ``save_pretrained`` so ``transformers serve`` loads them from disk.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)  # the virtual environment's scripts: python, gpuprobe, transformers
GPUPROBE = os.path.join(BIN, "gpuprobe")

SPECIAL = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = ["hello world, how are you today?", "the quick brown fox jumps over the lazy dog.",
          "a tiny model for tests, trained on nothing much.", "what time is it? it is time to serve tokens."]


def build_tiny_model(out: Path) -> Path:
    """A 2-layer Llama (vocabulary 300) and its tokenizer with a chat template, saved in ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=tok.get_vocab_size(), max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2, max_new_tokens=16)
    model.save_pretrained(out)
    return out


def tiny_llama() -> Any:
    """A tiny Llama with random weights (seed 0), for continuous batching in the test process."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """This environment without GPUPROBE_* variables, the virtual environment's scripts first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    env["OMP_NUM_THREADS"] = "1"  # two cores are shared with the test process
    env.update(extra)
    return env


def http_get(url: str, timeout: float = 5) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def wait_until(what: str, ok: Callable[[], Any], timeout: float, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the process exited ({proc.returncode}) while waiting for {what}:\n{out[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


class Served:
    """A command started through ``gpuprobe run`` in a session of its own; :meth:`stop` ends its group."""

    def __init__(self, args: Sequence[str], cwd: Path, metrics_port: int, env: dict[str, str] | None = None,
                 log: Path | None = None, plain: bool = False) -> None:
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.serve_port: int | None = None  # the served program's own port, where it has one
        self.log = log
        out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed in stop()
        self._out = out
        # plain: the same command without gpuprobe, for answers to compare with
        command = list(args) if plain else [GPUPROBE, "run", "--port", str(metrics_port), "--", *args]
        self.proc = subprocess.Popen(command, cwd=cwd, env=env or child_env(), stdout=out, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log is not None and self.log.exists() else ""

    def scrape(self) -> Scrape:
        text = http_get(self.metrics_url)
        assert text is not None, f"/metrics at {self.metrics_url} did not answer:\n{self.tail()}"
        return Scrape(text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._out is not subprocess.DEVNULL:
            self._out.close()


class Scrape:
    """One scrape of /metrics, parsed with prometheus_client's parser."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.text = text
        self.samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    def find(self, name: str, **labels: str) -> list[Any]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the matching samples (0 when none)."""
        return sum(s.value for s in self.find(name, **labels))

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)


PROMPTS = ["hello world", "how are you today?", "the quick brown fox", "what time is it?", "tell me a story",
           "serve tokens"]


def chat(port: int, i: int, stream: bool) -> tuple[int, int]:
    """One chat completion with the real OpenAI client; ``(prompt_tokens, completion_tokens)`` of its usage."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=180)
    kwargs = dict(model="./tiny", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                  max_tokens=6 + 2 * i)
    if not stream:
        usage = client.chat.completions.create(**kwargs).usage
    else:
        usage = None
        for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
            usage = chunk.usage or usage
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens


def answer(port: int, i: int) -> str:
    """The text of one chat completion (the model's own generation config: greedy)."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=180)
    reply = client.chat.completions.create(model="./tiny", max_tokens=8,
                                           messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
    return reply.choices[0].message.content or ""


def concurrent_chats(port: int, n: int = 6) -> list[tuple[int, int]]:
    """``n`` chats at once, every other one streaming."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: chat(port, i, stream=i % 2 == 0), range(n)))


def start_served(tiny_model: Path, log_dir: Path, *serve_args: str, plain: bool = False) -> Served:
    """``gpuprobe run -- transformers serve ./tiny --device cpu ...``, ready for requests (``plain``: the
    same server without gpuprobe)."""
    serve_port, metrics_port = free_port(), free_port()
    served = Served(["transformers", "serve", "./tiny", "--device", "cpu", "--host", "127.0.0.1", "--port",
                     str(serve_port), *serve_args], cwd=tiny_model.parent, metrics_port=metrics_port,
                    log=log_dir / "serve.log", plain=plain)
    served.serve_port = serve_port

    def up(url: str) -> bool:
        if served.proc.poll() is not None:
            pytest.fail(f"the server exited ({served.proc.returncode}):\n{served.tail()}")
        return http_get(url) is not None

    try:
        wait_until("transformers serve", lambda: up(f"http://127.0.0.1:{serve_port}/health"), 180)
        if not plain:
            wait_until("/metrics", lambda: up(served.metrics_url), 60)
    except BaseException:
        served.stop()
        raise
    return served
