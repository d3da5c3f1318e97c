"""``gpuprobe try`` as a new user meets it: a factory file beside its own modules, a model folder asked for the
processors it cannot carry, the report's remedy naming the factory form, plain counts in the table and a
note for a variant whose first token comes much later.

Real tiny Llamas built from configs (folders written with ``save_pretrained``, factories in files), the
command line run as a child interpreter (``python -I -m gpuprobe try``) with its exit status checked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuprobe.experiment import Variant, remedy_line, render, try_command, try_remedies  # noqa: E402
from gpuprobe.experiment.load import load  # noqa: E402

_CONFIG = ("transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, "
           "num_attention_heads=4, num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1, "
           "eos_token_id=2)")

# A helper module, imported by the factory file beside it (as `python myfactory.py` would find it).
HELPER = f"""
import torch
import transformers


def tiny():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM({_CONFIG}).eval()
"""

FACTORY = """
import torch

from helper import tiny


def slow():
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    return tiny(), {"input_ids": ids, "max_new_tokens": 2, "do_sample": False}
"""


def _model() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpuprobe_try(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``gpuprobe try ARGS`` in a child interpreter, isolated, in ``cwd``; returns the finished process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    return subprocess.run([sys.executable, "-I", "-m", "gpuprobe", "try", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: a second torch thread only adds noise
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------ a factory file's folder

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_factory_file_imports_the_module_beside_it_from_another_folder(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "helper.py").write_text(HELPER)
    (mine / "myfactory.py").write_text(FACTORY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    done = _gpuprobe_try(f"{mine / 'myfactory.py'}:slow", "--variant", "nothing=pass", "--variants", "nothing",
                         "--rounds", "1", "--budget", "20s", cwd=elsewhere)

    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    assert done.stdout.startswith(f"gpuprobe try: {mine / 'myfactory.py'}:slow (float32")


def test_loading_a_factory_file_puts_sys_path_back_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "myfactory.py").write_text(FACTORY)
    before = list(sys.path)
    try:
        loaded = load(f"{tmp_path / 'myfactory.py'}:slow")
        assert list(sys.path) == before
        assert loaded.kwargs["max_new_tokens"] == 2 and callable(loaded.model.generate)
    finally:
        sys.modules.pop("helper", None)  # the user's module, imported by the load: not this test process's


@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_module_the_factory_file_imports_that_does_not_exist_is_the_users_error_with_its_line(
        tmp_path: Path) -> None:
    (tmp_path / "myfactory.py").write_text("import torch\nimport no_such_helper_module\n\n\ndef slow():\n"
                                           "    return None\n")

    done = _gpuprobe_try(f"{tmp_path / 'myfactory.py'}:slow", "--budget", "5s", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and "internal error" not in line, line
    assert "ModuleNotFoundError: No module named 'no_such_helper_module'" in line
    assert f"{tmp_path / 'myfactory.py'}:2, in <module>" in line


# ------------------------------------------------------------------------------------ processors and a folder

@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_processors_on_a_model_folder_are_refused_before_it_loads_and_the_factory_form_is_shown(
        tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    _model().save_pretrained(folder)
    # Cut its weights short: had the folder been loaded first, its damaged file would be the error.
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    started = time.monotonic()

    done = _gpuprobe_try(str(folder), "--variants", "processors", "--budget", "60s", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert "a model folder carries no logits processor or stopping criterion of yours" in line
    assert "gpuprobe try myfile.py:make --variants processors" in line
    assert "SafetensorError" not in line and done.stdout == ""
    assert time.monotonic() - started < 60  # the interpreter's start: no budget spent


@pytest.mark.parametrize("named", ["no-logits-processor:BanTokens", "no-stopping-criterion:StopAtDot"])
@pytest.mark.subprocess_only  # what it checks runs in the child it starts
def test_a_named_processor_variant_on_a_folder_is_refused_too(tmp_path: Path, named: str) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    done = _gpuprobe_try(str(folder), "--variants", f"static-cache,{named}", cwd=tmp_path)
    assert done.returncode == 2
    assert f"--variants {named}: a model folder carries no logits processor" in done.stderr


def test_processors_asked_of_a_call_that_passes_none_say_so_in_a_note() -> None:
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    result = try_remedies(_model(), {"input_ids": ids, "max_new_tokens": 1, "do_sample": False},
                          variants=["processors"], budget="20s", max_rounds=1)
    notes = [n for n in result.notes if n.startswith("--variants processors:")]
    assert len(notes) == 1
    assert "pass no logits_processor or stopping_criteria list" in notes[0]
    assert "gpuprobe try myfile.py:make --variants processors" in notes[0]
    assert [v.name for v in result.workloads[0].variants] == []


class BanTokens(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        scores[:, 3] = -float("inf")
        return scores


def test_a_named_processor_the_call_does_not_pass_is_said_with_what_it_passes() -> None:
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "max_new_tokens": 1, "do_sample": False,
              "logits_processor": transformers.LogitsProcessorList([BanTokens()])}
    result = try_remedies(_model(), kwargs, variants=["no-logits-processor:BanRepeats"], budget="20s", max_rounds=1)
    assert ("--variants no-logits-processor:BanRepeats: not run: the generate() arguments' logits_processor holds "
            "no BanRepeats (it holds: BanTokens).") in result.notes


def test_the_remedy_of_a_processor_finding_names_the_factory_form() -> None:
    assert try_command("host_sync") == "gpuprobe try myfile.py:make --variants processors"
    assert try_command("logits_processor_share") == "gpuprobe try myfile.py:make --variants processors"
    assert remedy_line("host_sync") == ("Measure it: gpuprobe try myfile.py:make --variants processors (make() in "
                                        "myfile.py returns (model, generate_kwargs), your logits processors in them)")
    # a MODEL the caller names is kept; a remedy a folder can measure keeps MODEL
    assert try_command("host_sync", "mine.py:make") == "gpuprobe try mine.py:make --variants processors"
    assert remedy_line("kv_cache_concat") == "Measure it: gpuprobe try MODEL --variants static-cache"


# ------------------------------------------------------------------------------------ the table and its notes

ITEMS_PER_CALL = 2000


class ReadsEveryScore(transformers.LogitsProcessor):
    """Reads a score on the host ITEMS_PER_CALL times a step: that many syncs a step on a GPU."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        for _ in range(ITEMS_PER_CALL):
            scores[0, 0].item()
        return scores


# Run before every call of its variant (a fresh processor each time): the first token waits 60 ms more.
LATE_FIRST_TOKEN = textwrap.dedent("""
    import time

    class _LateFirstToken(transformers.LogitsProcessor):
        def __init__(self):
            self.first = True

        def __call__(self, input_ids, scores):
            if self.first:
                self.first = False
                time.sleep(0.06)
            return scores

    generate_kwargs["logits_processor"] = transformers.LogitsProcessorList(
        list(generate_kwargs["logits_processor"]) + [_LateFirstToken()])
""").strip()


def test_thousands_of_syncs_a_step_read_as_a_plain_number_and_a_late_first_token_gets_a_note() -> None:
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "max_new_tokens": 3, "min_new_tokens": 3, "do_sample": False,
              "logits_processor": transformers.LogitsProcessorList([ReadsEveryScore()])}
    late = Variant("late-first-token", "the first token 60 ms later", LATE_FIRST_TOKEN)

    result = try_remedies(_model(), kwargs, variants=["late-first-token"], extra=[late], budget="120s", max_rounds=9)

    w = result.workloads[0]
    assert w.rounds == 9
    assert w.baseline.syncs_per_step is not None and w.baseline.syncs_per_step >= ITEMS_PER_CALL
    text = render(result)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("baseline"))
    assert re.search(rf"\b{ITEMS_PER_CALL // 1000},0\d\d\b", row), row  # 2,001 or so: not 2e+03
    assert "e+0" not in text
    (variant,) = w.variants
    # the first token's time against the baseline's, from the medians of their own figures
    times = variant.figures["ttft_s"].median / w.baseline.figures["ttft_s"].median
    assert times > 1.5, times
    notes = [n for n in result.notes if "late-first-token takes" in n]
    assert len(notes) == 1, result.notes
    shown = float(re.search(r"takes ([\d.]+)× the baseline's time to first token", notes[0]).group(1))
    assert shown == pytest.approx(times, rel=0.35)
    assert notes[0] in text
