"""Multi-rank reports on the real 8-rank DLRM traces (tests/data/kineto/param_dlrm_8rank, from
facebookresearch/param: see its README): per-rank communication and overlap computed here from the raw
events, ranks from distributedInfo, stragglers, skew, the CLI and diff of two directories."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns

from gpuprobe.errors import ConfigError
from gpuprobe.report import ReportInputError, analyze, diff
from gpuprobe.report._ranks import analyze_ranks
from gpuprobe.report.cli import EXIT_BAD_INPUT, main_diff, main_report

DLRM = Path(__file__).resolve().parents[1] / "data" / "kineto" / "param_dlrm_8rank"
KINETO = DLRM.parent


def _merge(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(pairs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _expected(path: Path) -> dict[str, Any]:
    """Per-rank figures from the raw events: NCCL kernels against the other kernels, per device."""
    trace = read_trace(path)
    kernels = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    comm: dict[Any, list[tuple[int, int]]] = {}
    other: dict[Any, list[tuple[int, int]]] = {}
    for k in kernels:
        span = (to_ns(k["ts"]), to_ns(k["ts"]) + to_ns(k["dur"]))
        (comm if "nccl" in k["name"].lower() else other).setdefault(k["args"]["device"], []).append(span)
    overlap = exposed = 0
    for device, pairs in comm.items():
        c, o = _merge(pairs), _merge(other.get(device, []))
        both = sum(max(0, min(b, d) - max(a, c0)) for a, b in c for c0, d in o)
        overlap += both
        exposed += sum(b - a for a, b in c) - both
    return {
        "rank": trace["distributedInfo"]["rank"],
        "kernel_ns": sum(to_ns(k["dur"]) for k in kernels),
        "communication_ns": sum(b - a for pairs in comm.values() for a, b in pairs),
        "overlap_ns": overlap,
        "exposed_communication_ns": exposed,
        "step_ns": [to_ns(e["dur"]) for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")],
        "comm_starts": {k["name"]: [] for k in kernels},
        "kernels": kernels,
    }


@pytest.fixture(scope="module")
def dlrm() -> tuple[Any, list[Any]]:
    return analyze_ranks([DLRM], jobs=2)


def test_per_rank_communication_and_overlap_from_the_raw_events(dlrm: Any) -> None:
    merged, _ = dlrm
    rows = {r.rank: r for r in merged.ranks.rows}
    assert merged.ranks.source == "distributedInfo.rank" and sorted(rows) == list(range(8))
    for path in sorted(DLRM.iterdir()):
        exp = _expected(path)
        row = rows[exp["rank"]]
        assert row.path == str(path)
        assert (row.kernel_ns, row.communication_ns, row.overlap_ns, row.exposed_communication_ns) == (
            exp["kernel_ns"], exp["communication_ns"], exp["overlap_ns"], exp["exposed_communication_ns"],
        ), path.name
        assert exp["overlap_ns"] > 0 and exp["exposed_communication_ns"] > 0


def test_ranks_come_from_distributed_info_not_file_order(tmp_path: Path) -> None:
    files = sorted(DLRM.iterdir())
    for i, f in enumerate(files):  # names that sort in the opposite order of the ranks
        shutil.copy(f, tmp_path / f"trace-{7 - i}.json.gz")
    merged, results = analyze_ranks([tmp_path], jobs=1)
    assert [(r.rank, Path(r.path).name) for r in results] == [(i, f"trace-{7 - i}.json.gz") for i in range(8)]


def _strip_rank(src: Path, dst: Path) -> None:
    data = json.loads(gzip.open(src).read())
    data.pop("distributedInfo", None)
    dst.write_bytes(gzip.compress(json.dumps(data).encode()))


def test_file_order_without_ranks_and_a_clear_error_for_duplicates(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for i in (3, 5):
        _strip_rank(DLRM / f"rank-{i}.json.gz", a / f"r{i}.json.gz")
    merged, results = analyze_ranks([a], jobs=1)
    assert merged.ranks.source == "file order" and [r.rank for r in results] == [0, 1]
    assert "ranks from file order" in merged.summary.path
    shutil.copy(DLRM / "rank-2.json.gz", b / "x.json.gz")
    shutil.copy(DLRM / "rank-2.json.gz", b / "y.json.gz")
    with pytest.raises(ConfigError, match="several traces claim rank 2"):
        analyze_ranks([b], jobs=1)


def test_parallel_and_serial_give_the_same_report(dlrm: Any) -> None:
    serial, _ = analyze_ranks([DLRM], jobs=1)
    assert serial.to_dict() == dlrm[0].to_dict()


def test_stragglers_and_skew_from_the_raw_events(dlrm: Any) -> None:
    merged, _ = dlrm
    steps = {_expected(p)["rank"]: _expected(p)["step_ns"][0] for p in sorted(DLRM.iterdir())}
    slowest = max(steps, key=lambda r: steps[r])
    row = merged.ranks.stragglers[0]
    ordered = sorted(steps.values())
    assert (row.slowest_rank, row.slowest_ns) == (slowest, steps[slowest])
    assert row.median_ns == round((ordered[3] + ordered[4]) / 2)
    # the k-th SendRecv kernel of every rank is one collective: skew = latest start - earliest
    starts = {}
    for p in sorted(DLRM.iterdir()):
        exp = _expected(p)
        starts[exp["rank"]] = sorted(to_ns(k["ts"]) for k in exp["kernels"] if "SendRecv" in k["name"])
    n = min(len(s) for s in starts.values())
    skews = sorted(max(s[k] for s in starts.values()) - min(s[k] for s in starts.values()) for k in range(n))
    sendrecv = next(s for s in merged.ranks.skew if "SendRecv" in s.family)
    assert (sendrecv.occurrences, sendrecv.max_skew_ns) == (n, skews[-1])
    assert sendrecv.median_skew_ns == skews[n // 2]  # n is odd


def test_merged_sections_sum_the_ranks(dlrm: Any) -> None:
    merged, results = dlrm
    assert merged.summary.kernel_count == sum(r.report.summary.kernel_count for r in results)
    by_cat = {c.category: c.total_ns for c in merged.categories.rows}
    for cat in by_cat:
        assert by_cat[cat] == sum(
            next((c.total_ns for c in r.report.categories.rows if c.category == cat), 0) for r in results
        )


def test_multi_rank_findings(dlrm: Any, tmp_path: Path) -> None:
    merged, _ = dlrm
    found = {f.id: f for f in merged.findings}
    assert found["exposed_communication"].evidence["exposed_ns"] == sum(r.exposed_communication_ns for r in merged.ranks.rows)
    assert found["straggler"].evidence["rank"] == merged.ranks.stragglers[0].slowest_rank
    assert found["host_sync"].evidence["ranks"] == list(range(8))  # one finding for all ranks, with them listed
    # two identical ranks without communication: neither finding
    for i in (0, 1):
        _strip_rank(KINETO / "tracelens_h100_bert_small_flash.json.gz", tmp_path / f"r{i}.json.gz")
    calm, _ = analyze_ranks([tmp_path], jobs=1)
    assert not {"exposed_communication", "straggler"} & {f.id for f in calm.findings}


def test_cli_directory_by_rank_and_diff_of_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_report([str(DLRM), "--jobs", "2", "--format", "json", "--sections", "ranks"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in data["ranks"]["rows"]] == list(range(8))
    assert main_report([str(DLRM), "--jobs", "2", "--format", "json", "--by-rank", "--sections", "summary"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "gpuprobe.report.ranks/1" and len(data["ranks"]) == 8
    assert data["ranks"][3]["report"]["summary"]["path"].endswith("rank-3.json.gz")
    assert main_report([str(DLRM / "rank-0.json.gz"), str(DLRM / "rank-1.json.gz"), "--sections", "ranks"]) == 0
    assert "Ranks (2" in capsys.readouterr().out
    assert main_report([str(tmp_path)]) == EXIT_BAD_INPUT
    assert "no trace files" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own status for a bad option value
        main_report([str(DLRM), "--jobs", "0"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert "--jobs: must be positive" in capsys.readouterr().err
    assert main_report([str(DLRM / "rank-0.json.gz"), "--by-rank"]) == EXIT_BAD_INPUT
    assert "--by-rank needs several traces" in capsys.readouterr().err
    d = diff(DLRM, DLRM, jobs=2)
    assert all(r.delta == 0 for r in d.categories) and d.verdict == "unchanged"
    assert [f.id for f in d.findings] == ["verdict"]  # the verdict, and nothing else
    assert main_diff([str(DLRM), str(DLRM / "rank-1.json.gz"), "--jobs", "2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["b_path"].endswith("rank-1.json.gz")


def test_a_single_trace_has_its_communication_section() -> None:
    exp = _expected(DLRM / "rank-4.json.gz")
    comm = analyze(DLRM / "rank-4.json.gz").communication
    assert (comm.communication_ns, comm.overlap_ns, comm.exposed_ns) == (
        exp["communication_ns"], exp["overlap_ns"], exp["exposed_communication_ns"],
    )


def test_nsys_ranks_come_from_the_recorded_environment(tmp_path: Path, make_nsys: Any) -> None:
    """nsys exports keep the environment in TARGET_INFO_SYSTEM_ENV (official schema: globalVid,
    devStateName, name, nameEnum, value): as one property holding every NAME=value, or a property
    per variable. Files named in the opposite order of their ranks; LOCAL_RANK must not be taken."""
    base = (Path(__file__).resolve().parents[1] / "data" / "nsys_min.sql").read_text()
    table = ("CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT NOT NULL, "
             "name TEXT NOT NULL, nameEnum INTEGER NOT NULL, value TEXT NOT NULL);\n")
    blob = "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'SystemProperties', 'DeviceEnvironment', 1, '{}');\n"
    row = "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'SystemProperties', '{}', 2, '{}');\n"
    d = tmp_path / "run"
    d.mkdir()
    make_nsys(d / "a.sqlite", base + table + blob.format("HOME=/root\nLOCAL_RANK=0\nRANK=2\nWORLD_SIZE=3\n"))
    make_nsys(d / "b.sqlite", base + table + row.format("LOCAL_RANK", "7") + row.format("RANK", "1"))
    nul_separated = ("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'SystemProperties', 'DeviceEnvironment', 1, "
                     "'LOCAL_RANK=1' || char(0) || 'RANK=0' || char(0) || 'PATH=/bin');\n")
    make_nsys(d / "c.sqlite", base + table + nul_separated)
    merged, results = analyze_ranks([d], jobs=1)
    assert [(r.rank, Path(r.path).name) for r in results] == [(0, "c.sqlite"), (1, "b.sqlite"), (2, "a.sqlite")]
    assert merged.ranks.source == "RANK in the environment nsys recorded"
    # Without the variable: the file order, said so.
    e = tmp_path / "plain"
    e.mkdir()
    make_nsys(e / "x.sqlite", base + table + blob.format("LOCAL_RANK=3"))
    make_nsys(e / "y.sqlite", base)
    merged, results = analyze_ranks([e], jobs=1)
    assert merged.ranks.source == "file order" and [Path(r.path).name for r in results] == ["x.sqlite", "y.sqlite"]


def _two_process_export(make_nsys: Any, path: Path) -> Path:
    """nsys_min.sql (process 4242) plus a second process, 4343, on device 1: a GEMM, and an NCCL
    all-reduce that starts during it; 4242 gets an all-reduce too, after its kernels."""
    base = (Path(__file__).resolve().parents[1] / "data" / "nsys_min.sql").read_text()
    gpid, gtid = (1 << 48) | (4343 << 24), (1 << 48) | (4343 << 24) | 4343
    gpid0 = (1 << 48) | (4242 << 24)
    cols = "(start,end,deviceId,contextId,streamId,correlationId,globalPid,demangledName,shortName,registersPerThread," \
           "gridX,gridY,gridZ,blockX,blockY,blockZ,staticSharedMemory,dynamicSharedMemory,localMemoryPerThread," \
           "localMemoryTotal,gridId)"
    extra = f"""
INSERT INTO PROCESSES VALUES ({gpid},4343,'python3');
INSERT INTO StringIds VALUES (40,'ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)'),
 (41,'ncclDevKernel_AllReduce_Sum_f32_RING_LL');
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1004000,1008000,0,{gtid},201,2,0,NULL),(1009000,1010000,0,{gtid},202,2,0,NULL);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL {cols} VALUES
 (1011000,1031000,1,1,9,201,{gpid},6,6,168,64,1,1,128,1,1,0,0,0,0,9101),
 (1025000,1045000,1,1,10,202,{gpid},40,41,64,1,1,1,512,1,1,0,0,0,0,9102),
 (1050000,1060000,0,1,10,0,{gpid0},40,41,64,1,1,1,512,1,1,0,0,0,0,9103);
"""
    return make_nsys(path, base + extra)


def test_an_nsys_export_of_several_processes_is_one_rank_per_process(
    tmp_path: Path, make_nsys: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    path = _two_process_export(make_nsys, tmp_path / "torchrun.sqlite")
    # Expected from the raw rows: per process, all kernel time, NCCL time, and NCCL time that overlaps
    # the process's other kernels on the same device.
    con = sqlite3.connect(path)
    rows = con.execute("SELECT k.start, k.end, (k.globalPid >> 24) & 16777215, k.deviceId, s.value "
                       "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName").fetchall()
    con.close()
    expected = {}
    for pid in sorted({r[2] for r in rows}):
        mine = [r for r in rows if r[2] == pid]
        comm = [(a, b, d) for a, b, _, d, n in mine if n.startswith("nccl")]
        other = [(a, b, d) for a, b, _, d, n in mine if not n.startswith("nccl")]
        overlap = sum(max(0, min(b, b2) - max(a, a2)) for a, b, d in comm for a2, b2, d2 in other if d == d2)
        comm_ns = sum(b - a for a, b, _ in comm)
        expected[pid] = (sum(b - a for a, b, *_ in mine), comm_ns, overlap, comm_ns - overlap)
    assert expected[4343][2] > 0 and expected[4242][2] == 0  # the test can tell overlap from none

    merged, results = analyze_ranks([path], jobs=1)
    assert merged.ranks.source == "file and process order"
    assert [r.path for r in results] == [f"{path} (process 4242)", f"{path} (process 4343)"]
    got = {int(r.path.rsplit(" ", 1)[1].rstrip(")")): (r.kernel_ns, r.communication_ns, r.overlap_ns,
                                                        r.exposed_communication_ns)
           for r in merged.ranks.rows}
    assert got == expected
    # The CLI takes the one file as the ranks of one run.
    assert main_report([str(path), "--format", "json", "--sections", "ranks", "--jobs", "2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [row["rank"] for row in shown["ranks"]["rows"]] == [0, 1]


def test_an_executor_of_the_callers_runs_each_rank_as_a_task(dlrm: Any) -> None:
    # A real executor of another kind than gpuprobe's own workers: the merged report is the same.
    seen: list[tuple[int, int]] = []
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        merged, results = analyze_ranks([DLRM], executor=pool, progress=lambda done, total: seen.append((done, total)))
    assert merged.to_dict() == dlrm[0].to_dict()
    assert [r.rank for r in results] == [r.rank for r in dlrm[1]]
    assert [done for done, _ in seen] == list(range(1, 9)) and {total for _, total in seen} == {8}


def test_an_executor_task_that_cannot_read_its_trace_names_the_file(tmp_path: Path) -> None:
    shutil.copy(DLRM / "rank-0.json.gz", tmp_path / "a.json.gz")
    (tmp_path / "b.json").write_text('{"traceEvents": [')
    with concurrent.futures.ThreadPoolExecutor(2) as pool, pytest.raises(ReportInputError, match="b.json"):
        analyze_ranks([tmp_path], executor=pool)


def test_an_executor_takes_the_place_of_jobs() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool, pytest.raises(ConfigError, match="jobs and executor"):
        analyze_ranks([DLRM], executor=pool, jobs=2)
    with pytest.raises(ConfigError, match="concurrent.futures.Executor, not Pool"):
        analyze_ranks([DLRM], executor=Pool())  # type: ignore[arg-type]


class Pool:
    """Something with ``submit`` that is not a ``concurrent.futures.Executor``."""

    def submit(self, fn: Any, *args: Any) -> None:
        raise AssertionError("never called")
