"""Wall time and peak RSS of ``gpuprobe report`` against HolisticTraceAnalysis, on the real traces.

HTA (``pip install HolisticTraceAnalysis``) goes into its own virtual environment,
``benchmarks/report/.venv-hta``, made by this script: it is never installed into the project's
environment nor a dependency of it. Each measurement is a fresh child process (interpreter start
and imports included, as a user would see them); the two tools alternate, first one then the
other, for ``--repeat`` rounds; a child's peak RSS comes from ``os.wait4`` (its own
``rusage``, which ``getrusage(RUSAGE_CHILDREN)`` would mix with earlier children). Medians and
ratios go into RESULTS.md.

What each side does: gpuprobe computes and renders its full report (every section, text);
HTA builds ``TraceAnalysis(trace_dir=...)`` and calls ``get_gpu_kernel_breakdown()``.

Example:
    python benchmarks/report/bench_vs_hta.py --repeat 7
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from _results import machine, update_section  # noqa: E402

HTA_VENV = HERE / ".venv-hta"
HTA_PACKAGE = "HolisticTraceAnalysis==0.5.0"
TRACES = sorted((ROOT / "tests" / "data" / "kineto").glob("*.json.gz"))
GPUPROBE_CHILD = (
    "import sys; from gpuprobe.report import analyze, render; sys.stdout.write(render(analyze(sys.argv[1]), 'text'))"
)
HTA_CHILD = (
    "import sys; from hta.trace_analysis import TraceAnalysis; "
    "TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)"
)


def hta_python() -> Path:
    """The HTA environment's interpreter, made (and HTA installed) on first use."""
    python = HTA_VENV / "bin" / "python"
    if python.exists():
        check = subprocess.run([str(python), "-c", "import hta"], capture_output=True)
        if check.returncode == 0:
            return python
    print(f"creating {HTA_VENV} and installing {HTA_PACKAGE} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(HTA_VENV)], check=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", HTA_PACKAGE], capture_output=True, text=True)
    if pip.returncode != 0:
        lines = [line for line in pip.stderr.splitlines() if line.strip() and "WARNING" not in line]
        raise RuntimeError(f"pip could not install {HTA_PACKAGE}: {lines[-1] if lines else 'no message'}")
    return python


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run one child; return (wall seconds, its peak RSS in MB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {err.decode(errors='replace')[-500:]}")
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds per trace (at least 5)")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args(argv)
    repeat = max(5, args.repeat)
    try:
        hta = hta_python()
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        body = f"## gpuprobe vs HolisticTraceAnalysis\n\nNot measured: {exc}"
        print(body, file=sys.stderr)
        if not args.no_write:
            update_section("hta", body)
        return 1
    hta_version = subprocess.run(
        [str(hta), "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace in TRACES:
            folder = Path(tmp) / trace.name.split(".")[0]  # HTA reads every trace of a folder
            folder.mkdir()
            shutil.copy(trace, folder / trace.name)
            tools = {
                "gpuprobe": [sys.executable, "-c", GPUPROBE_CHILD, str(folder / trace.name)],
                "hta": [str(hta), "-c", HTA_CHILD, str(folder)],
            }
            samples: dict[str, list[tuple[float, float]]] = {"gpuprobe": [], "hta": []}
            for i in range(repeat):
                order = ["gpuprobe", "hta"] if i % 2 == 0 else ["hta", "gpuprobe"]
                for tool in order:
                    samples[tool].append(run(tools[tool], env))
            med = {
                t: (statistics.median(w for w, _ in s), statistics.median(r for _, r in s)) for t, s in samples.items()
            }
            rows.append((trace.name, med["gpuprobe"], med["hta"]))
            print(
                f"{trace.name}: gpuprobe {med['gpuprobe'][0]:.2f} s {med['gpuprobe'][1]:.0f} MB; "
                f"HTA {med['hta'][0]:.2f} s {med['hta'][1]:.0f} MB",
                file=sys.stderr,
            )
    lines = [
        "## gpuprobe vs HolisticTraceAnalysis (real traces)",
        "",
        f"{datetime.date.today()}, {machine()}; HolisticTraceAnalysis {hta_version} in its own venv; "
        f"medians of {repeat} interleaved runs, each a fresh process; "
        "`python benchmarks/report/bench_vs_hta.py`",
        "",
        "gpuprobe: full report, every section, rendered as text. HTA: `TraceAnalysis(trace_dir=...)` + "
        "`get_gpu_kernel_breakdown()`.",
        "",
        "| trace | gpuprobe wall | HTA wall | speed-up | gpuprobe peak RSS | HTA peak RSS | RSS ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (gw, gr), (hw, hr) in rows:
        lines.append(
            f"| {name} | {gw:.2f} s | {hw:.2f} s | {hw / gw:.1f}x | {gr:.0f} MB | {hr:.0f} MB | {gr / hr:.2f} |"
        )
    lines += ["", "Goal: a speed-up of 3x or more and an RSS ratio of 0.25 or less."]
    print("\n".join(lines))
    if not args.no_write:
        update_section("hta", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
