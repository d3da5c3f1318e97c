"""``torch._C._autograd._KinetoEvent`` of several torch releases, as stand-ins for tests.

One torch is installed per environment, but gpuprobe's kernel sampler and the simulated CUDA's
profiler must follow the kineto events of every release they support. The ``kineto_shape`` fixture
runs a test once with the installed torch's class and once with a stand-in class of each release
below; the stand-in's methods are only names (calling one raises): the simulated CUDA hands out events
shaped as whatever class ``torch._C._autograd._KinetoEvent`` is while it runs, and the sampler reads
that class to decide how to tell device work apart. A stand-in is a test double for a torch release
that cannot be installed beside the pinned one; each list is the class's public methods as read from
that release's wheel (``dir(torch._C._autograd._KinetoEvent)``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# torch 2.2.2 (PyPI wheel): times in microseconds; no is_user_annotation(), no activity_type().
TORCH_2_2 = frozenset({
    "concrete_inputs", "correlation_id", "cuda_elapsed_us", "device_index", "device_resource_id", "device_type",
    "dtypes", "duration_us", "end_thread_id", "flops", "fwd_thread_id", "is_async", "linked_correlation_id", "name",
    "nbytes", "privateuse1_elapsed_us", "scope", "sequence_nr", "shapes", "stack", "start_thread_id", "start_us",
})
# torch 2.11.0 (PyPI wheel; the same list on a real H200 with torch 2.11.0+cu130): no activity_type().
TORCH_2_11 = frozenset({
    "concrete_inputs", "correlation_id", "cuda_elapsed_us", "device_index", "device_resource_id", "device_type",
    "dtypes", "duration_ns", "end_ns", "end_thread_id", "flops", "fwd_thread_id", "is_async", "is_hidden_event",
    "is_user_annotation", "kwinputs", "linked_correlation_id", "metadata_json", "name", "nbytes", "overload_name",
    "privateuse1_elapsed_us", "scope", "sequence_nr", "shapes", "stack", "start_ns", "start_thread_id",
})
# torch 2.13.0 (the pinned release).
TORCH_2_13 = TORCH_2_11 | frozenset({
    "activity_type", "external_id", "extra_meta", "flow_id", "flow_start", "flow_type", "is_python_function",
    "python_id", "python_module_id", "python_parent_id", "structured_input_shapes", "structured_input_strides",
})
SHAPES = {"torch-2.2": TORCH_2_2, "torch-2.11": TORCH_2_11, "torch-2.13": TORCH_2_13}


def public_methods(cls: type) -> frozenset[str]:
    """The public attribute names of a class, as ``dir`` gives them."""
    return frozenset(n for n in dir(cls) if not n.startswith("_"))


def stand_in(release: str) -> type:
    """A class named ``_KinetoEvent`` with the public methods of ``release`` (one of :data:`SHAPES`)."""
    def method(name: str):  # type: ignore[no-untyped-def]
        def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError(f"the stand-in _KinetoEvent of {release} was called ({name}); only its shape counts")
        return call

    return type("_KinetoEvent", (), {n: method(n) for n in SHAPES[release]})


def use_shape(monkeypatch: pytest.MonkeyPatch, release: str) -> frozenset[str]:
    """Make ``torch._C._autograd._KinetoEvent`` a stand-in of ``release`` for the test; its methods."""
    import torch

    monkeypatch.setattr(torch._C._autograd, "_KinetoEvent", stand_in(release))
    return SHAPES[release]


@pytest.fixture(params=["installed", "torch-2.11", "torch-2.13"])
def kineto_shape(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[frozenset[str]]:
    """The public methods of the ``_KinetoEvent`` the test runs with: the installed torch's, or a stand-in's."""
    import torch

    if request.param == "installed":
        yield public_methods(torch._C._autograd._KinetoEvent)
    else:
        yield use_shape(monkeypatch, request.param)
