"""An instrumented model pickles as if it were not: ``torch.save(model)`` and ``pickle.dumps(model)`` after
``instrument()`` and a ``generate()`` call carry nothing of gpuprobe, so they load in a Python where gpuprobe
cannot be imported, and the loaded model generates the original's tokens; the model in the program stays
instrumented. Its decoder layers, the logits processors and stopping criteria of a call, the cache it
returned and its generation config pickle without gpuprobe too."""

from __future__ import annotations

import copy
import io
import json
import pickle
import pickletools
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from _hfkit import torch, transformers

import gpuprobe
from gpuprobe.integrations import transformers as hf

# The child interpreter: the Python this virtual environment was made from, which has no gpuprobe, given
# the environment's site-packages folder (torch, transformers) as a plain path entry. Its .pth files are
# not run, so the editable install's finder that makes the checkout importable is not installed either.
BASE_PYTHON = Path(sys.base_prefix) / "bin" / Path(sys.executable).name
SITE_PACKAGES = Path(torch.__file__).resolve().parents[1]
ROOT = Path(__file__).resolve().parents[2]

IDS = [[5, 6, 7, 8, 9, 10]]
NEW_TOKENS = 8

LOAD = textwrap.dedent("""
    import importlib.util, json, pickle, sys
    sys.path.insert(0, sys.argv[1])
    assert importlib.util.find_spec("gpuprobe") is None, "gpuprobe is importable here"
    import torch
    ids = torch.tensor(json.loads(sys.argv[4]))
    out = {}
    with open(sys.argv[2], "rb") as f:
        saved = torch.load(f, weights_only=False)
    with open(sys.argv[3], "rb") as f:
        pickled, layer, processors, criteria, cache, generation_config = pickle.load(f)
    for name, model in (("torch.load", saved), ("pickle.loads", pickled)):
        extra = sorted(k for k in vars(model) if "gpuprobe" in k or k in ("generate", "_prefill", "__getstate__"))
        assert extra == [], extra
        out[name] = model.generate(ids, max_new_tokens=int(sys.argv[5]), min_new_tokens=int(sys.argv[5]),
                                   do_sample=False).tolist()
    out["parts"] = [type(layer).__name__, [type(p).__name__ for p in processors],
                    [type(c).__name__ for c in criteria], type(cache).__name__, generation_config.max_length]
    out["gpuprobe_modules"] = sorted(m for m in sys.modules if m.startswith("gpuprobe"))
    print(json.dumps(out))
""")


def _tiny_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model: Any, **kwargs: Any) -> Any:
    return model.generate(torch.tensor(IDS), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          do_sample=False, **kwargs)


def _strings(data: bytes) -> set[str]:
    """Every string in a pickle: the module and name of each class or function it imports when loaded
    among them (GLOBAL takes them as one argument, STACK_GLOBAL as two strings)."""
    found: set[str] = set()
    for _, arg, _ in pickletools.genops(data):
        if isinstance(arg, str):
            found.update(arg.split(" ") if " " in arg else [arg])
    return found


def _requests(model_name: str) -> int:
    return sum(p.count for md in gpuprobe.collect() if md.spec.name == "gen_ai.server.request.duration"
               for p in md.points if p.labels["gen_ai.request.model"] == model_name)


@pytest.fixture
def instrumented() -> Any:
    model = _tiny_llama()
    hf.instrument(model, model_name="pickled", layers=True, layer_every=1)
    yield model
    hf.uninstrument(model)


def test_instrument_leaves_the_state_dict_as_it_was() -> None:
    model = _tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hf.instrument(model, layers=True, layer_every=1)
    try:
        _generate(model)
        after = model.state_dict()
        assert list(after) == list(before)
        assert all(torch.equal(after[k], before[k]) for k in before)
    finally:
        hf.uninstrument(model)


def test_a_pickled_instrumented_model_refers_to_nothing_of_gpuprobe(instrumented: Any) -> None:
    _generate(instrumented)
    saved = io.BytesIO()
    torch.save(instrumented, saved)
    with zipfile.ZipFile(io.BytesIO(saved.getvalue())) as archive:
        data_pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        in_checkpoint = _strings(archive.read(data_pkl))
    for strings in (_strings(pickle.dumps(instrumented)), in_checkpoint):
        assert "transformers.models.llama.modeling_llama" in strings  # the oracle sees the model's own class
        assert [s for s in strings if "gpuprobe" in s] == []


def test_the_model_stays_instrumented_after_it_is_saved(instrumented: Any) -> None:
    expected = _generate(instrumented)
    seams_before = dict(vars(instrumented))
    torch.save(instrumented, io.BytesIO())
    pickle.dumps(instrumented)
    assert hf.is_instrumented(instrumented)
    assert dict(vars(instrumented)) == seams_before
    assert torch.equal(_generate(instrumented), expected)
    assert _requests("pickled") == 2  # the call before the save and the one after are both measured


def test_copies_of_an_instrumented_model_are_plain_models(instrumented: Any) -> None:
    expected = _generate(instrumented)
    for other in (copy.copy(instrumented), copy.deepcopy(instrumented), pickle.loads(pickle.dumps(instrumented))):
        assert not hf.is_instrumented(other)
        assert not any(k.startswith("_gpuprobe") or k in ("generate", "_prefill", "__getstate__") for k in vars(other))
        assert torch.equal(_generate(other), expected)
    assert _requests("pickled") == 1  # the copies' calls are not measured as the original's


def test_a_model_attribute_a_seam_stands_in_front_of_is_pickled_as_the_models_own() -> None:
    model = _tiny_llama()
    vars(model)["_has_unfinished_sequences"] = own = type(model)._has_unfinished_sequences.__get__(model)
    hf.instrument(model)
    try:
        assert vars(model)["_has_unfinished_sequences"] is not own  # the seam runs in front of it
        state = model.__getstate__()
        assert state["_has_unfinished_sequences"] is own
        assert "_gpuprobe_state" not in state and "generate" not in state and "__getstate__" not in state
    finally:
        hf.uninstrument(model)
    assert vars(model)["_has_unfinished_sequences"] is own


def test_a_saved_instrumented_model_loads_and_generates_where_gpuprobe_is_not_installed(
        instrumented: Any, tmp_path: Path) -> None:
    if sys.base_prefix == sys.prefix or not BASE_PYTHON.exists():
        pytest.skip("needs a virtual environment and the Python it was made from")
    processors = transformers.LogitsProcessorList([transformers.RepetitionPenaltyLogitsProcessor(1.3)])
    criteria = transformers.StoppingCriteriaList([transformers.MaxTimeCriteria(max_time=600.0)])
    result = _generate(instrumented, logits_processor=processors, stopping_criteria=criteria,
                       return_dict_in_generate=True)
    expected = _generate(instrumented).tolist()
    checkpoint, pickled = tmp_path / "model.pt", tmp_path / "parts.pickle"
    torch.save(instrumented, checkpoint)
    pickled.write_bytes(pickle.dumps((instrumented, instrumented.model.layers[0], processors, criteria,
                                      result.past_key_values, instrumented.generation_config)))
    assert hf.is_instrumented(instrumented)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([str(BASE_PYTHON), "-I", "-c", LOAD, str(SITE_PACKAGES), str(checkpoint), str(pickled),
                           json.dumps(IDS), str(NEW_TOKENS)], cwd=work, capture_output=True, text=True,
                          timeout=240, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert str(ROOT) not in done.stderr
    assert out["torch.load"] == expected and out["pickle.loads"] == expected
    assert out["parts"] == ["LlamaDecoderLayer", ["RepetitionPenaltyLogitsProcessor"], ["MaxTimeCriteria"],
                            type(result.past_key_values).__name__, instrumented.generation_config.max_length]
    assert out["gpuprobe_modules"] == []
