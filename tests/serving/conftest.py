"""Fixtures of the serving tests: one tiny model on disk per session; in-process tests leave no model
instrumented. Metrics are zeroed around every test by tests/conftest.py.

Continuous batching is checked once per session before the first test that needs it: a tiny real
``generate_batch`` without gpuprobe, in a process of its own. Where transformers has no continuous
batching in the form the tests use, or where it does not give every request back (as in old releases
on a CPU), those tests skip and say why (again at the end of the run). Where the call raises, they run
and fail: an API change is a failure, not a skip. A test needs continuous batching when its module's
name says ``continuous`` or it is marked ``continuous_batching``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("prometheus_client")

from _servekit import build_tiny_model  # noqa: E402

from gpuprobe.integrations import transformers as hf  # noqa: E402


# What the continuous batching tests call, on the tiny Llama they use; gpuprobe is never imported.
# Its last line: "unavailable: ...", "raised: ..." or "N of M" (requests back with all their tokens).
_CB_PROBE = """
import sys
import transformers
from _servekit import tiny_llama

missing = [n for n in ("ContinuousBatchingConfig", "GenerationConfig") if not hasattr(transformers, n)]
model = tiny_llama()
if missing or not hasattr(model, "generate_batch"):
    print("unavailable: no " + ", ".join(missing or ["generate_batch"]))
    sys.exit()
prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]
gen = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
try:
    cfg = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=32)
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
except Exception as exc:
    print(f"raised: {type(exc).__name__}: {exc}")
    sys.exit()
full = [o for o in out.values() if len(o.generated_tokens) == 4 and not getattr(o, "error", None)]
assert "gpuprobe" not in sys.modules
print(f"{len(full)} of {len(prompts)}")
"""
_CB_TIMEOUT_S = 120  # 3 tiny requests take ~3 s on 2 busy cores
_cb_skip_reason: list[str | None] = []  # filled by the first test that needs continuous batching


def continuous_batching_unavailable() -> str | None:
    """Why the continuous batching tests cannot run here, or None when they can; probed once per session.

    Returns:
        The reason, naming the installed transformers, when it has no ``generate_batch`` or
        ``ContinuousBatchingConfig``, or when a tiny ``generate_batch`` run without gpuprobe does not
        return every request with all of its tokens in time. None when it does, and when the call raises
        (the tests then fail and show why).
    """
    if not _cb_skip_reason:
        import transformers

        version = transformers.__version__
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent)
        reason: str | None = None
        try:
            proc = subprocess.run([sys.executable, "-c", _CB_PROBE], capture_output=True, text=True, env=env,
                                  timeout=_CB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            reason = (f"continuous batching of transformers {version} does not finish 3 tiny requests in "
                      f"{_CB_TIMEOUT_S} s on this machine, without gpuprobe")
        else:
            last = (proc.stdout.strip().splitlines() or [""])[-1]
            if last.startswith("unavailable: "):
                reason = f"transformers {version} has no continuous batching as the tests use it ({last[13:]})"
            elif proc.returncode == 0 and not last.startswith("raised: ") and last != "3 of 3":
                reason = (f"continuous batching of transformers {version} returns {last or 'nothing'} requests "
                          f"with all their tokens on this machine, without gpuprobe")
        _cb_skip_reason.append(reason)
    return _cb_skip_reason[0]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "continuous_batching: needs transformers' continuous batching to work "
                                       "here (skipped, with the reason, where it does not)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: a module-scoped server started with --continuous-batching would fail instead.
    if "continuous" in item.path.name or item.get_closest_marker("continuous_batching") is not None:
        reason = continuous_batching_unavailable()
        if reason is not None:
            pytest.skip(reason)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # A skip of every continuous batching test must not pass unnoticed in a run's counts.
    if _cb_skip_reason and _cb_skip_reason[0] is not None:
        terminalreporter.write_line(f"continuous batching tests skipped: {_cb_skip_reason[0]}", yellow=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder ``tiny`` holding a 2-layer Llama and its chat-template tokenizer (``save_pretrained``)."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def _nothing_instrumented() -> Iterator[None]:
    yield
    hf.uninstrument_all()
