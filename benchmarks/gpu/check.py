"""The GPU check: gpuprobe's doctor, the real-GPU tests and the GPU benchmarks, in one command.

Run through ``scripts/gpu-check`` (which puts this checkout on ``PYTHONPATH``)::

    scripts/gpu-check                 # on a machine with an NVIDIA GPU: ~6 minutes, writes
                                      # benchmarks/RESULTS-gpu.md and benchmarks/RESULTS-gpu.json
    scripts/gpu-check --dry-run       # everything but the CUDA parts, tiny models, the fewest rounds;
                                      # writes to a temporary folder (also what happens without a GPU)

Parts, in order, each within its time budget: ``python -m gpuprobe doctor --json``; ``python -m pytest
tests/cuda -m cuda -q``; the benchmarks of ``benchmarks/gpu/runner.py`` in a child process (each gets a
share of the time left, by weight). Nothing needs the network; a missing package is named before
anything runs (docs/gpu.md, "The GPU check").

Exit status: 0 when the tests passed and every benchmark reported its figures, 1 otherwise, 2 when a
required package is missing or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS-gpu.md"

# (import name, distribution, why) — checked before anything runs.
REQUIRED = (
    ("torch", "torch", "the models and CUDA (preinstalled on the GPU machines)"),
    ("transformers", "transformers", "the models (preinstalled on the GPU machines)"),
    ("pytest", "pytest", "runs tests/cuda (a wheel to carry, with iniconfig, pluggy, pygments)"),
    ("prometheus_client", "prometheus-client", "tests/cuda/test_transformers_cuda.py is skipped without it; "
                                               "a wheel to carry"),
)
# Used when present; their absence is recorded, and changes what is measured as the results say.
OPTIONAL = (
    ("nvtx", "nvtx", "gpuprobe's NVTX backend (without it: torch.cuda.nvtx); a wheel to carry"),
    ("pytest_timeout", "pytest-timeout", "the per-test timeout pyproject.toml sets; a wheel to carry"),
)

# The whole check's time, its parts' limits (seconds), on a GPU and in the dry run.
TOTAL_S = {"gpu": 360.0, "dry": 240.0}
DOCTOR_S = 60.0
TESTS_S = {"gpu": 150.0, "dry": 120.0}
WRITE_MARGIN_S = 10.0  # what writing the results takes, with room to spare
GRACE_S = 20.0  # how long the benchmark process may run past its deadline (a last round's overrun)
ROUNDS = {"gpu": (5, 10_000), "dry": (2, 2)}  # (min, max) rounds per benchmark
DRY_SKIPS = {"generate.graph": "torch.compile (reduce-overhead) on a CPU takes minutes: not run in the dry run"}


class MissingPackage(SystemExit):
    """A required package is missing (exit status 2); the message has been printed."""


def preflight() -> dict[str, Any]:
    """Which packages are there; raises :class:`MissingPackage` (exit 2) naming the first missing one."""
    found: dict[str, Any] = {}
    for name, dist, why in REQUIRED:
        try:
            if name == "pytest":
                importlib.import_module(name)  # its own dependencies come with it: import it
            elif importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named {name!r}")
        except ImportError as exc:
            print(f"gpu-check: missing Python package {dist!r} ({why}): {exc}.\n"
                  f"Carry its wheel and install it offline (docs/gpu.md, 'The GPU check'):\n"
                  f"  python -m pip install --no-index --no-deps --target DIR wheels/*.whl\n"
                  f"  PYTHONPATH=DIR scripts/gpu-check", file=sys.stderr)
            raise MissingPackage(2) from None
        found[dist] = _version(dist)
    for name, dist, why in OPTIONAL:
        try:
            present = importlib.util.find_spec(name) is not None
        except ImportError:
            present = False
        found[dist] = _version(dist) if present else None
        if found[dist] is None:
            print(f"gpu-check: {dist} is not installed ({why}); going on without it", file=sys.stderr)
    return found


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def cuda_devices() -> int:
    """CUDA devices torch sees (NVML: the parent process initializes no CUDA context)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.version.cuda else 0
    except Exception:
        return 0


def checkout() -> dict[str, Any]:
    """The gpuprobe sources measured: the git commit when there is one, and a hash of gpuprobe/*.py."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "gpuprobe").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    out: dict[str, Any] = {"sources_sha256": digest.hexdigest()[:16], "commit": "unknown (no git checkout)",
                           "modified": None}
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
            status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10)
            out["modified"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def doctor() -> dict[str, Any]:
    """``python -m gpuprobe doctor --json``: its JSON, or its text, or that this gpuprobe has none."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "gpuprobe", "doctor", "--json"], capture_output=True,
                             text=True, timeout=DOCTOR_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"available": True, "status": f"timed out after {DOCTOR_S:.0f} s"}
    res: dict[str, Any] = {"available": True, "exit_status": out.returncode,
                           "elapsed_s": round(time.perf_counter() - t0, 1)}
    if out.returncode != 0 and "unknown command 'doctor'" in out.stderr:
        return {"available": False, "status": "doctor: not available (this gpuprobe has no doctor command)"}
    try:
        res["report"] = json.loads(out.stdout)
    except json.JSONDecodeError:
        res["output"] = out.stdout[-8000:]
    if out.stderr.strip():
        res["stderr"] = out.stderr[-4000:]
    return res


def run_tests(limit_s: float, path: str = "tests/cuda") -> dict[str, Any]:
    """``python -m pytest tests/cuda -m cuda -q`` within ``limit_s``; counts from its JUnit XML."""
    cmd = [sys.executable, "-m", "pytest", path, "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        junit = Path(tmp) / "junit.xml"
        try:
            out = subprocess.run([*cmd, f"--junitxml={junit}"], capture_output=True, text=True, timeout=limit_s,
                                 cwd=ROOT)
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stdout or b"")
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            return {"command": " ".join(cmd[1:]), "status": f"timed out after {limit_s:.0f} s",
                    "passed": False, "output_tail": tail[-3000:]}
        res: dict[str, Any] = {"command": "python " + " ".join(cmd[1:]), "exit_status": out.returncode,
                               "elapsed_s": round(time.perf_counter() - t0, 1),
                               "output_tail": (out.stdout + out.stderr)[-3000:]}
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        res["summary"] = lines[-1].strip("= ") if lines else ""
        if junit.exists():
            res.update(_junit_counts(junit))
    # pytest: 0 all passed, 5 nothing collected (every test deselected or skipped at collection)
    res["passed"] = out.returncode in (0, 5) and not res.get("failed_tests")
    return res


def _junit_counts(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in root.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {**counts, "failed_tests": failed}


def run_benchmarks(parts: list[str], size: str, deadline: float, rounds: tuple[int, int], *,
                   grace_s: float = 60.0, runner: str = "benchmarks.gpu.runner",
                   say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark process and read its lines as they come; a crashed process is started again
    for the parts left.

    Args:
        parts: names of the runner's parts, in order.
        size: the models' size (``gpu`` or ``tiny``).
        deadline: ``time.time()`` by which the last round should end.
        rounds: the fewest and the most rounds of each part.
        grace_s: how long past the deadline the process may run (a part past its share still ends its
            fewest rounds) before it is stopped and its unfinished part reported.
        runner: the module run with ``python -m``.
        say: told of each part's start and end (progress for the terminal).
    """
    environment: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    left = list(parts)
    while left:
        cmd = [sys.executable, "-m", runner, "--parts", ",".join(left), "--size", size,
               "--deadline", str(deadline), "--min-rounds", str(rounds[0]), "--max-rounds", str(rounds[1])]
        current: str | None = None
        progressed = False

        def read(line: str) -> None:
            nonlocal environment, current, progressed
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                return  # a library's own print
            kind = event.pop("kind", None)
            if kind == "environment":
                environment = event["environment"]
            elif kind == "start":
                current = event["part"]
                progressed = True
                results[current] = {"status": "started", "budget_s": round(event["budget_s"], 1)}
                if say:
                    say(f"{current}: started, {event['budget_s']:.0f} s for its rounds")
            elif kind in ("result", "failed"):
                name = event.pop("part")
                results[name].update(status="ok" if kind == "result" else "failed", **event)
                left.remove(name)
                current = None
                if say:
                    say(f"{name}: {'done' if kind == 'result' else 'FAILED: ' + event.get('error', '')} "
                        f"in {event.get('elapsed_s', 0):.0f} s")

        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
            assert proc.stdout is not None
            reader = threading.Thread(target=lambda: [read(line) for line in proc.stdout], daemon=True)
            reader.start()
            try:
                proc.wait(timeout=max(deadline + grace_s - time.time(), 1))
                timed_out = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                timed_out = True
            reader.join(timeout=10)
            err.seek(0)
            stderr = err.read()
        if current is not None:  # started and never reported: it took the process down or ran out of time
            why = "stopped: out of time" if timed_out else f"the process ended (exit status {proc.returncode})"
            results[current].update(status="failed", error=why, stderr=stderr[-3000:])
            left.remove(current)
        elif left and not progressed:  # it died before starting any (an import error, say)
            for name in left:
                results[name] = {"status": "failed", "error": f"not run: the benchmark process failed "
                                                              f"(exit status {proc.returncode})",
                                 "stderr": stderr[-3000:]}
            left = []
        if left and time.time() > deadline:
            for name in left:
                results[name] = {"status": "failed", "error": "not run: the time budget was spent"}
            left = []
    return {"environment": environment, "parts": results}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu import runner, report

    ap = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0],
                                 epilog="scripts/gpu-check --wheels DIR ... (first) installs DIR/*.whl offline into a "
                                        "temporary folder on PYTHONPATH first (docs/gpu.md, 'The GPU check').")
    ap.add_argument("--dry-run", action="store_true",
                    help="no CUDA parts, tiny models, the fewest rounds; results go to a temporary folder")
    ap.add_argument("--out", type=Path, help="folder for RESULTS-gpu.md and RESULTS-gpu.json "
                                             "(default: benchmarks/, or a temporary folder for a dry run)")
    ap.add_argument("--parts", default=",".join(runner.PARTS),
                    help="benchmarks to run, comma-separated (default: all: %(default)s)")
    ap.add_argument("--no-tests", action="store_true", help="leave out pytest tests/cuda")
    ap.add_argument("--no-doctor", action="store_true", help="leave out gpuprobe doctor")
    args = ap.parse_args(argv)
    unknown = [p for p in args.parts.split(",") if p not in runner.PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(runner.PARTS)}")
    t_start = time.time()
    packages = preflight()
    dry_reason = "--dry-run" if args.dry_run else None
    if dry_reason is None and cuda_devices() == 0:
        dry_reason = "no CUDA device: torch sees none"
        print("gpu-check: torch sees no CUDA device: running the dry run instead", file=sys.stderr)
    mode = "dry" if dry_reason else "gpu"
    if dry_reason:
        # Hidden from every part (doctor, tests, benchmarks): a dry run on a GPU machine is the dry run.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    out_dir = args.out or (Path(tempfile.gettempdir()) / "gpuprobe-gpu-check" if dry_reason else RESULTS.parent)
    deadline = t_start + TOTAL_S[mode] - WRITE_MARGIN_S - GRACE_S

    def say(msg: str) -> None:
        print(f"gpu-check [{time.time() - t_start:5.0f} s] {msg}", file=sys.stderr, flush=True)

    say(f"{'dry run (' + dry_reason + ')' if dry_reason else 'GPU run'}; results to {out_dir}")
    results: dict[str, Any] = {
        "schema": 1, "dry_run": dry_reason is not None, "dry_run_reason": dry_reason,
        "started": datetime.datetime.fromtimestamp(t_start, datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "python": platform.python_version()},
        "packages": packages, "gpuprobe": checkout(),
    }
    if args.no_doctor:
        results["doctor"] = {"available": None, "status": "not run (--no-doctor)"}
    else:
        say("python -m gpuprobe doctor --json")
        results["doctor"] = doctor()
    if args.no_tests:
        results["tests"] = {"status": "not run (--no-tests)", "passed": None}
    else:
        say("python -m pytest tests/cuda -m cuda -q")
        results["tests"] = run_tests(min(TESTS_S[mode], max(deadline - time.time() - 60, 30)))
        say(f"tests: {results['tests'].get('summary') or results['tests'].get('status')}")
    parts = args.parts.split(",")
    skipped = {p: DRY_SKIPS[p] for p in parts if dry_reason and p in DRY_SKIPS}
    say(f"benchmarks: {', '.join(p for p in parts if p not in skipped)} (until +{deadline - t_start:.0f} s)")
    bench = run_benchmarks([p for p in parts if p not in skipped], "tiny" if dry_reason else "gpu", deadline,
                           ROUNDS[mode], grace_s=GRACE_S, say=say)
    results["environment"] = bench["environment"]
    results["benchmarks"] = []
    for name in parts:
        entry = {"name": name, "title": runner.PARTS[name].title}
        entry.update({"status": "skipped", "reason": skipped[name]} if name in skipped else bench["parts"][name])
        results["benchmarks"].append(entry)
    results["elapsed_s"] = round(time.time() - t_start, 1)
    ok = (results["tests"].get("passed") is not False
          and all(b["status"] in ("ok", "skipped") for b in results["benchmarks"]))
    results["ok"] = ok
    md, js = report.write(results, out_dir)
    say(f"wrote {md} and {js}")
    print(report.summary(results))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MissingPackage as exc:
        sys.exit(exc.code)
