"""`gpuprobe report` and `gpuprobe diff` of CPU traces: a tiny Llama (built from a config) generating under
the program's own ``torch.profiler`` (CPU activity only), with gpuprobe's transformers integration off and
on. Expected values come from the raw events of the traces, read with plain ``json``."""

from __future__ import annotations

import json
import statistics
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze, diff, render

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT, NEW, EARLIER = 5, 6, 4
GPU_TITLES = ("Top kernels", "GPU time by category", "Kernel families", "Non-GEMM kernels", "Attention kernels",
              "Launch overhead", "Memory operations", "Small frequent kernels")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``plain``: integration off; ``ours``: integration on, after an earlier generate() of ``EARLIER``
    tokens outside the profile; ``phased``: integration on and the program's own prefill/decode ranges."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.testing import reset

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.arange(3, PROMPT + 3).unsqueeze(0)
    kw = dict(attention_mask=torch.ones_like(ids), min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    folder = tmp_path_factory.mktemp("cpu")
    out: dict[str, Path] = {}
    opened: list[Any] = []
    calls = [0]

    def before(module: Any, args: Any, kwargs: Any) -> None:  # one forward a step; the first is the prefill
        r = record_function("prefill" if calls[0] == 0 else "decode")
        calls[0] += 1
        r.__enter__()
        opened.append(r)

    def after(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        opened.pop().__exit__(None, None, None)

    reset()
    try:
        for name in ("plain", "ours", "phased"):
            if name == "ours":
                instrument(model)
                with torch.no_grad():  # steps 0..EARLIER-1 of the process, outside the trace
                    model.generate(ids, max_new_tokens=EARLIER, **{**kw, "min_new_tokens": EARLIER})
            hooks = []
            if name == "phased":
                hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
                         model.register_forward_hook(after, with_kwargs=True)]
            with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
                model.generate(ids, max_new_tokens=NEW, **kw)
            for h in hooks:
                h.remove()
            out[name] = folder / f"{name}.json"
            prof.export_chrome_trace(str(out[name]))
    finally:
        uninstrument(model)
        reset()
    return out


def _x(path: Path) -> list[dict[str, Any]]:
    return [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]


def test_no_gpu_activity_is_said_once_instead_of_empty_gpu_sections(traces: dict[str, Path]) -> None:
    report = analyze(traces["ours"])
    for fmt in ("text", "md"):
        text = render(report, fmt)
        assert text.count("no GPU activity in this trace") == 1
        assert not [t for t in GPU_TITLES if t in text], fmt
        assert "Steps" in text and "CPU operators" in text
    as_json = json.loads(render(report, "json"))
    assert as_json["kernels"]["count"] == 0 and as_json["launches"]["launch_count"] == 0  # JSON keeps them
    assert "Top kernels" in render(report, "csv") or "kernels" in render(report, "csv")


def test_long_events_list_each_call_once_by_its_outermost_event(traces: dict[str, Path]) -> None:
    path = traces["plain"]
    ops = [e for e in _x(path) if e.get("cat") == "cpu_op"]
    rows = analyze(path, top=10).timeline.rows
    listed = []
    for r in rows:
        e = next(e for e in ops if e["name"] == r.name and to_ns(e["dur"]) == r.dur_ns)
        listed.append(e)

    def inside(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return a is not b and a["tid"] == b["tid"] and b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"]

    # no listed event is the same call as another listed one (nested, most of its time)
    assert not [(a["name"], b["name"]) for a in listed for b in listed if inside(a, b) and a["dur"] >= b["dur"] * Decimal("0.8")]
    # the longest operator is listed, and the one nested in it with most of its time (aten::linear > aten::mm) is not
    top = max(ops, key=lambda e: e["dur"])
    assert top in listed
    nested = [e for e in ops if inside(e, top) and e["dur"] >= top["dur"] * Decimal("0.8")]
    assert nested and not [e for e in nested if e in listed]
    assert "one row per call" in render(analyze(path, top=10, sections=["timeline"]), "text")


def test_steps_say_their_numbers_count_the_whole_process(traces: dict[str, Path]) -> None:
    raw = sorted((e for e in _x(traces["ours"]) if e["name"].startswith("gpuprobe.step#")), key=lambda e: e["ts"])
    report = analyze(traces["ours"])
    # the earlier generate() ran EARLIER steps (one forward a token): this trace's first is step #EARLIER
    assert [r.name for r in report.steps.rows] == [e["name"] for e in raw] == [
        f"gpuprobe.step#{EARLIER + i}" for i in range(NEW)]
    assert [r.index for r in report.steps.rows] == list(range(NEW))
    text = render(report, "text")
    assert "counts the steps of the whole process" in text
    # no range says the phase: blank, and the table says why
    assert {r.phase for r in report.steps.rows} == {""}
    assert "phase: blank where the trace does not say it" in text


def test_the_phase_comes_from_a_range_inside_the_step(traces: dict[str, Path]) -> None:
    ev = _x(traces["phased"])
    steps = sorted((e for e in ev if e["name"].startswith("gpuprobe.step#")), key=lambda e: e["ts"])
    marks = [e for e in ev if e["name"] in ("prefill", "decode")]
    expected = [next(m["name"] for m in marks if s["ts"] <= m["ts"] and m["ts"] + m["dur"] <= s["ts"] + s["dur"])
                for s in steps]
    assert expected == ["prefill"] + ["decode"] * (NEW - 1)
    report = analyze(traces["phased"])
    assert [r.phase for r in report.steps.rows] == expected
    assert "phase: blank" not in render(report, "text")


def test_fail_on_info_skips_findings_that_ask_nothing(traces: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprobe.report.cli import EXIT_FINDINGS, main_report

    path = str(traces["ours"])
    found = {f.id: f for f in analyze(path).findings}
    stop = found["host_sync"]
    assert stop.severity == "info" and stop.asks_nothing and "stop_check" in stop.evidence
    quiet = ["--no-progress", "--sections", "findings", "--threshold", "kv_cache_concat.per_layer=1000"]
    assert main_report([path, "--fail-on", "info", *quiet]) == 0  # only the expected stopping check
    capsys.readouterr()
    if "kv_cache_concat" in found:  # an info finding that asks something (a static cache) still gates
        assert not found["kv_cache_concat"].asks_nothing
        assert main_report([path, "--fail-on", "info", "--no-progress", "--sections", "findings"]) == EXIT_FINDINGS
        assert "kv_cache_concat" in capsys.readouterr().err
    # JSON says it only where it is true
    as_json = json.loads(render(analyze(path), "json"))["findings"]
    assert [f.get("asks_nothing", False) for f in as_json] == [f.id == "host_sync" for f in analyze(path).findings]


def test_a_finding_that_asks_something_names_the_try_variant(traces: dict[str, Path]) -> None:
    from gpuprobe.experiment.remedies import REMEDY_VARIANTS

    f = {f.id: f for f in analyze(traces["plain"]).findings}["host_sync"]
    assert f.severity == "warning"
    option = REMEDY_VARIANTS["host_sync"].option
    assert f.remedy.endswith(f".\nMeasure it: gpuprobe try myfile.py:make --variants {option} (make() in myfile.py "
                             "returns (model, generate_kwargs), your logits processors in them)")
    info = [f for f in analyze(traces["ours"]).findings if f.severity == "info"]
    assert info and not [f for f in info if "gpuprobe try" in f.remedy]


def test_the_verdict_follows_the_normalization(traces: dict[str, Path]) -> None:
    path = traces["phased"]
    durs = [to_ns(e["dur"]) for e in _x(path) if e["name"].startswith("gpuprobe.step#")]
    steps = len(durs)
    tokens_a, tokens_b = steps, 1000 * steps  # B: the same steps, a thousand times the tokens

    def figure(scale: float) -> tuple[float, float]:
        values = sorted(d * scale for d in durs)
        q = statistics.quantiles(values, n=10, method="inclusive")
        return statistics.median(values), q[-1] - q[0]

    a, a_spread = figure(steps / tokens_a)
    b, b_spread = figure(steps / tokens_b)
    d = diff(path, path, normalize="token", tokens_a=tokens_a, tokens_b=tokens_b)
    row = next(r for r in d.verdict_rows if r.figure == "CPU time per token")
    assert row.a == pytest.approx(a, abs=1) and row.b == pytest.approx(b, abs=1)  # whole ns
    assert row.judgement == ("better" if a - b > max(a_spread, b_spread) else "same")
    assert d.findings[0].title.startswith("Verdict per token:")
    cpu = next(r for r in d.overview if r.key == "CPU time in steps")
    assert cpu.ratio == pytest.approx(b / a)  # the table and the verdict weigh the same figures
    same = diff(path, path)  # per step, the same trace twice: unchanged, and it asks nothing
    assert same.verdict == "unchanged" and same.findings[0].asks_nothing
