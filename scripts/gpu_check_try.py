"""The GPU check's ``gpuprobe try`` step: the remedies measured on the GPU, their table added to RESULTS-gpu.md.

Run by ``scripts/gpu-check`` after the check itself, with the same arguments (it reads ``--out`` and
``--try``) and the check's RESULTS-gpu.json (whether it was a dry run). On a GPU: ``gpuprobe try`` on the
check's GPU-sized Llama (benchmarks/gpu/_models.py, bf16, a 512-token prompt, 64 new tokens) with a
100 s budget. In a dry run only when asked (``--try``: the check's own dry run has no time to spare),
on the tiny Llama on the CPU for 15 s. Its Markdown becomes the section "gpuprobe try" of
RESULTS-gpu.md, and its command, exit status and time the key ``try`` of RESULTS-gpu.json, both
rewritten atomically.

    python scripts/gpu_check_try.py [--out DIR] [--try]

Exit status: 0 when ``gpuprobe try`` succeeded or was not asked for in a dry run, 1 when it failed (the
section says how), 2 when the check's results are not there to add to. Also a factory for
``gpuprobe try``: ``scripts/gpu_check_try.py:model``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (budget, max_new_tokens, prompt length) on a GPU and in the dry run; the process's limit adds loading and
# a compile's first call (which no budget can interrupt)
PLAN = {"gpu": ("100s", 64, 512), "dry": ("15s", 8, 16)}
LIMIT_S = {"gpu": 300.0, "dry": 120.0}
SECTION = "## gpuprobe try"


def model() -> tuple[Any, dict[str, Any]]:
    """The factory ``gpuprobe try`` loads: the check's Llama (GPU-sized on CUDA, tiny on the CPU) and its prompt."""
    import torch

    from benchmarks.gpu import _models

    size = "gpu" if torch.cuda.is_available() else "tiny"
    m = _models.llama(size)
    _budget, new, length = PLAN["gpu" if size == "gpu" else "dry"]
    ids = _models.prompt(m, length)
    return m, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": new, "do_sample": False}


def _results(out: Path | None, dry_run: bool) -> Path | None:
    """The folder of the check's results: ``--out``, else the one of the two defaults written last."""
    if out is not None:
        return out
    candidates = [Path(tempfile.gettempdir()) / "gpuprobe-gpu-check"] + ([] if dry_run else [ROOT / "benchmarks"])
    written = [c for c in candidates if (c / "RESULTS-gpu.json").exists()]
    return max(written, key=lambda c: (c / "RESULTS-gpu.json").stat().st_mtime) if written else None


def _demote(markdown: str) -> str:
    """The try report's headings two levels down, under the section (# → ###)."""
    return re.sub(r"(?m)^(#+) ", lambda m: "##" + m.group(1) + " ", markdown)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu_check_try.py", description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--try", dest="asked", action="store_true", help="in a dry run too")
    args, _others = ap.parse_known_args(argv)
    out = _results(args.out, args.dry_run)
    if out is None or not (out / "RESULTS-gpu.md").exists() or not (out / "RESULTS-gpu.json").exists():
        print(f"gpu-check: no RESULTS-gpu.md and .json in {out or 'the default folders'} to add the gpuprobe try "
              "section to", file=sys.stderr)
        return 2
    md_path, js_path = out / "RESULTS-gpu.md", out / "RESULTS-gpu.json"
    dry = bool(json.loads(js_path.read_text()).get("dry_run"))
    if dry and not args.asked:
        _add(md_path, js_path, [SECTION, "", "Not run in a dry run (`scripts/gpu-check --dry-run --try` runs it on "
                                             "the CPU)."], {"status": "not run (dry run)"})
        return 0
    mode = "dry" if dry else "gpu"
    with tempfile.TemporaryDirectory(prefix="gpu-check-try-") as tmp:
        return _run(mode, dry, PLAN[mode][0], Path(tmp) / "try.md", md_path, js_path)


def _add(md_path: Path, js_path: Path, lines: list[str], entry: dict[str, Any]) -> None:
    """Put the section at the end of RESULTS-gpu.md (in place of an earlier one) and ``try`` into the JSON."""
    from gpuprobe._files import write_file_atomic

    text = md_path.read_text()
    text = text.split("\n" + SECTION + "\n", 1)[0].rstrip("\n") + "\n\n" + "\n".join(lines).rstrip("\n") + "\n"
    write_file_atomic(md_path, text)
    results = json.loads(js_path.read_text())
    results["try"] = entry
    write_file_atomic(js_path, json.dumps(results, indent=2, default=str) + "\n")


def _run(mode: str, dry: bool, budget: str, report: Path, md_path: Path, js_path: Path) -> int:
    cmd = [sys.executable, "-m", "gpuprobe", "try", f"{Path(__file__).relative_to(ROOT)}:model", "--budget", budget,
           "--format", "markdown", "--output", str(report), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if dry:
        env["CUDA_VISIBLE_DEVICES"] = ""  # as in the check's dry run: the CPU, even on a GPU machine
    print(f"gpu-check: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT_S[mode])
        status: int | None = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        status = None
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    elapsed = time.perf_counter() - t0
    shown = "python -m " + " ".join(cmd[2:9])
    lines = [SECTION, ""]
    if status == 0 and report.exists():
        lines += [f"`{shown}` ({'dry run: the tiny Llama on the CPU' if dry else 'on the GPU'}), {elapsed:.0f} s. "
                  "The remedies gpuprobe's findings name, measured on this machine: gains per round against the "
                  "baseline, median (min–max), a verdict only past the spread.", "", _demote(report.read_text())]
    else:
        why = f"exit status {status}" if status is not None else f"stopped after {LIMIT_S[mode]:.0f} s"
        lines += [f"**Failed** ({why}): `{shown}`", "", "```", stderr[-3000:].rstrip(), "```", ""]
    _add(md_path, js_path, lines, {"status": "ok" if status == 0 else "failed", "command": shown, "dry_run": dry,
                                   "exit_status": status, "elapsed_s": round(elapsed, 1)})
    print(f"gpu-check: gpuprobe try {'done' if status == 0 else 'FAILED'} in {elapsed:.0f} s; added to {md_path}",
          file=sys.stderr)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
