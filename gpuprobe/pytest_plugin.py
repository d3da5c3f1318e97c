"""gpuprobe's pytest plugin: budgets of counts for generation, baselines kept in the repository, and timing
judged only beyond its noise (``docs/testing.md``).

Fixtures:

- ``gpuprobe_budget``: ``with gpuprobe_budget(host_syncs_per_step=0, recompiles=0): model.generate(...)``
  fails when a count of the block exceeds its budget, with a table of what changed and where;
  ``with gpuprobe_budget.baseline("decode"): ...`` compares every count with ``<baselines>/decode.json``,
  which ``pytest --gpuprobe-update`` writes.
- ``gpuprobe_ab``: ``gpuprobe_ab(run_a, run_b)`` times the two interleaved and fails only when ``run_b`` is
  slower than ``run_a`` beyond the rounds' own spread (the statistics of ``gpuprobe try``).

Registered through the ``pytest11`` entry point (as ``gpuprobe``; ``-p no:gpuprobe`` leaves it out). It does
nothing until a test asks for one of its fixtures: loading it imports neither torch nor gpuprobe's runtime,
starts nothing and has no hook that runs per test (its notes are read from the reports once, at the end).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import pytest

__all__ = ["BudgetExceeded", "Budget", "ABResult"]

_NOTE = "gpuprobe"  # the user_properties key of the notes shown at the end of the run
_STATE = pytest.StashKey["_RunState"]()
DEFAULT_BASELINE_DIR = "gpuprobe-baselines"


class BudgetExceeded(AssertionError):
    """A count of a budgeted block went over its budget, or grew past its baseline (the message is the table)."""


# -- options and the run's state ------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprobe")
    group.addoption("--gpuprobe-update", action="store_true", default=False,
                    help="write or refresh the baselines that gpuprobe_budget.baseline(NAME) compares with")
    group.addoption("--gpuprobe-baseline-dir", default=None, metavar="DIR",
                    help="the folder of the baseline files (relative to the current folder; default: the "
                         f"gpuprobe_baseline_dir ini value, else {DEFAULT_BASELINE_DIR}/ in the rootdir)")
    parser.addini("gpuprobe_baseline_dir", f"the folder of gpuprobe's baseline files, relative to the rootdir "
                                           f"(default {DEFAULT_BASELINE_DIR})", default=DEFAULT_BASELINE_DIR)


@dataclasses.dataclass
class _RunState:
    update: bool
    baseline_dir: str
    run: str  # one id for the whole run, shared by xdist's workers
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # baseline name → the test that used it
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _state(config: pytest.Config) -> _RunState:
    found = config.stash.get(_STATE, None)
    if found is None:
        cli = config.getoption("--gpuprobe-baseline-dir")
        if cli:
            folder = os.path.abspath(cli)
        else:
            folder = os.path.join(str(config.rootpath), config.getini("gpuprobe_baseline_dir") or DEFAULT_BASELINE_DIR)
        found = _RunState(bool(config.getoption("--gpuprobe-update")), folder, _run_id(config))
        config.stash[_STATE] = found
    return found


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The baselines' notes (written, can be tightened), read from the run's reports (xdist's workers' too)."""
    notes: list[str] = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", None) or ():
                if key == _NOTE:
                    notes.append(str(value))
    if notes:
        terminalreporter.write_sep("-", "gpuprobe baselines")
        for note in dict.fromkeys(notes):
            terminalreporter.write_line(note)


_RUN = pytest.StashKey[str]()


def _run_id(config: pytest.Config) -> str:
    """One id for the whole run: made by the process that started it, handed to xdist's workers."""
    found = config.stash.get(_RUN, None)
    if found is None:
        workerinput = getattr(config, "workerinput", None) or {}
        found = str(workerinput.get("gpuprobe_run") or uuid.uuid4().hex)
        config.stash[_RUN] = found
    return found


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: each worker gets the run's id (their claims on baseline names are shared through it)."""
    node.workerinput["gpuprobe_run"] = _run_id(node.config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run's claims on baseline names go with it (the process that started the run removes them)."""
    config = session.config
    if getattr(config, "workerinput", None) is None and _RUN in config.stash:
        shutil.rmtree(_claims_folder(config.stash[_RUN]), ignore_errors=True)


# -- gpuprobe_budget ------------------------------------------------------------------------------------

class Budget:
    """The ``gpuprobe_budget`` fixture: call it with budgets, or :meth:`baseline`, around a block.

    Example (a test)::

        def test_decode_has_no_syncs(gpuprobe_budget, model, inputs):
            with gpuprobe_budget(host_syncs_per_step=0, recompiles=0, dynamic_cache_concats=0):
                model.generate(**inputs, max_new_tokens=16, cache_implementation="static")
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def __call__(self, **budgets: Any) -> _Block:
        """A block whose counts must stay within ``budgets`` (keywords of ``gpuprobe.testing.budget.COUNTS``)."""
        __tracebackhide__ = True
        from .testing import budget as b

        try:
            parsed = b.parse_budgets(budgets)
        except b.BudgetError as exc:
            problem = f"gpuprobe_budget: {exc}"
        else:
            return _Block(self._request, tuple(parsed), budgets=parsed)
        _fail(problem)

    def baseline(self, name: str, *, counts: Sequence[str] | None = None) -> _Block:
        """A block whose counts (every count, or ``counts``) are compared with the baseline file ``name``.

        ``pytest --gpuprobe-update`` writes the file instead (``<baseline dir>/<name>.json``, one entry per
        machine kind: ``cpu``, ``cuda:<device name>``).
        """
        __tracebackhide__ = True
        from .testing import budget as b

        asked = tuple(b.COUNTS) if counts is None else tuple(counts)
        try:
            b.check_name(name)
            unknown = [c for c in asked if c not in b.COUNTS]
            if unknown or not asked:
                raise b.BudgetError(f"unknown count(s) {', '.join(map(repr, unknown)) or '(none given)'} for "
                                    f"baseline {name!r}; the counts are: {', '.join(b.COUNTS)}")
        except b.BudgetError as exc:
            _fail(f"gpuprobe_budget.baseline: {exc}")
        state = _state(self._request.config)
        nodeid = self._request.node.nodeid
        with state.lock:
            other = state.names.get(name)
            if other is None:
                state.names[name] = nodeid
        if other is None and state.update:
            other = _claim(state.run, name, nodeid)
        if other is not None:
            _fail(f"gpuprobe_budget.baseline: baseline {name!r} is used by {other} already in this run; one block "
                  f"per baseline: give {nodeid} a name of its own")
        return _Block(self._request, asked, baseline=name)


@pytest.fixture
def gpuprobe_budget(request: pytest.FixtureRequest) -> Budget:
    """Budgets of counts (host syncs, launches, recompiles, graph breaks, cache concatenations, Python
    calls, peak memory) for a block of generation, and baselines of them (``docs/testing.md``)."""
    return Budget(request)


class _Block:
    """One budgeted block (a context manager); after it, :attr:`results` holds what was measured."""

    def __init__(self, request: pytest.FixtureRequest, counts: tuple[str, ...], *,
                 budgets: dict[str, Any] | None = None, baseline: str | None = None) -> None:
        self._request = request
        self._counts = counts
        self._budgets = budgets
        self._baseline = baseline
        self._measurement: Any = None
        self._record: dict[str, Any] = {}  # the baseline's counts for this machine (compared at the end)
        self.results: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        """The :class:`~gpuprobe.testing.budget.Measured` of one count (after the block)."""
        return self.results[name]

    def __enter__(self) -> _Block:
        __tracebackhide__ = True
        from .testing import budget as b

        if self._baseline is not None and not _state(self._request.config).update:
            self._record = self._read_baseline(b)  # before the block runs: a bad file fails at once
        try:
            self._measurement = b.Measurement(self._counts).__enter__()
        except b.BudgetError as exc:
            _fail(f"gpuprobe_budget: {exc}")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        __tracebackhide__ = True
        from .testing import budget as b

        try:
            self._measurement.__exit__(exc_type, exc, tb)
        except b.BudgetError as error:
            if exc_type is None:
                _fail(f"gpuprobe_budget: {error}")
        if exc_type is not None:
            return  # the block's own exception goes on as it is
        self.results = self._measurement.results
        if self._budgets is not None:
            self._check_budgets(b)
        else:
            self._check_baseline(b)

    def _check_budgets(self, b: Any) -> None:
        __tracebackhide__ = True
        rows = b.check(self._budgets, self.results)
        over = [r for r in rows if r.failed]
        if over:
            names = ", ".join(dict.fromkeys(r.count for r in over))
            raise BudgetExceeded(b.render(rows, f"gpuprobe budget exceeded: {names}"))
        skipped = [r for r in rows if r.verdict == "skipped"]
        if skipped:
            held = [r.count for r in rows if r.verdict == "ok"]
            why = "; ".join(f"{r.count} cannot be counted here: {r.where}" for r in skipped)
            pytest.skip(f"gpuprobe_budget: {why}" + (f" (held: {', '.join(held)})" if held else ""))

    def _path(self) -> str:
        return os.path.join(_state(self._request.config).baseline_dir, f"{self._baseline}.json")

    def _read_baseline(self, b: Any) -> dict[str, Any]:
        """This machine's record in the baseline file, its shape checked; fails the test naming the problem."""
        __tracebackhide__ = True
        name, path, nodeid, machine = self._baseline, self._path(), self._request.node.nodeid, b.machine_key()
        try:
            data = b.read_baseline(path)
        except b.BaselineError as exc:
            _fail(f"gpuprobe_budget.baseline: {exc}")
        if data is None:
            pytest.fail(f"gpuprobe_budget.baseline: no baseline {name!r} ({path}); write it with pytest "
                        "--gpuprobe-update", pytrace=False)
        if data["name"] != name or data["test"] != nodeid:
            pytest.fail(f"gpuprobe_budget.baseline: baseline {path} was written by {data['test']} as "
                        f"{data['name']!r}, not by {nodeid}: give each test a baseline of its own, or write it "
                        "again with pytest --gpuprobe-update", pytrace=False)
        record = data["machines"].get(machine)
        if record is None:
            pytest.fail(f"gpuprobe_budget.baseline: baseline {name!r} ({path}) holds no counts for {machine} (it has "
                        f"{', '.join(sorted(data['machines']))}); write them with pytest --gpuprobe-update on this "
                        "machine", pytrace=False)
        return dict(record)

    def _check_baseline(self, b: Any) -> None:
        __tracebackhide__ = True
        state = _state(self._request.config)
        name = self._baseline
        assert name is not None
        path = self._path()
        nodeid = self._request.node.nodeid
        machine = b.machine_key()
        if state.update:
            self._write_baseline(b, state, path, name, nodeid, machine)
            return
        record = self._record
        results = {k: m for k, m in self.results.items()
                   if m.skipped is None or k in record["counts"]}  # what was not countable when it was written
        rows = b.compare_baseline(record, results)
        grew = [r for r in rows if r.failed]
        if grew:
            names = ", ".join(dict.fromkeys(r.count for r in grew))
            header = (f"gpuprobe baseline {name!r} ({os.path.relpath(path)}, {machine}): {names} grew"
                      + b.version_note(record))
            raise BudgetExceeded(b.render(rows, header) + "\n(pytest --gpuprobe-update accepts the new counts)")
        shrank = [r for r in rows if r.verdict == "shrank"]
        if shrank:
            what = ", ".join(f"{r.count} {r.limit} → {r.measured}" for r in shrank)
            self._request.node.user_properties.append(
                (_NOTE, f"{nodeid}: baseline {name!r} can be tightened ({what}): pytest --gpuprobe-update"))
        skipped = [r for r in rows if r.verdict == "skipped"]
        if skipped:
            why = "; ".join(f"{r.count} cannot be counted here: {r.where}" for r in skipped)
            pytest.skip(f"gpuprobe_budget.baseline {name!r}: {why}")

    def _write_baseline(self, b: Any, state: _RunState, path: str, name: str, nodeid: str, machine: str) -> None:
        __tracebackhide__ = True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        record = b.baseline_record(self.results)
        with _folder_lock(os.path.dirname(path)):
            replaced = ""
            try:
                data = b.read_baseline(path)
            except b.BaselineError as exc:
                data, replaced = None, f" (it replaces an unreadable file: {exc})"
            if data is not None and data["test"] == nodeid and data["name"] == name \
                    and data["machines"].get(machine) == record:
                note = f"baseline {name!r} for {machine} is up to date ({os.path.relpath(path)})"
            else:
                if data is None or data["test"] != nodeid or data["name"] != name:
                    data = {"format": b.BASELINE_FORMAT, "name": name, "test": nodeid, "machines": {}}
                data["machines"][machine] = record
                b.write_baseline(path, data)
                note = f"wrote baseline {name!r} for {machine} ({os.path.relpath(path)}){replaced}"
        self._request.node.user_properties.append((_NOTE, f"{nodeid}: {note}"))


def _claims_folder(run: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"gpuprobe-baselines-{run}")


def _claim(run: str, name: str, nodeid: str) -> str | None:
    """Claim baseline ``name`` for ``nodeid`` in this run, across xdist's workers (they share the run's id):
    None when claimed, else the test that holds it."""
    folder = _claims_folder(run)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            with open(path, encoding="utf-8") as f:
                holder = f.read() or "another test"
        except OSError:
            holder = "another test"
        return None if holder == nodeid else holder
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(nodeid)
    return None


def _fail(message: str) -> NoReturn:
    """Fail the test with ``message`` alone: no traceback of the plugin, no exception chained to it."""
    __tracebackhide__ = True
    # Why the exception's context is dropped: raised inside an ``except``, pytest.fail's exception prints the
    # one handled before it too ("During handling of the above exception...") and the line said it already.
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception as failed:
        failed.__context__ = None
        failed.__suppress_context__ = True
        raise


@contextlib.contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """An exclusive lock on the baseline folder (xdist's workers write baselines at once), where the OS has
    one: ``flock`` on the folder itself, so no lock file is left beside the baselines."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): the run's id in each file still tells two writers apart
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# -- gpuprobe_ab ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ABResult:
    """Two variants timed interleaved.

    Attributes:
        a_ns: ``run_a``'s time in each round (nanoseconds, wall clock).
        b_ns: ``run_b``'s, from the same rounds.
        comparison: :class:`gpuprobe.experiment.stats.Comparison` of b against a (``ratio``: a's time ÷ b's
            per round, above 1 when b is faster; ``noise``; ``verdict``).
    """

    a_ns: list[int]
    b_ns: list[int]
    comparison: Any

    @property
    def verdict(self) -> str:
        """``faster``, ``slower`` (b against a, beyond the noise), ``no difference`` or ``too few rounds``."""
        return str(self.comparison.verdict)

    def describe(self, names: tuple[str, str] = ("a", "b")) -> str:
        """The comparison in one sentence, with the spread of each side and of the ratios."""
        from .experiment.stats import spread

        c = self.comparison
        slow = 1 / c.ratio.median if c.ratio.median else float("inf")
        sa, sb = spread([t / 1e6 for t in self.a_ns]), spread([t / 1e6 for t in self.b_ns])
        return (f"{names[1]} takes {slow:.3f}x {names[0]}'s time (median of {c.ratio.n} interleaved rounds; per-round "
                f"{names[0]}/{names[1]} ratios {c.ratio.min:.3f}-{c.ratio.max:.3f}, interquartile {c.ratio.q1:.3f}-"
                f"{c.ratio.q3:.3f}; noise {c.noise * 100:.1f} %); {names[0]} {sa.median:.3f} ms ({sa.min:.3f}-"
                f"{sa.max:.3f}), {names[1]} {sb.median:.3f} ms ({sb.min:.3f}-{sb.max:.3f}); verdict: {c.verdict}")


def _synchronize() -> Callable[[], None]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        return cuda.synchronize
    return lambda: None


def ab(run_a: Callable[[], Any], run_b: Callable[[], Any], *, rounds: int = 9, warmup: int = 1,
       tolerance: float = 0.0, names: tuple[str, str] = ("a", "b")) -> ABResult:
    """Time ``run_a`` and ``run_b`` in ``rounds`` interleaved rounds; fail only when b is slower beyond the noise.

    Each round runs both, the order alternating (a then b, then b then a), so a drift of the machine
    touches both sides of a round's ratio alike; on CUDA each run ends with ``torch.cuda.synchronize()``
    (its device work is in its time). The verdict is ``gpuprobe try``'s (:func:`gpuprobe.experiment.stats.compare`):
    slower only when the rounds agree beyond chance (a sign test at 1 %), the ratios' quartile lies on
    that side and the median exceeds the ratios' own spread.

    Args:
        run_a: the reference.
        run_b: the variant held to it.
        rounds: at least 7 (the fewest the sign test can decide on).
        warmup: untimed runs of each first.
        tolerance: a slowdown no larger than this (0.05: 5 %) passes even beyond the noise.
        names: what the message calls them.

    Returns:
        The :class:`ABResult` (the test may look at ``verdict`` or ``comparison`` further).
    """
    __tracebackhide__ = True
    from .experiment.stats import MIN_ROUNDS, SLOWER, compare

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < MIN_ROUNDS:
        pytest.fail(f"gpuprobe_ab: rounds must be a whole number >= {MIN_ROUNDS} (the fewest the sign test decides "
                    f"on), got {rounds!r}", pytrace=False)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        pytest.fail(f"gpuprobe_ab: warmup must be a whole number >= 0, got {warmup!r}", pytrace=False)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        pytest.fail(f"gpuprobe_ab: tolerance is a fraction in [0, 1), got {tolerance!r}", pytrace=False)
    if not callable(run_a) or not callable(run_b):
        pytest.fail("gpuprobe_ab: run_a and run_b are callables without arguments", pytrace=False)
    clock = time.perf_counter_ns
    for _ in range(warmup):
        run_a()
        run_b()
    sync = _synchronize()  # a warm-up may have initialized CUDA
    times: dict[str, list[int]] = {"a": [], "b": []}
    for r in range(rounds):
        order = (("a", run_a), ("b", run_b)) if r % 2 == 0 else (("b", run_b), ("a", run_a))
        for key, fn in order:
            t0 = clock()
            fn()
            sync()
            times[key].append(clock() - t0)
    result = ABResult(times["a"], times["b"], compare(times["a"], times["b"], lower_is_better=True))
    c = result.comparison
    if c.verdict == SLOWER and (1 / c.ratio.median if c.ratio.median else float("inf")) > 1 + tolerance:
        raise AssertionError(f"gpuprobe_ab: {names[1]} is slower than {names[0]} beyond the noise: "
                             + result.describe(names))
    return result


@pytest.fixture
def gpuprobe_ab() -> Callable[..., ABResult]:
    """``gpuprobe_ab(run_a, run_b, rounds=9)``: the two timed interleaved; fails only when ``run_b`` is slower
    than ``run_a`` beyond the rounds' spread (``docs/testing.md``)."""
    return ab
