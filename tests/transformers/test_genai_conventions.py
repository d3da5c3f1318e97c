"""The OpenTelemetry GenAI conventions' names: by default the ones gpuprobe has emitted so far, with
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` the newest ones too (the token-usage counters
and per-operation histograms, the renamed time to first chunk); a streamer's first chunk timed as the
convention's time to first chunk. The variable is read once per process, so each case runs a real tiny Llama
in a fresh interpreter (``python -I``) with the variable set, and checks there what gpuprobe collected
against what generate() returned and what the test's own streamer saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from gpuprobe._semconv import ENV, GENAI_LATEST, parse

pytest.importorskip("torch")
pytest.importorskip("transformers")

# What the child runs: two generate() calls of a tiny Llama with a streamer whose puts it times itself, one
# call without; then what gpuprobe collected, by metric name, as JSON on the last line of its output.
_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("always")
import torch, transformers
import gpuprobe
from gpuprobe.integrations import transformers as hf

torch.manual_seed(0)
config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2)
with warnings.catch_warnings(record=True) as caught:
    model = hf.instrument(transformers.LlamaForCausalLM(config).eval(), model_name="tiny")


class Stamps:
    # the puts after the prompt's: the chunks of output, stamped when this streamer receives them
    def __init__(self):
        self.puts = []
    def put(self, value):
        self.puts.append(time.perf_counter())
    def end(self):
        pass


first_chunk, tokens = [], 0
for new in (3, 5):
    streamer = Stamps()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                         streamer=streamer)
    first_chunk.append(streamer.puts[1] - t0)  # puts[0] is the prompt
    tokens += out.shape[1] - ids.shape[1]
out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
tokens += 2
if len(sys.argv) > 1:  # the variable changed after the first read: nothing changes
    import os
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = sys.argv[1]
    hf.instrument(transformers.LlamaForCausalLM(config).eval(), model_name="late").generate(
        torch.tensor([[5, 6]]), max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
seen = {}
for md in gpuprobe.collect():
    for p in md.points:
        seen.setdefault(md.spec.name, []).append(
            {"labels": p.labels, "count": p.count, "sum": p.sum, "value": p.value, "max": p.max})
print(json.dumps({"seen": seen, "first_chunk": first_chunk, "tokens": int(tokens),
                  "warnings": [str(w.message) for w in caught]}))
"""


def _run(opt_in: str | None, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    if opt_in is not None:
        env[ENV] = opt_in
    with tempfile.TemporaryDirectory() as cwd:  # a safe working folder for the child
        done = subprocess.run([sys.executable, "-I", "-c", _CHILD, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _total(seen: dict[str, Any], name: str, field: str, **labels: str) -> float:
    return sum(p[field] for p in seen.get(name, []) if all(p["labels"].get(k) == v for k, v in labels.items()))


CHILD = pytest.mark.subprocess_only  # what it checks runs in the child interpreter
OLD, NEW = "gen_ai.client.operation.time_to_first_chunk", "gen_ai.client.inference.time_to_first_chunk"
LATEST_ONLY = ("gen_ai.client.inference.usage.input_tokens", "gen_ai.client.inference.usage.output_tokens",
               "gen_ai.client.inference.operation.input_tokens", "gen_ai.client.inference.operation.output_tokens",
               NEW)


def _check_first_chunk(got: dict[str, Any], name: str) -> None:
    (point,) = got["seen"][name]
    assert point["count"] == 2  # the two streaming calls; none for the call without a streamer
    # gpuprobe's clock starts inside generate() and stops as the first output chunk is handed over: within what
    # the test measured around it (from before the call to the streamer receiving the chunk), less the
    # little that lies outside gpuprobe's span.
    measured = got["first_chunk"]
    assert 0 < point["sum"] <= sum(measured)
    assert point["sum"] >= sum(measured) - 0.05
    assert point["max"] <= max(measured)


@CHILD
def test_by_default_the_names_so_far_and_the_v1_41_time_to_first_chunk() -> None:
    got = _run(None)
    seen = got["seen"]
    assert not set(LATEST_ONLY) & set(seen)
    _check_first_chunk(got, OLD)
    assert _total(seen, "gen_ai.client.token.usage", "sum", **{"gen_ai.token.type": "output"}) == got["tokens"] == 10
    assert got["warnings"] == []


@CHILD
def test_opted_in_the_newest_names_count_what_the_histogram_counts() -> None:
    got = _run(f"http/dup, {GENAI_LATEST}")
    seen = got["seen"]
    assert OLD not in seen
    _check_first_chunk(got, NEW)
    for kind, n in (("input", 5 + 5 + 3), ("output", got["tokens"])):
        histogram = _total(seen, "gen_ai.client.token.usage", "sum", **{"gen_ai.token.type": kind})
        counter = seen[f"gen_ai.client.inference.usage.{kind}_tokens"]
        assert [p["labels"]["gen_ai.token.modality"] for p in counter] == ["unknown"]
        assert counter[0]["labels"]["gen_ai.provider.name"] == "transformers"
        per_call = seen[f"gen_ai.client.inference.operation.{kind}_tokens"]
        assert histogram == counter[0]["value"] == per_call[0]["sum"] == n
        assert per_call[0]["count"] == 3  # one per successful call
    assert got["warnings"] == []


@CHILD
def test_a_genai_value_gpuprobe_cannot_use_is_warned_once_and_the_defaults_are_kept() -> None:
    got = _run("gen_ai_latest")
    assert not set(LATEST_ONLY) & set(got["seen"])
    assert OLD in got["seen"]
    (warning,) = got["warnings"]
    assert f"{ENV}='gen_ai_latest'" in warning and GENAI_LATEST in warning


@CHILD
def test_the_variable_is_read_once_per_process() -> None:
    got = _run(None, GENAI_LATEST)
    late = [p for name in LATEST_ONLY for p in got["seen"].get(name, [])]
    assert late == []  # the second model, instrumented after the variable changed, keeps the first reading
    assert _total(got["seen"], "gen_ai.client.token.usage", "count", **{"gen_ai.request.model": "late"}) == 2


@pytest.mark.parametrize(("raw", "latest", "warned"), [
    (None, False, False), ("", False, False), ("http", False, False), ("database/dup,http", False, False),
    ("gen_ai_latest_experimental", True, False), (" http , gen_ai_latest_experimental ", True, False),
    ("gen_ai_latest_experimental,gen_ai_tool_definitions", True, False),
    ("gen_ai", False, True), ("gen_ai/dup", False, True), ("GEN_AI_LATEST_EXPERIMENTAL", False, True),
])
def test_the_variable_is_a_list_of_which_only_genai_values_are_gpuprobes(raw: str | None, latest: bool,
                                                                         warned: bool) -> None:
    got, problem = parse(raw)
    assert got is latest
    assert (problem is not None) is warned
