"""docs/architecture.md describes the package as it is: its parts list names every module, and no
import runs back up the layer table it declares."""

from __future__ import annotations

import re
from pathlib import Path

from test_structure import import_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuprobe"
DOC = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> dict[str, int]:
    """The layer table of the doc: module or package (dotted, under ``gpuprobe``) -> its layer."""
    layers: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\| (\d+) \| [^|]+ \| (.+) \|$", line)
        if m:
            for name in re.findall(r"`([\w.]+)`", m.group(2)):
                layers["gpuprobe" if name == "gpuprobe" else f"gpuprobe.{name}"] = int(m.group(1))
    return layers


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the most specific entry naming ``module`` or a package above it."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = layers.get(".".join(parts[:i]))
        if found is not None:
            return found
    return None


def back_edges(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return sorted(f"{m} (layer {layer_of(m, layers)}) imports {t} (layer {layer_of(t, layers)})"
                  for m, targets in graph.items() for t in targets
                  if (layer_of(t, layers) or 0) > (layer_of(m, layers) or 0))


def test_every_module_has_a_layer() -> None:
    layers = layer_table(DOC.read_text(encoding="utf-8"))
    assert len(set(layers.values())) >= 5, layers
    assert [m for m in import_graph() if layer_of(m, layers) is None] == []


def test_no_import_runs_back_up_the_layers() -> None:
    layers = layer_table(DOC.read_text(encoding="utf-8"))
    assert back_edges(import_graph(), layers) == []


def test_a_back_edge_is_found() -> None:
    layers = layer_table(DOC.read_text(encoding="utf-8"))
    graph = {"gpuprobe.runtime": {"gpuprobe.integrations.transformers"}, "gpuprobe.integrations.kit":
             {"gpuprobe.integrations._transformers.series"}, "gpuprobe._sync_audit": {"gpuprobe.experiment.remedies"}}
    assert back_edges(graph, layers) == [
        "gpuprobe._sync_audit (layer 1) imports gpuprobe.experiment.remedies (layer 6)",
        "gpuprobe.integrations.kit (layer 3) imports gpuprobe.integrations._transformers.series (layer 5)",
        "gpuprobe.runtime (layer 2) imports gpuprobe.integrations.transformers (layer 5)",
    ]


def test_the_offline_tools_lend_no_module_to_the_layers_below() -> None:
    layers = layer_table(DOC.read_text(encoding="utf-8"))
    top = max(layers.values())
    tools = [name for name, layer in layers.items() if layer == top]
    lent = sorted(name for name, layer in layers.items()
                  if layer < top and any(name.startswith(tool + ".") for tool in tools))
    assert lent == []


# -- the parts list ----------------------------------------------------------------------------------

def listed_paths(text: str) -> tuple[set[str], set[str]]:
    """``(files, folders)`` the parts list names, as paths under ``gpuprobe/``.

    The list is the tree in the first code block after "## The parts": an entry at a deeper indent is
    inside the folder above it; a file may also be named in its folder's description (``seams.py``).
    """
    block = text.split("## The parts", 1)[1].split("```", 2)[1]
    files: set[str] = set()
    folders: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    current = ""
    for line in block.splitlines()[1:]:
        m = re.match(r"( *)(\S+)\s*(.*)", line)
        if not m:
            continue
        indent, name, rest = len(m.group(1)), m.group(2), m.group(3)
        entry = re.fullmatch(r"[\w.]+/|[\w.]+\.py", name)
        if entry and indent <= (stack[-1][0] + 2 if stack else 0) and not (indent > 6 + len(stack) * 2):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            base = stack[-1][1] if stack else ""
            if name == "gpuprobe/":
                stack = [(indent, "")]
                current = ""
                continue
            path = base + name
            if name.endswith("/"):
                folders.add(path)
                stack.append((indent, path))
                current = path
            else:
                files.add(path)
                current = base
        else:
            rest = line
        for named in re.findall(r"(?<![\w/.`])([\w]+\.py)\b", rest):
            files.add(current + named)
    return files, folders


def package_files() -> set[str]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and rel != "__init__.py":
            continue  # a folder's own __init__ goes with the folder
        out.add(rel)
    return out


def test_the_parts_list_names_every_module() -> None:
    files, folders = listed_paths(DOC.read_text(encoding="utf-8"))
    missing = sorted(package_files() - files)
    assert missing == [], "docs/architecture.md, The parts: add these modules"
    folders_missing = sorted({str(Path(f).parent) + "/" for f in package_files() if "/" in f} - folders)
    assert folders_missing == []


def test_the_parts_list_names_nothing_that_is_gone() -> None:
    files, _ = listed_paths(DOC.read_text(encoding="utf-8"))
    real = package_files() | {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")}
    assert sorted(files - real) == []


def test_the_listing_reader_sees_a_missing_module() -> None:
    text = "## The parts\n\n```\ngpuprobe/\n  a.py   x\n  sub/   b.py, c.py\n    d.py  y\n```\n"
    files, folders = listed_paths(text)
    assert files == {"a.py", "sub/b.py", "sub/c.py", "sub/d.py"}
    assert folders == {"sub/"}
