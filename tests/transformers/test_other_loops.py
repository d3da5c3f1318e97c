"""transformers' other decoding loops: each measured right or measured per call only, as docs/transformers.md says.

- The modes transformers moved to the Hub (contrastive search, DoLa, group and constrained beam search)
  need ``trust_remote_code=True`` and a download: here they raise, instrumented or not, alike.
- ``custom_generate=<callable>``: a loop gpuprobe does not see; per-call metrics only.
- ``synced_gpus=True`` (two gloo ranks on the CPU): a rank that is done runs forwards that select
  nothing until the other is done; they are no steps of its request.
- Every ``GenerationMode`` of the installed transformers is in the modes table of docs/transformers.md.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _hfkit import ROOT, prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument

HUB_MODES = {
    "contrastive_search": dict(penalty_alpha=0.6, top_k=4),
    "dola_generation": dict(dola_layers="low"),
    "group_beam_search": dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0),
    "constrained_beam_search": dict(num_beams=2, force_words_ids=[[5]]),
}


def counts(metric: str, **labels: str) -> float:
    return sum(p.count if md.spec.instrument == "histogram" else p.value for md in gpuprobe.collect()
               if md.spec.name == metric for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))


def output_tokens() -> float:
    return sum(p.sum for md in gpuprobe.collect() if md.spec.name == "gen_ai.client.token.usage"
               for p in md.points if p.labels.get("gen_ai.token.type") == "output")


@pytest.mark.parametrize("mode", sorted(HUB_MODES))
def test_a_mode_moved_to_the_hub_fails_alike_and_is_counted_as_a_failed_call(make_model, mode: str) -> None:
    kw = HUB_MODES[mode]
    assert transformers.GenerationConfig(**kw).get_generation_mode().value == mode
    model = make_model("llama")

    def run() -> BaseException:
        with pytest.raises(Exception) as caught:
            model.generate(prompt(), max_new_tokens=4, **kw)
        return caught.value

    plain = run()
    instrument(model, model_name="m")
    measured = run()
    assert (type(measured), str(measured)) == (type(plain), str(plain))
    assert counts("gen_ai.server.request.duration", **{"error.type": type(plain).__qualname__}) == 1
    assert counts("gpuprobe.step.duration") == 0


def test_a_custom_generate_callable_is_measured_per_call(make_model) -> None:
    def greedy(model: Any, input_ids: Any, logits_processor: Any = None, stopping_criteria: Any = None,
               generation_config: Any = None, **kwargs: Any) -> Any:  # a loop of its own: no _prefill, no stop check
        for _ in range(generation_config.max_new_tokens):
            logits = model(input_ids).logits[:, -1, :]
            input_ids = torch.cat([input_ids, logits.argmax(-1, keepdim=True)], dim=-1)
        return input_ids

    model = make_model("llama")
    ids = prompt(batch=2, length=5)
    ref = model.generate(ids, max_new_tokens=4, custom_generate=greedy)
    instrument(model, model_name="m")
    assert torch.equal(ref, model.generate(ids, max_new_tokens=4, custom_generate=greedy))
    assert counts("gen_ai.server.request.duration") == 1
    assert output_tokens() == 2 * 4  # from the returned shape: no step was seen
    assert counts("gpuprobe.step.duration") == 0
    assert counts("gen_ai.server.time_to_first_token") == 0


def test_every_generation_mode_of_this_transformers_is_in_the_docs_table() -> None:
    modes = [m.value for m in transformers.generation.configuration_utils.GenerationMode]
    doc = (Path(ROOT) / "docs" / "transformers.md").read_text()
    table = doc[doc.index("## Generation modes"):]
    table = table[:table.index("\n## ", 1)]
    rows = {m for row in re.findall(r"^\|([^|]*)\|", table, re.M) for m in re.findall(r"`([a-z_]+)`", row)}
    assert sorted(set(modes) - rows) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_synced_gpus_counts_no_step_after_a_rank_is_done() -> None:
    pytest.importorskip("torch.distributed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch without gloo")
    worker = Path(__file__).with_name("_synced_worker.py")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    procs = [subprocess.Popen([sys.executable, str(worker)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    results = {}
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        line = json.loads(out.strip().splitlines()[-1])
        results[line["rank"]] = line
    import _synced_worker as w

    for rank, new in ((0, w.STOP), (1, w.NEW)):
        got = results[rank]
        assert got["measured"] == got["plain"]
        assert len(got["plain"][0]) == w.PROMPT + new
        assert got["output_tokens"] == new
        c = got["counts"]
        assert c["gpuprobe.step.duration|clock=host,phase=prefill"] == 1
        assert c["gpuprobe.step.duration|clock=host,phase=decode"] == new - 1
        assert c["gpuprobe.inter_token.duration|clock=host"] == new - 1
        assert c["gen_ai.server.time_per_output_token|"] == 1
