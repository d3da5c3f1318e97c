"""``@probe`` calls a function exactly as the caller called it, whatever ``__signature__`` declares.

A declared ``__signature__`` describes a function to introspection; it does not change how a call binds
to the function's code. The probed function must receive the very arguments the plain function receives
(recorded inside it) and give the same result or exception, for positional, keyword, defaulted and
``*args``/``**kwargs`` calls, and for calls that do not bind; introspection still sees what it saw.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuprobe
from gpuprobe import probe

P = inspect.Parameter
received: list[Any] = []  # what each target function was called with, recorded inside it


def _declared(*params: inspect.Parameter) -> inspect.Signature:
    return inspect.Signature(list(params))


def different_defaults(a: Any, b: Any = 1, *, c: Any = 2) -> Any:
    received.append(("different_defaults", a, b, c))
    return (a, b, c)


different_defaults.__signature__ = _declared(  # type: ignore[attr-defined]
    P("a", P.POSITIONAL_OR_KEYWORD), P("b", P.POSITIONAL_OR_KEYWORD, default=100),
    P("c", P.KEYWORD_ONLY, default=200))


def different_names(a: Any, b: Any = 0) -> Any:
    received.append(("different_names", a, b))
    return a - b


different_names.__signature__ = _declared(  # type: ignore[attr-defined]
    P("x", P.POSITIONAL_OR_KEYWORD), P("y", P.POSITIONAL_OR_KEYWORD, default=5))


def keywords_only_in_code(**kw: Any) -> Any:
    received.append(("keywords_only_in_code", dict(kw)))
    return sorted(kw.items())


keywords_only_in_code.__signature__ = _declared(  # type: ignore[attr-defined]
    P("a", P.POSITIONAL_OR_KEYWORD), P("b", P.POSITIONAL_OR_KEYWORD, default=5))


def _inner(a: Any, b: Any = 1) -> Any:
    return a * 10 + b


@functools.wraps(_inner)
def wraps_another(*args: Any, **kwargs: Any) -> Any:
    received.append(("wraps_another", args, dict(kwargs)))
    return _inner(*args, **kwargs)


@functools.wraps(_inner)
def wraps_and_declares(*args: Any, **kwargs: Any) -> Any:
    received.append(("wraps_and_declares", args, dict(kwargs)))
    return _inner(*args, **kwargs)


# What a decorator that keeps the signature for tools does: a (*args, **kwargs) body, the inner one's signature.
wraps_and_declares.__signature__ = inspect.signature(_inner)  # type: ignore[attr-defined]


def positional_only_declared_otherwise(a: Any, /, b: Any = 3, *rest: Any, **extra: Any) -> Any:
    received.append(("positional_only_declared_otherwise", a, b, rest, dict(extra)))
    return (a, b, rest, extra)


positional_only_declared_otherwise.__signature__ = _declared(  # type: ignore[attr-defined]
    P("a", P.KEYWORD_ONLY), P("b", P.KEYWORD_ONLY, default=7))


def names_the_wrapper_uses(len: Any, perf_counter_ns: Any = 3, *, _on: Any = 4) -> Any:  # noqa: A002
    received.append(("names_the_wrapper_uses", len, perf_counter_ns, _on))
    return (len, perf_counter_ns, _on)


class DeclaresASignature:
    """A callable object whose class declares a signature its ``__call__`` does not have."""

    __signature__ = _declared(P("only", P.POSITIONAL_ONLY))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        received.append(("DeclaresASignature", args, dict(kwargs)))
        return len(args) + len(kwargs)


class Methods:
    def method(self, a: Any, b: Any = 1) -> Any:
        received.append(("Methods.method", a, b))
        return a + b

    method.__signature__ = _declared(P("self", P.POSITIONAL_OR_KEYWORD),  # type: ignore[attr-defined]
                                     P("b", P.POSITIONAL_OR_KEYWORD, default=50))
    probed_method = probe(method)


TARGETS: dict[str, Callable[..., Any]] = {
    "different defaults": different_defaults,
    "different names": different_names,
    "**kw function with a declared signature": keywords_only_in_code,
    "functools.wraps of another function": wraps_another,
    "functools.wraps and the inner signature declared": wraps_and_declares,
    "positional-only code, keyword-only declared": positional_only_declared_otherwise,
    "parameters named like the wrapper's globals": names_the_wrapper_uses,
    "a class with __signature__": DeclaresASignature(),
}
PROBED = {name: probe(fn) for name, fn in TARGETS.items()}


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What one call gives: its result or its exception (type and message), and what the function received."""
    received.clear()
    try:
        result: tuple[Any, ...] = ("returned", fn(*args, **kwargs))
    except Exception as exc:
        result = ("raised", type(exc), str(exc))
    return (*result, list(received))


def _host_calls(name: str) -> int:
    return sum(p.count for md in gpuprobe.collect() if md.spec.name == "gpuprobe.probe.duration"
               for p in md.points if p.labels["probe"] == name and p.labels["clock"] == "host")


# Calls of every shape: positional, keyword (by the code's names and by the declared ones), defaulted,
# extra positional and keyword arguments, and calls that do not bind.
CALLS = [
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((), {"a": 1}),
    ((), {"a": 1, "b": 2}),
    ((1,), {"b": 2}),
    ((1,), {"c": 3}),
    ((1, 2), {"c": 3, "d": 4}),
    ((), {"x": 1, "y": 2}),
    ((1,), {"y": 2}),
    ((), {"len": 1, "perf_counter_ns": 2, "_on": 3}),
    ((), {}),
    ((1,), {"a": 1}),
    ((1, 2, 3, 4, 5), {"only": 6}),
]


@pytest.mark.parametrize("args, kwargs", CALLS, ids=[repr(c) for c in CALLS])
@pytest.mark.parametrize("name", list(TARGETS))
def test_a_probed_function_receives_the_arguments_the_plain_function_receives(
        name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert _outcome(PROBED[name], args, kwargs) == _outcome(TARGETS[name], args, kwargs)


_KEYWORDS = st.sampled_from(["a", "b", "c", "d", "x", "y", "only", "len", "perf_counter_ns", "_on", "rest", "kw"])


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(list(TARGETS)), args=st.lists(st.integers(-5, 5), max_size=5).map(tuple),
       kwargs=st.dictionaries(_KEYWORDS, st.integers(-5, 5), max_size=4))
def test_any_call_of_a_probed_function_binds_as_the_plain_call_does(
        name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert _outcome(PROBED[name], args, kwargs) == _outcome(TARGETS[name], args, kwargs)


def test_a_call_through_a_run_time_disabled_probe_binds_as_the_plain_call_does() -> None:
    gpuprobe.disable()
    try:
        for name in TARGETS:
            for args, kwargs in CALLS:
                assert _outcome(PROBED[name], args, kwargs) == _outcome(TARGETS[name], args, kwargs), (name, args)
    finally:
        gpuprobe.enable()


def test_a_function_with_a_declared_signature_is_still_measured() -> None:
    assert PROBED["different defaults"](1) == (1, 1, 2)
    assert PROBED["**kw function with a declared signature"](a=1) == [("a", 1)]
    assert _host_calls("different_defaults") == 1
    assert _host_calls("keywords_only_in_code") == 1


def test_a_method_whose_function_declares_a_signature_binds_as_the_plain_method() -> None:
    obj = Methods()
    for args, kwargs in [((1,), {}), ((1, 2), {}), ((), {"a": 1}), ((), {"b": 1}), ((1,), {"b": 3})]:
        assert _outcome(obj.probed_method, args, kwargs) == _outcome(obj.method, args, kwargs)


@pytest.mark.parametrize("name", list(TARGETS))
def test_introspection_sees_the_signature_it_saw_before(name: str) -> None:
    assert inspect.signature(PROBED[name]) == inspect.signature(TARGETS[name])


def test_a_declared_signature_stays_declared_on_the_wrapper() -> None:
    declared = different_defaults.__signature__  # type: ignore[attr-defined]
    assert PROBED["different defaults"].__signature__ is declared  # type: ignore[attr-defined]
    assert str(inspect.signature(PROBED["different defaults"])) == "(a, b=100, *, c=200)"


def test_a_callable_object_without_a_qualified_name_is_wrapped_and_rebound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An instance has no __qualname__; the wrapper's code is compiled afresh for it (no cached factory)
    # when it is wrapped and again when a reconfiguration rebinds every wrapper.
    from gpuprobe import _probe

    monkeypatch.setattr(_probe, "_factories", {})
    target = DeclaresASignature()
    probed = probe(target)
    assert getattr(probed, "__gpuprobe__", None) is not None, "the object was passed through, not wrapped"
    _probe._factories.clear()
    gpuprobe.configure(memory=True)
    try:
        assert _outcome(probed, (1, 2), {"k": 3}) == _outcome(target, (1, 2), {"k": 3})
    finally:
        gpuprobe.configure(memory=False)
