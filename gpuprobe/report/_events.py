"""What a loader yields: typed trace events with integer nanoseconds, what the trace says about
itself (:class:`TraceInfo`), and exact time conversion."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal

__all__ = [
    "Event",
    "EventFields",
    "event_fields",
    "KERNEL",
    "MEMCPY",
    "MEMSET",
    "RUNTIME",
    "CPU_OP",
    "RANGE",
    "GPU_RANGE",
    "PYTHON",
    "GPU_SYNC",
    "KINDS",
    "TraceInfo",
    "us_to_ns",
    "int_or",
    "LIMIT",
]

KERNEL = "kernel"
MEMCPY = "memcpy"
MEMSET = "memset"
RUNTIME = "runtime"
CPU_OP = "cpu_op"
RANGE = "range"
GPU_RANGE = "gpu_range"
PYTHON = "python"
GPU_SYNC = "gpu_sync"
#: Every event kind, in report order.
KINDS: tuple[str, ...] = (KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, RANGE, GPU_RANGE, PYTHON, GPU_SYNC)

#: Times, sizes and ids stay below this magnitude, so that a start plus a duration fits in int64.
LIMIT = 1 << 62


@dataclasses.dataclass(slots=True)
class Event:
    """One timed event of a trace.

    Attributes:
        kind: One of :data:`KINDS`: ``kernel``, ``memcpy``, ``memset`` (GPU side); ``runtime``
            (CUDA runtime or driver API call); ``cpu_op``; ``range`` (``user_annotation`` or NVTX
            range on a CPU thread); ``gpu_range`` (its projection on a GPU stream); ``python``.
        name: The event name; runtime API names carry no version suffix.
        start_ns: Start time in integer nanoseconds on the trace's own clock.
        dur_ns: Duration in integer nanoseconds (never negative).
        pid: Process (CPU events) or device (kineto GPU events) id.
        tid: Thread (CPU events) or stream (GPU events) id.
        correlation: Links a launch API call to the GPU work it enqueued; -1 if none.
        nbytes: Bytes copied or set by a memcpy or memset; -1 if unknown.
        stream: CUDA stream of a GPU event; -1 if unknown.
        device: Device of a GPU event; -1 if unknown.
        direction: Direction of a memcpy (``HtoD``, ``DtoH``, ``DtoD``, ...); empty otherwise.
        flops: Floating-point operations of a CPU operator (kineto's ``flops``, recorded with
            ``with_flops=True``); -1 if unknown.
        elements: Elements of the tensor inputs of a concatenation operator (``aten::cat``,
            recorded with ``record_shapes=True``); -1 if unknown.

    Example:
        >>> Event("kernel", "k", 1_012_000, 18_304).end_ns
        1030304
    """

    kind: str
    name: str
    start_ns: int
    dur_ns: int
    pid: int | str = 0
    tid: int | str = 0
    correlation: int = -1
    nbytes: int = -1
    stream: int = -1
    device: int = -1
    direction: str = ""
    flops: int = -1
    elements: int = -1

    @property
    def end_ns(self) -> int:
        """End time in nanoseconds."""
        return self.start_ns + self.dur_ns


#: An event's fields as a plain tuple, in :class:`Event`'s field order (kind, name, start_ns, dur_ns, pid,
#: tid, correlation, nbytes, stream, device, direction, flops, elements): what a reader's fast path hands
#: the scan instead of an :class:`Event` (building one and reading it back cost half of a pass).
EventFields = tuple[str, str, int, int, "int | str", "int | str", int, int, int, int, str, int, int]

#: The :data:`EventFields` of an :class:`Event` (``event_fields(Event("kernel", "k", 0, 5))`` is
#: ``("kernel", "k", 0, 5, 0, 0, -1, -1, -1, -1, "", -1, -1)``).
event_fields: Callable[[Event], EventFields] = operator.attrgetter(*(f.name for f in dataclasses.fields(Event)))


class TraceInfo:
    """What a trace says about itself; complete once the loader's event stream is exhausted.

    Attributes:
        source: ``"kineto"`` or ``"nsys"``.
        devices: GPU names.
        base_time_ns: Wall-clock time (ns since the Unix epoch) of the trace clock's zero, if known.
        skipped_events: Events that were left out: malformed, or of a phase the report does not read.
        skipped_reasons: How many malformed ones for each reason (``"not a JSON object"``, ...).
        skipped_phases: How many of a phase the report does not read, by kind and phase (``"kernel
            events of phase 'B'"``: kineto reads complete events, ``X``, only).
        correlation_by_process: Whether correlation ids are unique per process only (nsys), so
            the join of a launch and its GPU work also matches the process.
        notes: Remarks of the loader worth showing (unclosed ranges, ...).
        rank: The process's rank in a distributed run, if known: kineto's ``distributedInfo.rank``,
            or the ``RANK`` variable of the environment nsys recorded.
        world_size: The number of ranks of that run, if known.
        rank_source: Where ``rank`` came from (``"distributedInfo.rank"``, ``"RANK"``), or None.

    Example:
        >>> TraceInfo("nsys").correlation_by_process
        True
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.devices: list[str] = []
        self.base_time_ns: int | None = None
        self.skipped_events = 0
        self.skipped_reasons: dict[str, int] = {}
        self.skipped_phases: dict[str, int] = {}
        self.correlation_by_process = source == "nsys"
        self.notes: list[str] = []
        self.rank: int | None = None
        self.world_size: int | None = None
        self.rank_source: str | None = None

    def skip(self, reason: str) -> None:
        """Count one event left out for ``reason``."""
        self.skipped_events += 1
        self.skipped_reasons[reason] = self.skipped_reasons.get(reason, 0) + 1

    def skip_phase(self, phase: str) -> None:
        """Count one event left out for its phase (``phase``: its kind and phase, as :attr:`skipped_phases`)."""
        self.skipped_events += 1
        self.skipped_phases[phase] = self.skipped_phases.get(phase, 0) + 1


class FloatText(str):
    """The text of a JSON number with a fraction or exponent, kept as written."""

    __slots__ = ()


_THOUSAND = Decimal(1000)


def _decimal_to_ns(value: Decimal) -> int:
    # why adjusted() first: 1e999999 µs would overflow the product (decimal.Overflow), and int() of
    # 1e999990 builds a million-digit integer; anything of 19 digits or more is out of range anyway
    if not value.is_finite() or value.adjusted() >= 19:
        raise ValueError(f"time out of range: {value!r}")
    ns = (value * _THOUSAND).to_integral_value(rounding=ROUND_HALF_EVEN)
    return int(ns)


def us_to_ns(value: object) -> int:
    """Convert a kineto time in microseconds to integer nanoseconds, exactly.

    Kineto writes ``ts`` and ``dur`` in microseconds with three decimals (``18.304``); going
    through a float would move a 1-3 µs kernel by a nanosecond or more once added to an epoch-sized
    timestamp, so the digits are shifted as text (or as a :class:`~decimal.Decimal`).

    Args:
        value: An ``int``, a :class:`FloatText` (number text from the JSON parser), a
            :class:`~decimal.Decimal`, or a finite ``float``.

    Returns:
        Nanoseconds, rounded half to even beyond the third decimal.

    Raises:
        ValueError: The value is not a finite number or is out of the 64-bit range.

    Example:
        >>> us_to_ns(FloatText("18.304")), us_to_ns(1012), us_to_ns(Decimal("2413669096090.1"))
        (18304, 1012000, 2413669096090100)
    """
    kind = type(value)
    ns: int
    if kind is int:
        ns = value * 1000  # type: ignore[operator]
    elif kind is FloatText:
        text: str = value  # type: ignore[assignment]
        dot = text.find(".")
        shifted = None
        if dot > 0 and len(text) - dot <= 4:
            # why: shifting the decimal point in the text is exact and 4x cheaper than Decimal
            try:
                shifted = int(text[:dot] + text[dot + 1 :] + "00"[: dot + 4 - len(text)])
            except ValueError:  # an exponent: 1.5e3
                shifted = None
        if shifted is not None:
            ns = shifted
        else:
            try:
                ns = _decimal_to_ns(Decimal(text))
            except (ArithmeticError, ValueError) as exc:  # decimal's errors are ArithmeticErrors
                raise ValueError(f"not a number in range: {text[:40]!r}") from exc
    elif kind is Decimal:
        try:
            ns = _decimal_to_ns(value)  # type: ignore[arg-type]
        except (ArithmeticError, ValueError) as exc:
            raise ValueError(f"not a finite number in range: {value!r}") from exc
    elif kind is float:
        try:
            ns = _decimal_to_ns(Decimal(repr(value)))
        except (ArithmeticError, ValueError) as exc:
            raise ValueError(f"not a finite number in range: {value!r}") from exc
    else:
        raise ValueError(f"not a number: {value!r}")
    if not -LIMIT < ns < LIMIT:
        raise ValueError("time out of range")
    return ns


def int_or(value: object, default: int = -1) -> int:
    """Return ``value`` if it is an ``int`` within 62 bits, else ``default``.

    Example:
        >>> int_or(7), int_or("7"), int_or(True)
        (7, -1, -1)
    """
    if type(value) is int and -LIMIT < value < LIMIT:  # type: ignore[operator]
        return value  # type: ignore[return-value]
    return default
