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


def _synthetic(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "benchmarks" / "report"))
    try:
        from make_synthetic_trace import write_trace
    finally:
        sys.path.pop(0)
    buf = io.StringIO()
    write_trace(buf, 2_000_000, seed=5)
    path = tmp_path / "synthetic.json"
    path.write_text(buf.getvalue())
    return path


def test_flop_totals_crunched_in_chunks_are_the_twin_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprobe.report import _columns_numpy as _columns

    path = _synthetic(tmp_path)
    monkeypatch.setattr(_columns, "_FLOPS_ROWS", 7)  # many chunks, a name split across them
    fast = analyze(path, backend="numpy", top=1000).to_dict()
    assert fast["flops"]["rows"] and fast["flops"]["total_flops"] > 0
    assert fast == analyze(path, backend="python", top=1000).to_dict()


def test_launches_in_thread_order_kept_as_views_give_the_sorted_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from gpuprobe.report import _columns_numpy as _columns

    path = _synthetic(tmp_path)
    assert _columns._in_thread_order(np, np.array([0, 0, 1, 1]), np.array([5, 9, 1, 2]))
    assert not _columns._in_thread_order(np, np.array([0, 1, 0]), np.array([5, 1, 9]))
    assert not _columns._in_thread_order(np, np.array([0, 0]), np.array([9, 5]))
    views = analyze(path, backend="numpy", top=1000).to_dict()
    monkeypatch.setattr(_columns, "_in_thread_order", lambda *args: False)
    assert analyze(path, backend="numpy", top=1000).to_dict() == views
