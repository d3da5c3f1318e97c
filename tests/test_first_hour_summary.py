"""``gpuprobe.summary()`` and the periodic log line say where a step's time goes: each component's share of
the step time, largest first (as the demo's table and the live page do).

A real tiny Llama generating with a logits processor that sleeps, so that it dominates however busy the
shared CPU is (sleeping is the one cost a busy machine does not stretch); the shares are checked against
the test's own clock and against the step durations, a metric the shares are not computed from.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gpuprobe  # noqa: E402
from gpuprobe._summary import LogLine, _totals  # noqa: E402
from gpuprobe.integrations.transformers import instrument, uninstrument  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402

SLEEP_S = 0.05
NEW_TOKENS = 5


class Sleepy(transformers.LogitsProcessor):
    """Sleeps SLEEP_S a step, and keeps how long its calls took by the test's own clock."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        t0 = time.perf_counter()
        time.sleep(SLEEP_S)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return scores


@pytest.fixture
def model() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: a second torch thread only adds noise
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.generate(torch.ones(1, 6, dtype=torch.long), max_new_tokens=2)  # the first call's one-off costs, unmeasured
    m = instrument(m, model_name="tiny")
    yield m
    uninstrument(m)
    torch.set_num_threads(threads)


def _generate(model: Any, processor: Sleepy) -> float:
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                   logits_processor=transformers.LogitsProcessorList([processor]))
    return time.perf_counter() - t0


def _host_step_seconds() -> tuple[float, int]:
    total, count = 0.0, 0
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.step.duration":
            for p in md.points:
                if p.labels.get("clock") == "host":
                    total, count = total + p.sum, count + p.count
    return total, count


def test_the_summary_ranks_the_components_by_their_share_of_the_step_time(model: Any) -> None:
    sleepy = Sleepy()
    wall = _generate(model, sleepy)
    table = gpuprobe.summary()

    parts = [c for c in table.components if c.model == "tiny"]
    assert parts and table.dominant is not None
    assert (table.dominant.component, table.dominant.processor) == ("logits_processor", "Sleepy")
    shares = [c.share for c in parts]
    assert shares == sorted(shares, reverse=True)
    assert sum(shares) == pytest.approx(1.0)
    step_seconds, steps = _host_step_seconds()
    assert steps == NEW_TOKENS == sleepy.calls
    top = parts[0]
    # its time is what the processor's own clock saw (within the stand-in's overhead), per step and in all
    assert sleepy.seconds <= top.seconds <= sleepy.seconds + 0.005 * steps
    assert top.per_step == pytest.approx(top.seconds / steps)
    # its share is of the step time the step series measured, and at least its sleep over the calls' wall time
    assert top.share == pytest.approx(top.seconds / step_seconds, rel=0.02)
    assert top.share >= sleepy.seconds / wall
    text = str(table).splitlines()
    assert text[0].split()[:4] == ["step", "time", "by", "component"] and "share" in text[0]
    assert text[2].startswith("logits_processor:Sleepy") and text[2].rstrip().endswith(f"{top.share:.1%}")
    assert table.to_dict()["components"][0]["name"] == "logits_processor:Sleepy"
    assert "logits_processor:Sleepy" in table._repr_html_()


def test_the_log_line_gives_the_components_shares_of_the_interval_largest_first(model: Any) -> None:
    rt = runtime()
    _generate(model, Sleepy())  # before the interval: not in the line
    before = _totals(rt.collect())
    sleepy = Sleepy()
    wall = _generate(model, sleepy)
    after = _totals(rt.collect())

    line = LogLine.line(before, after, 10.0)
    assert line is not None and "step time " in line
    listed = line.split("step time ", 1)[1].split(", ")
    named = [item.rsplit(" ", 2) for item in listed if item.endswith(" %")]
    assert named[0][0] == "logits_processor:Sleepy"
    percents = [int(n[1]) for n in named]
    assert percents == sorted(percents, reverse=True)
    assert percents[0] >= int(100 * sleepy.seconds / wall) - 1  # rounded: at least its sleep's share of the calls
