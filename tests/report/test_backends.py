"""The numpy fast path and its plain-Python twin give the same report, to the last field."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import analyze

pytest.importorskip("numpy")
ROOT = Path(__file__).resolve().parents[2]


def same(path: Path, **kwargs: Any) -> None:
    fast = analyze(path, backend="numpy", top=1000, **kwargs).to_dict()
    twin = analyze(path, backend="python", top=1000, **kwargs).to_dict()
    assert fast == twin


@pytest.mark.parametrize(
    "name", ["kineto_min.json", "kineto/hta_sampled_rank-0.json.gz", "kineto/hta_triton_example.json.gz"]
)
def test_backends_agree_on_the_test_traces(data_dir: Path, name: str) -> None:
    same(data_dir / name)


def test_backends_agree_on_the_cpu_traces(cpu_traces: dict[str, Path]) -> None:
    for path in cpu_traces.values():
        same(path)


def test_backends_agree_on_an_nsys_export(nsys_db: Path) -> None:
    same(nsys_db)


def test_backends_agree_with_a_custom_step_pattern(data_dir: Path) -> None:
    same(data_dir / "kineto" / "hta_sampled_rank-0.json.gz", step_pattern="forward|backward")


def test_backends_agree_on_a_synthetic_decode_trace(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks" / "report"))
    try:
        from make_synthetic_trace import write_trace
    finally:
        sys.path.pop(0)
    buf = io.StringIO()
    steps, _ = write_trace(buf, 3_000_000, seed=3)
    path = tmp_path / "synthetic.json"
    path.write_text(buf.getvalue())
    same(path)
    assert analyze(path, backend="numpy").summary.step_count == steps


def test_an_unknown_backend_is_refused(kineto_min: Path) -> None:
    with pytest.raises(ValueError, match="backend"):
        analyze(kineto_min, backend="fortran")
