"""Check that a change leaves the JSON reports unchanged, byte for byte, on every trace of tests/data.

``--record DIR`` writes the JSON report of every case into DIR with the tree given by ``--tree``
(a checkout or ``git archive`` of the revision to compare against; default: this tree);
``--compare DIR`` writes them again (with this tree, or ``--tree``) and lists the cases whose bytes differ. Cases:
every kineto trace under tests/data with each JSON engine (msgspec, stdlib, ijson) and each column
backend (python, numpy); the Nsight Systems exports (decompressed under /tmp) with each backend;
the multi-rank directory through the command line (``--format json``); and any ``--extra`` trace
(a large synthetic or real-shaped one: the default engine, numpy, and stdlib as well).

Example:
    git archive HEAD gpuprobe | tar -x -C /tmp/base
    python benchmarks/report/same_output.py --record /tmp/out-base --tree /tmp/base
    python benchmarks/report/same_output.py --compare /tmp/out-base
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

# One child process per tree writes every case: (name, kind, path, engine, backend).
_CHILD = r"""
import json, sys
from pathlib import Path
from gpuprobe.report import analyze, render
from gpuprobe.report.cli import main_report
out = Path(sys.argv[1])
for line in sys.stdin.read().splitlines():
    name, kind, path, engine, backend = line.split("\t")
    target = out / (name + ".json")
    try:
        if kind == "cli":
            rc = main_report([path, "--format", "json", "--output", str(target), "--no-progress"])
            if rc != 0:
                target.write_text(f"exit {rc}\n")
        else:
            target.write_text(render(analyze(path, engine=engine, backend=backend), "json"))
    except Exception as exc:  # recorded, so that an error compares like an output
        target.write_text(f"error {type(exc).__name__}: {exc}\n")
"""


def cases(extra: list[str]) -> list[tuple[str, str, str, str, str]]:
    """(name, kind, path, engine, backend) of every case."""
    out = []
    kineto = sorted(
        p for p in DATA.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")) and "ncu" != p.parent.name
    )
    for p in kineto:
        rel = str(p.relative_to(DATA)).replace("/", "__")
        for engine in ("msgspec", "stdlib", "ijson"):
            for backend in ("python", "numpy"):
                out.append((f"{rel}.{engine}.{backend}", "api", str(p), engine, backend))
    tmp = Path(tempfile.gettempdir()) / "gpuprobe-same-output-nsys"
    tmp.mkdir(exist_ok=True)
    for p in sorted((DATA / "nsys").glob("*.sqlite.xz")):
        db = tmp / p.name.removesuffix(".xz")
        if not db.exists():
            with lzma.open(p) as src, open(db, "wb") as dst:
                shutil.copyfileobj(src, dst)
        for backend in ("python", "numpy"):
            out.append((f"nsys__{db.name}.{backend}", "api", str(db), "auto", backend))
    for d in sorted(p for p in (DATA / "kineto").iterdir() if p.is_dir()):
        out.append((f"dir__{d.name}", "cli", str(d), "auto", "auto"))
    for x in extra:
        name = Path(x).name
        out.append((f"extra__{name}.auto.numpy", "api", x, "auto", "numpy"))
        out.append((f"extra__{name}.stdlib.numpy", "api", x, "stdlib", "numpy"))
    return out


def write(target: Path, tree: Path, extra: list[str]) -> list[str]:
    """Write every case's output into ``target`` with the code of ``tree``; the case names."""
    target.mkdir(parents=True, exist_ok=True)
    todo = cases(extra)
    env = dict(os.environ, PYTHONPATH=str(tree))
    lines = "\n".join("\t".join(c) for c in todo)
    # cwd: an empty folder, not ROOT, whose gpuprobe `python -c` would import before the tree's (the working
    # folder comes first on its path)
    with tempfile.TemporaryDirectory() as empty:
        subprocess.run([sys.executable, "-c", _CHILD, str(target)], input=lines, text=True, env=env, check=True,
                       cwd=empty)
    return [c[0] for c in todo]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="DIR", help="write the reference outputs here")
    group.add_argument("--compare", metavar="DIR", help="compare this tree's outputs with those recorded here")
    parser.add_argument("--tree", default=str(ROOT), help="the source tree to run (default: this one)")
    parser.add_argument("--extra", nargs="*", default=[], help="more traces (large ones: default engine and stdlib)")
    args = parser.parse_args(argv)
    if args.record:
        names = write(Path(args.record), Path(args.tree), args.extra)
        print(f"recorded {len(names)} outputs in {args.record}")
        return 0
    ref = Path(args.compare)
    with tempfile.TemporaryDirectory() as tmp:
        names = write(Path(tmp), Path(args.tree), args.extra)
        differ = []
        for name in names:
            a, b = ref / (name + ".json"), Path(tmp) / (name + ".json")
            if not a.exists() or a.read_bytes() != b.read_bytes():
                differ.append(name)
                if a.exists():
                    shutil.copy(b, ref / (name + ".json.new"))  # kept beside the reference, to diff
    for name in differ:
        print("DIFFERS", name)
    print(f"{len(names) - len(differ)} of {len(names)} outputs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
