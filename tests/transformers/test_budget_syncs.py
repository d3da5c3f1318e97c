"""What the sync budgets count, measured in this process on tiny real Llamas (``Measurement``, what the
``gpuprobe_budget`` fixture runs): the syncs of the user's code, transformers' own left out as expected
and kept beside them, every sync in the ``_all`` counts, and the sync audit's reading of which keys were
transformers' alone.

Expected values come from the code run here: transformers' stop check reads one flag a step (one
``.item()`` for each new token), the processor and the model's own method below sync once a step each.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hfkit import prompt, torch, transformers

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.runtime import runtime
from gpuprobe.testing.budget import Measurement, check

TOKENS = 8
SYNC_COUNTS = ["host_syncs", "host_syncs_per_step", "host_syncs_all", "host_syncs_per_step_all"]
STOP = ("other", None, "aten::_local_scalar_dense")  # transformers' stop check: bool(unfinished.max() == 0)


class ItemProcessor(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if scores[0, 0].item() > 1e9:  # the user's sync
            scores = scores * 1
        return scores


class SyncingLlama(transformers.LlamaForCausalLM):
    """A model whose own code syncs once a step, in the step's ``other`` part (with the stop check)."""

    def _update_model_kwargs_for_generation(self, outputs: Any, model_kwargs: dict[str, Any],
                                            is_encoder_decoder: bool = False, num_new_tokens: int = 1) -> Any:
        outputs.logits[0, -1, 0].item()  # the model's own sync
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder, num_new_tokens)


def llama(cls: type = transformers.LlamaForCausalLM) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return cls(config).eval()


def generate(model: Any, processors: list[Any] = ()) -> Any:  # type: ignore[assignment]
    return model.generate(prompt(), max_new_tokens=TOKENS, do_sample=False, eos_token_id=None,
                          logits_processor=transformers.LogitsProcessorList(list(processors)))


@pytest.fixture
def models() -> Any:
    made: list[Any] = []

    def make(cls: type = transformers.LlamaForCausalLM) -> Any:
        made.append(llama(cls))
        return made[-1]

    yield make
    for m in made:
        hf.uninstrument(m)


def test_a_plain_generate_holds_no_sync_and_keeps_the_stop_check_as_expected(models: Any) -> None:
    with Measurement(SYNC_COUNTS) as m:
        generate(models())
    r = m.results
    assert (r["host_syncs"].value(), r["host_syncs_per_step"].value()) == (0, 0)
    assert r["host_syncs_per_step"].expected.components() == {"other": 1}
    assert r["host_syncs"].expected.value("other") == TOKENS
    # the _all counts: the same syncs, none left out
    assert r["host_syncs_per_step_all"].components() == {"other": 1}
    assert r["host_syncs_all"].components() == r["host_syncs"].expected.components()
    assert r["host_syncs_all"].expected is None
    rows = {row.count: row for row in check({"host_syncs_per_step": 0}, r)}
    assert rows["host_syncs_per_step"].verdict == "ok"
    assert rows["host_syncs_per_step (expected)"].measured == 1
    assert "transformers/generation/" in rows["host_syncs_per_step (expected)"].where


def test_a_processor_s_sync_counts_and_transformers_own_stay_left_out(models: Any) -> None:
    with Measurement(SYNC_COUNTS) as m:
        generate(models(), [ItemProcessor()])
    r = m.results
    assert r["host_syncs_per_step"].components() == {"logits_processor/ItemProcessor": 1}
    assert r["host_syncs"].components() == {"logits_processor/ItemProcessor": TOKENS}  # one call a token
    assert "test_budget_syncs.py:" in r["host_syncs"].details["logits_processor/ItemProcessor"]
    assert r["host_syncs_per_step_all"].components() == {"logits_processor/ItemProcessor": 1, "other": 1}


def test_a_key_the_user_s_code_syncs_under_too_counts_whole(models: Any) -> None:
    with Measurement(SYNC_COUNTS) as m:
        generate(models(SyncingLlama))
    r = m.results
    # the model's own sync and the stop check share (other, aten::_local_scalar_dense): both count
    assert r["host_syncs_per_step"].components() == {"other": 2}
    assert r["host_syncs_per_step"].expected.components() == {}
    assert "test_budget_syncs.py:" in r["host_syncs_per_step"].details["other"]


def test_the_sites_name_the_keys_only_transformers_synced(models: Any) -> None:
    gpuprobe.configure(sync_audit=1)
    model = hf.instrument(models(), memory=False, kv_cache=False)
    with pytest.warns(RuntimeWarning, match="in logits_processor ItemProcessor forces"):  # the user's: warned
        generate(model, [ItemProcessor()])
    only = runtime().sync_sites.only_expected()
    assert STOP in only
    assert ("logits_processor", "ItemProcessor", "aten::_local_scalar_dense") not in only
    syncing = hf.instrument(models(SyncingLlama), memory=False, kv_cache=False)
    with pytest.warns(RuntimeWarning, match="in other forces .* at .*test_budget_syncs.py:"):
        generate(syncing)
    assert STOP not in runtime().sync_sites.only_expected()  # the user's sighting of it settles it
