"""``@probe`` over any callable behaves like the callable: static and class methods stay what they are,
a property's getter is measured, callable objects keep their attributes (``lru_cache``'s ``cache_info()``)
and their binding, and what gpuprobe cannot read is handed back unchanged with one warning."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import pytest

import gpuprobe
from gpuprobe import probe


def _calls(name: str) -> int:
    """How many calls the host-clock series of probe ``name`` has counted."""
    return sum(p.count for md in gpuprobe.collect() if md.spec.name == "gpuprobe.probe.duration"
               for p in md.points if p.labels["probe"] == name and p.labels["clock"] == "host")


class Shapes:
    factor = 3

    def __init__(self) -> None:
        self._size = 1

    @probe
    @staticmethod
    def static_outer(x: int) -> int:
        return x + 1

    @staticmethod
    @probe
    def static_inner(x: int) -> int:
        return x + 2

    @probe
    @classmethod
    def class_outer(cls, x: int) -> tuple[str, int]:
        return cls.__name__, x * cls.factor

    @classmethod
    @probe
    def class_inner(cls, x: int) -> tuple[str, int]:
        return cls.__name__, x

    @probe
    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = value

    @probe
    @functools.lru_cache(maxsize=8)
    def cached(self, x: int) -> int:
        return x * self.factor


class Derived(Shapes):
    factor = 5


def test_static_methods_stay_static_through_the_class_and_an_instance() -> None:
    for name in ("static_outer", "static_inner"):
        assert isinstance(inspect.getattr_static(Shapes, name), staticmethod)
    assert Shapes.static_outer(1) == Shapes().static_outer(1) == 2
    assert Shapes.static_inner(1) == Shapes().static_inner(1) == 3
    assert _calls("Shapes.static_outer") == 2 and _calls("Shapes.static_inner") == 2


def test_class_methods_stay_class_methods_and_get_the_right_class() -> None:
    assert isinstance(inspect.getattr_static(Shapes, "class_outer"), classmethod)
    assert Shapes.class_outer(2) == ("Shapes", 6)
    assert Derived().class_outer(2) == ("Derived", 10)
    assert Derived.class_inner(4) == ("Derived", 4)
    assert _calls("Shapes.class_outer") == 2 and _calls("Shapes.class_inner") == 1


def test_a_property_measures_its_getter_and_keeps_its_setter() -> None:
    shapes = Shapes()
    assert isinstance(inspect.getattr_static(Shapes, "size"), property)
    shapes.size = 7
    assert shapes.size == 7 and shapes.size == 7
    assert _calls("Shapes.size") == 2


def test_lru_cache_keeps_its_cache_functions_and_signature() -> None:
    @probe
    @functools.lru_cache(maxsize=None)
    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(15) == 610
    info = fib.cache_info()
    assert (info.misses, info.currsize) == (16, 16)
    fib.cache_clear()
    assert fib.cache_info().currsize == 0
    assert str(inspect.signature(fib)) == "(n: 'int') -> 'int'"
    assert _calls("test_lru_cache_keeps_its_cache_functions_and_signature.<locals>.fib") == 16 + 13


def test_lru_cache_on_a_method_binds_and_keeps_its_cache_functions() -> None:
    Shapes.cached.cache_clear()
    one, other = Shapes(), Derived()
    assert one.cached(2) == 6 and one.cached(2) == 6 and other.cached(2) == 10
    assert one.cached.cache_info().hits == 1 and Shapes.cached.cache_info().misses == 2
    assert _calls("Shapes.cached") == 3


def test_a_callable_object_keeps_its_attributes_live() -> None:
    class Scale:
        def __init__(self) -> None:
            self.by = 2

        def __call__(self, x: int) -> int:
            return x * self.by

    scale = Scale()
    probed = probe(scale)
    assert probed(3) == 6
    scale.by = 10  # a change after decoration is seen through the probed object
    assert probed.by == 10 and probed(3) == 30
    probed.by = 4  # and a write reaches the object
    assert scale.by == 4
    partial = probe(functools.partial(pow, 2))
    assert partial(5) == 32 and partial.func is pow and partial.args == (2,)
    assert _calls("test_a_callable_object_keeps_its_attributes_live.<locals>.Scale") == 2
    assert _calls("pow") == 1


class _RaisingGetattr:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} here")

    def __call__(self, x: int) -> int:
        return x + 100


class _RaisingSignature:
    @property
    def __signature__(self) -> Any:
        raise ZeroDivisionError("no signature")

    def __call__(self, x: int) -> int:
        return x - 100


def test_a_callable_whose_signature_raises_is_measured_and_decorating_it_raises_nothing() -> None:
    target = _RaisingSignature()
    probed = probe(target)
    assert probed(150) == 50 and probed.__wrapped__ is target
    assert _calls("_RaisingSignature") == 1


@pytest.mark.parametrize("target", [_RaisingGetattr(), Shapes], ids=["getattr", "class"])
def test_what_cannot_be_read_is_handed_back_unchanged_with_one_warning(target: Any) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        probed = probe(target)
        probe(target)  # a second decoration of the same object says nothing more
    assert probed is target
    ours = [w for w in seen if "gpuprobe: probe() leaves" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
    if target is not Shapes:
        assert probed(150) == 250


def test_a_wrapper_still_names_the_functions_it_wraps() -> None:
    assert Shapes.static_outer.__name__ == "static_outer"
    assert Shapes.__dict__["class_outer"].__func__.__qualname__ == "Shapes.class_outer"
    assert Shapes.cached.__wrapped__.__wrapped__.__qualname__ == "Shapes.cached"
