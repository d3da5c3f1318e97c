"""Hostile inputs for ``gpuprobe report``: one generator per shape, each writing a small file.

Every shape is what a hostile (or very unlucky) user could hand the report: nesting 100,000 levels
deep, integers past Python's digit limit, a 1 GiB name in a 1 MB gzip file, SQLite "tables" that are
views running a query of the file's choosing, figures no tool writes, files that are not files. Each
says what the report must do with it: refuse it (exit status 2, one line naming the file and the
problem) or read it and say what it left out or changed in the report's warnings. The files are
written here, not committed: the largest is about 5 MB (a SQLite export holding one 5 MiB name),
the gzip bombs about 1 MB each.

Run as a script to write them all into a folder and try them by hand::

    python tests/report/hostile.py /tmp/hostile
    python -m gpuprobe report /tmp/hostile/deep_events.json
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
MIN_DOC = json.loads((DATA / "kineto_min.json").read_text())
NSYS_SQL = (DATA / "nsys_min.sql").read_text()
NCU_RAW = DATA / "ncu" / "microgpusim_vectoradd_gtx1080_raw.csv"
NCU_DETAILS = DATA / "ncu" / "esmm_sgemm_a10g_details.csv"

KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "pid": 0, "tid": 7, "args": {"correlation": 1}}
DEPTH = 100_000
DIGITS = 5_000  # past Python's 4,300-digit limit for integers
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Shape:
    """One hostile input and what the report must do with it.

    Attributes:
        name: The file's name (its stem says the shape).
        kind: ``json`` (tried on every JSON engine), ``nsys`` or ``ncu``.
        make: Writes the file at a path.
        refused: The problem the one-line error must name (a substring), or None if it is read.
        warning: A substring of a warning of the report (a count of what was left out or read
            otherwise), for a shape that is read.
    """

    name: str
    kind: str
    make: Callable[[Path], None]
    refused: str | None = None
    warning: str | None = None

    def write(self, folder: Path) -> Path:
        """Write the file into ``folder``; its path."""
        path = folder / self.name
        path.unlink(missing_ok=True)
        self.make(path)
        return path


def _doc(events: list[object] | None = None, **meta: object) -> dict[str, object]:
    return {**meta, "traceEvents": MIN_DOC["traceEvents"] + (events or [])}


def _text(text: str | bytes) -> Callable[[Path], None]:
    data = text.encode() if isinstance(text, str) else text

    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _json(doc: object) -> Callable[[Path], None]:
    return _text(json.dumps(doc))


def _nested(where: str) -> Callable[[Path], None]:
    """100,000 nested arrays (200 KB) as an element of traceEvents, in an event's args, or in metadata."""
    deep = "[" * DEPTH + "]" * DEPTH
    head, tail = json.dumps(_doc())[:-2], "]}"
    if where == "events":
        return _text(f"{head}, {deep}{tail}")
    if where == "args":
        event = json.dumps({**KERNEL, "args": {"correlation": 1, "Input Dims": "@"}}).replace('"@"', deep)
        return _text(f"{head}, {event}{tail}")
    return _text('{"deviceProperties": ' + deep + ", " + json.dumps(_doc())[1:])


def _number(where: str, literal: str) -> Callable[[Path], None]:
    if where == "event":
        return _text(json.dumps(_doc([{**KERNEL, "ts": "@"}])).replace('"@"', literal))
    return _text(json.dumps(_doc(baseTimeNanoseconds="@")).replace('"@"', literal))


def _gzip_bomb(prefix: str, fill: bytes, size: int, suffix: str) -> Callable[[Path], None]:
    """A gzip file whose text is ``prefix``, ``size`` bytes of ``fill`` and ``suffix``: about 1 MB per GiB.

    Written in a second: one MiB of ``fill`` is deflated once, after a full flush (so that its bytes
    do not depend on what came before), and repeated; the gzip header and trailer (CRC-32 and size)
    are written here.
    """

    def write(path: Path) -> None:
        block = fill * ((1 << 20) // len(fill))
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate
        head = packer.compress(prefix.encode()) + packer.flush(zlib.Z_FULL_FLUSH)
        repeated = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
        crc = zlib.crc32(prefix.encode())
        for _ in range(size // len(block)):
            crc = zlib.crc32(block, crc)
        crc = zlib.crc32(suffix.encode(), crc)
        total = len(prefix.encode()) + size // len(block) * len(block) + len(suffix.encode())
        with open(path, "wb") as f:
            f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip, deflate, no name, no time
            f.write(head)
            f.write(repeated * (size // len(block)))
            f.write(packer.compress(suffix.encode()) + packer.flush())
            f.write(crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little"))

    return write


_EVENTS_HEAD = json.dumps(_doc())[:-2] + ", "


def _nsys(script: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        con = sqlite3.connect(path)
        con.executescript(NSYS_SQL + script)
        con.commit()
        con.close()

    return write


_KERNEL_COLUMNS = "start, end, correlationId, globalPid, deviceId, streamId, demangledName"


def _ncu_negative(path: Path) -> None:
    """The raw export with its first kernel's duration negative (a figure no ncu writes)."""
    lines = NCU_RAW.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID",'))
    cells = lines[header].rstrip("\n").split('","')
    column = cells.index("gpu__time_duration")
    row = header + 2  # after the units row
    values = lines[row].rstrip("\n").split('","')
    values[column] = "-" + values[column]
    lines[row] = '","'.join(values) + "\n"
    path.write_text("".join(lines))


def _ncu_cut(source: Path) -> Callable[[Path], None]:
    """An export cut in the middle of its last table row, as an interrupted copy leaves it."""

    def write(path: Path) -> None:
        data = source.read_bytes()
        path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 1 + 20])

    return write


SHAPES: tuple[Shape, ...] = (
    # nesting: RecursionError on json and msgspec, memory quadratic in the depth under ijson
    Shape("deep_events.json", "json", _nested("events"), refused="nested too deeply"),
    Shape("deep_args.json", "json", _nested("args"), refused="nested too deeply"),
    Shape("deep_metadata.json", "json", _nested("metadata"), refused="nested too deeply"),
    # numbers
    Shape("huge_integer_event.json", "json", _number("event", "9" * DIGITS),
          refused="more than 4,300 digits"),
    Shape("huge_integer_metadata.json", "json", _number("meta", "9" * DIGITS),
          refused="more than 4,300 digits"),
    Shape("huge_exponent_event.json", "json", _number("event", "1e999999"),
          warning="1 malformed event was left out: 1 with a time that is not a number in range"),
    Shape("huge_exponent_metadata.json", "json", _number("meta", "1e999999"),
          warning="baseTimeNanoseconds is not an integer within ±2**62: ignored"),
    # decompression bombs: 1 MB files that hold 1 GiB or 512 MiB of text
    Shape("bomb_kernel_name.json.gz", "json",
          _gzip_bomb(_EVENTS_HEAD + '{"ph": "X", "cat": "kernel", "name": "', b"a", GIB,
                     '", "ts": 1, "dur": 1}]}'),
          refused="more than 16 MiB of text without a complete value"),
    Shape("bomb_event_key.json.gz", "json",
          _gzip_bomb(_EVENTS_HEAD + '{"', b"k", GIB // 2, '": 1}]}'),
          refused="more than 16 MiB of text without a complete value"),
    Shape("bomb_top_level_key.json.gz", "json",
          _gzip_bomb('{"', b"k", GIB // 2, '": 1, "traceEvents": []}'),
          refused="more than 16 MiB of text without a complete value"),
    Shape("bomb_whitespace.json.gz", "json",
          _gzip_bomb('{"traceEvents": [', b" ", GIB // 16, "]}"),
          refused="more than 16 MiB of text without a complete value"),
    # accepted silently before: now counted and said
    Shape("negative_duration.json", "json", _json(_doc([{**KERNEL, "dur": -40.0}])),
          warning="1 event has a negative duration: read as 0 ns"),
    Shape("null_duration.json", "json", _json(_doc([{**KERNEL, "dur": None}])),
          warning="1 event has no duration (dur missing or null): read as 0 ns"),
    Shape("missing_duration.json", "json",
          _json(_doc([{k: v for k, v in KERNEL.items() if k != "dur"}])),
          warning="1 event has no duration (dur missing or null): read as 0 ns"),
    Shape("non_object_events.json", "json", _json(_doc([1, "kernel", [KERNEL], None])),
          warning="4 malformed events were left out: 4 not a JSON object"),
    # messages
    Shape("not_json.json", "json", _text("this is not JSON\n"),
          refused="not a trace: not JSON text (it begins with 'this is not JSON'); gpuprobe report reads"),
    Shape("only_whitespace.json", "json", _text(" \n\t\n"), refused="empty file"),
    # read as the same trace without the mark (no warning; test_hostile.py compares the events)
    Shape("byte_order_mark.json", "json", _text(b"\xef\xbb\xbf" + json.dumps(_doc()).encode())),
    # Nsight Systems exports whose tables run SQL of the file's choosing, or hold values no export holds
    Shape("nsys_recursive_view.sqlite", "nsys", _nsys(
        "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL; CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE "
        "r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r) SELECT n AS start, n AS end, 1 AS correlationId, "
        "0 AS globalPid, 0 AS deviceId, 7 AS streamId, 6 AS demangledName FROM r;"),
        refused="CUPTI_ACTIVITY_KIND_KERNEL is a view, not a table"),
    Shape("nsys_zeroblob_view.sqlite", "nsys", _nsys(
        "DROP TABLE StringIds; CREATE VIEW StringIds AS SELECT 6 AS id, zeroblob(900000000) AS value;"),
        refused="StringIds is a view, not a table"),
    Shape("nsys_generated_column.sqlite", "nsys", _nsys(
        "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL; CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, "
        "correlationId INTEGER, globalPid INTEGER, deviceId INTEGER, streamId INTEGER, demangledName INTEGER, "
        "shortName BLOB GENERATED ALWAYS AS (zeroblob(900000000)) VIRTUAL);"
        f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({_KERNEL_COLUMNS}) VALUES (1, 2, 1, 0, 0, 7, 6);"),
        refused="column shortName of table CUPTI_ACTIVITY_KIND_KERNEL is generated"),
    Shape("nsys_virtual_table.sqlite", "nsys", _nsys(
        "DROP TABLE NVTX_EVENTS; CREATE VIRTUAL TABLE NVTX_EVENTS USING fts5(start, end, eventType, text, globalTid);"),
        refused="NVTX_EVENTS is a virtual table"),
    Shape("nsys_long_name.sqlite", "nsys", _nsys(
        "UPDATE StringIds SET value = printf('%.*c', 5000000, 'k') WHERE id = 6;"),
        refused="a value longer than 4 MiB"),
    # Nsight Compute exports: figures no ncu writes, and files cut inside a row
    Shape("ncu_negative_time.csv", "ncu", _ncu_negative, warning="1 negative figure left out (duration_ns (1))"),
    Shape("ncu_cut_raw.csv", "ncu", _ncu_cut(NCU_RAW), refused="truncated"),
    Shape("ncu_cut_details.csv", "ncu", _ncu_cut(NCU_DETAILS), refused="truncated"),
)


def write_all(folder: Path) -> dict[str, Path]:
    """Every shape's file, written into ``folder`` (by name)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {shape.name: shape.write(folder) for shape in SHAPES}


if __name__ == "__main__":
    for name, path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "hostile")).items():
        print(f"{path}  ({path.stat().st_size:,} bytes)")
