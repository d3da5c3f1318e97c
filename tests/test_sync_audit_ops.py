"""The sync audit's kernels, operator by operator; the setting; probe(sync_audit=True)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import gpuprobe  # noqa: E402
from gpuprobe import ConfigError, config, probe  # noqa: E402
from gpuprobe._sync_audit import SyncSites, active, new_audit  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402

SYNCS = "gpuprobe.step.syncs"


def audit(fn: Callable[[], Any]) -> dict[str, int]:
    """Run ``fn`` under a fresh audit; the counted operators by name."""
    audit = new_audit(SyncSites(lambda key, message: None))
    with audit:
        fn()
    out: dict[str, int] = {}
    for (where, func), n in audit.counts.items():
        assert where == ("other", None)
        name = str(func._schema.name)
        out[name] = out.get(name, 0) + n
    return out


X = torch.arange(6.0)
MASK = X > 2


@pytest.mark.parametrize("name, fn", [
    ("item", lambda: X.sum().item()),
    ("bool", lambda: bool(X[0] > 1)),
    ("int", lambda: int(X[1])),
    ("float", lambda: float(X[1])),
])
def test_reading_a_scalar_counts_as_local_scalar_dense(name: str, fn: Callable[[], Any]) -> None:
    assert audit(fn) == {"aten::_local_scalar_dense": 1}


@pytest.mark.parametrize("fn", [lambda: X.nonzero(), lambda: torch.where(MASK), lambda: torch.argwhere(MASK)])
def test_nonzero_and_what_calls_it_count(fn: Callable[[], Any]) -> None:
    assert audit(fn) == {"aten::nonzero": 1}


def test_masked_select_counts() -> None:
    assert audit(lambda: X.masked_select(MASK)) == {"aten::masked_select": 1}


@pytest.mark.parametrize("fn, op", [
    (lambda: torch.unique(X), "aten::_unique2"),
    (lambda: torch.unique(X.view(2, 3), dim=0), "aten::unique_dim"),
    (lambda: torch.unique_consecutive(X), "aten::unique_consecutive"),
    (lambda: torch._unique(X), "aten::_unique"),
    (lambda: torch.ops.aten.unique_dim_consecutive(X.view(2, 3), 0), "aten::unique_dim_consecutive"),
])
def test_every_unique_variant_counts(fn: Callable[[], Any], op: str) -> None:
    assert audit(fn) == {op: 1}


def test_indexing_with_a_bool_mask_counts_and_with_integers_does_not() -> None:
    assert audit(lambda: X[MASK]) == {"aten::index": 1}
    assert audit(lambda: X[MASK.to(torch.uint8).bool()]) == {"aten::index": 1}
    assert audit(lambda: X[torch.tensor([0, 2])]) == {}


def test_assigning_through_a_bool_mask_counts_unless_it_is_a_masked_fill() -> None:
    def assign_tensor() -> None:
        y = X.clone()
        y[MASK] = torch.ones(3)

    def assign_scalar() -> None:  # ATen runs this as masked_fill_: no sync
        y = X.clone()
        y[MASK] = 0.0

    def assign_by_position() -> None:
        y = X.clone()
        y[torch.tensor([0, 1])] = torch.ones(2)

    assert audit(assign_tensor) == {"aten::index_put_": 1}
    assert audit(assign_scalar) == {}
    assert audit(assign_by_position) == {}
    assert audit(lambda: X.index_put((MASK,), torch.ones(3))) == {"aten::index_put": 1}


def test_repeat_interleave_counts_only_without_an_output_size() -> None:
    repeats = torch.tensor([1, 2])
    assert audit(lambda: torch.repeat_interleave(repeats)) == {"aten::repeat_interleave": 1}
    assert audit(lambda: X[:2].repeat_interleave(repeats, dim=0)) == {"aten::repeat_interleave": 1}
    assert audit(lambda: X[:2].repeat_interleave(repeats, dim=0, output_size=3)) == {}
    assert audit(lambda: X.repeat_interleave(2)) == {}


def test_operators_that_never_sync_are_not_counted() -> None:
    def work() -> None:
        y = torch.nn.functional.linear(X.view(1, 6), torch.ones(3, 6))
        (y.softmax(-1) * 2).argmax(-1)
        torch.cat([X, X]).masked_fill(torch.cat([MASK, MASK]), 0.0)
        X.clone().copy_(X)
        X.to(torch.float64)

    assert audit(work) == {}


def test_on_the_cpu_no_copy_is_a_copy_to_the_host() -> None:
    assert audit(lambda: (X.to("cpu", copy=True), torch.empty(6).copy_(X), X.tolist())) == {}


def test_copies_from_a_simulated_device_to_the_host_count(simcuda) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1)
    on_device = sim.place(torch.arange(4.0), 0)
    host = torch.empty(4)
    assert audit(lambda: on_device.to("cpu", copy=True)) == {"aten::_to_copy": 1}
    assert audit(lambda: host.copy_(on_device)) == {"aten::copy_": 1}
    # Not a sync: non-blocking copies, copies to the device, dtype changes on the device.
    assert audit(lambda: host.copy_(on_device, non_blocking=True)) == {}
    assert audit(lambda: on_device.to("cpu", copy=True, non_blocking=True)) == {}
    assert audit(lambda: on_device.copy_(host)) == {}
    assert audit(lambda: on_device.to(torch.float64)) == {}


def test_compiled_code_runs_and_is_counted_under_the_audit() -> None:
    @torch.compile(backend="eager")
    def compiled_before(x: Any) -> Any:
        return x.sin() + x.sum().item()

    @torch.compile(backend="eager")
    def compiled_inside(x: Any) -> Any:
        return x.cos() * 2

    expected = X.sin() + X.sum().item()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(compiled_before(X), expected)  # compiled outside any audit
        results: list[Any] = []
        counts = audit(lambda: results.extend([compiled_before(X), compiled_inside(X)]))
    assert torch.equal(results[0], expected) and torch.equal(results[1], X.cos() * 2)
    assert counts == {"aten::_local_scalar_dense": 1}  # the graph break's .item() runs eagerly


def test_a_higher_order_operator_runs_through_the_audit() -> None:
    out: list[Any] = []
    counts = audit(lambda: out.append(torch.cond(X.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (X,))))
    assert torch.equal(out[0], X.sin())
    assert counts == {}  # what runs inside the operator is not seen


def test_a_higher_order_operator_created_after_the_first_audit_runs_through_it() -> None:
    from torch._ops import HigherOrderOperator

    class Twice(HigherOrderOperator):
        def __init__(self) -> None:
            super().__init__("gpuprobe_test_twice")

        def __call__(self, x: Any) -> Any:
            return super().__call__(x)

    audit(lambda: None)  # the kernels exist before the operator does
    twice = Twice()
    twice.py_impl(torch._C.DispatchKey.CompositeExplicitAutograd)(lambda x: x * 2)
    twice.py_impl(torch._C.DispatchKey.Autograd)(lambda x: x * 2)
    assert torch.equal(twice(X), X * 2)  # outside an audit, as torch made it
    out: list[Any] = []
    assert audit(lambda: out.append(twice(X))) == {}
    assert torch.equal(out[0], X * 2)


def test_audits_nest_and_each_counts_what_runs_while_it_is_entered() -> None:
    sites = SyncSites(lambda key, message: None)
    outer, inner = new_audit(sites), new_audit(sites)
    with outer:
        X.nonzero()
        with inner:
            X.sum().item()
        X[MASK]

    def names(a: Any) -> dict[str, int]:
        return {str(func._schema.name): n for (_, func), n in a.counts.items()}

    assert names(outer) == {"aten::nonzero": 1, "aten::_local_scalar_dense": 1, "aten::index": 1}
    assert names(inner) == {"aten::_local_scalar_dense": 1}
    assert active() is None


def test_an_audit_counts_only_its_own_thread() -> None:
    import threading

    started, release = threading.Event(), threading.Event()
    seen_there: list[bool] = []

    def elsewhere() -> None:
        started.set()
        release.wait(5)
        seen_there.append(bool(torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PreDispatch)))
        for _ in range(5):
            X.nonzero()

    t = threading.Thread(target=elsewhere)
    t.start()
    started.wait(5)

    def here() -> None:
        release.set()
        t.join(5)
        X.sum().item()

    assert audit(here) == {"aten::_local_scalar_dense": 1}
    assert seen_there == [False]


def test_what_runs_on_fake_tensors_is_not_counted() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    def traced() -> None:
        with FakeTensorMode():
            fake = torch.empty(6)
            fake.to("cpu", copy=True)
            with pytest.raises(Exception):  # data-dependent: a fake tensor cannot say how many
                fake.nonzero()
        X.nonzero()

    assert audit(traced) == {"aten::nonzero": 1}


def test_the_audit_counts_under_the_attribution_set_on_it() -> None:
    audit = new_audit(SyncSites(lambda key, message: None))
    with audit:
        X.sum().item()
        audit.where = ("logits_processor", "Mine")
        X.sum().item()
        X.nonzero()
        audit.where = ("other", None)
    got = {(where, str(func._schema.name)): n for (where, func), n in audit.counts.items()}
    assert got == {(("other", None), "aten::_local_scalar_dense"): 1,
                   (("logits_processor", "Mine"), "aten::_local_scalar_dense"): 1,
                   (("logits_processor", "Mine"), "aten::nonzero"): 1}


def test_a_new_site_is_reported_once_with_its_source_line() -> None:
    reported: list[tuple[str, str]] = []
    sites = SyncSites(lambda key, message: reported.append((key, message)))
    line = inspect.currentframe().f_lineno + 3  # type: ignore[union-attr]
    for _ in range(3):
        with new_audit(sites):
            X.sum().item()
    assert len(reported) == 1
    assert f"{__file__}:{line}" in reported[0][1] and "aten::_local_scalar_dense" in reported[0][1]
    assert list(sites.recent) == [{"component": "other", "op": "aten::_local_scalar_dense",
                                   "source": f"{__file__}:{line}"}]


def test_warnings_turned_into_errors_do_not_break_an_audited_call() -> None:
    @probe("strict", sync_audit=True)
    def strict() -> float:
        return X.sum().item()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert strict() == 15.0
    assert sync_counts() == {("probe", "strict", "aten::_local_scalar_dense"): 1}
    assert [s["processor"] for s in runtime().sync_sites.recent] == ["strict"]


def test_sites_keep_only_the_last_few() -> None:
    sites = SyncSites(lambda key, message: None, keep=2)
    for i in range(3):
        sites.seen(("logits_processor", f"P{i}"), "aten::nonzero")
    assert [s["processor"] for s in sites.recent] == ["P1", "P2"]


# -- the setting -------------------------------------------------------------------------------

def test_the_setting_is_read_from_the_environment() -> None:
    assert config.load({}).sync_audit == 0
    assert config.load({"GPUPROBE_SYNC_AUDIT": "100"}).sync_audit == 100


@pytest.mark.parametrize("raw", ["-1", "x", "1.5", "ten"])
def test_a_bad_variable_names_the_setting(raw: str) -> None:
    with pytest.raises(ConfigError, match="GPUPROBE_SYNC_AUDIT"):
        config.load({"GPUPROBE_SYNC_AUDIT": raw})


@pytest.mark.parametrize("raw", [-1, 2.5, True, "n"])
def test_a_bad_keyword_names_the_setting(raw: Any) -> None:
    with pytest.raises(ConfigError, match="sync_audit"):
        gpuprobe.configure(sync_audit=raw)


def test_info_shows_the_setting_and_the_sites() -> None:
    gpuprobe.configure(sync_audit=7)
    with pytest.warns(RuntimeWarning, match="sync audit: aten::nonzero in forward"):
        runtime().sync_sites.seen(("forward", None), "aten::nonzero")
    info = gpuprobe.info()
    assert info["sync_audit"] == 7
    assert [(s["component"], s["op"]) for s in info["sync_sites"]] == [("forward", "aten::nonzero")]


# -- probe(sync_audit=True) -----------------------------------------------------------------------

def sync_counts() -> dict[tuple[str, str, str], float]:
    out = {}
    for md in gpuprobe.collect():
        if md.spec.name == SYNCS:
            for p in md.points:
                out[(p.labels["component"], p.labels["processor"], p.labels["op"])] = p.value
    return out


def test_a_probed_function_counts_its_syncs_under_its_name() -> None:
    @probe("decode", sync_audit=True)
    def decode(x: Any) -> int:
        return int(x.sum().item()) + len(x.nonzero())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decode(X)
        decode(X)
    assert sync_counts() == {("probe", "decode", "aten::_local_scalar_dense"): 2,
                             ("probe", "decode", "aten::nonzero"): 2}


def audit_key_on() -> bool:
    """Whether the dispatcher's PreDispatch key (where the audit's kernels live) is on for this thread."""
    return bool(torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PreDispatch))


def test_a_probed_block_counts_its_syncs_and_leaves_no_audit_behind() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(KeyError):
            with probe("block", sync_audit=True):
                X[MASK]
                raise KeyError("boom")
    assert not audit_key_on() and active() is None
    assert sync_counts() == {("probe", "block", "aten::index"): 1}


def test_a_probe_without_sync_audit_enters_no_audit() -> None:
    seen = []

    @probe("plain")
    def plain() -> None:
        seen.append(audit_key_on())
        X.sum().item()

    plain()
    with probe("plain block"):
        seen.append(audit_key_on())
    assert seen == [False, False]
    assert sync_counts() == {}


def test_a_probed_function_keeps_auditing_after_a_reconfiguration() -> None:
    @probe("kept", sync_audit=True)
    def kept() -> None:
        X.nonzero()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept()
        gpuprobe.configure(memory=True)
        kept()
    assert sync_counts() == {("probe", "kept", "aten::nonzero"): 2}


def test_sync_audit_refuses_coroutines_and_generators() -> None:
    async def coroutine() -> None:
        pass

    def generator() -> Any:
        yield 1

    for fn in (coroutine, generator):
        with pytest.raises(ConfigError, match="sync_audit"):
            probe("p", sync_audit=True)(fn)
    with pytest.raises(ConfigError, match="sync_audit"):
        probe("p", sync_audit="yes")  # type: ignore[call-overload]
