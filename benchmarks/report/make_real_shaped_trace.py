"""Write a large kineto trace made of real public traces, replicated, streaming.

The sources are real profiler traces of tests/data/kineto (see its README for where each comes
from), chosen for their different eras and shapes: PyTorch 1.9's capitalised categories with
string GPU threads and long operator ``args`` (2021), integer-microsecond timestamps with ``ac2g``
flows, CUDA graphs and NCCL (HolisticTraceAnalysis' traces), three-decimal epoch timestamps (2024),
recent traces with ``python_function`` events, instant events and timestamps of one to three
decimals (TraceLens, CUDA and ROCm).

Each source is copied as its own text, element by element, so that every key, number literal and
run of white space is as the profiler wrote it; only these numbers change from one replica to the
next: ``ts`` moves by a whole number of microseconds past the end of the previous replica (its
decimals are kept), and ``correlation``, ``External id``/``external id`` and the flow ``id`` move
past the largest one written so far. Metadata events (``ph: "M"``) are written with the first
replica of a source only. The sources take turns, each writing about the same number of bytes per
round, until the target size is passed. The header and the keys after ``traceEvents`` are the
first source's.

Example:
    python benchmarks/report/make_real_shaped_trace.py /tmp/real.json --size-gb 1.0
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
from pathlib import Path
from typing import IO

__all__ = ["SOURCES", "write_trace", "Source"]

KINETO = Path(__file__).resolve().parents[2] / "tests" / "data" / "kineto"
#: The real traces a real-shaped trace is made of, in the order they take turns.
SOURCES = (
    "hta_sampled_rank-0.json.gz",
    "hta_cudagraph_nccl_rank0.json.gz",
    "hta_ns_resolution_v100.json.gz",
    "kineto_tb_resnet50_v100_2021.json.gz",
    "tracelens_h100_qwen1_5_0_5b_forward.json.gz",
    "tracelens_b200_vllm_prefill.json.gz",
    "tracelens_mi300_ddp_resnet_rccl.json.gz",
)
_ROUND_BYTES = 16 << 20  # each source writes about this much per round
_NUMBER = re.compile(r'"(ts|correlation|External id|external id|id)": (-?\d+)')
_TS, _ID = 0, 1


class Source:
    """One real trace, cut into literal text and the numbers a replica shifts.

    Attributes:
        name: The file name.
        header: The text up to the first element of ``traceEvents``.
        trailer: The text after its last element.
        first: The pieces of the first replica (every element).
        later: The pieces of the later replicas (no metadata events).
        span_us: Microseconds from the earliest ``ts`` to the latest end.
        min_ts: The earliest ``ts`` (integer part).
        max_id: The largest correlation, External id or flow id.
        events: Elements in the first replica, in a later one.
    """

    def __init__(self, path: Path, max_chars: int = 0) -> None:
        self.name = path.name
        text = gzip.open(path, "rt", encoding="utf-8").read() if path.name.endswith(".gz") else path.read_text()
        decode = json.JSONDecoder().raw_decode
        ws = re.compile(r"[ \t\n\r]*")
        start = text.index('"traceEvents"')
        pos = text.index("[", start) + 1
        spans: list[tuple[int, int, object]] = []
        lo, hi = None, None
        while True:
            pos = ws.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos] == "]":
                break
            value, end = decode(text, pos)
            spans.append((pos, end, value.get("ph") if isinstance(value, dict) else None))
            if isinstance(value, dict) and isinstance(value.get("ts"), (int, float)) and value.get("ph") != "M":
                ts = value["ts"]
                dur = value.get("dur") if isinstance(value.get("dur"), (int, float)) else 0
                lo = ts if lo is None or ts < lo else lo
                hi = ts + dur if hi is None or ts + dur > hi else hi
            pos = ws.match(text, end).end()  # type: ignore[union-attr]
            if text[pos] == ",":
                pos += 1
        self.header = text[: spans[0][0]]
        self.trailer = text[spans[-1][1] :]
        body = text[spans[0][0] : spans[-1][1]]
        if max_chars and len(body) > max_chars:  # every k-th element only (the mix of events kept)
            spans = spans[:: -(-len(body) // max_chars)]
            body = ",\n".join(text[s:e] for s, e, _ in spans)
        self.min_ts = int(lo or 0)
        self.span_us = int((hi or 0) - (lo or 0)) + 1
        later = ",\n".join(text[s:e] for s, e, ph in spans if ph != "M")
        self.max_id = max((int(m.group(2)) for m in _NUMBER.finditer(body) if m.group(1) != "ts"), default=0)
        self.first = _pieces(body)
        self.later = _pieces(later)
        self.events = (len(spans), sum(1 for _, _, ph in spans if ph != "M"))

    def write(self, emit: IO[str] | None, pieces: list[object], ts_shift: int, id_shift: int) -> int:
        """Write one replica; the characters written."""
        out = []
        for p in pieces:
            if type(p) is str:
                out.append(p)
            else:
                key, value = p  # type: ignore[misc]
                out.append(str(value + (ts_shift if key == _TS else id_shift)))
        text = "".join(out)
        if emit is not None:
            emit.write(text)
        return len(text)


def _pieces(body: str) -> list[object]:
    """Literal text and ``(kind, value)`` of each number to shift, in order."""
    pieces: list[object] = []
    last = 0
    for m in _NUMBER.finditer(body):
        pieces.append(body[last : m.start(2)])
        pieces.append((_TS if m.group(1) == "ts" else _ID, int(m.group(2))))
        last = m.end(2)
    pieces.append(body[last:])
    return pieces


def write_trace(
    out: IO[str], target_bytes: int, sources: tuple[str, ...] = SOURCES, source_chars: int = 0, round_chars: int = _ROUND_BYTES
) -> tuple[int, int]:
    """Write a real-shaped trace of at least ``target_bytes`` characters to ``out``.

    Args:
        out: A text stream.
        target_bytes: Stop after the replica that crosses this size.
        sources: Files of tests/data/kineto.
        source_chars: Take every k-th element of each source only, about this many characters (0: all):
            the mix of events of the source in a smaller file (for profiling; launches lose their kernels).
        round_chars: Characters each source writes per round.

    Returns:
        ``(replicas, events)`` written.

    Example:
        >>> import io
        >>> buf = io.StringIO()
        >>> write_trace(buf, 10_000, ("hta_triton_example.json.gz",))[0] >= 1
        True
        >>> json.loads(buf.getvalue())["traceEvents"][0]["ph"]
        'M'
    """
    srcs = [Source(KINETO / name, source_chars) for name in sources]
    written = 0
    replicas = 0
    events = 0
    clock = srcs[0].min_ts  # µs: where the next replica starts
    ids = 0  # ids of the next replica start above this
    seen: set[str] = set()

    def emit(text: str) -> None:
        nonlocal written
        out.write(text)
        written += len(text)

    emit(srcs[0].header)
    while written < target_bytes:
        for src in srcs:
            done = 0
            while done < round_chars and written < target_bytes:
                first = src.name not in seen
                seen.add(src.name)
                if replicas:
                    emit(",\n")
                n = src.write(out, src.first if first else src.later, clock - src.min_ts, ids)
                written += n
                done += n
                clock += src.span_us + 1000  # a millisecond between replicas
                ids += src.max_id + 1
                replicas += 1
                events += src.events[0 if first else 1]
    emit(srcs[0].trailer)
    return replicas, events


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="output file (.json or .json.gz)")
    parser.add_argument("--size-gb", type=float, default=1.0, help="uncompressed size (default 1.0)")
    parser.add_argument("--source", action="append", help="a trace of tests/data/kineto (repeatable; default: "
                        + ", ".join(SOURCES) + ")")
    parser.add_argument("--source-mb", type=float, default=0.0,
                        help="every k-th element of each source only, about this many MB (default: all; for profiling)")
    parser.add_argument("--round-mb", type=float, default=_ROUND_BYTES / 2**20, help="MB each source writes per turn")
    args = parser.parse_args(argv)
    target = int(args.size_gb * 1e9)
    tmp = args.path + ".tmp"
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        replicas, events = write_trace(
            out, target, tuple(args.source or SOURCES), int(args.source_mb * 2**20), int(args.round_mb * 2**20)
        )
    os.replace(tmp, args.path)
    print(f"wrote {args.path}: {replicas} replicas, {events} events, {target / 1e9:.2f}+ GB uncompressed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
