"""Panels documented to be empty on a healthy run (the reason is in the model and in the JSON), the
summary ``--verify`` prints, and ``--out`` keeping every written file under it. No Prometheus server here
(tests/monitoring/test_verify_counts.py runs ``--verify`` against one)."""

from __future__ import annotations

import os
import re

import pytest

from gpuprobe import dashboards as dash
from gpuprobe.dashboards.cli import PROMETHEUS_SUBDIR
from gpuprobe.dashboards.model import GENERATE_ONLY, NEEDS_GPU

from .promstack import ROOT, shipped_dashboards


def _result(panel: str, series: int, no_data: str | None = None, error: str | None = None,
            ref: str = "A") -> dash.QueryResult:
    return dash.QueryResult("gpuprobe-overview", panel, ref, "sum(x)", gpu_only=no_data == NEEDS_GPU.reason,
                            series=series, error=error, no_data=no_data)


# -- the reason in the model and in the JSON -----------------------------------------------------------------

def test_every_panel_reads_back_its_reason_from_the_shipped_json() -> None:
    for model, board in zip(dash.dashboards(), shipped_dashboards(), strict=True):
        read = {p["title"]: dash.no_data_reason(p) for p in dash.json_panels(board)}
        assert read == {p.title: p.no_data_reason for p in model.panels}


def test_the_json_description_ends_with_the_reasons_sentence() -> None:
    for model, board in zip(dash.dashboards(), shipped_dashboards(), strict=True):
        described = {p["title"]: p["description"] for p in dash.json_panels(board)}
        for panel in model.panels:
            said = f"{panel.description} {GENERATE_ONLY}" if panel.generate_only else panel.description
            if panel.no_data is not None:
                assert described[panel.title] == f"{said} {panel.no_data.sentence}"
            else:
                assert described[panel.title] == said


def test_reasons_cover_what_the_docs_call_normally_empty() -> None:
    reasons = {p.title: p.no_data_reason.reason for d in dash.dashboards() for p in d.panels if p.no_data_reason}
    assert reasons["Errors"] == "waits for an error"
    assert reasons["Telemetry dropped"] == reasons["Telemetry dropped by rank"] == "waits for dropped telemetry"
    assert reasons["Kernel time by category"] == reasons["Kernel launches by category"] == "kernel sampling off"
    assert reasons["Host syncs per step by component"] == "sync audit off"
    serving = next(r for r in dash.overview().rows if r.title.startswith("Serving"))
    speculative = next(r for r in dash.overview().rows if r.title == "Speculative decoding")
    assert {reasons[p.title] for p in serving.panels} == {"no continuous batching"}
    assert {reasons[p.title] for p in speculative.panels} == {"no speculative decoding"}
    assert all(reasons[p.title] == "needs a GPU" for d in dash.dashboards() for p in d.panels if p.gpu_only)
    # What a generate() call always records has no excuse to be empty.
    for title in ("Time to first token", "Tokens per second", "Step time by component", "Memory allocated and peak",
                  "KV cache size", "Batch size", "Requests in flight"):
        assert title not in reasons


def test_docs_name_every_reason() -> None:
    with open(os.path.join(ROOT, "docs", "grafana.md"), encoding="utf-8") as f:
        doc = f.read()
    for reason in dash.NO_DATA_REASONS:
        assert f"| {reason.reason} |" in doc, f"docs/grafana.md does not list the reason {reason.reason!r}"


def test_a_hand_edited_description_without_the_sentence_has_no_reason() -> None:
    assert dash.no_data_reason({"description": "Failed generate() calls per second."}) is None
    assert dash.no_data_reason({"description": "GPU only. Device clock."}) is NEEDS_GPU


def test_needs_gpu_is_said_with_gpu_only() -> None:
    with pytest.raises(ValueError, match="gpu_only=True"):
        dash.Panel("p", "d", (), no_data=NEEDS_GPU)


# -- the summary ---------------------------------------------------------------------------------------------

def test_summary_counts_only_queries_that_returned_data() -> None:
    results = [_result("Batch size", 1), _result("SM clock", 0, "needs a GPU"),
               _result("GPU temperature", 0, "needs a GPU"), _result("Errors", 0, "waits for an error")]
    lines, failed = dash.summary(results)
    assert lines[0] == "1 of 4 queries returned data."
    assert not failed


def test_summary_lists_excused_panels_by_reason_in_the_documented_order() -> None:
    results = [_result("Errors", 0, "waits for an error", ref="A"), _result("Errors", 1, "waits for an error", ref="B"),
               _result("SM clock", 0, "needs a GPU"), _result("Queue time", 0, "no continuous batching")]
    lines, failed = dash.summary(results)
    assert lines[1:] == [
        "3 queries returned no data in panels that are empty for a documented reason:",
        "  needs a GPU (1 query):", "    gpuprobe-overview / SM clock",
        "  waits for an error (1 query):", "    gpuprobe-overview / Errors (1 of its 2 queries)",
        "  no continuous batching (1 query):", "    gpuprobe-overview / Queue time",
    ]
    assert not failed


def test_summary_fails_on_an_empty_panel_without_a_reason() -> None:
    lines, failed = dash.summary([_result("Batch size", 0), _result("Errors", 0, "waits for an error")])
    assert failed
    assert lines[-2:] == ["1 query returned no data in panels with no documented reason to be empty:",
                          "  gpuprobe-overview / Batch size / A"]


def test_summary_fails_on_a_query_prometheus_refused_even_with_a_reason() -> None:
    lines, failed = dash.summary([_result("Errors", 0, "waits for an error", error="bad_data: parse error")])
    assert failed
    assert lines[-2:] == ["1 query failed:", "  gpuprobe-overview / Errors / A: bad_data: parse error"]


def test_query_lines_carry_the_reason() -> None:
    assert str(_result("SM clock", 0, "needs a GPU")).startswith("gpuprobe-overview / SM clock / A [needs a GPU]: no data")


# -- --out keeps everything under it --------------------------------------------------------------------------

def _tree(folder: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files)


def test_inline_quantiles_with_out_writes_everything_under_out(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    work, out = tmp_path / "cwd", tmp_path / "mine"
    work.mkdir()
    monkeypatch.chdir(work)
    assert dash.main(["--inline-quantiles", "--out", str(out)]) == 0
    assert _tree(str(work)) == []  # nothing in the current folder (it was ./deploy/prometheus/)
    prom = [os.path.join(PROMETHEUS_SUBDIR, n) for n in sorted(dash.prometheus_files())]
    assert _tree(str(out)) == sorted(["gpuprobe-overview.json", "gpuprobe-ranks.json", *prom])
    inline = dash.dashboard_files(inline=True)
    for name, text in inline.items():
        assert (out / name).read_text(encoding="utf-8") == text
    assert re.search(r"histogram_quantile\(0\.95", inline["gpuprobe-overview.json"])
    assert dash.main(["--check", "--inline-quantiles", "--out", str(out)]) == 0


def test_out_and_prometheus_out_both_given_are_both_kept(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    assert dash.main(["--out", "d", "--prometheus-out", "p"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["d", "p"]
    assert sorted(os.listdir(tmp_path / "p")) == sorted(dash.prometheus_files())


def test_without_out_the_repository_folders_are_written(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    assert dash.main([]) == 0
    assert _tree(str(tmp_path)) == sorted(
        [os.path.join(dash.DASHBOARD_DIR, n) for n in dash.dashboard_files()]
        + [os.path.join(dash.PROMETHEUS_DIR, n) for n in dash.prometheus_files()])
