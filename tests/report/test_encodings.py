"""What a file is, said or read: a trace written as UTF-16 or UTF-32 text (as Windows tools write it,
with or without a byte-order mark) is read as the same trace on every engine; a file that is not JSON
(Python source, other text) is refused saying so, naming the file and what the report reads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import ReportInputError, analyze, render
from gpuprobe.report.cli import main_report

DATA = Path(__file__).resolve().parents[1] / "data"
KINETO = DATA / "kineto"
ENGINES = ("msgspec", "stdlib", "ijson")
#: name -> how the text is encoded: a codec, and bytes put before it (a byte-order mark)
ENCODINGS = {
    "utf-16-le": ("utf-16-le", b""),  # PowerShell's Out-File and > of Windows PowerShell 5, without the mark
    "utf-16-be": ("utf-16-be", b""),
    "utf-16 with its mark": ("utf-16", b""),  # Python's utf-16 writes the mark
    "utf-32-le": ("utf-32-le", b""),
    "utf-32 with its mark": ("utf-32", b""),
    "utf-8 with its mark": ("utf-8", b"\xef\xbb\xbf"),
}


def _json_of(path: Path, engine: str = "auto") -> dict[str, Any]:
    report = json.loads(render(analyze(path, engine=engine), "json"))
    report["summary"]["path"] = "-"
    return report


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_a_trace_in_another_unicode_encoding_is_read_as_the_same_trace_on_every_engine(
    name: str, tmp_path: Path
) -> None:
    source = KINETO / "hta_alexnet_syncs.json.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        text = f.read()
    codec, mark = ENCODINGS[name]
    plain = tmp_path / "trace.json"
    plain.write_bytes(mark + text.encode(codec))
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = _json_of(source, "stdlib")
    assert expected["summary"]["kernel_count"] > 50
    for engine in ENGINES:
        assert _json_of(plain, engine) == expected, engine
        assert _json_of(packed, engine) == expected, engine


def test_utf16_text_that_is_not_valid_utf16_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (DATA / "kineto_min.json").read_text(encoding="utf-8")
    raw = bytearray(text.encode("utf-16-le"))
    middle = len(raw) // 2 & ~1
    raw[middle:middle + 2] = b"\x00\xdc"  # a lone low surrogate
    path = tmp_path / "broken.json"
    path.write_bytes(bytes(raw))
    for engine in ENGINES:
        assert main_report([str(path), "--engine", engine]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gpuprobe report: error: {path}: not UTF-16 (little-endian) text at byte "), engine
        assert err.count("\n") == 1


def test_bytes_with_a_utf16_mark_but_no_json_after_it_are_not_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00\x01binary")
    with pytest.raises(ReportInputError, match="not UTF-8 text at byte 0: not a JSON trace"):
        analyze(path)


_EXPECTED = ("gpuprobe report reads PyTorch profiler traces (JSON text: .json, .json.gz), Nsight Systems SQLite "
             "exports (nsys export --type sqlite) and Nsight Compute exports (CSV, .ncu-rep)")


@pytest.mark.parametrize("suffix", [".py", ".json"])
def test_a_python_file_is_refused_as_python_source_naming_what_the_report_reads(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = Path(__file__).resolve().parents[2] / "benchmarks" / "report" / "same_output.py"  # a real script
    path = tmp_path / f"script{suffix}"
    path.write_bytes(source.read_bytes())
    first = source.read_text().splitlines()[0]
    for engine in ENGINES:
        assert main_report([str(path), "--engine", engine]) == 2
        err = capsys.readouterr().err
        assert err == (f"gpuprobe report: error: {path}: not a trace: not JSON text (it begins with "
                       f"{first[:40] + '…'!r}, and looks like Python source); {_EXPECTED}\n"), engine


def test_a_text_file_says_what_it_begins_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.json"
    path.write_text("\n\n  step times were fine\nsecond line\n")
    assert main_report([str(path)]) == 2
    assert capsys.readouterr().err == (f"gpuprobe report: error: {path}: not a trace: not JSON text (it begins with "
                                       f"'step times were fine'); {_EXPECTED}\n")


def test_a_gzip_of_python_source_is_refused_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "script.json.gz"
    path.write_bytes(gzip.compress(b"import os\n\nprint(os.getcwd())\n"))
    with pytest.raises(ReportInputError, match=r"not JSON text \(it begins with 'import os', and looks like Python"):
        analyze(path)


@pytest.mark.parametrize("text", ['"traceEvents"', "42", "null", " -1.5e3"])
def test_json_that_is_not_an_object_says_so(text: str, tmp_path: Path) -> None:
    path = tmp_path / "value.json"
    path.write_text(text)
    with pytest.raises(ReportInputError, match=r"not a trace: the top-level JSON value is not an object \(a trace "
                                               r"is an object with a 'traceEvents' list\); gpuprobe report reads"):
        analyze(path)
