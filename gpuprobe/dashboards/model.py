"""The dashboard model: dashboards of rows of panels of queries, independent of how they are rendered."""

from __future__ import annotations

import dataclasses

__all__ = [
    "GPU_ONLY",
    "NoData",
    "NEEDS_GPU",
    "WAITS_FOR_ERRORS",
    "WAITS_FOR_DROPS",
    "KERNEL_SAMPLING_OFF",
    "SYNC_AUDIT_OFF",
    "NO_CONTINUOUS_BATCHING",
    "NO_SPECULATIVE_DECODING",
    "PEAKS_UNKNOWN",
    "LAYER_TIMING_OFF",
    "NO_PROBES",
    "NO_SERVICE_LEVEL_GOALS",
    "NO_DIFFUSION_PIPELINE",
    "NO_DATA_REASONS",
    "GENERATE_ONLY",
    "NO_GENERATE_CALL",
    "EXEMPLARS_NOTE",
    "Target",
    "Panel",
    "Row",
    "Dashboard",
]

GPU_ONLY = "GPU only."
"""How the description of a panel that needs a GPU begins (device clock, CUDA allocator)."""


@dataclasses.dataclass(frozen=True)
class NoData:
    """A documented reason for a panel to show no data on a healthy run: what it needs, or waits for.

    Attributes:
        reason: a few words, as ``python -m gpuprobe dashboard --verify`` lists it.
        sentence: what the panel's description says; the reason is read back from the JSON by it.

    Example:
        >>> WAITS_FOR_ERRORS.reason
        'waits for an error'
    """

    reason: str
    sentence: str


NEEDS_GPU = NoData("needs a GPU", GPU_ONLY)
"""The panel's series exist only on a CUDA device (``Panel.gpu_only``; the description begins with it)."""
WAITS_FOR_ERRORS = NoData("waits for an error", "No data until a generate() call or one of your probes fails.")
WAITS_FOR_DROPS = NoData("waits for dropped telemetry",
                         "No data, or zero, until gpuprobe drops a record (nothing dropped is the healthy state).")
KERNEL_SAMPLING_OFF = NoData("kernel sampling off",
                             "No data while kernel sampling is off (GPUPROBE_KERNEL_SAMPLING=N turns it on).")
SYNC_AUDIT_OFF = NoData("sync audit off", "No data while the sync audit is off (GPUPROBE_SYNC_AUDIT=N turns it on).")
NO_CONTINUOUS_BATCHING = NoData(
    "no continuous batching",
    "No data unless continuous batching runs (generate_batch, transformers serve --continuous-batching); "
    "preemptions only once the scheduler has evicted a request.")
NO_SPECULATIVE_DECODING = NoData(
    "no speculative decoding",
    "No data unless speculative decoding runs (assistant_model=, prompt_lookup_num_tokens=).")
PEAKS_UNKNOWN = NoData(
    "peaks unknown",
    "No data unless the device's peaks are known: a GPU in the table of docs/utilization.md, or "
    "GPUPROBE_PEAK_MEMORY_BANDWIDTH / GPUPROBE_PEAK_FLOPS; gpuprobe.info() says why not.")
LAYER_TIMING_OFF = NoData("layer timing off",
                          "No data unless decoder layers are timed (instrument(model, layers=True)).")
NO_PROBES = NoData("no probes", "No data unless the program runs @probe / with probe() regions of its own.")
NO_SERVICE_LEVEL_GOALS = NoData(
    "no service-level goals",
    "No data unless service-level goals are set (GPUPROBE_SLO_TTFT, GPUPROBE_SLO_TPOT, GPUPROBE_SLO_E2E) and a "
    "request has ended.")

NO_DIFFUSION_PIPELINE = NoData(
    "no diffusers pipeline",
    "No data unless a diffusers pipeline is measured (instrument(pipe), instrument_all(), or gpuprobe run) and "
    "has run.")

NO_DATA_REASONS = (NEEDS_GPU, WAITS_FOR_ERRORS, WAITS_FOR_DROPS, KERNEL_SAMPLING_OFF, SYNC_AUDIT_OFF,
                   NO_CONTINUOUS_BATCHING, NO_SPECULATIVE_DECODING, PEAKS_UNKNOWN, LAYER_TIMING_OFF, NO_PROBES,
                   NO_SERVICE_LEVEL_GOALS, NO_DIFFUSION_PIPELINE)
"""Every documented reason, in the order ``--verify`` lists them (docs/grafana.md names each one)."""

GENERATE_ONLY = "Only generate() calls record it: continuous batching (generate_batch, transformers serve " \
                "--continuous-batching) does not."
"""What the description of a panel only ``generate()`` calls feed says (``Panel.generate_only``)."""
NO_GENERATE_CALL = NoData("no generate() call in this process: continuous batching only", GENERATE_ONLY)
"""Why a :attr:`Panel.generate_only` panel is empty where the processes scraped ran continuous batching and
made no ``generate()`` call: ``--verify`` asks Prometheus which they did (not one of :data:`NO_DATA_REASONS`,
which hold whatever the workload)."""


EXEMPLARS_NOTE = ("With traces on, the dots are exemplars: each is one request (or scheduler step) in a bucket of "
                  "the histogram, and opens its span in the traces data source (docs/tracing.md, Exemplars).")
"""What the description of a panel whose query shows exemplars adds (see :attr:`Target.exemplar`)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One query of a panel: PromQL (with Grafana variables) and the legend of its series.

    Attributes:
        expr: the query.
        legend: the legend of its series.
        exemplar: Grafana also asks Prometheus for the exemplars of the histogram buckets the query reads
            (a request's span per bucket, while traces are on), drawn as dots on the panel. The query must
            read the ``_bucket`` series themselves: a recorded series has no exemplars.

    Example:
        >>> Target("sum(gpuprobe_generate_active)", "in flight").legend
        'in flight'
    """

    expr: str
    legend: str
    exemplar: bool = False

    def __post_init__(self) -> None:
        if self.exemplar and "_bucket" not in self.expr:
            raise ValueError(f"target {self.legend!r}: exemplars come from _bucket series, which {self.expr!r} "
                             "does not read")


@dataclasses.dataclass(frozen=True)
class Panel:
    """One Grafana time-series panel.

    Attributes:
        title: shown on the panel.
        description: shown in the panel's info tooltip (starts with :data:`GPU_ONLY` if ``gpu_only``;
            the JSON adds the sentence of ``no_data``).
        targets: the queries.
        unit: a Grafana unit id (``s``, ``bytes``, ``percentunit``, ``suffix: tok/s``, ...).
        stack: stack the series (parts of a whole).
        gpu_only: its series exist only on a CUDA device.
        no_data: why it may show no data on a healthy run without a GPU problem (what it waits for or
            needs), or None when it always has data while generation runs.
        generate_only: only ``generate()`` calls feed it, not continuous batching (the JSON description adds
            :data:`GENERATE_ONLY`; ``--verify`` excuses it where the processes made no generate() call).

    Example:
        >>> Panel("Batch size", "Mean sequences per call.", ()).unit
        'short'
    """

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    stack: bool = False
    gpu_only: bool = False
    no_data: NoData | None = None
    generate_only: bool = False

    def __post_init__(self) -> None:
        if self.no_data is NEEDS_GPU:
            raise ValueError(f"panel {self.title!r}: say gpu_only=True rather than no_data=NEEDS_GPU")
        if self.no_data is NO_GENERATE_CALL:
            raise ValueError(f"panel {self.title!r}: say generate_only=True rather than no_data=NO_GENERATE_CALL")

    @property
    def no_data_reason(self) -> NoData | None:
        """The documented reason it may be empty: :data:`NEEDS_GPU` for a GPU-only panel, else ``no_data``.

        Example:
            >>> Panel("p", "GPU only. d", (), gpu_only=True).no_data_reason.reason
            'needs a GPU'
        """
        return NEEDS_GPU if self.gpu_only else self.no_data


@dataclasses.dataclass(frozen=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """A dashboard: rows of panels and the template variables ``model``, ``rank`` and ``instance``.

    Example:
        >>> p = Panel("p", "d", ())
        >>> [x.title for x in Dashboard("u", "t", "d", (Row("a", (p,)), Row("b", (p,)))).panels]
        ['p', 'p']
    """

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]

    @property
    def panels(self) -> list[Panel]:
        """Every panel, row by row."""
        return [p for row in self.rows for p in row.panels]
