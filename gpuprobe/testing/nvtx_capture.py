"""Record NVTX calls for real, without Nsight Systems.

A small C library (``nvtx_inject.c``, next to this module) is compiled on first
use and loaded by the NVTX runtime itself through ``NVTX_INJECTION64_PATH``.
The NVTX runtime is compiled into the ``nvtx`` package, into libtorch and into
any program that includes the NVTX v3 headers; on the first NVTX call of a
process it loads the library, which then receives every push, pop, mark, range,
domain, registered string and category call and appends one JSON line per call
to the file named by ``GPUPROBE_NVTX_CAPTURE_FILE``.

Because NVTX looks for the injection library only once, on the first NVTX call
of a process, the environment has to be in place before that call: in practice
the code under test runs in a subprocess. :func:`run_captured` does all of it::

    from gpuprobe.testing.nvtx_capture import run_captured

    cap = run_captured('''
        import nvtx
        d = nvtx.get_domain("gpuprobe")
        d.push_range(message="step")
        d.pop_range()
    ''')
    assert cap.names("gpuprobe") == ["step"]
    assert cap.is_balanced()

Timestamps are ``CLOCK_MONOTONIC`` nanoseconds, the clock behind
:func:`time.monotonic_ns`; thread ids are kernel thread ids, the values of
:func:`threading.get_native_id`. The default NVTX domain (a ``NULL`` handle,
used by ``nvtx.push_range("x")`` and ``torch.cuda.nvtx``) is reported as
``""`` (:data:`DEFAULT_DOMAIN`). Child processes inherit the environment and record
into the same file; events carry their ``pid`` and ranges are rebuilt per process and thread.

Headers: the three NVTX v3 headers the library needs (``nvToolsExt.h``,
``nvtxDetail/nvtxTypes.h``, ``nvtxDetail/nvtxLinkOnce.h``, Apache-2.0 with LLVM
exception, license alongside) are vendored in ``_nvtx_include/``. Set
``GPUPROBE_NVTX_INCLUDE`` to a directory holding ``nvtx3/`` to use other ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CAPTURE_FILE_ENV",
    "DEFAULT_DOMAIN",
    "INJECTION_PATH_ENV",
    "NvtxCapture",
    "NvtxCaptureError",
    "NvtxEvent",
    "NvtxRange",
    "build_injection_library",
    "capture_env",
    "nvtx_include_dir",
    "parse_capture",
    "run_captured",
]

#: Environment variable naming the file the injection library appends to.
CAPTURE_FILE_ENV = "GPUPROBE_NVTX_CAPTURE_FILE"
#: Environment variable the NVTX runtime reads to find an injection library (64-bit processes).
INJECTION_PATH_ENV = "NVTX_INJECTION64_PATH"
#: Name reported for the default NVTX domain (the ``NULL`` domain handle).
DEFAULT_DOMAIN = ""
#: Environment variable overriding where the NVTX headers are taken from (a directory holding ``nvtx3/``).
INCLUDE_ENV = "GPUPROBE_NVTX_INCLUDE"
#: Environment variable overriding where the compiled library is cached.
CACHE_DIR_ENV = "GPUPROBE_NVTX_CACHE_DIR"

_HERE = Path(__file__).resolve().parent
_SOURCE = _HERE / "nvtx_inject.c"
_VENDORED_INCLUDE = _HERE / "_nvtx_include"
_HEADERS = ("nvtx3/nvToolsExt.h", "nvtx3/nvtxDetail/nvtxTypes.h", "nvtx3/nvtxDetail/nvtxLinkOnce.h")
_CFLAGS = ("-shared", "-fPIC", "-O2", "-pthread", "-std=gnu11", "-fvisibility=hidden", "-Wall")
_LIB_PREFIX = "libgpuprobe_nvtx_inject-"

Payload = int | float | list | None

_build_lock = threading.Lock()
_built: dict[tuple[str, str], Path] = {}


class NvtxCaptureError(RuntimeError):
    """Building the injection library, running captured code or reading a capture failed.

    Attributes:
        stderr: the standard error of the failed compiler or subprocess, when there was one.
        returncode: its exit status, when there was one.
    """

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


@dataclasses.dataclass(frozen=True)
class NvtxEvent:
    """One NVTX call as the injection library saw it.

    Attributes:
        kind: ``push``, ``pop``, ``mark``, ``range_start``, ``range_end``, ``domain_create``,
            ``domain_destroy``, ``register_string``, ``name_category``, ``name_thread``, or ``init``
            (one per NVTX instance that attached the library).
        domain: the domain name; ``""`` for the default domain; ``None`` for ``init`` and ``name_thread``.
        thread: kernel thread id of the caller (:func:`threading.get_native_id`).
        message: the message, resolved from ASCII, wide or registered strings; for ``register_string``
            the registered text, for ``name_thread`` the thread name.
        category: the category id, ``None`` when the event has none (id 0).
        payload: ``int`` or ``float`` for scalar payloads; for extended (schema) payloads a list of
            ``{"schema": id, "size": bytes}`` dicts; ``None`` when absent.
        ts: ``CLOCK_MONOTONIC`` nanoseconds (comparable with :func:`time.monotonic_ns`).
        pid: process id of the caller.
        category_name: the name given to ``category`` in this domain, if any, at the time of the call.
        payload_type: ``int64``, ``uint64``, ``int32``, ``uint32``, ``double``, ``float`` or ``ext``.
        message_type: ``ascii``, ``unicode`` or ``registered``.
        color: ARGB color, when one was given.
        depth: for ``push`` the 0-based level of the new range, for ``pop`` the level of the range
            ended (-1 for a pop with no open range), as returned to the caller.
        range_id: for ``range_start`` / ``range_end``, the id that pairs them.
        target: for ``name_thread``, the thread id being named.
    """

    kind: str
    domain: str | None
    thread: int
    message: str | None
    category: int | None
    payload: Payload
    ts: int
    pid: int = 0
    category_name: str | None = None
    payload_type: str | None = None
    message_type: str | None = None
    color: int | None = None
    depth: int | None = None
    range_id: int | None = None
    target: int | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NvtxEvent:
        """Build an event from one decoded line of a capture file."""
        return cls(
            kind=str(obj["kind"]),
            domain=obj.get("domain"),
            thread=int(obj.get("tid", 0)),
            message=obj.get("message"),
            category=obj.get("category"),
            payload=obj.get("payload"),
            ts=int(obj.get("ts", 0)),
            pid=int(obj.get("pid", 0)),
            category_name=obj.get("category_name"),
            payload_type=obj.get("payload_type"),
            message_type=obj.get("message_type"),
            color=obj.get("color"),
            depth=obj.get("depth"),
            range_id=obj.get("id"),
            target=obj.get("target"),
        )


@dataclasses.dataclass(frozen=True)
class NvtxRange:
    """A range rebuilt from a push and its pop (or a start and its end).

    Attributes:
        message: the message of the push / start.
        domain: the domain name (``""`` for the default domain).
        thread: the thread that pushed (or started) the range.
        pid: the process.
        depth: 0 for a top-level range, 1 for a range inside it, ... (always 0 for start/end ranges).
        parent: index, in the same list, of the enclosing range of the same thread and domain.
        path: messages from the outermost enclosing range down to this one.
        start_ts: timestamp of the push / start (ns).
        end_ts: timestamp of the pop / end (ns), ``None`` while the range is still open.
        category: category id, or ``None``.
        category_name: category name, or ``None``.
        payload: payload of the push / start, or ``None``.
        payload_type: its type name, or ``None``.
        index: position of this range in the list it belongs to.
        end_thread: the thread that popped (or ended) the range.
    """

    message: str | None
    domain: str | None
    thread: int
    pid: int
    depth: int
    parent: int | None
    path: tuple[str | None, ...]
    start_ts: int
    end_ts: int | None
    category: int | None
    category_name: str | None
    payload: Payload
    payload_type: str | None
    index: int
    end_thread: int | None = None

    @property
    def duration_ns(self) -> int | None:
        """``end_ts - start_ts``, or ``None`` while the range is open."""
        return None if self.end_ts is None else self.end_ts - self.start_ts

    @property
    def closed(self) -> bool:
        """Whether the range was popped / ended."""
        return self.end_ts is not None


def _open_range(e: NvtxEvent, index: int, depth: int, parent: int | None,
                path: tuple[str | None, ...]) -> dict[str, Any]:
    """The fields of an :class:`NvtxRange` opened by ``e``; its end is filled in when it closes."""
    return dict(message=e.message, domain=e.domain, thread=e.thread, pid=e.pid, depth=depth, parent=parent,
                path=path, start_ts=e.ts, end_ts=None, category=e.category, category_name=e.category_name,
                payload=e.payload, payload_type=e.payload_type, index=index, end_thread=None)


@dataclasses.dataclass
class NvtxCapture:
    """The events of one capture, with helpers to check them.

    Attributes:
        events: every recorded call, in file order (which is call order within each thread).
        stdout: the subprocess's standard output (:func:`run_captured` only).
        stderr: the subprocess's standard error (:func:`run_captured` only).
        returncode: the subprocess's exit status (:func:`run_captured` only).

    Example:
        >>> cap = NvtxCapture([
        ...     NvtxEvent("push", "gpuprobe", 7, "outer", None, None, 1),
        ...     NvtxEvent("push", "gpuprobe", 7, "inner", None, None, 2),
        ...     NvtxEvent("pop", "gpuprobe", 7, None, None, None, 3),
        ...     NvtxEvent("pop", "gpuprobe", 7, None, None, None, 4),
        ... ])
        >>> [r.path for r in cap.ranges("gpuprobe")]
        [('outer',), ('outer', 'inner')]
        >>> cap.is_balanced()
        True
    """

    events: list[NvtxEvent]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None

    @property
    def attached(self) -> bool:
        """Whether the injection library was attached by at least one NVTX instance."""
        return any(e.kind == "init" for e in self.events)

    def filter(
        self,
        kind: str | Iterable[str] | None = None,
        domain: str | None = None,
        thread: int | None = None,
    ) -> list[NvtxEvent]:
        """Events of the given kind(s), domain and thread (``None`` matches all).

        Example:
            >>> cap = NvtxCapture([NvtxEvent("mark", "", 1, "m", None, None, 5)])
            >>> [e.message for e in cap.filter("mark", domain="")]
            ['m']
        """
        kinds = {kind} if isinstance(kind, str) else (set(kind) if kind is not None else None)
        return [
            e
            for e in self.events
            if (kinds is None or e.kind in kinds)
            and (domain is None or e.domain == domain)
            and (thread is None or e.thread == thread)
        ]

    def domains(self) -> list[str]:
        """Names of the domains seen (created or used), in order of first appearance."""
        seen: dict[str, None] = {}
        for e in self.events:
            if e.domain is not None and e.kind != "init":
                seen.setdefault(e.domain, None)
        return list(seen)

    def threads(self, domain: str | None = None) -> list[int]:
        """Thread ids that pushed, popped, marked or started ranges, in order of first appearance."""
        seen: dict[int, None] = {}
        for e in self.filter(("push", "pop", "mark", "range_start", "range_end"), domain=domain):
            seen.setdefault(e.thread, None)
        return list(seen)

    def ranges(self, domain: str | None = None) -> list[NvtxRange]:
        """Push/pop ranges rebuilt per process, thread and domain, in push order.

        Args:
            domain: only ranges of this domain (``""`` for the default domain); ``None`` for all.

        Returns:
            One :class:`NvtxRange` per push. A push that was never popped has ``end_ts=None``.
            ``parent`` indexes into the returned list.

        Example:
            >>> cap = NvtxCapture([
            ...     NvtxEvent("push", "d", 1, "a", None, None, 10),
            ...     NvtxEvent("pop", "d", 1, None, None, None, 20),
            ... ])
            >>> r = cap.ranges("d")[0]
            >>> (r.message, r.depth, r.parent, r.duration_ns)
            ('a', 0, None, 10)
        """
        fields: list[dict[str, Any]] = []
        stacks: dict[tuple[int, int, str | None], list[int]] = {}
        for e in self.filter(("push", "pop"), domain=domain):
            stack = stacks.setdefault((e.pid, e.thread, e.domain), [])
            if e.kind == "push":
                parent = stack[-1] if stack else None
                path = (fields[parent]["path"] if parent is not None else ()) + (e.message,)
                fields.append(_open_range(e, len(fields), len(stack), parent, path))
                stack.append(len(fields) - 1)
            elif stack:
                idx = stack.pop()
                fields[idx]["end_ts"] = e.ts
                fields[idx]["end_thread"] = e.thread
            # else: a pop of a range opened before this process forked (depth >= 0), or an
            # unbalanced pop (depth -1): neither closes a range seen here.
        return [NvtxRange(**f) for f in fields]

    def start_end_ranges(self, domain: str | None = None) -> list[NvtxRange]:
        """Start/end ranges (``nvtxRangeStart*`` / ``nvtxRangeEnd``) paired by id, in start order.

        They may end on another thread than the one that started them (see ``end_thread``).
        """
        out: list[dict[str, Any]] = []
        by_id: dict[tuple[int, int], int] = {}
        for e in self.filter(("range_start", "range_end"), domain=domain):
            key = (e.pid, e.range_id or 0)
            if e.kind == "range_start":
                by_id[key] = len(out)
                out.append(_open_range(e, len(out), 0, None, (e.message,)))
            elif key in by_id:
                idx = by_id.pop(key)
                out[idx]["end_ts"] = e.ts
                out[idx]["end_thread"] = e.thread
        return [NvtxRange(**f) for f in out]

    def names(self, domain: str | None = None) -> list[str | None]:
        """Messages of the push/pop ranges, in push order (repeats kept).

        Example:
            >>> cap = NvtxCapture([NvtxEvent("push", "", 1, "x", None, None, 1),
            ...                    NvtxEvent("pop", "", 1, None, None, None, 2)])
            >>> cap.names()
            ['x']
        """
        return [r.message for r in self.ranges(domain)]

    def problems(self, domain: str | None = None) -> list[str]:
        """Why the push/pop ranges are not balanced: pops with nothing open, pushes never popped.

        Checked per process, thread and domain; empty when :meth:`is_balanced`. In a forked
        child, a pop of a range its parent opened before the fork is not a problem: the library
        tracks the inherited depth and reports it (``depth >= 0``).
        """
        out: list[str] = []
        stacks: dict[tuple[int, int, str | None], list[NvtxEvent]] = {}
        for e in self.filter(("push", "pop"), domain=domain):
            stack = stacks.setdefault((e.pid, e.thread, e.domain), [])
            if e.kind == "push":
                stack.append(e)
            elif stack:
                stack.pop()
            elif e.depth is None or e.depth < 0:
                out.append(f"pop with no open range: domain={e.domain!r} thread={e.thread} ts={e.ts}")
        for (_, thread, dom), stack in stacks.items():
            for e in stack:
                out.append(f"range never popped: {e.message!r} domain={dom!r} thread={thread} ts={e.ts}")
        return out

    def is_balanced(self, domain: str | None = None) -> bool:
        """Whether, in every thread and domain, each pop closes a push and each push is popped."""
        return not self.problems(domain)

    def format_ranges(self, domain: str | None = None) -> str:
        """The push/pop ranges as an indented text tree, one line per range (handy in assert messages)."""
        lines = []
        for r in self.ranges(domain):
            extra = []
            if r.category is not None:
                extra.append(f"category={r.category_name or r.category}")
            if r.payload is not None:
                extra.append(f"payload={r.payload!r}")
            if not r.closed:
                extra.append("OPEN")
            tail = f" ({', '.join(extra)})" if extra else ""
            lines.append(f"{'  ' * r.depth}[{r.domain or 'default'}:{r.thread}] {r.message}{tail}")
        return "\n".join(lines)


def parse_capture(path: str | os.PathLike[str]) -> NvtxCapture:
    """Read a capture file written by the injection library.

    A last line cut short (a process killed while writing) is dropped; any other malformed
    line raises. A file that does not exist reads as an empty capture (no NVTX call was made).

    Args:
        path: the file named by ``GPUPROBE_NVTX_CAPTURE_FILE``.

    Returns:
        The events, in file order.

    Raises:
        NvtxCaptureError: a line is not a valid event.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "cap.jsonl"
        >>> _ = p.write_text('{"kind":"push","ts":1,"pid":2,"tid":3,"domain":"d","depth":0,"message":"a"}\\n')
        >>> parse_capture(p).events[0].message
        'a'
    """
    p = Path(path)
    if not p.exists():
        return NvtxCapture([])
    data = p.read_bytes().decode("utf-8", errors="replace")
    lines = data.split("\n")
    complete = data.endswith("\n")
    events = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            events.append(NvtxEvent.from_json(obj))
        except (ValueError, KeyError, TypeError) as exc:
            if no == len(lines) and not complete:
                break
            raise NvtxCaptureError(f"{p}:{no}: not an NVTX capture line ({exc}): {line[:200]!r}") from exc
    return NvtxCapture(events)


def nvtx_include_dir() -> Path:
    """The directory holding ``nvtx3/nvToolsExt.h`` used to build the injection library.

    Looked up in order: ``$GPUPROBE_NVTX_INCLUDE``; the headers vendored with gpuprobe; the
    ``include`` directory of an installed NVIDIA wheel (``nvidia-nvtx``, ``nvidia-nvtx-cu12``).

    Raises:
        NvtxCaptureError: no NVTX v3 headers were found.

    Example:
        >>> (nvtx_include_dir() / "nvtx3" / "nvToolsExt.h").is_file()
        True
    """
    override = os.environ.get(INCLUDE_ENV)
    if override:
        d = Path(override)
        if not (d / _HEADERS[0]).is_file():
            raise NvtxCaptureError(f"${INCLUDE_ENV}={override} has no {_HEADERS[0]}")
        return d
    candidates = [_VENDORED_INCLUDE]
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            candidates.extend(sorted(base.glob("*/include")))
    for d in candidates:
        if all((d / h).is_file() for h in _HEADERS):
            return d
    raise NvtxCaptureError(
        "NVTX v3 headers not found: expected nvtx3/nvToolsExt.h under "
        f"{_VENDORED_INCLUDE}, ${INCLUDE_ENV}, or an installed nvidia-nvtx wheel "
        "(pip install nvidia-nvtx-cu12)"
    )


def _default_cache_dir() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuprobe" / "nvtx"


def _compiler(compiler: str | None) -> list[str]:
    cmd = shlex.split(compiler or os.environ.get("CC") or "gcc")
    if not cmd or shutil.which(cmd[0]) is None:
        raise NvtxCaptureError(
            f"C compiler {cmd[0] if cmd else compiler!r} not found: the NVTX injection library is "
            "compiled on first use (install gcc, e.g. `apt-get install gcc`, or set CC)"
        )
    return cmd


def build_injection_library(cache_dir: str | os.PathLike[str] | None = None, *, compiler: str | None = None) -> Path:
    """Compile the NVTX injection library (once) and return the path of the shared object.

    The result is cached under ``cache_dir`` by a hash of the C source, the NVTX headers,
    the compiler command and the flags; an existing build is reused. Compilation goes to a
    temporary file renamed into place, so concurrent builds are safe.

    Args:
        cache_dir: where to keep the library. Defaults to ``$GPUPROBE_NVTX_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/gpuprobe/nvtx`` (``~/.cache/gpuprobe/nvtx``), falling back to a
            per-user temporary directory if that is not writable.
        compiler: the C compiler command; defaults to ``$CC`` or ``gcc``.

    Returns:
        Path of ``libgpuprobe_nvtx_inject-<hash>.so``.

    Raises:
        NvtxCaptureError: the compiler or the NVTX headers are missing, or compilation failed
            (the compiler's output is in the message and in ``stderr``).

    Example:
        >>> lib = build_injection_library()
        >>> lib.suffix
        '.so'
    """
    cc = _compiler(compiler)
    include = nvtx_include_dir()
    digest = hashlib.sha256()
    digest.update(_SOURCE.read_bytes())
    for h in _HEADERS:
        digest.update(h.encode() + b"\0" + (include / h).read_bytes())
    digest.update("\0".join([*cc, *_CFLAGS, platform.machine(), sys.platform]).encode())
    key = digest.hexdigest()[:20]

    explicit = cache_dir is not None
    dirs = [Path(cache_dir)] if cache_dir is not None else [_default_cache_dir()]
    if not explicit:
        dirs.append(Path(tempfile.gettempdir()) / f"gpuprobe-nvtx-{os.getuid()}")

    with _build_lock:
        last_error: OSError | None = None
        for d in dirs:
            memo = _built.get((str(d), key))
            if memo is not None and memo.is_file():
                return memo
            target = d / f"{_LIB_PREFIX}{key}.so"
            if target.is_file():
                _built[(str(d), key)] = target
                return target
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd, tmp_name = tempfile.mkstemp(dir=d, prefix=f".{_LIB_PREFIX}", suffix=".so.tmp")
            except OSError as exc:
                last_error = exc
                continue
            os.close(fd)
            tmp = Path(tmp_name)
            cmd = [*cc, *_CFLAGS, "-I", str(include), str(_SOURCE), "-o", str(tmp)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    raise NvtxCaptureError(
                        f"compiling the NVTX injection library failed ({shlex.join(cmd)}):\n{proc.stderr}",
                        stderr=proc.stderr,
                        returncode=proc.returncode,
                    )
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
            finally:
                if tmp.exists():
                    tmp.unlink()
            _built[(str(d), key)] = target
            return target
        raise NvtxCaptureError(f"no writable cache directory for the NVTX injection library: {last_error}")


def capture_env(out_path: str | os.PathLike[str], library: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Environment variables that make a process record its NVTX calls to ``out_path``.

    They must be in the process's environment before its first NVTX call (NVTX looks for the
    injection library only once), so set them for a subprocess, or before anything calls NVTX.
    The file is appended to, one JSON line per call; read it with :func:`parse_capture`.

    Args:
        out_path: the capture file (created if missing).
        library: the injection library; built with :func:`build_injection_library` if omitted.

    Returns:
        ``{"NVTX_INJECTION64_PATH": ..., "GPUPROBE_NVTX_CAPTURE_FILE": ...}`` (absolute paths).

    Example:
        >>> import os, subprocess, sys, tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "nvtx.jsonl")
        >>> env = {**os.environ, **capture_env(out)}
        >>> _ = subprocess.run([sys.executable, "-c", "import nvtx; nvtx.mark('hi')"], env=env, check=True)
        >>> [e.message for e in parse_capture(out).filter("mark")]
        ['hi']
    """
    lib = Path(library) if library is not None else build_injection_library()
    return {
        INJECTION_PATH_ENV: str(lib.resolve()),
        CAPTURE_FILE_ENV: str(Path(out_path).resolve()),
    }


def run_captured(
    code: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    cwd: str | os.PathLike[str] | None = None,
    library: str | os.PathLike[str] | None = None,
) -> NvtxCapture:
    """Run ``python -c code`` with NVTX capture on and return what it recorded.

    The code runs in a fresh interpreter (:data:`sys.executable`), dedented first, with the
    current environment plus ``env`` plus the capture variables; ``NVTX_DISABLE`` is dropped
    unless given in ``env``. The directory holding this ``gpuprobe`` package is put first on
    ``PYTHONPATH`` so the subprocess imports the same copy.

    Args:
        code: Python source to run.
        env: extra environment variables for the subprocess.
        timeout: seconds before the subprocess is killed.
        cwd: working directory of the subprocess.
        library: a prebuilt injection library (see :func:`build_injection_library`).

    Returns:
        The capture, with the subprocess's ``stdout``, ``stderr`` and ``returncode``.

    Raises:
        NvtxCaptureError: the subprocess exited non-zero or timed out (its stderr is in the
            message and in ``stderr``), or the library could not be built.

    Example:
        >>> cap = run_captured('''
        ...     import nvtx
        ...     with nvtx.annotate("load", domain="gpuprobe"):
        ...         pass
        ... ''')
        >>> cap.names("gpuprobe"), cap.is_balanced()
        (['load'], True)
    """
    lib = Path(library) if library is not None else build_injection_library()
    with tempfile.TemporaryDirectory(prefix="gpuprobe-nvtx-") as tmp:
        out = Path(tmp) / "nvtx.jsonl"
        child_env = {k: v for k, v in os.environ.items() if k != "NVTX_DISABLE"}
        child_env.update(env or {})
        child_env.update(capture_env(out, lib))
        package_root = str(_HERE.parent.parent)
        existing = child_env.get("PYTHONPATH")
        child_env["PYTHONPATH"] = package_root + (os.pathsep + existing if existing else "")
        try:
            proc = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(code)],
                env=child_env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise NvtxCaptureError(
                f"captured code timed out after {timeout}s\n--- stderr ---\n{err}", stderr=err
            ) from exc
        if proc.returncode != 0:
            raise NvtxCaptureError(
                f"captured code exited with status {proc.returncode}\n--- stderr ---\n{proc.stderr}",
                stderr=proc.stderr,
                returncode=proc.returncode,
            )
        cap = parse_capture(out)
    cap.stdout = proc.stdout
    cap.stderr = proc.stderr
    cap.returncode = proc.returncode
    return cap
