"""``torch._C._autograd._KinetoEvent`` of several torch releases, as stand-ins for tests.

One torch is installed per environment, but gpuprobe's kernel sampler and the simulated CUDA's
profiler must follow the kineto events of every release they support. The ``kineto_shape`` fixture
runs a test once with the installed torch's class and once with a stand-in class of each release
below; the stand-in's methods are only names (calling one raises): the simulated CUDA hands out events
shaped as whatever class ``torch._C._autograd._KinetoEvent`` is while it runs, and the sampler reads
that class to decide how to tell device work apart. A stand-in is a test double for a torch release
that cannot be installed beside the pinned one; each list is the class's public methods as read from
that release's wheel (``dir(torch._C._autograd._KinetoEvent)``).

:class:`KinetoTrace` builds small traces in the shape of the exported kineto JSON, for the report's tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------------------------ trace builder

#: Runtime API callback ids as CUPTI gives them in kineto's ``cbid`` argument (CUDA 12).
CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaStreamSynchronize": 131, "cudaMemsetAsync": 51,
        "cudaGraphLaunch": 311}
HOST_PID = 4242
STREAM = 7


class KinetoTrace:
    """Builds a kineto trace event by event, in the shape of a real one (see /work/shared/formats
    kineto_min.json and tests/data/kineto_min.json): ``user_annotation`` ranges and ``cpu_op`` events
    with ``External id``; ``cuda_runtime`` calls with ``External id``, ``cbid`` and ``correlation``;
    ``ac2g`` flow pairs; kernels and copies on the GPU process with kineto's launch arguments. A CUDA
    graph replay is one ``cudaGraphLaunch`` whose node kernels carry its correlation id and External
    id, as in the real traces of tests/data/kineto. Times are µs (floats, 3 decimals, as kineto writes).
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 100
        self.ext = 0
        self.clock = 0.0  # the host thread's time, advanced by the helpers
        self.gpu_free = 0.0  # when the stream is free again

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def range(self, name: str, ts: float, dur: float) -> None:
        args = {"External id": self._next_ext(), "Record function id": 0, "Ev Idx": len(self.events)}
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": HOST_PID, "tid": HOST_PID,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args})

    def op(self, name: str, ts: float, dur: float, **args: Any) -> int:
        ext = self._next_ext()
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": HOST_PID, "tid": HOST_PID,
                            "ts": round(ts, 3), "dur": round(dur, 3),
                            "args": {"External id": ext, "Record function id": 0, "Ev Idx": len(self.events), **args}})
        return ext

    def runtime(self, name: str, ts: float, dur: float, ext: int) -> int:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": HOST_PID, "tid": HOST_PID,
                            "ts": round(ts, 3), "dur": round(dur, 3),
                            "args": {"External id": ext, "cbid": CBID[name], "correlation": self.corr}})
        return self.corr

    def gpu(self, cat: str, name: str, ts: float, dur: float, corr: int, ext: int, **args: Any) -> None:
        self.events.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": HOST_PID, "ts": round(ts, 3),
                            "cat": "ac2g", "name": "ac2g"})
        base = {"External id": ext, "device": 0, "context": 1, "stream": STREAM, "correlation": corr}
        if cat == "kernel":
            base.update({"queued": 0, "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5,
                         "warps per SM": 2.0, "grid": [64, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": STREAM, "ts": round(ts, 3),
                            "dur": round(dur, 3), "args": {**base, **args}})
        self.events.append({"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": round(ts, 3), "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})

    def kernel(self, op: str, kernel: str, kdur: float, op_us: float = 6.0, launch_us: float = 3.0,
               **op_args: Any) -> None:
        """An operator launching one kernel at the host clock; the kernel runs when launched and the stream is free."""
        ext = self.op(op, self.clock, op_us, **op_args)
        corr = self.runtime("cudaLaunchKernel", self.clock + 1, launch_us, ext)
        start = max(self.clock + 1 + launch_us + 2, self.gpu_free)
        self.gpu("kernel", kernel, start, kdur, corr, ext)
        self.gpu_free = start + kdur
        self.clock += op_us + 1

    def graph(self, nodes: list[tuple[str, float]], launch_us: float = 8.0) -> None:
        """One graph replay at the host clock: a cudaGraphLaunch and its node kernels, back to back."""
        ext = self._next_ext()
        corr = self.runtime("cudaGraphLaunch", self.clock, launch_us, ext)
        start = max(self.clock + launch_us + 2, self.gpu_free)
        for name, dur in nodes:
            self.gpu("kernel", name, start, dur, corr, ext)
            start += dur + 0.5
        self.gpu_free = start
        self.clock += launch_us + 1

    def item(self, outer: str = "aten::is_nonzero", sync_us: float = 0.0) -> None:
        """bool(tensor) (or .item()): a 1-element DtoH copy, then a stream sync until the GPU is done."""
        t0 = self.clock
        wait = max(self.gpu_free - (t0 + 8), 0.0) + 2 + sync_us
        total = 12 + wait
        self.op(outer, t0, total)
        if outer != "aten::item":
            self.op("aten::item", t0 + 0.5, total - 1)
        ext = self.op("aten::_local_scalar_dense", t0 + 1, total - 2)
        corr = self.runtime("cudaMemcpyAsync", t0 + 2, 3, ext)
        start = max(t0 + 6, self.gpu_free)
        self.gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", start, 1.2, corr, ext, bytes=1)
        self.gpu_free = start + 1.2
        self.runtime("cudaStreamSynchronize", t0 + 6, wait + 2, ext)
        self.clock = t0 + total + 1

    def write(self, path: Path) -> Path:
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9,
                                                         "computeMinor": 0, "numSms": 132}],
               "record_shapes": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1727743122000000000,
               "traceEvents": self.events, "traceName": path.name}
        path.write_text(json.dumps(doc))
        return path
