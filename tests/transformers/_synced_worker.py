"""One rank of a two-rank ``generate(synced_gpus=True)`` run (gloo on the CPU), for test_generation_modes_more.

Rank 0 stops after ``STOP`` new tokens (a stopping criterion), rank 1 runs to ``NEW`` tokens: rank 0's loop
goes on running forwards, selecting nothing, until rank 1 is done. Prints one JSON line: the plain and the
instrumented outputs, and what gpuprobe counted.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument

NEW, STOP, PROMPT = 6, 3, 5


class StopAfter(transformers.StoppingCriteria):
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.limit, dtype=torch.bool)


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(rank))
    criteria = transformers.StoppingCriteriaList([StopAfter(PROMPT + STOP)] if rank == 0 else [])

    def run() -> list[list[int]]:
        return model.generate(ids, max_new_tokens=NEW, do_sample=False, synced_gpus=True,
                              stopping_criteria=criteria).tolist()

    plain = run()
    instrument(model, model_name="m")
    measured = run()
    counted: dict[str, float] = {}
    for md in gpuprobe.collect():
        for p in md.points:
            key = md.spec.name + "|" + ",".join(f"{k}={v}" for k, v in sorted(p.labels.items())
                                                if k in ("gen_ai.token.type", "phase", "clock"))
            counted[key] = counted.get(key, 0) + (p.count if md.spec.instrument == "histogram" else p.value)
    usage = {md.spec.name: sum(p.sum for p in md.points if p.labels.get("gen_ai.token.type") == "output")
             for md in gpuprobe.collect() if md.spec.name == "gen_ai.client.token.usage"}
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "plain": plain, "measured": measured, "counts": counted,
                      "output_tokens": usage.get("gen_ai.client.token.usage", 0)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
