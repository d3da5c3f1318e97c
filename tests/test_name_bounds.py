"""What a program's inputs can name never grows gpuprobe without limit.

Past ``max_label_values`` a probe name, a model name or an exception type folds into ``other`` and keeps
nothing of its own: it shares the ``other`` series' queues, takes no cache entry, and a drain or a
``collect()`` costs the series there are, not the names ever seen. The memory figures are read in a
fresh interpreter (``python -I``, VmRSS from ``/proc/self/status`` after ``gc.collect()``); every call
is still counted, in its own series or in ``other``.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuprobe
from gpuprobe import probe
from gpuprobe._metrics import OTHER
from gpuprobe.runtime import runtime

ROOT = str(Path(__file__).resolve().parent.parent)
CAP = 100  # the max_label_values default
NAMES = 200_000
GROWTH_MB = 20

_CHILD = r"""
import gc, json, sys
sys.path.insert(0, ROOT)

def rss_mb():
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

import gpuprobe
from gpuprobe import probe

def with_names(prefix, count):
    for i in range(count):
        with probe(f"{prefix}{i}"):
            pass

def functions(prefix, count):
    for i in range(count):
        def f(x, y=2):
            return x + y
        f.__qualname__ = f"{prefix}{i}"
        assert probe(f)(1) == 3

class Failure(Exception):
    pass

def error_types(prefix, count):
    failing = probe("failing")
    for i in range(count):
        Failure.__qualname__ = f"{prefix}{i}"  # a new exception type name each time
        try:
            with failing:
                raise Failure()
        except Failure:
            pass

use = {"with probe(name)": with_names, "@probe functions": functions, "exception types": error_types}[ROW]
use("warm", 200)  # past the cap already: the baseline has its `other` series
gpuprobe.collect()
before = rss_mb()
use("name", N)
grown = rss_mb() - before
data = {md.spec.name: md.points for md in gpuprobe.collect()}
host = [p for p in data.get("gpuprobe.probe.duration", []) if p.labels["clock"] == "host"]
errors = data.get("gpuprobe.probe.errors", [])
print(json.dumps({
    "grown_mb": grown,
    "calls": sum(p.count for p in host),
    "probe_names": sorted({p.labels["probe"] for p in host}),
    "errors": sum(p.value for p in errors),
    "error_types": sorted({p.labels["error.type"] for p in errors}),
}))
"""


def _in_fresh_interpreter(row: str, n: int, cwd: Path) -> dict[str, Any]:
    code = f"ROOT = {ROOT!r}\nROW = {row!r}\nN = {n}\n" + _CHILD
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("row", ["with probe(name)", "@probe functions"])
def test_200000_distinct_probe_names_grow_memory_by_at_most_20_mb_and_every_call_is_counted(
        row: str, tmp_path: Path) -> None:
    got = _in_fresh_interpreter(row, NAMES, tmp_path)
    assert got["grown_mb"] <= GROWTH_MB, f"{row}: +{got['grown_mb']:.1f} MB after {NAMES:,} names"
    assert got["calls"] == 200 + NAMES  # the warm-up's calls and the names', each counted once
    # The first CAP names (the warm-up's) have series of their own; every later one is in `other`.
    assert set(got["probe_names"]) == {f"warm{i}" for i in range(CAP)} | {OTHER}


def test_distinct_exception_type_names_grow_memory_by_at_most_20_mb_and_every_error_is_counted(
        tmp_path: Path) -> None:
    n = 100_000
    got = _in_fresh_interpreter("exception types", n, tmp_path)
    assert got["grown_mb"] <= GROWTH_MB, f"+{got['grown_mb']:.1f} MB after {n:,} exception types"
    assert got["calls"] == 200 + n and got["errors"] == 200 + n
    assert got["probe_names"] == ["failing"]
    assert set(got["error_types"]) == {f"warm{i}" for i in range(CAP)} | {OTHER}


_fills = itertools.count()


def _fill_the_cap() -> None:
    """Take every value the ``probe`` label has left, with names no other test used (a cached probe would not
    take one)."""
    fill = next(_fills)
    for i in range(CAP):
        probe(f"fill{fill}-{i}")


def _state_size() -> tuple[int, int]:
    """Label sets every family keeps, and value queues: what a drain and a collect() walk."""
    rt = runtime()
    return sum(len(f.children) for f in rt.registry.families.values()), len(rt.buffers._queues)


def test_names_past_the_cap_add_no_series_and_no_queue() -> None:
    _fill_the_cap()
    with probe("past the cap"):
        pass
    gpuprobe.collect()
    before = _state_size()
    for i in range(5_000):
        with probe(f"name{i}"):
            pass
        probe(f"decorated{i}")(lambda: None)()
    gpuprobe.collect()
    assert _state_size() == before


def test_a_name_past_the_cap_shares_the_queue_of_the_other_series() -> None:
    within = probe("within the cap")
    _fill_the_cap()
    first, second = probe("past the cap 1"), probe("past the cap 2")
    assert first._folded and second._folded and not within._folded
    assert first.host is second.host and dict(first.host.labels)["probe"] == OTHER
    with first:
        pass
    with second:
        pass
    assert first._local.queue is second._local.queue
    assert sum(p.count for md in gpuprobe.collect() if md.spec.name == "gpuprobe.probe.duration"
               for p in md.points if p.labels["probe"] == OTHER and p.labels.get("clock", "host") == "host") == 2


def test_a_block_over_one_name_past_the_cap_in_a_loop_reuses_its_probe_and_caches_stay_bounded() -> None:
    from gpuprobe import _probe

    _fill_the_cap()
    assert probe("looped") is probe("looped")  # kept among the recent folded names
    cached = len(_probe._cache)
    for i in range(1_000):
        probe(f"once{i}")
    assert len(_probe._recent_folded) <= _probe._RECENT_FOLDED
    assert len(_probe._cache) == cached


def test_async_blocks_with_names_past_the_cap_leave_the_task_context_bounded() -> None:
    _fill_the_cap()

    async def many() -> tuple[int, int]:
        async with probe("first"):
            pass
        size = len(contextvars.copy_context())
        for i in range(5_000):
            async with probe(f"task{i}"):
                pass
        return size, len(contextvars.copy_context())

    first, last = asyncio.run(many())
    assert last == first


def _tiny_model() -> Any:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, max_position_embeddings=64))


def test_model_names_past_the_cap_add_no_series() -> None:
    from gpuprobe.integrations.transformers import instrument

    import torch

    model = _tiny_model()
    ids = torch.tensor([[1, 2, 3]])
    for i in range(CAP + 10):
        instrument(model, model_name=f"model{i}")
    model.generate(ids, max_new_tokens=2, do_sample=False)
    gpuprobe.collect()
    before = _state_size()
    for i in range(CAP + 10, CAP + 1_000):
        instrument(model, model_name=f"model{i}")
    model.generate(ids, max_new_tokens=3, do_sample=False)
    data = {md.spec.name: md.points for md in gpuprobe.collect()}
    assert _state_size() == before
    requests = data["gen_ai.server.request.duration"]
    assert {p.labels["gen_ai.request.model"] for p in requests} == {OTHER}  # both calls, under names past the cap
    assert sum(p.count for p in requests) == 2


def test_request_error_types_past_the_cap_add_no_series() -> None:
    from gpuprobe.integrations.kit import RequestSeries

    series = RequestSeries(runtime(), "tiny", "my-loop")
    records = runtime().thread_records()
    for i in range(CAP + 1):  # the last one is the first in `other`
        records.append((series.request_error(f"Error{i}"), 1_000))
    gpuprobe.collect()
    before = _state_size()
    for i in range(CAP + 1, CAP + 5_000):
        records.append((series.request_error(f"Error{i}"), 1_000))
    points = next(md.points for md in gpuprobe.collect() if md.spec.name == "gen_ai.server.request.duration")
    assert _state_size() == before
    assert len(series._errors) <= 64
    assert sum(p.count for p in points) == CAP + 5_000
