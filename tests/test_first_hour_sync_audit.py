"""The live sync audit warns about the syncs the user can act on (their code, a processor or criterion they
passed) and keeps transformers' own (the stop check, masking_utils) as expected: counted, listed in
``info()["sync_sites"]`` with ``"expected": True``, not warned about.

A real tiny Llama on the CPU (where the audit counts what would synchronise on a GPU); the user's code is
this file: a logits processor and a forward hook that read a value on the host.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gpuprobe  # noqa: E402
from gpuprobe.integrations.transformers import instrument, uninstrument  # noqa: E402

SCALAR = "aten::_local_scalar_dense"


class ReadsTheLastToken(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        int(input_ids[0, -1])  # a host read: the user's own sync
        return scores


READ_LINE = inspect.getsourcelines(ReadsTheLastToken.__call__)[1] + 1


@pytest.fixture
def model() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    gpuprobe.configure(sync_audit=1)
    m = instrument(transformers.LlamaForCausalLM(cfg).eval(), model_name="tiny")
    yield m
    uninstrument(m)


def _generate(model: Any, **kwargs: Any) -> list[str]:
    """One call with a padded batch (transformers' masking then reads the mask on the host); the sync audit's
    warnings it raised."""
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, **kwargs)
    return [str(w.message) for w in caught if "sync audit" in str(w.message)]


def _syncs() -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.step.syncs":
            for p in md.points:
                key = (p.labels["component"], p.labels.get("processor", ""))
                out[key] = out.get(key, 0.0) + p.value
    return out


def test_transformers_own_syncs_are_expected_counted_and_not_warned(model: Any) -> None:
    warned = _generate(model)

    assert warned == []
    sites = gpuprobe.info()["sync_sites"]
    ours = [s for s in sites if s["component"] in ("other", "forward")]
    assert ours and all(s.get("expected") is True for s in ours), sites
    # each names where in transformers it ran, and the user's generate() line it came from
    assert all("/transformers/" in s["via"] and s["source"].startswith(f"{__file__}:") for s in ours)
    assert any(s["component"] == "other" and s["via"].split("/transformers/")[1].startswith("generation/")
               for s in ours)  # the stop check
    assert _syncs()[("other", "")] >= 3  # still counted: once a step at least


def test_a_processor_the_user_passed_is_warned_with_its_line_and_the_factory_form(model: Any) -> None:
    warned = _generate(model, logits_processor=transformers.LogitsProcessorList([ReadsTheLastToken()]))

    assert len(warned) == 1, warned
    assert f"{SCALAR} in logits_processor ReadsTheLastToken" in warned[0]
    assert f"at {__file__}:{READ_LINE}" in warned[0]
    assert "gpuprobe try myfile.py:make --variants no-logits-processor:ReadsTheLastToken" in warned[0]
    (site,) = [s for s in gpuprobe.info()["sync_sites"] if s.get("processor") == "ReadsTheLastToken"]
    assert "expected" not in site and site["source"] == f"{__file__}:{READ_LINE}"


def test_the_users_own_sync_is_warned_even_where_transformers_had_one_of_the_same_kind(model: Any) -> None:
    assert _generate(model) == []  # masking_utils' read in the forward: expected
    expected = [s for s in gpuprobe.info()["sync_sites"] if s["component"] == "forward" and s["op"] == SCALAR]
    assert [s.get("expected") for s in expected] == [True]

    def reads_a_value(module: Any, args: Any, output: Any) -> None:
        output[0].flatten()[0].item()  # the user's forward hook: a sync of the same component and operator

    hook_line = inspect.getsourcelines(reads_a_value)[1] + 1
    handle = model.model.layers[0].register_forward_hook(reads_a_value)
    try:
        warned = _generate(model)
    finally:
        handle.remove()
    assert len(warned) == 1, warned
    assert f"{SCALAR} in forward" in warned[0] and f"at {__file__}:{hook_line}" in warned[0]
    forward = [s for s in gpuprobe.info()["sync_sites"] if s["component"] == "forward" and s["op"] == SCALAR]
    assert [(s.get("expected", False), s["source"]) for s in forward][-1] == (False, f"{__file__}:{hook_line}")
