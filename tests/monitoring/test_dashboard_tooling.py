"""The tooling around the dashboards: PromQL checks, the command line's errors, file writing, and
what works without the ``dashboard`` extra. No Prometheus server is started here."""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import os
import pkgutil
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import gpuprobe.dashboards
from gpuprobe import dashboards as dash

from .promstack import DASHBOARD_DIR, PROMETHEUS_DIR, ROOT, shipped_dashboards

SUBMODULES = sorted(m.name for m in pkgutil.iter_modules(gpuprobe.dashboards.__path__) if m.name != "__main__")


def _panel(board: dict[str, Any], title: str) -> Any:
    return next(p for p in dash.json_panels(board) if p["title"] == title)


def _copy_of_shipped(uid: str) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(json.dumps(next(b for b in shipped_dashboards() if b["uid"] == uid)))
    return board


# -- PromQL checks ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("inline", [False, True])
def test_every_generated_query_parses_and_names_known_series(inline: bool) -> None:
    boards = [dash.render(d) for d in dash.dashboards(inline)]
    assert sum(len(p["targets"]) for b in boards for p in dash.json_panels(b)) > 40
    assert [problem for b in boards for problem in dash.check_queries(b)] == []


def test_every_rule_expression_parses_and_names_known_series() -> None:
    assert dash.check_rules(dash.recording_rules()) == []
    assert dash.check_rules(dash.alert_rules(ttft_seconds=0.25)) == []


def test_a_malformed_query_is_reported_naming_dashboard_panel_and_query() -> None:
    board = _copy_of_shipped("gpuprobe-overview")
    expr = "sum(rate(gen_ai_client_token_usage_sum[5m])"  # one ")" short
    _panel(board, "Tokens per second")["targets"][0]["expr"] = expr
    problems = dash.check_queries(board)
    assert len(problems) == 1
    assert problems[0].startswith("dashboard 'gpuprobe-overview', panel 'Tokens per second', query A: "
                                  "not valid PromQL (")
    assert problems[0].endswith(f"): {expr}")


def test_a_query_of_the_wrong_type_is_reported() -> None:
    board = _copy_of_shipped("gpuprobe-ranks")
    # rate() needs a range vector; balanced brackets and known names, so only a parser sees it.
    _panel(board, "Memory allocated by rank")["targets"][0]["expr"] = "rate(gpuprobe_memory_allocated_bytes)"
    problems = dash.check_queries(board)
    assert len(problems) == 1 and "panel 'Memory allocated by rank', query A: not valid PromQL" in problems[0]


def test_a_misspelt_variable_is_reported_by_name() -> None:
    board = _copy_of_shipped("gpuprobe-ranks")
    target = _panel(board, "Requests in flight by rank")["targets"][0]
    target["expr"] = target["expr"].replace("$rank", "$rnak")
    assert dash.check_queries(board) == [
        "dashboard 'gpuprobe-ranks', panel 'Requests in flight by rank', query A: $rnak is not a variable of "
        "the dashboard"]


def test_a_malformed_variable_query_is_reported_naming_the_variable() -> None:
    board = _copy_of_shipped("gpuprobe-overview")
    variable = next(v for v in board["templating"]["list"] if v["name"] == "rank")
    variable["query"] = 'label_values({gpuprobe_rank=~".+", gpuprobe_rank, gpuprobe_rank)'
    problems = dash.check_queries(board)
    assert len(problems) == 1 and problems[0].startswith(
        "dashboard 'gpuprobe-overview', variable 'rank': not valid PromQL")


def test_a_broken_rule_is_reported_naming_group_and_rule() -> None:
    rules = dash.recording_rules()
    rules["groups"][0]["rules"][1]["expr"] = "histogram_quantile(0.95, sum by (le) (rate(x_bucket[1m]))"
    rules["groups"][0]["rules"][2]["expr"] = "gen_ai_server_time_to_first_token_seconds"
    problems = dash.check_rules(rules)
    assert len(problems) == 2
    assert problems[0].startswith("rule group 'gpuprobe-latency', record "
                                  "'gpuprobe:gen_ai_server_time_to_first_token_seconds:p95_rate1m': not valid PromQL")
    assert problems[1] == (
        "rule group 'gpuprobe-latency', record 'gpuprobe:gen_ai_server_time_to_first_token_seconds:p99_rate1m': "
        "gen_ai_server_time_to_first_token_seconds is not a series gpuprobe exports or records "
        "(did you mean gen_ai_server_time_to_first_token_seconds_sum?)")


def test_metric_names_raises_naming_the_query_it_cannot_parse() -> None:
    with pytest.raises(dash.InvalidQueryError, match=r"not valid PromQL \(.+\): sum by \(le\) \($"):
        dash.metric_names("sum by (le) (")


def test_check_mode_fails_on_a_hand_edited_malformed_query(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "dash"
    shutil.copytree(DASHBOARD_DIR, out)
    path = out / "gpuprobe-overview.json"
    board = json.loads(path.read_text())
    _panel(board, "Batch size")["targets"][0]["expr"] += ")"
    path.write_text(json.dumps(board, indent=2, ensure_ascii=False) + "\n")
    assert dash.main(["--check", "--out", str(out), "--prometheus-out", PROMETHEUS_DIR]) == 1
    err = capsys.readouterr().err
    assert "panel 'Batch size', query A: not valid PromQL" in err
    assert f"{path} differs" in err


# -- the command line's errors -------------------------------------------------------------------------------

def _one_line_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert dash.main(args) == 2
    captured = capsys.readouterr()
    lines: list[str] = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprobe dashboard: "), captured.err
    return lines[0]


def test_a_value_of_the_wrong_type_gives_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(capsys, ["--scrape-config", "--ranks", "many"])
    assert "argument --ranks: invalid int value: 'many'" in line and "--help" in line


def test_an_unknown_flag_gives_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: --nodes 2" in _one_line_error(capsys, ["--scrape-config", "--nodes", "2"])


def test_a_verify_url_that_is_not_a_url_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(capsys, ["--verify", "127.0.0.1:9090", "--out", DASHBOARD_DIR])
    assert "--verify must be the URL of a Prometheus server" in line and "'127.0.0.1:9090'" in line


def test_verify_without_dashboards_names_the_out_folder(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    line = _one_line_error(capsys, ["--verify", "http://127.0.0.1:1", "--out", str(tmp_path)])
    assert f"--out {tmp_path} has no gpuprobe-overview.json" in line


def test_verify_names_a_dashboard_file_that_is_not_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(DASHBOARD_DIR, tmp_path / "d")
    (tmp_path / "d" / "gpuprobe-overview.json").write_text("{")
    line = _one_line_error(capsys, ["--verify", "http://127.0.0.1:1", "--out", str(tmp_path / "d")])
    assert f"{tmp_path / 'd' / 'gpuprobe-overview.json'} is not valid JSON" in line


def test_a_bad_var_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(capsys, ["--verify", "http://127.0.0.1:1", "--var", "instance", "--out", DASHBOARD_DIR])
    assert "--var must be NAME=VALUE, got 'instance'" in line


def test_an_out_folder_that_is_a_file_is_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = _one_line_error(capsys, ["--out", str(blocker), "--prometheus-out", str(tmp_path / "p")])
    assert f"--out {blocker}: cannot write there" in line


# -- writing files -------------------------------------------------------------------------------------------

@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_written_files_are_readable_by_others_and_leave_no_temporaries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dashboards, prometheus = tmp_path / "d", tmp_path / "p"
    assert dash.main(["--out", str(dashboards), "--prometheus-out", str(prometheus)]) == 0
    written = sorted(os.listdir(dashboards)) + sorted(os.listdir(prometheus))
    assert written == ["gpuprobe-overview.json", "gpuprobe-ranks.json", "gpuprobe-alerts.yml", "gpuprobe-rules.yml",
                       "prometheus-otel-collector.yml", "prometheus-ranks.yml", "prometheus.yml"]
    for folder in (dashboards, prometheus):
        for name in os.listdir(folder):
            assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o644, name


def test_rewriting_replaces_a_file_instead_of_writing_into_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["--out", str(tmp_path / "d"), "--prometheus-out", str(tmp_path / "p")]
    assert dash.main(args) == 0
    path = tmp_path / "p" / "prometheus.yml"
    path.write_text("edited\n")
    before = os.stat(path).st_ino
    assert dash.main(args) == 0
    assert os.stat(path).st_ino != before  # a new file renamed over the old one
    assert path.read_text() == dash.prometheus_files()["prometheus.yml"]


# -- without the dashboard extra --------------------------------------------------------------------------------

def _run_without_extra(code: str, cwd: str) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\nsys.modules['yaml'] = None\nsys.modules['promql_parser'] = None  # import raises\n"
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_json_dashboards_are_generated_without_the_dashboard_extra(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = _run_without_extra("""
        import json
        from gpuprobe import dashboards
        files = dashboards.dashboard_files()
        print(json.dumps(sorted(files)))
        print(json.dumps(json.loads(files["gpuprobe-ranks.json"])["uid"]))
    """, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ['["gpuprobe-overview.json", "gpuprobe-ranks.json"]', '"gpuprobe-ranks"']


def test_yaml_and_checks_without_the_dashboard_extra_name_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = _run_without_extra("""
        from gpuprobe import dashboards
        from gpuprobe.errors import MissingDependencyError
        for call in (lambda: dashboards.to_yaml({}), lambda: dashboards.metric_names("up")):
            try:
                call()
            except MissingDependencyError as exc:
                print(exc)
        print("exit", dashboards.main(["--out", "d", "--prometheus-out", "p"]))
    """, str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("gpuprobe needs the 'PyYAML' package for this; install it with: "
                        "pip install 'gpuprobe[dashboard]'")
    assert lines[1] == ("gpuprobe needs the 'promql-parser' package for this; install it with: "
                        "pip install 'gpuprobe[dashboard]'")
    assert lines[2] == "exit 2"
    assert done.stderr.strip() == "gpuprobe dashboard: " + lines[0]
    assert os.listdir(tmp_path) == []  # nothing half-written: every file is made before any is written


def test_importing_the_package_imports_neither_tooling_dependency() -> None:
    code = ("import sys, gpuprobe.dashboards, gpuprobe.dashboards.cli\n"
            "print(sorted(m for m in ('yaml', 'promql_parser') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


# -- the package itself --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SUBMODULES)
def test_examples_in_docstrings_run(name: str) -> None:
    module = importlib.import_module(f"gpuprobe.dashboards.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_no_module_of_the_package_imports_the_package_itself() -> None:
    folder = os.path.dirname(gpuprobe.dashboards.__file__)
    offenders = []
    for name in SUBMODULES:
        with open(os.path.join(folder, f"{name}.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
                offenders.append(f"{name}: from . import ...")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "gpuprobe.dashboards":
                offenders.append(f"{name}: from gpuprobe.dashboards import ...")
            if isinstance(node, ast.Import) and any(a.name == "gpuprobe.dashboards" for a in node.names):
                offenders.append(f"{name}: import gpuprobe.dashboards")
    assert offenders == []


def test_python_m_gpuprobe_dashboards_runs_the_same_command() -> None:
    done = subprocess.run([sys.executable, "-m", "gpuprobe.dashboards", "--scrape-config", "--base-port", "9700"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"127.0.0.1:9700"' in done.stdout
