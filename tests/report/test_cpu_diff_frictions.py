"""`gpuprobe report` and `gpuprobe diff` of CPU traces made by gpuprobe's own profile window: a tiny Llama
(built from a config) generating on the CPU with a slow logits processor of the user's (``ClampOutliers``,
one ``.item()`` per score) and without it.

What a user reads there: the plot's per-step bars by range, evidence whose names say the unit of their
values, the host-sync remedy as a list of short lines, the CPU time of each range (and no empty GPU
table), and a diff that names the processor it no longer runs with its time per step, fills its ranges'
per-step medians and spreads, and says "the findings below" only above some. Expected figures come from
the raw events of the traces, read with plain ``json``; quantiles with numpy's ``percentile``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.report import analyze, diff, render

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
np = pytest.importorskip("numpy")

PROMPT, NEW, WINDOW = 8, 12, "2-9"  # the window: steps 2 to 9 of the 12 of one generate()
WINDOW_STEPS = 8
STEP = re.compile(r"^gpuprobe\.step#\d+$")


class ClampOutliers(transformers.LogitsProcessor):
    """Moves every score beyond three standard deviations of its row to the row's mean, one score at a
    time in Python: a ``.item()`` per score, the slow processor a report should name."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        for row in range(scores.shape[0]):
            mean, std = scores[row].mean().item(), scores[row].std().item()
            for i in range(scores.shape[-1]):
                if abs(scores[row, i].item() - mean) > 3 * std:
                    scores[row, i] = mean
        return scores


def _record(path: Path, processors: list[Any]) -> list[int]:
    """A profile window over steps ``WINDOW`` of one instrumented generate(); the tokens it generated."""
    import gpuprobe
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.testing import reset

    reset()  # step indexes from 0: the window's steps are this generate()'s
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # why: on 2 busy cores torch's default threads made each forward 20x slower
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                      max_position_embeddings=256)
    model = instrument(transformers.LlamaForCausalLM(config).eval())
    ids = torch.arange(3, PROMPT + 3).unsqueeze(0)
    window = gpuprobe.profile(WINDOW, output=str(path))
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                                 do_sample=False, pad_token_id=0,
                                 logits_processor=transformers.LogitsProcessorList(processors))
    finally:
        window.stop()
        uninstrument(model)
        reset()
        torch.set_num_threads(threads)
    assert path.exists(), window
    return out[0, PROMPT:].tolist()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``clamp``: with ClampOutliers; ``plain``: without it."""
    folder = tmp_path_factory.mktemp("clamp")
    out = {"clamp": folder / "clamp.json", "plain": folder / "plain.json"}
    for name, path in out.items():
        assert len(_record(path, [ClampOutliers()] if name == "clamp" else [])) == NEW
    return out


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]


def _steps(path: Path, events: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The step ranges in time order (of ``events``, the trace's own when not given)."""
    events = _events(path) if events is None else events
    return sorted((e for e in events if e.get("cat") == "user_annotation" and STEP.match(e["name"])),
                  key=lambda e: e["ts"])


def _inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
    return (e is not outer and e["tid"] == outer["tid"] and outer["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"])


def _components(path: Path) -> list[dict[str, int]]:
    """Per step (in time order): the CPU time of each range directly inside the step's range, by name."""
    events = _events(path)
    ranges = [e for e in events if e.get("cat") == "user_annotation"]
    out = []
    for step in _steps(path, events):
        within = [e for e in ranges if _inside(e, step)]
        direct = [e for e in within if not any(_inside(e, other) for other in within)]
        by_name: dict[str, int] = {}
        for e in direct:
            by_name[e["name"]] = by_name.get(e["name"], 0) + to_ns(e["dur"])
        out.append(by_name)
    return out


def _as_shown(ns: float) -> str:
    """A time as a report shows it: ns, µs, ms or s with three decimals (written here, not imported)."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


# ------------------------------------------------------------------------------------------------ the plot


def test_the_plot_of_a_cpu_trace_stacks_each_step_by_its_ranges(traces: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gpuprobe.report._render import OTHER, figure, plot

    path = traces["clamp"]
    expected = _components(path)
    step_ns = [to_ns(e["dur"]) for e in _steps(path)]
    assert len(expected) == WINDOW_STEPS and all("ClampOutliers" in c and "forward" in c for c in expected)
    report = analyze(path, sections=["categories", "steps"])
    assert [row.ranges for row in report.steps.rows] == expected  # the report keeps them, per step

    fig = figure(report)
    top, bottom = fig.axes[:2]
    assert "CPU time by range" in top.get_title() and "CPU time by range" in bottom.get_title()
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in bottom.containers}
    names = list(dict.fromkeys(n for c in expected for n in c))  # in order of first appearance
    assert list(bars) == names + [OTHER]
    for name in names:
        assert bars[name] == pytest.approx([c.get(name, 0) / 1e6 for c in expected])
    # what none of the ranges holds: the step's own time (token selection, generate's loop)
    assert bars[OTHER] == pytest.approx([(s - sum(c.values())) / 1e6 for s, c in zip(step_ns, expected)])
    # the stacks reach the step's CPU time, the black line
    line = bottom.get_lines()[0]
    assert list(line.get_ydata()) == pytest.approx([s / 1e6 for s in step_ns])
    # the breakdown above: each range's CPU time over the steps
    top_bars = {label.get_text(): p.get_width() for label, p in zip(top.get_yticklabels(), top.patches)}
    assert top_bars["ClampOutliers"] == pytest.approx(sum(c["ClampOutliers"] for c in expected) / 1e6)

    png = tmp_path / "clamp.png"
    plot(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_of_a_gpu_trace_still_stacks_categories(kineto_min: Path) -> None:
    pytest.importorskip("matplotlib")
    from gpuprobe.report._render import figure

    report = analyze(kineto_min)
    bottom = figure(report).axes[1]
    assert "GPU time by category" in bottom.get_title()
    assert {c.get_label() for c in bottom.containers} == set(report.steps.rows[0].categories)


# ---------------------------------------------------------------------------------------- the report's words


def test_evidence_names_a_time_without_ns_and_shows_it_in_units(traces: dict[str, Path]) -> None:
    report = analyze(traces["clamp"])
    as_json = json.loads(render(report, "json"))["findings"]
    text = render(report, "text")
    evidence = [line for line in text.splitlines() if line.startswith("   evidence: ")]
    assert len(evidence) == len(as_json)
    for line, finding in zip(evidence, as_json):
        assert not re.search(r"_ns=", line), line  # a name that says ns never holds a value in ms
        stake = finding["evidence"]["at_stake_ns"]
        assert isinstance(stake, int)  # JSON keeps integer nanoseconds under the _ns name
        assert line.startswith(f"   evidence: at_stake={_as_shown(stake)}")
    sync = next(f for f in as_json if f["id"] == "host_sync")
    cpu = sync["evidence"]["would_sync_on_gpu"]["cpu_ns"]
    assert f"would_sync_on_gpu.cpu={_as_shown(cpu)}" in text


def test_the_host_sync_remedy_is_a_list_of_short_lines(traces: dict[str, Path]) -> None:
    report = analyze(traces["clamp"])
    sync = next(f for f in report.findings if f.id == "host_sync")
    assert sync.severity == "warning"
    items = sync.remedy.split("\n")
    assert len(items) >= 5 and items[-1].startswith("Measure it: gpuprobe try")
    lines = render(report, "text").splitlines()
    at = lines.index("   remedy:", next(i for i, line in enumerate(lines) if "] host_sync:" in line))
    block = []
    for line in lines[at + 1:]:
        if not line.startswith("     "):
            break
        block.append(line)
    assert all(len(line) <= 100 for line in block)
    shown: list[str] = []  # one bullet an item, its continuation lines indented under it
    for line in block:
        if line.startswith("     - "):
            shown.append(line[len("     - "):])
        else:
            assert line.startswith("       ") and shown
            shown[-1] += " " + line.strip()
    assert shown == items
    # the words of before, nothing lost: the device-side advice, the stopping check, the command
    for words in ("avoid .item()", "torch.where", "non_blocking=True", "GPUPROBE_SYNC_AUDIT", "DeferredStopCheck"):
        assert words in sync.remedy
    md = render(report, "md").splitlines()
    at = md.index("  - remedy:", next(i for i, line in enumerate(md) if "`host_sync`" in line))
    assert md[at + 1:at + 1 + len(items)] == [f"    - {item}" for item in items]


def test_a_cpu_trace_shows_the_cpu_time_of_each_range_and_no_empty_gpu_table(traces: dict[str, Path]) -> None:
    path = traces["clamp"]
    report = analyze(path)
    per_step = [c.get("ClampOutliers", 0) for c in _components(path)]
    p10, median, p90 = np.percentile(per_step, [10, 50, 90])
    row = next(r for r in report.ranges.rows if r.name == "ClampOutliers")
    # within 1 ns: an interpolated quantile rounds to whole ns, and float arithmetic may tip a half either way
    assert [row.cpu_step_p10_ns, row.cpu_step_median_ns, row.cpu_step_p90_ns] == pytest.approx([p10, median, p90],
                                                                                             abs=1)
    median = row.cpu_step_median_ns
    for fmt in ("text", "md"):
        text = render(report, fmt)
        assert "GPU time per range" not in text and "CPU time per range" in text
        assert _as_shown(median) in next(line for line in text.splitlines() if "/ClampOutliers" in line)
    assert "GPU busy" not in render(analyze(path, sections=["ranges"]), "text")
    # a GPU trace keeps its table; CSV has the same columns for both
    gpu = analyze(Path(__file__).parents[1] / "data" / "kineto_min.json", sections=["ranges"])
    assert "GPU time per range" in render(gpu, "text")
    header = render(analyze(path, sections=["ranges"]), "csv").splitlines()[0]
    assert header == render(gpu, "csv").splitlines()[0]
    assert {"gpu_busy_ns", "cpu_step_median_ns", "cpu_step_p10_ns", "cpu_step_p90_ns"} <= set(header.split(","))


# ------------------------------------------------------------------------------------------------------ diff


def test_a_diff_names_the_processor_it_no_longer_runs_with_its_time_per_step(traces: dict[str, Path]) -> None:
    clamp = [e for e in _events(traces["clamp"]) if e["name"] == "ClampOutliers"]
    per_step = sum(to_ns(e["dur"]) for e in clamp) / len(_steps(traces["clamp"]))
    d = diff(traces["clamp"], traces["plain"])
    removed = [f for f in d.findings if f.id == "removed_range"]
    assert [f.evidence["path"] for f in removed] == ["gpuprobe.step#N/ClampOutliers"]
    f = removed[0]
    assert f.evidence["cpu_ns"] == pytest.approx(per_step)
    assert f.title.startswith(f"ClampOutliers removed (in A only): -{_as_shown(per_step)} of CPU time per step")
    assert f.severity == "info" and f.asks_nothing  # a saving: nothing to undo
    assert f.evidence["calls"] == len(clamp)
    # the other way round it is work B adds, a warning with its time at stake
    back = [f for f in diff(traces["plain"], traces["clamp"]).findings if f.id == "added_range"]
    assert len(back) == 1 and back[0].severity == "warning" and not back[0].asks_nothing
    assert back[0].title.startswith(f"ClampOutliers added (in B only): +{_as_shown(per_step)} of CPU time per step")
    assert back[0].evidence["at_stake_ns"] == int(per_step * WINDOW_STEPS)
    # ranges both traces run are not findings: the ranges table compares them
    assert not [f for f in d.findings if f.id.endswith("_range") and "ClampOutliers" not in f.title]


def test_the_ranges_of_a_diff_have_their_median_and_spread_across_steps(traces: dict[str, Path]) -> None:
    d = diff(traces["clamp"], traces["plain"])
    rows = {r.key: r for r in d.ranges if r.metric == "cpu_ns"}
    for side, path in (("a", traces["clamp"]), ("b", traces["plain"])):
        forward = [c["forward"] for c in _components(path)]
        p10, median, p90 = np.percentile(forward, [10, 50, 90])
        row = rows["gpuprobe.step#N/forward"]
        assert getattr(row, f"{side}_median") == pytest.approx(median, abs=1)  # whole ns, as above
        assert getattr(row, f"{side}_spread") == pytest.approx(p90 - p10, abs=2)
    removed = rows["gpuprobe.step#N/ClampOutliers"]
    assert removed.a_median is not None and removed.b_median is None  # B has no such range: no steps of it
    # no GPU figure in two CPU traces: no GPU busy rows of "-" against "0 ns"
    assert not [r for r in d.ranges if r.metric == "gpu_busy_ns"]
    text = render(d, "text")
    table = text[text.index("\nRanges\n"):]
    forward_line = next(line for line in table.splitlines() if line.startswith("gpuprobe.step#N/forward "))
    assert forward_line.split()[-4:] != ["-", "-", "-", "-"]


def test_a_cpu_diff_leaves_out_the_gpu_sections(traces: dict[str, Path], kineto_min: Path) -> None:
    text = render(diff(traces["clamp"], traces["plain"]), "text")
    for title in ("GPU time by category", "Kernel families", "Memory operations"):
        assert f"\n{title}\n" not in text
    assert "no GPU activity in A or B: the GPU sections are left out" in text
    assert "\nRanges\n" in text and "\nCPU operators\n" in text
    gpu = render(diff(kineto_min, kineto_min), "text")
    assert "\nGPU time by category\n" in gpu and "left out" not in gpu


def test_the_verdict_points_at_findings_below_only_when_some_follow(traces: dict[str, Path]) -> None:
    d = diff(traces["clamp"], traces["plain"])
    verdict, below = d.findings[0], d.findings[1:]
    assert verdict.id == "verdict" and below  # the removed processor at least
    if "below" in verdict.remedy:
        assert "what remains" not in verdict.remedy or any(not f.asks_nothing for f in below)
    # with every range change under the threshold, nothing follows the verdict, and it says nothing of below
    alone = diff(traces["clamp"], traces["plain"], thresholds=["regression.min_ns=1e15"])
    assert [f.id for f in alone.findings] == ["verdict"]
    assert "below" not in alone.findings[0].remedy
