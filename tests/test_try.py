"""``gpuprobe try``: which variants apply to which model and machine, the code each prints (applied by hand,
it makes the variant), the output comparison, the statistics (a planted slowdown is found, a change that
does nothing is no difference), the command line's formats, the plot and the traces.

Real tiny models built from configs, real generate() calls, on the CPU. A GPU machine is described, not
simulated, where only the choice of variants depends on it (``Machine(cuda=True, ...)``). The timed runs
use a logits processor that sleeps: sleeping is the one cost a busy shared CPU does not stretch.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, cuda_present, run_python

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuprobe.experiment import (Variant, remedy_line, render, try_command, try_remedies,  # noqa: E402
                                 variant_for_sync_site)
from gpuprobe.experiment.outputs import match, new_tokens  # noqa: E402
from gpuprobe.experiment.remedies import REMEDY_VARIANTS  # noqa: E402
from gpuprobe.experiment.stats import MIN_ROUNDS, compare, spread  # noqa: E402
from gpuprobe.experiment.variants import Machine, NotRun, catalogue, machine_facts, processor_variants  # noqa: E402
from gpuprobe.integrations.transformers import is_instrumented  # noqa: E402

EXAMPLE = Path(ROOT) / "examples" / "try_remedies.py"
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
SLEEP_S = 0.15  # per call of the planted processor: many tiny decode steps, even on a loaded machine


class Sleepy(transformers.LogitsProcessor):
    """The planted slowdown: sleeps on every step (and counts its calls)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.calls += 1
        time.sleep(SLEEP_S)
        return scores


class Noop(transformers.LogitsProcessor):
    """Does nothing: never flagged."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.calls += 1
        return scores


def llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, **_IDS)
    return transformers.LlamaForCausalLM(cfg).eval()


def prompt(batch: int = 1, length: int = 6) -> dict[str, Any]:
    ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: a second torch thread only adds noise
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> Any:
    return llama()


@pytest.fixture(scope="module")
def planted(model: Any) -> dict[str, Any]:
    """One experiment, shared: the baseline generates through Sleepy and Noop; the processors group and a
    variant whose code changes nothing run against it."""
    sleepy, noop = Sleepy(), Noop()
    kwargs = {**prompt(), "max_new_tokens": 2, "do_sample": False,
              "logits_processor": transformers.LogitsProcessorList([sleepy, noop])}
    nothing = Variant("nothing", "a change that changes nothing", "generate_kwargs = dict(generate_kwargs)")
    before = model.config._attn_implementation
    result = try_remedies(model, kwargs, budget="60s", variants=["processors", "nothing"], extra=[nothing],
                          max_rounds=MIN_ROUNDS)
    return {"result": result, "kwargs": kwargs, "attention_before": before, "sleepy": sleepy}


def _variant(result: Any, name: str) -> Any:
    w = result.workloads[0]
    return next(v for v in w.variants if v.name == name)


# ---------------------------------------------------------------------------------------------- statistics

def test_spread_gives_the_median_the_extremes_and_the_quartiles() -> None:
    s = spread([9.0, 1.0, 5.0, 3.0, 7.0])
    assert (s.median, s.min, s.max, s.q1, s.q3, s.n) == (5.0, 1.0, 9.0, 3.0, 7.0, 5)


def test_a_variant_twice_as_fast_in_every_round_is_faster_by_two() -> None:
    base = [10.0, 12.0, 9.0, 11.0, 10.0, 13.0, 9.5]
    c = compare(base, [b / 2 for b in base], lower_is_better=True)
    assert c.verdict == "faster" and c.ratio.median == pytest.approx(2.0)


def test_a_rate_halved_is_slower() -> None:
    base = [100.0, 90.0, 110.0, 105.0, 95.0, 101.0, 99.0]
    assert compare(base, [b / 2 for b in base], lower_is_better=False).verdict == "slower"


def test_a_gain_inside_the_spread_of_the_rounds_is_no_difference() -> None:
    base = [10.0] * 8
    variant = [9.0, 9.9, 7.0, 9.95, 9.0, 6.0, 9.8, 5.0]  # faster in every round, but by less than the ratios spread
    c = compare(base, variant, lower_is_better=True)
    assert c.ratio.min > 1 and c.verdict == "no difference"


def test_rounds_that_disagree_are_no_difference() -> None:
    base = [10.0, 11.0, 10.0, 12.0, 10.0, 11.0, 12.0]
    variant = [10.5, 10.0, 11.0, 10.0, 12.0, 11.5, 11.0]
    assert compare(base, variant, lower_is_better=True).verdict == "no difference"


def test_a_clear_gain_with_a_few_rounds_against_it_is_still_found() -> None:
    base = [10.0] * 20
    variant = [5.0] * 17 + [11.0, 12.0, 10.5]  # 17 of 20 rounds twice as fast: no chance agreement
    c = compare(base, variant, lower_is_better=True)
    assert c.ratio.min < 1 and c.verdict == "faster"


def test_the_sign_test_is_the_binomial_tail() -> None:
    from gpuprobe.experiment.stats import sign_test

    assert sign_test(7, 7) == 1 / 128
    assert sign_test(0, 9) == 1.0
    assert sign_test(9, 10) == (10 + 1) / 1024  # 9 of 10 (10 ways) or 10 of 10 (1 way)


def test_fewer_rounds_than_the_minimum_give_no_verdict() -> None:
    n = MIN_ROUNDS - 1
    assert compare([2.0] * n, [1.0] * n, lower_is_better=True).verdict == "too few rounds"


# ---------------------------------------------------------------------------------------------- outputs

def test_the_same_tokens_are_identical() -> None:
    assert match([[5, 6, 7], [8, 9]], [[5, 6, 7], [8, 9]]).text == "identical"


def test_the_first_different_token_is_named_across_the_batch() -> None:
    m = match([[5, 6, 7, 8], [1, 2, 3, 4]], [[5, 6, 7, 9], [1, 2, 0, 4]])
    assert (m.identical, m.first_difference, m.text) == (False, 3, "differs from token 3 of 4")


def test_stopping_earlier_is_a_difference_where_the_shorter_one_ends() -> None:
    assert match([[5, 6, 7]], [[5, 6]]).first_difference == 3


def test_new_tokens_are_cut_after_the_end_of_sequence_for_both_ways_of_generating() -> None:
    out = torch.tensor([[9, 9, 5, 2, 0, 0], [9, 9, 5, 6, 7, 8]])
    assert new_tokens(out, [2, 2], {2}) == [[5, 2], [5, 6, 7, 8]]

    class Result:
        def __init__(self, tokens: list[int]) -> None:
            self.generated_tokens = tokens

    batch = {"req_0": Result([5, 2]), "req_1": Result([5, 6, 7, 8])}
    assert new_tokens(batch, [2, 2], {2}) == [[5, 2], [5, 6, 7, 8]]


# ---------------------------------------------------------------------------------------------- which variants apply

def _names(items: list[Any]) -> tuple[set[str], dict[str, str]]:
    return ({i.name for i in items if isinstance(i, Variant)},
            {i.name: i.reason for i in items if isinstance(i, NotRun)})


def test_a_llama_on_the_cpu_gets_the_cache_the_other_attention_and_bfloat16(model: Any) -> None:
    assert model.config._attn_implementation == "sdpa"  # the premise: the baseline's attention
    run, skipped = _names(catalogue(model, prompt(), batch=1, prompt_len=6, new_tokens=4))
    assert run == {"static-cache", "attn:eager", "dtype:bfloat16"}
    assert "GPU" in skipped["static-cache+compile"] and "--variants static-cache+compile" in skipped["static-cache+compile"]
    assert skipped["attn:flash_attention_2"] == "needs CUDA"
    assert "float16" in skipped["dtype:float16"]
    assert "batch" in skipped["continuous-batching"]


def test_a_batch_of_requests_adds_continuous_batching_unless_the_call_passes_processors(model: Any) -> None:
    run, _ = _names(catalogue(model, prompt(3), batch=3, prompt_len=6, new_tokens=4))
    assert "continuous-batching" in run
    with_processor = {**prompt(3), "logits_processor": transformers.LogitsProcessorList([Noop()])}
    _, skipped = _names(catalogue(model, with_processor, batch=3, prompt_len=6, new_tokens=4))
    assert "logits_processor" in skipped["continuous-batching"]


def test_a_model_without_fused_attention_gets_no_attention_variant() -> None:
    cls = transformers.BloomForCausalLM
    assert not cls._supports_sdpa and not cls._supports_flash_attn  # the premise: Bloom declares eager only
    bloom = cls(transformers.BloomConfig(hidden_size=32, n_layer=1, n_head=4, vocab_size=128, **_IDS)).eval()
    run, skipped = _names(catalogue(bloom, prompt(), batch=1, prompt_len=6, new_tokens=4))
    assert not any(n.startswith("attn:") for n in run)
    assert "one attention implementation" in skipped["attn:*"]
    assert "static-cache" in run


def test_a_model_that_cannot_compile_a_full_graph_gets_no_static_cache() -> None:
    cls = transformers.MambaForCausalLM
    assert not cls._can_compile_fullgraph  # the premise
    mamba = cls(transformers.MambaConfig(hidden_size=32, num_hidden_layers=1, vocab_size=128, state_size=4,
                                         **_IDS)).eval()
    run, skipped = _names(catalogue(mamba, prompt(), batch=1, prompt_len=6, new_tokens=4))
    assert "static-cache" not in run and "_can_compile_fullgraph" in skipped["static-cache"]
    assert not any(n.startswith("attn:") for n in run)


def test_a_baseline_with_a_static_cache_is_not_offered_one(model: Any) -> None:
    _, skipped = _names(catalogue(model, {**prompt(), "cache_implementation": "static"}, batch=1, prompt_len=6,
                                  new_tokens=4))
    assert "already" in skipped["static-cache"]


def test_on_a_gpu_the_static_cache_alone_turns_transformers_own_compile_off_and_compile_uses_cuda_graphs(
        model: Any) -> None:
    gpu = Machine(device="cuda:0", cuda=True, name="a GPU", flash_attn=False, flex_attention=True,
                  half_dtypes=("bfloat16", "float16"), compile_on_cpu=True)
    items = {i.name: i for i in catalogue(model, prompt(), batch=1, prompt_len=6, new_tokens=4, machine=gpu)}
    assert "disable_compile" in items["static-cache"].code
    assert 'mode="reduce-overhead"' in items["static-cache+compile"].code
    assert isinstance(items["attn:flash_attention_2"], NotRun) and "flash_attn" in items["attn:flash_attention_2"].reason
    assert isinstance(items["attn:flex_attention"], Variant)
    assert isinstance(items["dtype:float16"], Variant) and isinstance(items["dtype:bfloat16"], Variant)


def test_the_machine_of_a_cpu_model_is_the_cpu_with_bfloat16(model: Any) -> None:
    m = machine_facts(model)
    assert (m.cuda, m.clock, m.half_dtypes, m.flash_attn) == (False, "host", ("bfloat16",), False)


def test_only_flagged_processors_run_unless_named(model: Any) -> None:
    kwargs = {"logits_processor": transformers.LogitsProcessorList([Sleepy(), Noop()]),
              "stopping_criteria": transformers.StoppingCriteriaList([transformers.MaxLengthCriteria(20)])}
    flags = {("logits_processor", "Sleepy"): "80 % of the step"}
    run, skipped = _names(processor_variants(kwargs, flags, asked=["processors"]))
    assert run == {"no-logits-processor:Sleepy"}
    assert "not flagged" in skipped["no-logits-processor:Noop"]
    assert "not flagged" in skipped["no-stopping-criterion:MaxLengthCriteria"]
    run, _ = _names(processor_variants(kwargs, flags, asked=["no-logits-processor:Noop"]))
    assert "no-logits-processor:Noop" in run


# ---------------------------------------------------------------------------------------------- the printed code

def _apply_by_hand(code: str, model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a reader does with the printed change: run it where model and generate_kwargs are theirs."""
    scope = {"model": model, "generate_kwargs": dict(kwargs), "torch": torch, "transformers": transformers}
    exec(code, scope)
    return scope


def test_the_static_cache_code_makes_generate_use_a_static_cache(model: Any) -> None:
    code = next(i.code for i in catalogue(model, prompt(), batch=1, prompt_len=6, new_tokens=4)
                if i.name == "static-cache")
    mine = copy.deepcopy(model)
    scope = _apply_by_hand(code, mine, {**prompt(), "max_new_tokens": 3, "do_sample": False})
    out = scope["model"].generate(**scope["generate_kwargs"], return_dict_in_generate=True)
    assert isinstance(out.past_key_values, transformers.StaticCache)
    plain = mine.generate(**prompt(), max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert not isinstance(plain.past_key_values, transformers.StaticCache)


def test_the_attention_and_dtype_codes_change_the_model_as_named(model: Any) -> None:
    items = {i.name: i for i in catalogue(model, prompt(), batch=1, prompt_len=6, new_tokens=4)}
    mine = copy.deepcopy(model)
    _apply_by_hand(items["attn:eager"].code, mine, prompt())
    assert mine.config._attn_implementation == "eager"
    scope = _apply_by_hand(items["dtype:bfloat16"].code, copy.deepcopy(model), prompt())
    assert scope["model"].dtype == torch.bfloat16


def test_the_processor_code_leaves_that_processor_out_and_keeps_the_others(model: Any) -> None:
    sleepy, noop = Sleepy(), Noop()
    kwargs = {**prompt(), "max_new_tokens": 3, "do_sample": False,
              "logits_processor": transformers.LogitsProcessorList([sleepy, noop])}
    code = next(v.code for v in processor_variants(kwargs, {("logits_processor", "Sleepy"): "slow"}, asked=[])
                if isinstance(v, Variant))
    scope = _apply_by_hand(code, model, kwargs)
    model.generate(**scope["generate_kwargs"])
    assert (sleepy.calls, noop.calls) == (0, 3)
    assert len(kwargs["logits_processor"]) == 2  # the caller's own list is left alone


def test_the_continuous_batching_code_runs_generate_batch_with_the_same_greedy_tokens(model: Any) -> None:
    from helpers import cpu_continuous_batching_cannot_pin

    why = cpu_continuous_batching_cannot_pin()
    if why:
        pytest.skip(why)
    kwargs = {**prompt(2), "max_new_tokens": 4, "do_sample": False}
    code = next(i.code for i in catalogue(model, kwargs, batch=2, prompt_len=6, new_tokens=4)
                if i.name == "continuous-batching")
    scope = _apply_by_hand(code, model, kwargs)
    assert scope["generate"] == model.generate_batch
    batched = new_tokens(scope["generate"](**scope["generate_kwargs"]), [6, 6], {2})
    plain = new_tokens(model.generate(**kwargs), [6, 6], {2})
    assert match(plain, batched).identical


# ---------------------------------------------------------------------------------------------- the meter

class ReadsOnce(transformers.LogitsProcessor):
    """One host read per call: one sync per step on a GPU, counted by the audit on any machine."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        int(input_ids[0, -1])
        return scores


def test_the_audited_call_counts_syncs_by_processor_and_samples_the_steps(model: Any) -> None:
    from gpuprobe.experiment.measure import Meter
    from gpuprobe.integrations.transformers import instrument, uninstrument

    meter = Meter(cuda=False, launches=True)  # on a CPU the sampler counts leaf operators: the path, not launches
    try:
        _, audit = meter.audit(instrument(model).generate, {
            **prompt(), "max_new_tokens": 3, "do_sample": False,
            "logits_processor": transformers.LogitsProcessorList([ReadsOnce()])})
    finally:
        meter.close()
        uninstrument(model)
    assert audit.syncs is not None and audit.syncs.steps == 3
    assert audit.syncs.of("logits_processor", "ReadsOnce") == 1.0
    assert audit.syncs.of("other", "") == 1.0  # generate's own stop check
    assert audit.launches_per_step is not None
    if cuda_present():
        assert audit.launches_per_step == 0  # the sampler records CUDA work, and this model runs on the CPU
    else:
        assert audit.launches_per_step > 0  # no CUDA: the sampler counts the step's leaf operators


def test_on_a_gpu_the_figures_are_read_on_the_device_clock_and_the_rate_on_the_host_one() -> None:
    """What one call on a GPU records (both clocks), as the meter reads it; written out, not run on a GPU."""
    from gpuprobe.experiment.measure import Meter
    from gpuprobe.testing import Observation

    def ob(metric: str, value: float, **attrs: str) -> Observation:
        return Observation(metric, dict(attrs), value)

    recorded = [
        ob("gpuprobe.probe.duration", 0.50, probe="gpuprobe.try", clock="host"),
        ob("gpuprobe.probe.duration", 0.40, probe="gpuprobe.try", clock="device"),
        ob("gen_ai.server.time_to_first_token", 0.10, clock="host"),
        ob("gen_ai.server.time_to_first_token", 0.08, clock="device"),
        ob("gen_ai.server.time_per_output_token", 0.05),
        ob("gpuprobe.inter_token.duration", 0.02, clock="device"),
        ob("gpuprobe.inter_token.duration", 0.04, clock="device"),
        ob("gpuprobe.step.duration", 0.09, phase="prefill", clock="host"),
        ob("gpuprobe.step.duration", 0.07, phase="prefill", clock="device"),
        ob("gpuprobe.step.duration", 0.03, phase="decode", clock="device"),
        ob("gpuprobe.step.duration", 0.03, phase="decode", clock="device"),
        ob("gen_ai.client.token.usage", 5, **{"gen_ai.token.type": "output"}),
        ob("gpuprobe.memory.peak", 2e9, device="cuda:0"),
        ob("gpuprobe.memory.peak", 3e9, device="cuda:0"),
    ]
    figures = Meter(cuda=True)._figures(recorded)
    assert (figures.clock, figures.call_s, figures.ttft_s) == ("device", 0.40, 0.08)
    assert figures.tpot_s == pytest.approx(0.03) and figures.prefill_s == 0.07 and figures.decode_s == 0.06
    assert figures.tokens_per_s == pytest.approx(5 / 0.50) and figures.peak_memory_bytes == 3e9
    on_cpu = Meter(cuda=False)._figures(recorded)
    assert (on_cpu.clock, on_cpu.call_s, on_cpu.ttft_s, on_cpu.tpot_s, on_cpu.peak_memory_bytes) == (
        "host", 0.50, 0.10, 0.05, None)


# ---------------------------------------------------------------------------------------------- the experiment

def test_a_planted_slowdown_is_found_and_its_removal_measured_faster(planted: dict[str, Any]) -> None:
    result = planted["result"]
    w = result.workloads[0]
    assert w.rounds >= MIN_ROUNDS
    sleepy = _variant(result, "no-logits-processor:Sleepy")
    assert "of the step" in sleepy.variant.title  # flagged by its share of the baseline's steps
    assert sleepy.verdict == "faster"
    assert sleepy.vs_baseline["tokens_per_s"].ratio.median > 1.5
    assert sleepy.vs_baseline["tpot_s"].verdict == "faster"
    assert sleepy.output is not None and sleepy.output.identical
    assert w.winner is not None and w.winner.name == "no-logits-processor:Sleepy"


def test_a_change_that_changes_nothing_is_no_difference(planted: dict[str, Any]) -> None:
    nothing = _variant(planted["result"], "nothing")
    assert nothing.verdict == "no difference"
    assert nothing.output is not None and nothing.output.identical


def test_the_unflagged_processor_is_listed_as_not_run_with_why(planted: dict[str, Any]) -> None:
    reasons = {n.name: n.reason for n in planted["result"].workloads[0].not_run}
    assert "not flagged" in reasons["no-logits-processor:Noop"]


def test_the_figures_come_with_their_spread_and_one_value_per_round(planted: dict[str, Any]) -> None:
    w = planted["result"].workloads[0]
    for v in [w.baseline, *w.variants]:
        for name in ("tokens_per_s", "ttft_s", "tpot_s", "call_s", "kv_cache_bytes"):
            s = v.figures[name]
            assert s.n == w.rounds and s.min <= s.q1 <= s.median <= s.q3 <= s.max, (v.name, name)
    # the baseline's time per output token: its sleep is a floor (one decode step, with one sleep)
    assert w.baseline.figures["tpot_s"].min >= SLEEP_S


def test_the_experiment_leaves_the_model_and_the_settings_as_they_were(planted: dict[str, Any], model: Any) -> None:
    import gpuprobe

    assert not is_instrumented(model)
    assert model.config._attn_implementation == planted["attention_before"]
    assert gpuprobe.info()["sync_audit"] == 0
    assert len(planted["kwargs"]["logits_processor"]) == 2


def test_the_text_and_markdown_show_the_ranked_table_the_winner_code_and_the_cpu_caveat(
        planted: dict[str, Any]) -> None:
    result = planted["result"]
    text, md = render(result, "text"), render(result, "markdown")
    sleepy = _variant(result, "no-logits-processor:Sleepy")
    for out in (text, md):
        assert "Winner" in out and sleepy.variant.code.splitlines()[0] in out
        assert "A CPU does not show what a GPU would" in out
        assert out.index("no-logits-processor:Sleepy") < out.index("nothing")  # ranked: the winner first
    assert "| # | variant | tokens/s |" in md and "```python" in md
    assert json.loads(render(result, "json"))["workloads"][0]["winner"] == "no-logits-processor:Sleepy"


def test_sweeps_make_one_table_per_prompt_length_and_batch_size(model: Any) -> None:
    result = try_remedies(model, {**prompt(), "max_new_tokens": 2}, budget="30s", variants=["nothing"],
                          extra=[Variant("nothing", "no change", "pass")], prompt_lens=[4, 12],
                          batch_sizes=[1, 2], max_rounds=1)
    shapes = [(w.prompt_len, w.batch_size) for w in result.workloads]
    assert shapes == [(4, 1), (4, 2), (12, 1), (12, 2)]
    assert all(w.baseline.figures["tokens_per_s"].n == 1 for w in result.workloads)
    # one round, as asked: figures without verdicts, and each table says so
    assert all(w.no_verdict == f"not enough rounds for a verdict: 1 measured, as many as asked for (--rounds 1); "
                               f"the rule needs {MIN_ROUNDS}" for w in result.workloads)


def test_a_variant_that_fails_is_reported_failed_and_the_others_still_run(model: Any) -> None:
    broken = Variant("broken", "a change that breaks generate()", 'generate_kwargs["max_new_tokens"] = "many"')
    nothing = Variant("nothing", "no change", "pass")
    result = try_remedies(model, {**prompt(), "max_new_tokens": 2}, budget="30s", variants=["broken", "nothing"],
                          extra=[broken, nothing], max_rounds=1)
    w = result.workloads[0]
    failed = _variant(result, "broken")
    assert failed.error is not None and failed.figures == {}
    assert [v.name for v in w.variants] == ["nothing", "broken"]  # the failed one ranked last
    assert _variant(result, "nothing").figures["tokens_per_s"].n == 1
    assert "| broken |" not in render(result, "text") and "failed: " in render(result, "text")


# ---------------------------------------------------------------------------------------------- the command line

def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from gpuprobe.cli import main

    try:
        rc = main(["try", *args])
    except SystemExit as exc:  # argparse's own exit for a bad option, as from the shell
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


FACTORY = """
import time
import torch
import transformers

class Sleepy(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        time.sleep(%r)
        return scores

def planted():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    return transformers.LlamaForCausalLM(cfg).eval(), {"input_ids": ids, "max_new_tokens": 2, "do_sample": False,
                                                      "logits_processor": transformers.LogitsProcessorList([Sleepy()])}
""" % SLEEP_S


def test_the_command_line_writes_markdown_with_the_diff_of_the_traces_and_a_plot(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(FACTORY)
    rc, out, err = _cli(capsys, f"{tmp_path / 'mine.py'}:planted", "--budget", "90s", "--variants", "processors",
                        "--rounds", str(MIN_ROUNDS), "--format", "markdown",
                        "--plot", str(tmp_path / "try.png"), "--trace", str(tmp_path / "traces"))
    assert rc == 0, err
    traces = tmp_path / "traces"
    assert sorted(p.name for p in traces.iterdir()) == ["baseline.json.gz", "no-logits-processor-Sleepy.json.gz"]
    assert f"`gpuprobe diff {traces / 'baseline.json.gz'} {traces / 'no-logits-processor-Sleepy.json.gz'}`" in out
    assert "Winner: **no-logits-processor:Sleepy**" in out
    assert (tmp_path / "try.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from gpuprobe.report import analyze

    assert analyze(str(traces / "baseline.json.gz"), sections=["steps"]).steps.count >= 1  # gpuprobe report reads it


def test_the_command_line_writes_json_with_the_syncs_the_audit_counted(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(capsys, f"{EXAMPLE}:slow_processor", "--budget", "60s", "--variants", "processors",
                        "--new-tokens", "3", "--rounds", "1", "--format", "json",)
    assert rc == 0, err
    doc = json.loads(out)
    w = doc["workloads"][0]
    assert doc["schema"] == 1 and doc["machine"]["clock"] == "host"
    assert [v["name"] for v in w["variants"]] == ["no-logits-processor:BanLowScores"]
    assert w["baseline"]["syncs_per_step"] > 100  # a host read per token of the vocabulary, every step
    assert w["variants"][0]["syncs_per_step"] < 2  # only generate's own stop check is left


def test_the_command_line_runs_a_model_folder_in_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(ROOT) / "tests" / "serving"))
    try:
        from _servekit import build_tiny_model
    finally:
        sys.path.pop(0)
    folder = build_tiny_model(tmp_path / "tiny")
    rc, out, err = _cli(capsys, str(folder), "--device", "cpu", "--budget", "60s", "--variants", "attention",
                        "--new-tokens", "2",
                        "--prompt-lens", "8", "--rounds", "1",)
    assert rc == 0, err
    assert out.startswith("gpuprobe try: tiny (float32, attention sdpa) on CPU, host clock")
    assert "prompt 8 tokens × batch 1, 2 new tokens (greedy): 1 rounds" in out
    assert "attn:eager" in out


def test_the_command_line_names_a_bad_model_or_option_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(capsys, "Qwen/Qwen2.5-0.5B")
    assert rc == 2 and "downloads nothing" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _cli(capsys, f"{EXAMPLE}:no_such_factory")
    assert rc == 2 and "no_such_factory" in err
    rc, _, err = _cli(capsys, f"{EXAMPLE}:slow_processor", "--budget", "soon")
    assert rc == 2 and "--budget" in err
    rc, _, err = _cli(capsys, f"{EXAMPLE}:slow_processor", "--variants", "turbo")
    assert rc == 2 and "turbo" in err


# ---------------------------------------------------------------------------------------------- the loop back

def test_every_finding_the_table_names_is_a_rule_of_the_report_and_its_variants_are_accepted() -> None:
    from gpuprobe.experiment.runner import check_variants
    from gpuprobe.report._findings import RULES

    assert set(REMEDY_VARIANTS) <= set(RULES)
    for finding, entry in REMEDY_VARIANTS.items():
        assert check_variants(list(entry.variants)) == list(entry.variants), finding
    assert try_command("kv_cache_concat", "my model") == "gpuprobe try 'my model' --variants static-cache"
    assert remedy_line("pageable_memcpy") == ""
    assert variant_for_sync_site("stopping_criteria", "StopOnWord") == "no-stopping-criterion:StopOnWord"


class SyncsForTheWarning(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        int(input_ids[0, -1])
        return scores


def test_the_sync_audit_warning_names_the_variant_that_measures_the_run_without_the_processor(model: Any) -> None:
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument

    gpuprobe.configure(sync_audit=1)
    try:
        with pytest.warns(RuntimeWarning) as caught:
            instrument(model).generate(**prompt(), max_new_tokens=2, do_sample=False,
                                       logits_processor=transformers.LogitsProcessorList([SyncsForTheWarning()]))
    finally:
        uninstrument(model)
    messages = [str(w.message) for w in caught if "SyncsForTheWarning" in str(w.message)]
    assert messages and messages[0].endswith(
        "; gpuprobe try myfile.py:make --variants no-logits-processor:SyncsForTheWarning measures the run without it "
        "(make() in myfile.py returns (model, generate_kwargs), your logits processors in them)")


def test_importing_gpuprobe_leaves_the_experiment_and_importing_it_leaves_torch() -> None:
    proc = run_python("import sys, gpuprobe; print('gpuprobe.experiment' in sys.modules)")
    assert proc.stdout.strip() == "False", proc.stderr
    proc = run_python("import sys, gpuprobe.experiment; gpuprobe.experiment.REMEDY_VARIANTS; "
                      "print('torch' in sys.modules, 'transformers' in sys.modules)")
    assert proc.stdout.strip() == "False False", proc.stderr
