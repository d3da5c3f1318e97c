"""A metric's attributes are declared once, in its ``MetricSpec``: every series the live path records
carries only those (besides the process-wide ``gpuprobe.rank`` and ``gpuprobe.device``, and the user's
own on probes), with a declared value where the values are listed, and names its model with the
attribute the spec says names it (what the dashboards select by).

The series come from real runs on a tiny Llama: generate() with a logits processor under the sync
audit, assisted decoding, prompt lookup, continuous batching with preemption and a failing request,
and probes with attributes of the user's.
"""

from __future__ import annotations

import warnings

from _hfkit import prompt, torch, transformers
from helpers import cpu_continuous_batching_cannot_pin

import gpuprobe
from gpuprobe._metrics import SPECS
from gpuprobe.integrations.transformers import instrument

PROCESS_WIDE = {"gpuprobe.rank", "gpuprobe.device"}


class ReadsOneScalar:
    """A logits processor that syncs once a step (so the sync audit has something to count)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[0, 0].item()
        return scores


def _run_every_mode(model: transformers.PreTrainedModel) -> None:
    ids = prompt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sync audit's first-seen reports (tested on their own)
        model.generate(ids, max_new_tokens=4, do_sample=False,
                       logits_processor=transformers.LogitsProcessorList([ReadsOneScalar()]))
    model.generate(ids, max_new_tokens=4, do_sample=False, assistant_model=model)
    model.generate(torch.cat([ids, ids], dim=1), max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=2)
    if cpu_continuous_batching_cannot_pin() is None:  # else: a CPU torch under a simulated CUDA
        _run_continuous_batching(model)

    @gpuprobe.probe("user_step", attrs={"stage": "eval"})
    def user_step() -> int:
        return 1

    user_step()
    try:
        with gpuprobe.probe("failing"):
            raise ValueError("the user's own error")
    except ValueError:
        pass


def _run_continuous_batching(model: transformers.PreTrainedModel) -> None:
    gen = transformers.GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=-1, pad_token_id=0)
    tight = transformers.ContinuousBatchingConfig(num_blocks=8, page_size=16, max_batch_tokens=16)
    model.generate_batch([[3 + (i * 7 + j) % 120 for j in range(10)] for i in range(4)], generation_config=gen,
                         continuous_batching_config=tight)
    model.generate_batch([[5, 6, 7], [500, 6, 7]], generation_config=gen, continuous_batching_config=tight)


def test_every_recorded_series_carries_only_its_declared_attributes() -> None:
    gpuprobe.configure(sync_audit=1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)).eval()
    instrument(model, model_name="declared", layers=True, layer_every=1)
    _run_every_mode(model)

    seen: dict[str, list[dict[str, str]]] = {}
    for data in gpuprobe.collect():
        seen.setdefault(data.spec.name, []).extend(p.labels for p in data.points)
    # The run reached the families whose declarations matter most (an empty run would pass anything).
    reached = ["gen_ai.client.token.usage", "gpuprobe.step.duration", "gpuprobe.step.syncs",
               "gpuprobe.speculative.drafts", "gpuprobe.probe.duration", "gpuprobe.probe.errors"]
    if cpu_continuous_batching_cannot_pin() is None:
        reached.append("gpuprobe.requests.finished")
    for name in reached:
        assert seen.get(name), f"the workload recorded no {name}"

    wrong = []
    for name, label_sets in seen.items():
        spec = SPECS[name]
        declared = {a.name: a for a in spec.attributes}
        model_attribute = spec.model_attribute
        for labels in label_sets:
            extra = set(labels) - set(declared) - PROCESS_WIDE
            if extra and not spec.user_attributes:
                wrong.append(f"{name}: undeclared {sorted(extra)}")
            for key, value in labels.items():
                allowed = declared[key].values if key in declared else None
                if allowed is not None and value not in allowed:
                    wrong.append(f"{name}: {key}={value!r} is not one of {allowed}")
            if model_attribute is not None and labels.get(model_attribute) != "declared":
                wrong.append(f"{name}: the model is not named by {model_attribute} in {labels}")
    assert not wrong, "\n".join(sorted(set(wrong)))
    # The user's own attribute rides on the probe's series.
    assert any(labels.get("stage") == "eval" for labels in seen["gpuprobe.probe.duration"])
