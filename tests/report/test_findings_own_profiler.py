"""`gpuprobe report` of a trace the program recorded with its own ``torch.profiler.profile()``.

No gpuprobe profile window runs: a real tiny Llama (built from a config), instrumented, generates
inside the program's own CPU profiler, and the program exports the trace itself. The integration
records its step and component ranges into that session, so the report finds every step and puts
the processor's would-be syncs on its class. Expected figures come from the returned tokens and from
the raw events of the trace, read with plain ``json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns
from test_findings_recorded import ItemProcessor  # two .item() and one nonzero() a step

from gpuprobe.report import analyze

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT, NEW = 5, 9


def _own_trace(path: Path, processor: Any, profile: Any, **profile_kwargs: Any) -> int:
    """An instrumented tiny Llama generates inside ``profile(**profile_kwargs)``, the program's own
    profiler, which exports the trace to ``path``; returns the steps it ran, counted from its output."""
    from gpuprobe.integrations.transformers import instrument, uninstrument

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=128)
    model = instrument(transformers.LlamaForCausalLM(config).eval())
    ids = torch.arange(3, PROMPT + 3).unsqueeze(0)
    try:
        with torch.no_grad(), profile(**profile_kwargs) as prof:
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                                 do_sample=False, pad_token_id=0,
                                 logits_processor=transformers.LogitsProcessorList([processor]))
        prof.export_chrome_trace(str(path))
    finally:
        uninstrument(model)
    # One forward per new token: the prefill selects the first, each decode step one more.
    new_tokens = out.shape[1] - ids.shape[1]
    assert new_tokens == NEW
    return 1 + (new_tokens - 1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The program's own CPU trace of one generate(), and the steps it ran."""
    from torch.profiler import ProfilerActivity, profile

    from gpuprobe.testing import reset

    reset()
    path = tmp_path_factory.mktemp("own") / "mine.json"
    try:
        steps = _own_trace(path, ItemProcessor(), profile, activities=[ProfilerActivity.CPU])
    finally:
        reset()
    return path, steps


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]


def _inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
    return e["tid"] == outer["tid"] and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]


def test_the_report_finds_every_step_of_your_own_trace(recorded: tuple[Path, int]) -> None:
    path, steps = recorded
    raw = sorted((e for e in _events(path) if e["cat"] == "user_annotation" and e["name"].startswith("gpuprobe.step#")),
                 key=lambda e: e["ts"])
    report = analyze(path)
    assert report.steps is not None and report.steps.count == steps == len(raw)
    assert [r.cpu_ns for r in report.steps.rows] == [to_ns(e["dur"]) for e in raw]
    assert not any("no range matched the step pattern" in w for w in report.summary.warnings)


def test_the_report_puts_the_processors_syncs_on_its_class(recorded: tuple[Path, int]) -> None:
    path, steps = recorded
    ev = _events(path)
    ranges = [e for e in ev if e["cat"] == "user_annotation" and e["name"] == "ItemProcessor"]
    items = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::item" and any(_inside(e, r) for r in ranges)]
    nonzero = [e for e in ev if e["cat"] == "cpu_op" and e["name"] == "aten::nonzero"
               and any(_inside(e, r) for r in ranges)]
    assert len(ranges) == steps and len(items) == 2 * steps and len(nonzero) == steps
    f = {f.id: f for f in analyze(path).findings}["host_sync"]
    rows = {(r["operator"], r["range"]): r for r in f.evidence["would_sync_on_gpu"]["top_offenders"]}
    assert rows["aten::item", "ItemProcessor"]["calls"] == len(items)
    assert rows["aten::item", "ItemProcessor"]["per_step"] == 2
    assert rows["aten::nonzero", "ItemProcessor"]["calls"] == len(nonzero)


def test_the_cli_reads_your_own_trace(recorded: tuple[Path, int], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from gpuprobe.report.cli import main_report

    path, steps = recorded
    assert main_report([str(path), "--format", "json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"]["count"] == steps


def test_on_the_simulated_gpu_the_processors_syncs_are_put_on_its_class(simcuda: Any, tmp_path: Path) -> None:
    """The sync shows on a (simulated) GPU: the processor launches work and reads a scalar back, as
    ``.item()`` of a CUDA tensor does (a copy to the host, waited for). The model runs on the CPU; the
    program's own profiler has CPU and CUDA activity, with CUDA synchronization records."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity

    sim = simcuda(1)
    torch.cuda.current_device()

    class DeviceItemProcessor(transformers.LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            sim.launch(20_000, "reduce_max")
            sim.memcpy_and_sync(ns=2_000)
            return scores

    path = tmp_path / "mine.json"
    # the simulation's torch.profiler.profile, looked up once it is installed
    steps = _own_trace(path, DeviceItemProcessor(), torch.profiler.profile,
                       activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       experimental_config=_ExperimentalConfig(enable_cuda_sync_events=True))
    ev = _events(path)
    ranges = [e for e in ev if e["cat"] == "user_annotation" and e["name"] == "DeviceItemProcessor"]
    waits = [e for e in ev if e["name"] == "cudaStreamSynchronize" and any(_inside(e, r) for r in ranges)]
    assert len(ranges) == steps and len(waits) == steps
    report = analyze(path)
    assert report.steps is not None and report.steps.count == steps
    f = {f.id: f for f in report.findings}["host_sync"]
    # the simulation's wait is called from Python, not from inside an ATen operator: the row has none
    (row,) = [r for r in f.evidence["top_offenders"] if r["range"] == "DeviceItemProcessor"]
    assert row["calls"] == len(waits) and row["per_step"] == 1
