"""Fixtures for report tests: test data paths, raw readers for independent expectations, and
kineto traces recorded here on CPU from a tiny Llama model (built from a config, no downloads)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns  # noqa: F401  (the fixtures below hand them out)

DATA = Path(__file__).resolve().parents[1] / "data"
STEPS = 6  # forward calls of generate(max_new_tokens=6): one prefill and five decode steps


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def kineto_min() -> Path:
    return DATA / "kineto_min.json"


@pytest.fixture(scope="session")
def raw() -> Callable[[str | Path], dict[str, Any]]:
    return read_trace


@pytest.fixture(scope="session")
def ns() -> Callable[[Any], int]:
    return to_ns


def build_nsys(path: Path, script: str | None = None) -> Path:
    con = sqlite3.connect(path)
    con.executescript(script if script is not None else (DATA / "nsys_min.sql").read_text())
    con.commit()
    con.close()
    return path


@pytest.fixture
def nsys_db(tmp_path: Path) -> Path:
    return build_nsys(tmp_path / "nsys_min.sqlite")


@pytest.fixture(scope="session")
def make_nsys() -> Callable[[Path, str | None], Path]:
    return build_nsys


@pytest.fixture(scope="session")
def cpu_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two kineto traces of ``generate()`` on a tiny Llama: plain, and with a logits processor.

    Each forward call is a ``prefill`` or ``decode`` range holding a ``forward`` range; the
    processor runs inside a ``logits_processor`` range.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile, record_function

    class TracedPenalty(transformers.RepetitionPenaltyLogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            with record_function("logits_processor"):
                return super().__call__(input_ids, scores)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    state: dict[str, Any] = {"calls": 0, "open": []}

    def before(module: Any, args: Any, kwargs: Any) -> None:
        name = "prefill" if state["calls"] == 0 else "decode"
        state["calls"] += 1
        ranges = [record_function(name), record_function("forward")]
        for r in ranges:
            r.__enter__()
        state["open"].append(ranges)

    def after(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        for r in reversed(state["open"].pop()):
            r.__exit__(None, None, None)

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    folder = tmp_path_factory.mktemp("cpu_traces")
    out: dict[str, Path] = {}
    input_ids = torch.tensor([[1, 5, 9, 3, 7]])
    for variant in ("plain", "processor"):
        state["calls"] = 0
        processors = transformers.LogitsProcessorList([TracedPenalty(1.5)] if variant == "processor" else [])
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                do_sample=False,
                pad_token_id=0,
                logits_processor=processors,
            )
        assert state["calls"] == STEPS
        path = folder / f"{variant}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        out[variant] = path
    return out
