"""On a CUDA device: the static- vs dynamic-cache experiment, recorded in gpuprobe profile windows, and
the findings and diff that must hold on it (the same checks run here on kineto-shaped traces:
tests/report/test_findings_shapes.py).

A: a dynamic cache, eager. B: a static cache, which generate() compiles with
torch.compile(mode="reduce-overhead") on CUDA: one CUDA graph replay per decode step, the loop eager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import analyze, diff

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.cuda


def _record(path: Path, cache: str) -> Path:
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.testing import reset

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=8, vocab_size=1024,
                                      max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(config).eval().to("cuda", torch.bfloat16)
    ids = (torch.arange(1, 129).remainder(1000) + 3).unsqueeze(0).to("cuda")
    kwargs: dict[str, Any] = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                                  do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        for _ in range(3):  # compilation and graph capture happen here, not in the window
            model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        reset()
        instrument(model)
        window = gpuprobe.profile("1-8", output=str(path))
        try:
            model.generate(ids, **kwargs)
        finally:
            window.stop()
            uninstrument(model)
    assert path.exists(), window
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folder = tmp_path_factory.mktemp("cache_cuda")
    return {"A": _record(folder / "a.json.gz", "dynamic"), "B": _record(folder / "b.json.gz", "static")}


def test_dynamic_cache_concatenation_found_per_step(runs: dict[str, Path]) -> None:
    f = {f.id: f for f in analyze(runs["A"]).findings}["kv_cache_concat"]
    assert f.evidence["basis"] in ("per_step", "time", "elements")
    if f.evidence["basis"] == "per_step":
        assert f.evidence["layers"] == 4 and f.evidence["per_layer"] >= 2
        assert f.evidence["in_place_writes_per_step"] == 0


def test_graph_run_findings_agree_and_do_not_ask_for_graphs(runs: dict[str, Path]) -> None:
    found = {f.id: f for f in analyze(runs["B"]).findings}
    graphs = found["cuda_graphs"]
    assert graphs.severity == "info" and graphs.evidence["per_step"] >= 1
    assert "kv_cache_concat" not in found
    if "launch_bound" in found:
        lb = found["launch_bound"]
        assert lb.title.startswith("Launch-bound outside the CUDA graphs")
        assert "CUDA graphs (torch.compile" not in lb.remedy
        assert lb.evidence["launches_outside_graphs_per_step"] == graphs.evidence["launches_outside_graphs_per_step"]
    sync = found.get("host_sync")
    if sync is not None and sync.severity == "info":
        assert sync.evidence["stop_check"]["where"] == "the generate loop"


def test_diff_opens_with_the_verdict_and_calls_no_new_family_a_regression(runs: dict[str, Path]) -> None:
    d = diff(runs["A"], runs["B"])
    assert d.findings[0].id == "verdict"
    launches = next(r for r in d.verdict_rows if r.figure == "launches per step")
    assert launches.b < launches.a  # one replay instead of the forward's launches
    assert not [f for f in d.findings if f.id == "regression" and not f.evidence["a_ns"]]
