"""What the docs show runs as shown: every fenced block of README.md and docs/*.md, one test each.

Python blocks run (and the ``test_*`` functions they define are called), shell commands run from a
folder of stand-ins, and the output a doc shows — a transcript, a ``>>>`` result, a block claimed as
the output of a command — is compared with what the program prints. What a CPU test machine changes
(a tiny local model for hub names, the CPU for CUDA, free ports for fixed ones) and leaves out (GPU-only
blocks, installs, nsys/ncu, remote services), each with its reason, is the table in
``tests/_dockit.py``; the comparison rules are in its docstring. A failure names the doc and the line
of the block. ``pytest tests/test_docs.py -rs`` lists every skipped block with its reason.

All selected docs run in one process tree (``tests/_docrun.py``): torch and transformers are imported
once, each doc runs in a forked child, two at a time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _dockit
from _dockit import Block

BLOCKS = _dockit.all_blocks()
RUNNER = Path(__file__).resolve().parent / "_docrun.py"


@pytest.fixture(scope="module")
def doc_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The results of every doc that has a selected block, run once for the module."""
    if request.config.getoption("--simulate-gpu", False) or getattr(sys.modules.get("conftest"), "_machine_sim", None):
        pytest.skip("the docs run in processes of their own, which a simulated CUDA does not reach: "
                    "the plain run covers them")
    selected = {item.callspec.params["block"].doc for item in request.session.items
                if getattr(item, "function", None) is test_doc_block_runs_as_shown and hasattr(item, "callspec")}
    work = tmp_path_factory.mktemp("docs")
    job = work / "job.json"
    out = work / "results.json"
    job.write_text(json.dumps({"work": str(work), "parallel": os.cpu_count() and min(2, os.cpu_count() or 1),
                               "blocks": [b.to_json() for b in BLOCKS if b.doc in selected]}))
    proc = subprocess.run([sys.executable, str(RUNNER), str(job), str(out)], capture_output=True, text=True,
                          timeout=1500)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"the doc runner exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}


def _cpu_only_torch() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


# Outputs shown as a machine of one kind prints them (doctor's lines name the torch build): compared there only.
SHOWN_ON: dict[str, tuple[str, Callable[[], bool]]] = {
    "of `gpuprobe doctor`": ("a CPU-only torch build", _cpu_only_torch),
}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs_as_shown(block: Block, doc_results: dict[str, Any]) -> None:
    for marker, (machine, here) in SHOWN_ON.items():
        if block.kind == "output" and block.directive.endswith(marker) and not here():
            pytest.skip(f"{block.id}: the output shown is {machine}'s; this torch is not one")
    result = doc_results.get(block.id)
    if result is None:
        pytest.fail(f"{block.id}: not run (the doc changed while the test ran?)", pytrace=False)
    skipped = "".join(f"\n  not run: {part}" for part in result["skipped_parts"])
    if result["status"] == "skipped":
        pytest.skip(f"{block.id}: {result['message']}")
    if result["status"] == "failed":
        pytest.fail(f"{block.id} ({block.kind} block): {result['message']}{skipped}", pytrace=False)
    assert result["status"] == "passed", result


# ---------------------------------------------------------------------------------------- the rules themselves


def test_masked_output_keeps_counts_and_forgets_versions_paths_and_timings() -> None:
    shown = "ok    seams    all fit: 22 of 29 seams against torch 2.13.0+cpu (/srv/venv/lib/gpuprobe), 0.0213 s"
    same = "ok    seams    all fit: 22 of 29 seams against torch 2.11.0+cu128 (/work/main/gpuprobe), 1.5 s"
    drifted = "ok    seams    all fit: 21 of 28 seams against torch 2.13.0+cpu (/srv/venv/lib/gpuprobe), 0.0213 s"
    assert _dockit.compare_text(shown, same, "masked") is None
    problem = _dockit.compare_text(shown, drifted, "masked")
    assert problem is not None and "21 of 28" in problem
    assert _dockit.compare_text(shown, same, "exact") is not None


def test_a_path_under_the_working_folder_is_compared() -> None:
    shown = '{"path": "/srv/app/gpuprobe-steps-1200-1219-rank0.json.gz"}'
    actual = '{"path": "/tmp/run/gpuprobe-traces/gpuprobe-steps-3-22-rank0.json.gz"}'
    moved = '{"path": "/tmp/run/gpuprobe-steps-3-22-rank0.json.gz"}'
    value = _dockit.parse_value(shown)
    assert _dockit.compare_value(value, _dockit.parse_value(actual), "masked", folder="/tmp/run") is not None
    assert _dockit.compare_value(value, _dockit.parse_value(moved), "masked", folder="/tmp/run") is None


def test_sampled_lines_are_found_in_order() -> None:
    shown = "gpuprobe: capturing steps 8812-8814 (a slow step) to /srv/app/t/a.json.gz\ngpuprobe: written"
    actual = "noise\ngpuprobe: capturing steps 130-132 (a slow step) to /tmp/x/t/a.json.gz\nmore\ngpuprobe: written\n"
    assert _dockit.compare_text(shown, actual, "lines", folder="/tmp/x") is None
    assert _dockit.compare_text(shown, actual, "lines", folder="/tmp/y") is not None
    reordered = "gpuprobe: written\n" + actual.replace("gpuprobe: written", "")
    assert _dockit.compare_text(shown, reordered, "lines", folder="/tmp/x") is not None


def test_a_measured_value_that_prints_whole_matches_a_decimal_one() -> None:
    shown = "denoising step  model=m  5  12.9 ms  17.8 ms"
    assert _dockit.compare_text(shown, "denoising step  model=m  5  13 ms  17.8 ms", "lines") is None
    assert _dockit.compare_text(shown, "denoising step  model=m  5  13 s  17.8 ms", "lines") is not None


def test_head_and_part_are_exact_on_the_lines_they_show() -> None:
    actual = "a\nb\nc\nd\n"
    assert _dockit.compare_text("a\nb", actual, "head") is None
    assert _dockit.compare_text("b\nc", actual, "part") is None
    assert _dockit.compare_text("b\nd", actual, "part") is not None
    assert _dockit.compare_text("b\nc", actual, "head") is not None


def test_a_shown_value_gives_keys_and_types() -> None:
    actual = {"version": "0.1.0", "device": "cpu", "rank": 0, "exporters": [{"kind": "prometheus"}], "more": 1}
    assert _dockit.compare_value(_dockit.parse_value("{'version': '9', 'device': 'cuda:0', 'exporters': [...]}"),
                                 actual) is None
    assert "no key 'nvtx'" in (_dockit.compare_value({"nvtx": "nvtx"}, actual) or "")
    assert "shown a number" in (_dockit.compare_value({"device": 0}, actual) or "")
    assert _dockit.compare_value({"rank": 1}, actual, "exact") is not None
    assert _dockit.find_value({"kind": "prometheus"}, actual, "exact")


def test_commands_are_read_as_bash_reads_them() -> None:
    block = Block("x.md", 3, "bash", "a --x 1 \\\n    --y '#not' # comment\n# only a comment\nb $(c) # 'q'")
    assert [(c.text, c.offset) for c in _dockit.shell_commands(block)] == [("a --x 1 --y '#not'", 0), ("b $(c)", 3)]
    transcript = Block("x.md", 3, "", "$ one\nout 1\n\n$ two # why\nout 2")
    assert transcript.kind == "transcript"
    assert [(c.text, c.shown) for c in _dockit.shell_commands(transcript)] == [("one", "out 1\n"), ("two", "out 2")]


def test_every_text_block_says_what_it_is(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("# t\n\n```\nsome output\n```\n\n<!-- doc-test: skip (a diagram) -->\n```\nx\n```\n\n"
                   "<!-- doc-test: skip -->\n```text\ny\n```\n")
    blocks = _dockit.read_blocks(doc, tmp_path)
    assert [(b.line, b.kind) for b in blocks] == [(3, "unclassified"), (8, "skip"), (13, "skip")]
    assert _dockit.skip_reason(blocks[1].directive) == "a diagram"
    with pytest.raises(ValueError, match="says why"):
        _dockit.skip_reason(blocks[2].directive)


def test_a_transcript_that_drifted_fails_with_its_doc_and_line(tmp_path: Path) -> None:
    import _docrun

    doc = tmp_path / "d.md"
    doc.write_text("# t\n\n```\n$ echo hello\nhello\n$ echo 'a  b'\na  b\n```\n\n```bash\n$ echo hello\nhullo\n```\n")
    blocks = _dockit.read_blocks(doc, tmp_path)
    cwd = os.getcwd()
    try:
        results = _docrun.run_doc("d.md", blocks, tmp_path, {})
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
    assert [(r["id"], r["status"]) for r in results] == [("d.md:3", "passed"), ("d.md:10", "failed")]
    assert "line 11 `echo hello`" in results[1]["message"] and "hullo" in results[1]["message"]


def test_the_table_names_real_things() -> None:
    for rule in _dockit.SKIPS:
        re.compile(rule.pattern)
        assert rule.why and rule.kind in ("shell", "python")
    for sub in _dockit.SUBSTITUTIONS:
        re.compile(sub.pattern)
        assert sub.why
    assert set(_dockit.PRELUDE_FOR) | set(_dockit.SETUP) <= {b.doc for b in BLOCKS}
    for text in re.findall(r"tests/[\w/]+\.py", " ".join(r.why for r in _dockit.SKIPS)
                           + " ".join(b.directive for b in BLOCKS)):
        assert (_dockit.ROOT / text).exists(), text
