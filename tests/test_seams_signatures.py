"""The seams read a callable's parameters by name, from its signature, read once per code object: the
positions and names are those ``inspect.signature`` gives, bound methods without ``self``, through
``functools.wraps`` chains, and a ``__signature__`` of a callable's own always wins."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import pytest

from gpuprobe import _seams


def expected_positions(fn: Any, names: tuple[str, ...]) -> dict[str, int | None]:
    """The positions straight from inspect.signature (the oracle)."""
    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {n: params.index(n) if n in params else None for n in names}


class Model:
    def step(self, input_ids: Any, scores: Any = None, *, streamer: Any = None) -> Any:
        return input_ids


def traced(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@traced
def wrapped(inputs: Any, streamer: Any = None) -> Any:
    return inputs


def test_positions_are_the_signature_s_for_functions_bound_methods_and_wrapped_ones() -> None:
    names = ("input_ids", "scores", "streamer", "inputs")
    for fn in (Model.step, Model().step, Model().step, wrapped, Model.__init__):
        assert _seams.ArgReader(fn, names)._positions == expected_positions(fn, names), fn
    bound = _seams.ArgReader(Model().step, ("scores", "streamer"))
    assert bound.get((1, 2), {}, "scores") == 2 and bound.get((1,), {"streamer": 3}, "streamer") == 3
    unbound = _seams.ArgReader(Model.step, ("scores",))
    assert unbound.get(("self", 1, 2), {}, "scores") == 2  # the same code unbound: self counts


def test_one_signature_is_read_per_code_object(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(self: Any, a: Any, b: Any = None) -> None: ...  # a code object no other test has read

    cls = type("Fresh", (), {"method": fresh})
    reads: list[Any] = []
    signature = inspect.signature

    def counted(fn: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        reads.append(fn)
        return signature(fn, *args, **kwargs)

    monkeypatch.setattr(_seams.inspect, "signature", counted)
    readers = [_seams.ArgReader(cls().method, ("b",)) for _ in range(3)]
    assert [r.get((1, 2), {}, "b") for r in readers] == [2, 2, 2]
    assert len(reads) == 1  # three instances, one reading
    assert _seams.missing_parameters(cls().method, ("a", "c")) == "no parameter c (it takes a, b)"
    assert len(reads) == 1


def test_a_signature_of_the_callable_s_own_is_read_every_time() -> None:
    def original(a: Any, b: Any) -> None: ...

    assert _seams.ArgReader(original, ("b",))._positions == {"b": 1}
    original.__signature__ = inspect.Signature([inspect.Parameter("b", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    assert _seams.ArgReader(original, ("b",))._positions == {"b": 0}
    assert _seams.missing_parameters(original, ("a",)) == "no parameter a (it takes b)"
    # a function of the same code without one still reads its own parameters
    twin = types.FunctionType(original.__code__, globals())
    assert _seams.ArgReader(twin, ("b",))._positions == {"b": 1}


def test_what_cannot_be_read_is_said_and_read_as_keywords_only() -> None:
    assert _seams.missing_parameters(max, ("key",)) == "its signature cannot be read, and gpuprobe reads key"
    unreadable = _seams.ArgReader(max, ("key",))
    assert unreadable.get((1, 2), {"key": 3}, "key") == 3 and unreadable.get((1, 2), {}, "key") is None
    partial = functools.partial(Model.step, None)
    assert _seams.ArgReader(partial, ("scores",))._positions == expected_positions(partial, ("scores",))


def test_the_kept_signatures_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_seams, "_shapes", {})
    monkeypatch.setattr(_seams, "_SHAPES_KEPT", 10)
    for i in range(25):
        scope: dict[str, Any] = {}
        exec(f"def f{i}(a, b{i}=None): pass", scope)  # noqa: S102 - a new code object each time
        fn = scope[f"f{i}"]
        assert _seams.ArgReader(fn, (f"b{i}",))._positions == {f"b{i}": 1}
    assert len(_seams._shapes) == 10
