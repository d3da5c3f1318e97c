"""``gpuprobe report`` / ``gpuprobe diff`` as functions: formats, outputs, and bad input."""

from __future__ import annotations

import csv
import gzip
import importlib.metadata
import importlib.util
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuprobe
from gpuprobe.report import _analysis
from gpuprobe.report.cli import main_diff, main_report

ROOT = Path(__file__).resolve().parents[2]


def _bad_inputs(tmp: Path, kineto_min: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, words the error line must hold)."""
    text = kineto_min.read_bytes()
    cases: dict[str, tuple[bytes | None, str]] = {
        "empty.json": (b"", "empty file"),
        "truncated.json.gz": (gzip.compress(text)[:200], "truncated gzip"),
        "truncated.json": (text[: len(text) // 2], "truncated JSON"),
        "invalid.json": (b'{"traceEvents": [{"ph": "X" "cat": 1}]}', "invalid JSON"),
        "not_a_trace.json": (b'{"hello": [1, 2, 3]}', "not a kineto trace"),
        "top_level_string.json": (b'"traceEvents"', "not a trace"),
        "binary.json": (b"\xff\xfe\x00\x01binary", "not UTF-8"),
        "corrupt.json.gz": (b"\x1f\x8b\x08\x00garbage", "gzip"),
        "missing.json": (None, "no such file"),
    }
    out = {}
    for name, (data, words) in cases.items():
        path = tmp / name
        if data is not None:
            path.write_bytes(data)
        out[name] = (path, words)
    con = sqlite3.connect(tmp / "not_nsys.sqlite")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    out["not_nsys.sqlite"] = (tmp / "not_nsys.sqlite", "not an Nsight Systems export")
    con = sqlite3.connect(tmp / "no_end.sqlite")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, demangledName INTEGER)")
    con.commit()
    con.close()
    out["no_end.sqlite"] = (tmp / "no_end.sqlite", "table CUPTI_ACTIVITY_KIND_KERNEL lacks column end")
    return out


BAD = [
    "empty.json",
    "truncated.json.gz",
    "truncated.json",
    "invalid.json",
    "not_a_trace.json",
    "top_level_string.json",
    "binary.json",
    "corrupt.json.gz",
    "missing.json",
    "not_nsys.sqlite",
    "no_end.sqlite",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, kineto_min: Path, case: str, capsys: Any
) -> None:
    path, words = _bad_inputs(tmp_path, kineto_min)[case]
    assert main_report([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and str(path) in err and words in err, err
    assert "Traceback" not in err


def test_bad_input_from_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "empty.json.gz"
    path.write_bytes(b"")
    code = "import sys; from gpuprobe.report.cli import main_report; sys.exit(main_report(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"gpuprobe report: error: {path}: empty file\n"


def test_diff_with_a_bad_input_exits_2(tmp_path: Path, kineto_min: Path, capsys: Any) -> None:
    assert main_diff([str(kineto_min), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.json: no such file" in err


def test_a_bad_step_pattern_is_one_line(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min), "--step-pattern", "("]) == 2
    assert "bad step pattern" in capsys.readouterr().err


def test_text_report_shows_the_sections(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min)]) == 0
    out = capsys.readouterr().out
    for title in ("Summary", "Top kernels", "GPU time by category", "GPU time per range", "Steps", "Launch overhead"):
        assert title in out
    assert "decode_step/forward" in out and "27.424 µs" in out


def test_markdown_report_has_tables(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min), "--format", "md", "--sections", "kernels,categories"]) == 0
    out = capsys.readouterr().out
    assert "## Top kernels" in out and "| kernel | category |" in out
    assert "## Steps" not in out


def test_json_report_is_the_report_tree(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuprobe.report/1"
    assert doc["summary"]["kernel_ns"] == 27_424
    assert doc["steps"]["rows"][0]["categories"]["gemm"] == 18_304


def test_csv_report_of_one_section_is_one_table(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min), "--format", "csv", "--sections", "steps"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 1
    assert rows[0]["section"] == "steps" and rows[0]["gpu_busy_ns"] == "29760" and rows[0]["gemm_ns"] == "18304"


def test_output_is_written_to_the_file_and_not_to_stdout(tmp_path: Path, kineto_min: Path, capsys: Any) -> None:
    out = tmp_path / "report.md"
    out.write_text("old")
    assert main_report([str(kineto_min), "--format", "md", "--output", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert out.read_text().startswith("## Findings")  # findings come first in every format
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary file left behind


def test_an_output_in_a_missing_folder_is_one_line(tmp_path: Path, kineto_min: Path, capsys: Any) -> None:
    target = tmp_path / "no" / "r.txt"
    assert main_report([str(kineto_min), "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"gpuprobe report: error: {target}: cannot write: No such file or directory\n"


def test_a_plot_in_a_missing_folder_is_one_line(tmp_path: Path, kineto_min: Path, capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "no" / "plot.png"
    assert main_report([str(kineto_min), "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"gpuprobe report: error: {target}: cannot write: No such file or directory\n"


def test_plot_writes_a_png(tmp_path: Path, kineto_min: Path, capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    assert main_report([str(kineto_min), "--sections", "kernels", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Steps" not in capsys.readouterr().out


def test_plot_of_a_cpu_only_trace_says_there_is_no_gpu_activity(tmp_path: Path, cpu_traces: dict[str, Path]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "cpu.png"
    assert main_report([str(cpu_traces["plain"]), "--sections", "summary", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_goes_to_stderr_when_asked(data_dir: Path, capsys: Any) -> None:
    assert (
        main_report([str(data_dir / "kineto" / "hta_sampled_rank-0.json.gz"), "--progress", "--sections", "summary"])
        == 0
    )
    out, err = capsys.readouterr()
    assert "reading hta_sampled_rank-0.json.gz" in err
    assert "reading" not in out


def test_no_progress_when_stderr_is_not_a_terminal(kineto_min: Path, capsys: Any) -> None:
    assert main_report([str(kineto_min), "--sections", "summary"]) == 0
    assert capsys.readouterr().err == ""


def test_nsys_export_through_the_command(nsys_db: Path, capsys: Any) -> None:
    assert main_report([str(nsys_db), "--format", "json", "--sections", "ranges"]) == 0
    rows = json.loads(capsys.readouterr().out)["ranges"]["rows"]
    assert {r["path"]: r["gpu_busy_ns"] for r in rows}["decode_step/forward"] == 27_424


# ------------------------------------------------------------------------------- internal errors


def break_the_analysis(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    """Make the analysis step after reading the trace raise ``exc``, as a bug in it would."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(_analysis, "build_report", broken)


@pytest.mark.parametrize(
    ("exc", "first_line"),
    [
        (ValueError("step count < 0"), "gpuprobe report: internal error in gpuprobe: ValueError: step count < 0"),
        (KeyError("gemm"), "gpuprobe report: internal error in gpuprobe: KeyError: 'gemm'"),
        (ZeroDivisionError(), "gpuprobe report: internal error in gpuprobe: ZeroDivisionError"),
    ],
)
def test_an_exception_in_the_analysis_is_an_internal_error_with_exit_1(
    kineto_min: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, exc: Exception, first_line: str
) -> None:
    break_the_analysis(monkeypatch, exc)
    assert main_report([str(kineto_min)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == first_line


def test_an_internal_error_asks_for_a_report_with_the_command_line_and_versions(
    kineto_min: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    break_the_analysis(monkeypatch, ValueError("negative step count"))
    assert main_report([str(kineto_min), "--format", "md"]) == 1
    err = capsys.readouterr().err
    assert "This is a bug in gpuprobe, not a problem with your input. Please report it" in err
    assert f"  command: gpuprobe report {kineto_min} --format md\n" in err
    torch = importlib.metadata.version("torch") if importlib.util.find_spec("torch") else "not installed"
    assert f"  versions: gpuprobe {gpuprobe.__version__}, torch {torch}, Python " in err
    assert "Traceback" not in err


def test_debug_adds_the_traceback_of_an_internal_error(
    kineto_min: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    break_the_analysis(monkeypatch, ValueError("negative step count"))
    assert main_report([str(kineto_min), "--debug"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "ValueError: negative step count" in err and "internal error in gpuprobe" in err


def test_an_exception_in_the_analysis_of_a_diff_is_an_internal_error_with_exit_1(
    kineto_min: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    break_the_analysis(monkeypatch, ValueError("negative step count"))
    assert main_diff([str(kineto_min), str(kineto_min)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "gpuprobe diff: internal error in gpuprobe: ValueError: negative step count"


def test_a_malformed_trace_is_still_bad_input_with_exit_2(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "invalid.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1.5e}, {"ph": "X"}], "deviceProperties": []}')
    assert main_report([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuprobe report: error: {path}: invalid JSON") and err.count("\n") == 1
    assert "internal error" not in err
