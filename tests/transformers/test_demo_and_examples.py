"""The demo and the examples run, on CPU, and show what they promise."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from gpuprobe import demo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("transformers_*.py"))


def test_demo_quick_run_prints_a_component_table_and_writes_a_plot(tmp_path, capsys):
    plot = tmp_path / "steps.png"
    assert demo.main(["--quick", "--port", "0", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert "serving metrics at http://127.0.0.1:" in err
    assert err.count("request ") == 2  # one progress line per request
    for row in ("forward", "logits_processor:BanTokens", "logits_processor:RepetitionPenaltyLogitsProcessor",
                "stopping_criteria", "other", "step (all components)"):
        assert row in out
    assert "p99 ms" in out and "share" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_reports_a_busy_port_clearly(capsys):
    import socket

    with socket.socket() as busy:  # another program holds the port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert demo.main(["--quick", "--port", str(busy.getsockname()[1]), "--plot", ""]) == 2
    assert "already in use" in capsys.readouterr().err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()
