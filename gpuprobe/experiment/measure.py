"""One measured call: gpuprobe's own probes read back per call, the sync audit, a kineto trace.

Every call runs inside a probe (``gpuprobe.try``: the call's duration on the host clock, and on the
device clock on a GPU); the transformers integration records the rest (time to first token, steps,
components, tokens, memory). A sink of the runtime (:class:`gpuprobe.testing.InMemoryExporter`) keeps
what one call recorded, and :class:`Meter` turns it into :class:`CallFigures`. On a GPU the device
clock's figures are taken where the integration has them, once the call's work has finished, and the
audited call also samples its steps' kernels (launches per step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import gpuprobe
from gpuprobe._stats import median
from gpuprobe.profiling import KernelSampler, profile
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter, Observation

from .faults import CallFailed, is_gpuprobes

__all__ = ["CallFigures", "Syncs", "Audit", "Meter", "FIGURES"]

PROBE = "gpuprobe.try"

#: The figures compared between variants: name → (lower is better, unit, label).
FIGURES: dict[str, tuple[bool, str, str]] = {
    "tokens_per_s": (False, "tok/s", "tokens/s"),
    "ttft_s": (True, "s", "TTFT"),
    "tpot_s": (True, "s", "TPOT"),
    "prefill_s": (True, "s", "prefill"),
    "decode_s": (True, "s", "decode"),
    "call_s": (True, "s", "call"),
    "peak_memory_bytes": (True, "B", "peak memory"),
    "kv_cache_bytes": (True, "B", "KV cache"),
}


@dataclasses.dataclass
class CallFigures:
    """What one call measured. Times in seconds on ``clock``; None where the call gave no sample.

    Attributes:
        call_s: the whole call (the ``gpuprobe.try`` probe).
        ttft_s: time to first token (continuous batching: the median of its requests').
        tpot_s: time per output token after the first (device: the mean inter-token time).
        prefill_s, decode_s: the prefill step, and the decode steps summed.
        output_tokens: new tokens of every sequence.
        tokens_per_s: ``output_tokens`` over ``call_s``.
        peak_memory_bytes: the device allocator's peak during the call (CUDA only).
        kv_cache_bytes: the largest KV-cache size read during the call.
        components: host seconds per (component, processor) of the steps, for flagging.
        steps_s: host seconds of all steps.
    """

    clock: str
    call_s: float
    ttft_s: float | None
    tpot_s: float | None
    prefill_s: float | None
    decode_s: float | None
    output_tokens: int
    tokens_per_s: float | None
    peak_memory_bytes: float | None
    kv_cache_bytes: float | None
    components: dict[tuple[str, str], float]
    steps_s: float

    def figure(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)


@dataclasses.dataclass(frozen=True)
class Syncs:
    """What the sync audit counted in one call: syncs per audited step, by (component, processor)."""

    steps: int
    by_place: dict[tuple[str, str], float]

    @property
    def per_step(self) -> float | None:
        return sum(self.by_place.values()) / self.steps if self.steps else None

    def of(self, component: str, processor: str) -> float:
        return self.by_place.get((component, processor), 0.0) / self.steps if self.steps else 0.0


@dataclasses.dataclass(frozen=True)
class Audit:
    """What the audited call counted: its syncs (None when no step was audited: compiled calls are not),
    and kernel launches per sampled step (None unless the meter counts launches)."""

    syncs: Syncs | None
    launches_per_step: float | None


class Meter:
    """Measures calls one at a time on the calling thread; :meth:`close` detaches it.

    Args:
        cuda: the model runs on a CUDA device (device clock, peak memory, a synchronize after each call).
        launches: count kernel launches per step in the audited call (default: on CUDA; on a CPU the
            sampler counts the step's leaf operators instead, no launches).
        device: the CUDA device the model runs on (``cuda:1``); default: the current one.
    """

    def __init__(self, cuda: bool, launches: bool | None = None, device: str | None = None) -> None:
        self.cuda = cuda
        self.device = device
        self.launches = cuda if launches is None else launches
        self.clock = "device" if cuda else "host"
        self._probe = gpuprobe.probe(PROBE, kind="try", device_every=1)
        self._exporter = InMemoryExporter().attach()
        self._torch: Any = None
        if cuda:
            import torch

            self._torch = torch

    def close(self) -> None:
        self._exporter.detach()

    def _settle(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize(self.device)  # between calls, outside what is timed: device timings resolve

    def call(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[Any, CallFigures]:
        """Run ``fn(**kwargs)`` once, measured; returns its output and figures.

        Raises:
            CallFailed: the call raised (MODEL's error; the original is its ``error``). So do :meth:`audit`
                and :meth:`trace`.
        """
        self._settle()
        if self.cuda:
            self._torch.cuda.reset_peak_memory_stats(self.device)
        self._exporter.clear()
        with _model_errors():
            with self._probe:
                out = fn(**kwargs)
            self._settle()  # an asynchronous CUDA error of the call surfaces here
        return out, self._figures(self._exporter.observations())

    def audit(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[Any, Audit]:
        """Run ``fn(**kwargs)`` once with every step audited (``sync_audit=1``) and, when the meter counts
        launches, kernel sampling on every step it can take (a :class:`~gpuprobe.profiling.KernelSampler`)."""
        before = runtime().settings.sync_audit
        self._settle()
        self._exporter.clear()
        sampler = self._sampler()
        gpuprobe.configure(sync_audit=1)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the first sightings: counted below instead
                with _model_errors():
                    out = fn(**kwargs)
                    self._settle()
        finally:
            gpuprobe.configure(sync_audit=before)
            if sampler is not None:
                sampler.detach()  # waits for the last sample to be read
        obs = self._exporter.observations()
        steps = int(sum(o.value for o in obs if o.metric == "gpuprobe.step.audited"))
        places: dict[tuple[str, str], float] = defaultdict(float)
        for o in obs:
            if o.metric == "gpuprobe.step.syncs":
                places[(o.attrs.get("component", ""), o.attrs.get("processor", ""))] += o.value
        launches = None
        if sampler is not None and sampler.samples:
            launches = sum(o.value for o in obs if o.metric == "gpuprobe.kernel.launches") / sampler.samples
        return out, Audit(Syncs(steps, dict(places)) if steps else None, launches)

    def trace(self, fn: Callable[..., Any], kwargs: Mapping[str, Any], path: str | os.PathLike[str]) -> Path | str:
        """Run ``fn(**kwargs)`` once inside a profile window (a kineto trace at ``path``).

        Returns:
            The trace's path, or why there is none.
        """
        first = runtime().steps.index + 1
        window = profile((first, first + 10**9), output=path)
        try:
            with _model_errors():
                fn(**kwargs)
                self._settle()
        finally:
            written = window.stop()
        return written if written is not None else (window.error or "no step ran inside the window")

    def _sampler(self) -> KernelSampler | None:
        if not self.launches:
            return None
        try:
            return KernelSampler(1).attach()
        except Exception:  # launches per step are an extra: the audit goes on without them
            return None

    def _figures(self, obs: list[Observation]) -> CallFigures:
        by: dict[str, list[Observation]] = defaultdict(list)
        for o in obs:
            by[o.metric].append(o)

        def values(metric: str, **want: str) -> list[float]:
            return [o.value for o in by.get(metric, ()) if all(o.attrs.get(k) == v for k, v in want.items())]

        def clocked(metric: str, **want: str) -> list[float]:
            found = values(metric, clock=self.clock, **want) if self.cuda else []
            return found or values(metric, clock="host", **want)

        call = clocked("gpuprobe.probe.duration", probe=PROBE)
        call_s = call[-1] if call else 0.0
        host_call = values("gpuprobe.probe.duration", probe=PROBE, clock="host")
        tokens = int(sum(values("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})))
        if self.cuda and values("gpuprobe.inter_token.duration", clock="device"):
            inter = values("gpuprobe.inter_token.duration", clock="device")
            tpot: float | None = sum(inter) / len(inter)
        else:
            tpot = median(values("gen_ai.server.time_per_output_token"))
        prefill = clocked("gpuprobe.step.duration", phase="prefill")
        decode = clocked("gpuprobe.step.duration", phase="decode")
        components: dict[tuple[str, str], float] = defaultdict(float)
        for o in by.get("gpuprobe.step.component.duration", ()):
            components[(o.attrs.get("component", ""), o.attrs.get("processor", ""))] += o.value
        peak = values("gpuprobe.memory.peak") if self.cuda else []
        kv = values("gpuprobe.kv_cache.memory")
        wall = host_call[-1] if host_call else call_s
        return CallFigures(
            clock=self.clock,
            call_s=call_s,
            ttft_s=median(clocked("gen_ai.server.time_to_first_token")),
            tpot_s=tpot,
            prefill_s=sum(prefill) if prefill else None,
            decode_s=sum(decode) if decode else None,
            output_tokens=tokens,
            # a rate the caller sees: tokens over the call's host time
            tokens_per_s=tokens / wall if tokens and wall > 0 else None,
            peak_memory_bytes=max(peak) if peak else None,
            kv_cache_bytes=max(kv) if kv else None,
            components=dict(components),
            steps_s=sum(values("gpuprobe.step.duration", clock="host")),
        )


@contextlib.contextmanager
def _model_errors() -> Iterator[None]:
    """Around a call of MODEL and the wait for its device work: what is raised there is MODEL's
    (:class:`~gpuprobe.experiment.faults.CallFailed`), unless it was raised inside gpuprobe's own code."""
    try:
        yield
    except Exception as exc:
        if is_gpuprobes(exc):
            raise
        raise CallFailed(exc) from exc


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and the host seconds it took (for budgeting, never reported as a figure)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
