"""Draw the overview dashboard's panels with matplotlib, from a Prometheus that scrapes gpuprobe.

Where no Grafana is at hand, this renders the same queries (read from the shipped dashboard JSON,
template variables filled in) with ``query_range`` into one PNG, a subplot per panel::

    # against a Prometheus you run (see docs/grafana.md)
    python deploy/grafana/plot_from_prometheus.py --prometheus http://127.0.0.1:9090 --minutes 10 \
        --out overview.png

    # all in one: start Debian's /usr/bin/prometheus and the demo, warm up 60 s, record, plot, stop both
    python deploy/grafana/plot_from_prometheus.py --run-demo --seconds 150 --out docs/img/overview.png

Needs matplotlib (``pip install 'gpuprobe[report]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from gpuprobe import dashboards as dash  # noqa: E402
from gpuprobe._files import atomic_write, write_file_atomic  # noqa: E402

OVERVIEW = os.path.join(HERE, "dashboards", "gpuprobe-overview.json")
_SCALE = {"s": (1e3, "ms"), "bytes": (1 / 2**20, "MiB"), "percentunit": (100.0, "%")}


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def plot(prometheus: str, out: str, *, start: float, end: float, instance: str | None = None,
         rate_interval: str = "1m", dashboard: str = OVERVIEW, include_gpu_only: bool = False,
         title: str | None = None) -> dict[str, int]:
    """Render every panel of a dashboard JSON file over ``[start, end]`` into ``out`` (PNG).

    Args:
        prometheus: base URL of the Prometheus server.
        out: the PNG to write.
        start: first timestamp (Unix seconds).
        end: last timestamp (Unix seconds).
        instance: restrict to this ``instance`` label (default: every instance).
        rate_interval: what ``$__rate_interval`` becomes.
        dashboard: the dashboard JSON file.
        include_gpu_only: also draw panels that need a GPU (empty on a CPU run).
        title: the figure's title.

    Returns:
        Panel title → number of series drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(dashboard, encoding="utf-8") as f:
        board = json.load(f)
    prom = dash.Prometheus(prometheus, timeout=30)
    values = {"model": ".*", "rank": ".*", "instance": dash.regex_any([instance]) if instance else ".*"}
    panels = [p for p in dash.json_panels(board) if include_gpu_only or not dash.is_gpu_only(p)]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.1 * rows), squeeze=False)
    step = max(1.0, (end - start) / 300)
    drawn: dict[str, int] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        scale, shown = _SCALE.get(unit, (1.0, unit.replace("suffix:", "").strip() if unit != "short" else ""))
        stacked = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode")
        lines = []
        for target in panel["targets"]:
            expr = dash.fill(target["expr"], values, rate_interval)
            for res in prom.query_range(expr, start, end, step):
                pts = [(float(t) - start, float(v) * scale) for t, v in res["values"] if v not in ("NaN", "+Inf")]
                if pts:
                    lines.append((_legend(target.get("legendFormat", ""), res["metric"]), pts))
        if stacked == "normal" and lines:
            _stack(ax, lines)
        else:
            for name, pts in lines:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1.1)
        drawn[panel["title"]] = len(lines)
        ax.set_title(panel["title"] + (" (GPU only)" if dash.is_gpu_only(panel) else ""), fontsize=10)
        ax.set_ylabel(shown, fontsize=8)
        ax.set_xlabel("seconds", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if lines:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if len(lines) > 4 else 1, framealpha=0.6)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title or f"{board['title']} — from Prometheus query_range, {int(end - start)} s", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=80, format="png"), suffix=".png")
    plt.close(fig)
    return drawn


def _stack(ax: Any, lines: list[tuple[str, list[tuple[float, float]]]]) -> None:
    """Stacked areas on the union of timestamps (a missing point counts as 0)."""
    times = sorted({t for _, pts in lines for t, _ in pts})
    base = [0.0] * len(times)
    for name, pts in lines:
        by_t = dict(pts)
        top = [b + by_t.get(t, 0.0) for b, t in zip(base, times, strict=True)]
        ax.fill_between(times, base, top, label=name, alpha=0.7, linewidth=0)
        base = top


# -- --run-demo: a throwaway Prometheus and demo ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2):
                return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {url}")


@contextlib.contextmanager
def _started(cmd: list[str], log: str) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": ROOT})
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def run_demo(out: str, seconds: float, workload: str, warmup: float = 60.0,
             prometheus_bin: str = "/usr/bin/prometheus") -> dict[str, int]:
    """Start Prometheus (2 s scrapes, the shipped rules) and ``workload``; after ``warmup`` seconds (so the
    1 minute rate windows are full) record ``seconds``, plot, and stop both."""
    port, prom_port = _free_port(), _free_port()
    rules = [os.path.join(ROOT, "deploy", "prometheus", name) for name in (dash.RULES_FILE, dash.ALERTS_FILE)]
    config = dash.scrape_config(base_port=port, interval="2s", rule_files=rules)
    with tempfile.TemporaryDirectory(prefix="gpuprobe-plot-") as work:
        path = os.path.join(work, "prometheus.yml")
        write_file_atomic(path, dash.to_yaml(config))
        prom_cmd = [prometheus_bin, f"--config.file={path}", f"--storage.tsdb.path={work}/data",
                    f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]
        demo_cmd = shlex.split(workload.format(python=shlex.quote(sys.executable), port=port))
        with _started(prom_cmd, os.path.join(work, "prometheus.log")) as prom, \
                _started(demo_cmd, os.path.join(work, "demo.log")) as demo:
            _wait(f"http://127.0.0.1:{prom_port}/-/ready", 60, prom)
            _wait(f"http://127.0.0.1:{port}/metrics", 180, demo)
            time.sleep(warmup)
            start = time.time()
            time.sleep(seconds)
            end = time.time()
            return plot(f"http://127.0.0.1:{prom_port}", out, start=start, end=end,
                        title=f"gpuprobe overview, CPU demo run ({int(end - start)} s, tiny Llama, "
                              "Prometheus query_range)")


def main(argv: list[str] | None = None) -> int:
    """Command line: plot from a running Prometheus, or run a throwaway one with the demo."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="overview.png", help="PNG to write (default: %(default)s)")
    p.add_argument("--prometheus", help="Prometheus base URL")
    p.add_argument("--minutes", type=float, default=10, help="with --prometheus: how far back (default: 10)")
    p.add_argument("--instance", help="only this instance (host:port)")
    p.add_argument("--gpu", action="store_true", help="also draw the GPU-only panels")
    p.add_argument("--run-demo", action="store_true", help="start Prometheus and the demo, then plot")
    p.add_argument("--seconds", type=float, default=150, help="with --run-demo: how long to record")
    p.add_argument("--warmup", type=float, default=60, help="with --run-demo: seconds to run before recording")
    p.add_argument("--workload", default="{python} -m gpuprobe demo --port {port}",
                   help="with --run-demo: the command serving /metrics on {port} (default: %(default)s)")
    args = p.parse_args(argv)
    if args.run_demo:
        drawn = run_demo(args.out, args.seconds, args.workload, args.warmup)
    elif args.prometheus:
        end = time.time()
        drawn = plot(args.prometheus, args.out, start=end - 60 * args.minutes, end=end, instance=args.instance,
                     include_gpu_only=args.gpu)
    else:
        p.error("give --prometheus URL or --run-demo")
    for name, n in drawn.items():
        print(f"{n:3d} series  {name}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
