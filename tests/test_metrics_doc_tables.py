"""The metrics reference keeps its prose in docs/metrics.md; ``gpuprobe._docs`` writes only the tables
between the marker lines there (``python -m gpuprobe._docs``), on real copies of the file."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprobe import _docs
from gpuprobe._docs import TABLES, fill_tables

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-m", "gpuprobe._docs", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _prose(text: str) -> list[str]:
    """The lines of the reference outside its generated tables."""
    out, inside = [], False
    for line in text.splitlines():
        if line.endswith("table: generated, do not edit -->"):
            inside = True
        elif line.startswith("<!-- end ") and line.endswith(" table -->"):
            inside = False
        elif not inside:
            out.append(line)
    return out


def test_the_generator_holds_no_prose_of_the_reference() -> None:
    tree = ast.parse(Path(_docs.__file__).read_text(encoding="utf-8"))
    literals = " ".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    prose = [line for line in _prose(DOC.read_text(encoding="utf-8")) if len(line) > 30 and not line.startswith("|")]
    assert len(prose) > 100  # the reference's text is in the Markdown
    assert [line for line in prose if line in literals] == []


def test_every_table_has_its_markers_in_the_reference() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in TABLES:
        begin = f"<!-- {name} table: generated, do not edit -->"
        assert text.count(begin) == 1 and text.count(f"<!-- end {name} table -->") == 1, name
        assert text.index(begin) < text.index(f"<!-- end {name} table -->")


def test_a_stale_table_is_rewritten_and_the_prose_around_it_kept(tmp_path: Path) -> None:
    doc = tmp_path / "metrics.md"
    text = DOC.read_text(encoding="utf-8")
    begin = "<!-- buckets table: generated, do not edit -->\n"
    end = "<!-- end buckets table -->"
    a, b = text.index(begin) + len(begin), text.index(end)
    stale = text[:a] + "| `gone.metric` | 1 2 3 |\n" + text[b:]
    stale = stale.replace("Why these bounds:", "Why these bounds (a sentence written here):")
    doc.write_text(stale, encoding="utf-8")
    assert _run(str(doc), "--check").returncode == 1
    assert doc.read_text(encoding="utf-8") == stale  # --check writes nothing
    done = _run(str(doc))
    assert (done.returncode, done.stderr) == (0, "")
    rewritten = doc.read_text(encoding="utf-8")
    assert "gone.metric" not in rewritten
    assert rewritten[a:].startswith("| name | bucket bounds |\n|---|---|\n")
    assert rewritten == text.replace("Why these bounds:", "Why these bounds (a sentence written here):")
    assert _run(str(doc), "--check").returncode == 0


def test_the_reference_as_committed_is_current() -> None:
    done = _run(str(DOC), "--check")
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(("change", "said"), [
    (lambda t: t.replace("<!-- end dcgm table -->", ""), "the dcgm table has no end marker"),
    (lambda t: t.replace("<!-- exemplars table: generated", "<!-- examples table: generated"),
     "no generated table is named 'examples'"),
    (lambda t: t.replace("<!-- conventions table: generated, do not edit -->\n", "").replace(
        "<!-- end conventions table -->\n", ""), "no markers for the conventions table"),
])
def test_broken_markers_are_one_line_naming_the_problem_and_the_file_is_kept(tmp_path: Path, change, said) -> None:
    doc = tmp_path / "metrics.md"
    broken = change(DOC.read_text(encoding="utf-8"))
    doc.write_text(broken, encoding="utf-8")
    done = _run(str(doc))
    assert done.returncode == 2
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert doc.read_text(encoding="utf-8") == broken
    with pytest.raises(ValueError, match=said.split(" '")[0]):
        fill_tables(broken)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = _run(str(tmp_path / "nowhere.md"))
    assert done.returncode == 2 and "nowhere.md" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    shutil.rmtree(tmp_path, ignore_errors=True)
