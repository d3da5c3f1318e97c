"""``gpuprobe.summary()``, the periodic log line (``GPUPROBE_LOG_INTERVAL``) and ``gpuprobe --version``."""

from __future__ import annotations

import bisect
import importlib.metadata
import random
import subprocess
import sys
import time
from html.parser import HTMLParser

import pytest

import gpuprobe
from gpuprobe._summary import LogLine, quantile
from gpuprobe.testing import reset

from helpers import run_python


def _bucketed(values: list[float], bounds: list[float]) -> list[int]:
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1  # a value equal to a bound belongs to it (le)
    return counts


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_a_bucket_quantile_falls_in_the_bucket_of_the_sample_quantile(seed: int, q: float) -> None:
    rng = random.Random(seed)
    bounds = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1]
    values = [rng.lognormvariate(-4.5, 1.0) for _ in range(rng.randint(50, 500))]
    got = quantile(bounds, _bucketed(values, bounds), q, min(values), max(values))
    exact = sorted(values)[max(0, int(q * len(values) + 0.999999) - 1)]  # the nearest-rank quantile
    edges = [min(values), *bounds, max(values)]
    i = bisect.bisect_left(bounds, exact)
    assert edges[i] - 1e-12 <= got <= edges[i + 1] + 1e-12
    assert min(values) <= got <= max(values)


def test_a_quantile_of_nothing_is_nan_and_of_one_value_is_that_value() -> None:
    assert quantile([1.0], [0, 0], 0.5, 0.0, 0.0) != quantile([1.0], [0, 0], 0.5, 0.0, 0.0)
    assert quantile([1.0, 2.0], [0, 1, 0], 0.99, 1.5, 1.5) == 1.5


def test_the_summary_counts_every_call_and_orders_its_quantiles() -> None:
    reset()

    @gpuprobe.probe
    def nap(seconds: float) -> None:
        time.sleep(seconds)

    for i in range(12):
        nap(0.001 * (i % 4))
    table = gpuprobe.summary()
    (row,) = [r for r in table.histograms if r.metric == "gpuprobe.probe.duration" and r.labels["clock"] == "host"]
    assert row.count == 12 and row.title == "probe"
    assert 0.0015 * 0.9 < row.mean  # 12 naps of 0, 1, 2 and 3 ms: at least 1.5 ms on average
    assert row.p50 <= row.p99 <= row.max and row.max >= 0.003
    text = str(table)
    assert "probe" in text and "probe=" in text and "p99" in text.splitlines()[0]
    assert table.to_dict()["histograms"][0]["count"] == 12


def test_the_summary_shows_as_an_html_table_in_a_notebook() -> None:
    reset()
    with gpuprobe.probe("<script>", attrs={"variant": "a&b"}):
        pass
    page = gpuprobe.summary()._repr_html_()

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.text: list[str] = []

        def handle_starttag(self, tag: str, attrs: object) -> None:
            self.tags.append(tag)

        def handle_data(self, data: str) -> None:
            self.text.append(data)

    cells = Cells()
    cells.feed(page)
    assert "script" not in cells.tags and cells.tags.count("table") >= 1
    assert any("probe=<script>" in t and "variant=a&b" in t for t in cells.text)


def test_nothing_measured_says_so() -> None:
    reset()
    assert str(gpuprobe.summary()) == "nothing measured yet"


def _totals(count: int, total: float, counts: list[int]) -> dict[str, tuple[list[int], int, float, float, float]]:
    return {"gen_ai.server.request.duration": (counts, count, total, 0.01, 2.0),
            "gen_ai.client.token.usage:output": (counts, count, 10.0 * count, 1.0, 64.0)}


def test_the_log_line_says_what_happened_since_the_last_one() -> None:
    before = _totals(2, 1.0, [0] * 5 + [2] + [0] * 10)
    after = _totals(6, 3.0, [0] * 5 + [6] + [0] * 10)
    line = LogLine.line(before, after, 2.0)
    assert line == "gpuprobe: last 2 s: 4 requests, generation 20.0 tokens/s"
    assert LogLine.line(after, after, 2.0) is None


def test_the_log_line_is_written_every_interval_while_work_happens(tmp_path: object) -> None:
    proc = run_python("""
        import time, gpuprobe
        @gpuprobe.probe
        def work():
            time.sleep(0.002)
        end = time.monotonic() + 1.6
        while time.monotonic() < end:
            work()
        time.sleep(1.0)
    """, env={"GPUPROBE_LOG_INTERVAL": "0.4", "GPUPROBE_COLLECT_INTERVAL": "0.1"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuprobe: last")]
    busy = [line for line in lines if "probed calls" in line]
    assert len(busy) >= 2, proc.stderr
    assert lines[-1].endswith("nothing measured")
    idle = [line.endswith("nothing measured") for line in lines]
    assert not any(a and b for a, b in zip(idle, idle[1:]))  # an idle interval is said once, then skipped


def test_the_version_is_the_installed_distributions() -> None:
    for flag in ("--version", "-V"):
        done = subprocess.run([sys.executable, "-m", "gpuprobe", flag], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == f"gpuprobe {importlib.metadata.version('gpuprobe')}\n"
