"""On-demand profile captures while a program serves: the next N generation steps, recorded by a
profile window (:func:`gpuprobe.profiling.profile`) when someone asks for them.

Three ways to ask, each started by a setting (see ``docs/capture.md``):

- ``POST /gpuprobe/profile?steps=N`` on the /metrics port (:func:`wrap_wsgi`, used by
  :func:`gpuprobe.exporters.prometheus.serve`; ``profile_endpoint``);
- a signal, ``SIGUSR2`` by default (:class:`SignalTrigger`; ``profile_signal``);
- a slow step: a decode step longer than a fixed time or than a percentile of recent ones
  (:class:`SlowSteps`; ``profile_slow_step``), at most once per ``profile_slow_step_interval``.

All three go through the runtime's :class:`OnDemand`, which runs one capture at a time, names its
trace after the settings ``profile_dir`` / ``profile_name`` and remembers the last few captures
(``gpuprobe.info()["profile"]``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import signal
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from time import monotonic_ns, perf_counter_ns
from typing import Any

from ._torch_caps import profiler_enabled_here
from .errors import ConfigError, GpuprobeError
from .runtime import DISABLED_AT_IMPORT, Runtime

__all__ = ["OnDemand", "CaptureBusy", "on_demand", "respond", "wrap_wsgi", "SignalTrigger", "SlowSteps",
           "start_from_settings", "status", "PATH", "HEADER", "RECENT_STEPS"]

_log = logging.getLogger("gpuprobe")

PATH = "/gpuprobe/profile"
"""Where the /metrics server takes capture requests."""

HEADER = "X-Gpuprobe-Capture"
"""The header a capture request must carry (any value): a page of another site cannot send it without
asking the server first (a CORS preflight), which the server never grants."""

RECENT_STEPS = 1000
"""How many recent decode steps a percentile threshold (``profile_slow_step=p99``) is computed over."""

_KEEP = 10  # captures remembered for info()


class CaptureBusy(GpuprobeError):
    """A profile window already records (or waits for) the steps a capture would take."""


# -- one capture at a time ------------------------------------------------------------------------

class OnDemand:
    """The runtime's on-demand captures: :meth:`start` opens a profile window over the next N steps.

    Captures run one at a time, and never while another profile window (yours, the settings') records
    or waits for the same steps: torch.profiler runs one session at a time.
    """

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._lock = threading.Lock()
        self.recent: deque[tuple[str, Any]] = deque(maxlen=_KEEP)  # (reason, ProfileWindow)
        self.signal: SignalTrigger | None = None
        self.slow: SlowSteps | None = None
        self.quiet_until = -1  # steps up to this index are distorted by a capture (slow-step trigger)
        self.written: deque[str] = deque()  # traces this process's captures wrote, oldest first (profile_keep)
        # When each recent capture recorded (wall clock: started, ended or None), for the requests it covered.
        self.times: dict[int, list[float | None]] = {}
        rt.requests.find_capture = self.overlapping  # a request's span names the capture that recorded it
    def start(self, steps: int, reason: str, *, at: int | None = None) -> Any:
        """Capture the next ``steps`` steps; returns the :class:`~gpuprobe.profiling.ProfileWindow`.

        Args:
            steps: how many steps.
            reason: why (``request``, ``signal``, ``slow_step``; the ``{reason}`` of ``profile_name``).
            at: from a step hook, the step starting now: the capture starts with it.

        Raises:
            ConfigError: ``steps`` < 1.
            CaptureBusy: a profile window records or waits for those steps.
            GpuprobeError: probes are disabled (no step is counted) or PyTorch is missing.
        """
        from ._probe import is_enabled
        from .profiling import profile

        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")
        if not is_enabled():
            raise GpuprobeError("gpuprobe is disabled (gpuprobe.disable() or GPUPROBE_DISABLE=1): no step is counted")
        if "torch" not in sys.modules:
            try:
                import torch  # noqa: F401 - profile windows record with torch.profiler
            except ImportError:
                raise GpuprobeError("profile captures need PyTorch: pip install 'gpuprobe[transformers]'") from None
        rt = self._rt
        cfg = rt.settings
        with self._lock:
            first = rt.steps.index + 1 if at is None else at
            last = first + steps - 1
            busy = _window_in(rt, first, last)
            if busy is not None:
                raise CaptureBusy(f"a profile capture is already running: {_describe(busy)}; "
                                  f"ask again once its trace is written")
            name = cfg.profile_name.format(first=first, last=last, rank=cfg.rank, pid=os.getpid(), reason=reason)
            path = os.path.abspath(os.path.join(cfg.profile_dir, name))
            window = profile((first, last), output=path, runtime_=rt, owner="user")
            watch = _CaptureCost(rt, reason, _step_seconds(rt))
            window.on_started, window.on_finished = watch.started, watch.finished
            if at is not None:
                # The step clock runs the hooks it had when this step started: start the window here.
                window.on_step(at)
            self.recent.append((reason, window))
            # The window's start and its trace writing fall in the steps around it (see SlowSteps).
            self.quiet_until = max(self.quiet_until, last + 2)
        _say(f"capturing steps {first}-{last} ({_REASON_WORDS.get(reason, reason)}) to {path}")
        return window

    def replaced(self) -> str | None:
        """The trace the next capture's removes once it is written (``profile_keep``), or None."""
        keep = self._rt.settings.profile_keep
        with self._lock:
            return self.written[0] if keep and len(self.written) >= keep else None

    def wrote(self, path: str) -> None:
        """A capture's trace is written: keep at most ``profile_keep`` of them, removing the oldest."""
        keep = self._rt.settings.profile_keep
        with self._lock:
            if path in self.written:
                self.written.remove(path)  # the same name written again (a restarted step count)
            self.written.append(path)
            removed = [self.written.popleft() for _ in range(len(self.written) - keep)] if keep else []
        for old in removed:
            try:
                os.remove(old)
            except FileNotFoundError:
                continue
            except OSError as exc:
                _say(f"could not remove the oldest capture {old} (GPUPROBE_PROFILE_KEEP={keep}): {exc.strerror}")
                continue
            _say(f"removed the oldest capture {old}: GPUPROBE_PROFILE_KEEP={keep} keeps the last {keep}")

    def recording(self, window: Any, started: bool) -> None:
        """A capture's window starts (or stops) recording now."""
        import time

        # No lock: start() holds it while it starts a window from a step hook, which calls this.
        if started:
            live = {id(w) for _, w in list(self.recent)}
            self.times = {**{k: v for k, v in self.times.items() if k in live}, id(window): [time.time(), None]}
        else:
            span = self.times.get(id(window))
            if span is not None:
                span[1] = time.time()

    def overlapping(self, start: float, end: float) -> str | None:
        """The trace of the newest capture that recorded some of the time from ``start`` to ``end`` (wall clock)."""
        found = None
        times = self.times
        for _, window in list(self.recent):
            span = times.get(id(window))
            if span is None:
                continue
            began, ended = span
            if began <= end and (ended is None or ended >= start):
                path = window.path if window.path is not None else window.output
                found = None if path is None else os.path.abspath(str(path))
        return found

    def captures(self) -> list[dict[str, Any]]:
        """The last captures, oldest first: reason, steps, trace path, state."""
        return [_window_info(w, reason) for reason, w in list(self.recent)]

    def __repr__(self) -> str:
        return f"<gpuprobe on-demand captures ({len(self.recent)} recent)>"

    def close(self) -> None:
        """At reset and exit: forget the captures (their windows are closed on their own)."""
        self.recent.clear()
        if self._rt.requests.find_capture == self.overlapping:
            self._rt.requests.find_capture = None
        with _instances_lock:
            if _instances.get(self._rt) is self:
                del _instances[self._rt]


_REASON_WORDS = {"request": f"asked for by POST {PATH}", "signal": "asked for by a signal",
                 "slow_step": "a slow step"}

SLOWDOWN_WARNING = 2.0
"""A capture whose steps took more than this many times the steps before it is warned about."""


def _say(message: str) -> None:
    """One line on stderr (and the ``gpuprobe`` logger at INFO): a capture is something the user asked for
    or set up, so it is said where they look, not only in a log they may not have configured."""
    _log.info("gpuprobe: %s", message)
    try:
        sys.stderr.write(f"gpuprobe: {message}\n")
        sys.stderr.flush()
    except Exception:  # no usable stderr (a daemon): the log has it
        pass


def _step_seconds(rt: Runtime) -> tuple[float, int]:
    """Host time of every generation step so far, and how many: from ``gpuprobe.step.duration``."""
    total, count = 0.0, 0
    for md in rt.collect():
        if md.spec.name == "gpuprobe.step.duration":
            for p in md.points:
                if p.labels.get("clock") == "host":
                    total += p.sum
                    count += p.count
    return total, count


class _CaptureCost:
    """Says when a capture starts recording and when its trace is written, and warns when its steps took
    more than :data:`SLOWDOWN_WARNING` times the steps before it (their mean host time, compared)."""

    def __init__(self, rt: Runtime, reason: str, before: tuple[float, int]) -> None:
        self._rt = rt
        self._reason = reason
        self._before = before
        self._at_start: tuple[float, int] | None = None

    def started(self, window: Any) -> None:
        self._at_start = _step_seconds(self._rt)
        on_demand(self._rt).recording(window, True)

    def finished(self, window: Any) -> None:
        on_demand(self._rt).recording(window, False)
        if window.error is not None:
            _say(f"the capture of steps {window.first}-{window.last} failed: {window.error}")
            return
        where = window.path if window.path is not None else window.output
        _say(f"capture of steps {window.first}-{window.last} written to {where}")
        if where is not None:
            path = os.path.abspath(str(where))
            on_demand(self._rt).wrote(path)
            if self._rt.requests.wants_parents:  # traces are on: the capture's span, with its report's top finding
                _report_for_traces(self._rt, path, window, self._reason)
        if self._at_start is None:
            return
        (seconds_before, steps_before), (seconds_start, steps_start) = self._before, self._at_start
        seconds_end, steps_end = _step_seconds(self._rt)
        captured = steps_end - steps_start
        if steps_before == 0 or captured <= 0:
            return
        mean_before, mean_captured = seconds_before / steps_before, (seconds_end - seconds_start) / captured
        if mean_captured > SLOWDOWN_WARNING * mean_before:
            message = (f"gpuprobe: capturing made the captured steps {mean_captured / mean_before:.1f}x slower "
                       f"({mean_captured * 1e3:.3g} ms a step against {mean_before * 1e3:.3g} ms before): their "
                       f"times in the trace and in the metrics include the profiler's own cost")
            self._rt.warn_once(f"capture-cost:{window.first}", message)


_REPORT = ("import json, sys; sys.path.insert(0, sys.argv.pop(1)); from gpuprobe.report import analyze; "
           "found = analyze(sys.argv[1]).to_dict().get('findings') or []; "
           "print(json.dumps(found[0] if found else None))")
_REPORT_TIMEOUT = 300.0  # seconds the report on a capture may take before its span goes out without it


def _report_for_traces(rt: Runtime, path: str, window: Any, reason: str) -> None:
    """Read the capture's trace with ``gpuprobe report`` in a process of its own (``python -I``, so the program
    pays nothing for it), then hand the capture and the report's top finding to the trace exporter."""
    span = on_demand(rt).times.get(id(window)) or [None, None]
    started, ended = span

    def run() -> None:
        import subprocess

        finding = None
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _REPORT, root, path], capture_output=True, text=True,
                                  timeout=_REPORT_TIMEOUT, cwd=root, stdin=subprocess.DEVNULL)
            if done.returncode == 0 and done.stdout.strip():
                finding = json.loads(done.stdout.strip().splitlines()[-1])
        except (OSError, ValueError, subprocess.TimeoutExpired):
            finding = None
        try:
            for item in rt.lifecycle.items():  # the trace exporter (gpuprobe.exporters.traces) takes captures
                taken = getattr(item, "capture_reported", None)
                if callable(taken):
                    taken(path=path, reason=reason, first=window.first, last=window.last, started=started,
                          ended=ended, finding=finding)
        except Exception as exc:  # never into the program
            rt.warn_once("capture-span", f"gpuprobe: the span of the capture {path} could not be made: {exc!r}")

    threading.Thread(target=run, name="gpuprobe-capture-report", daemon=True).start()


_instances: weakref.WeakKeyDictionary[Runtime, OnDemand] = weakref.WeakKeyDictionary()
_instances_lock = threading.Lock()


def on_demand(rt: Runtime) -> OnDemand:
    """The :class:`OnDemand` of ``rt`` (made at first use, forgotten at reset)."""
    with _instances_lock:
        found = _instances.get(rt)
        if found is None:
            found = _instances[rt] = OnDemand(rt)
            rt.add_closeable(found, owner="user")
        return found


def _windows(rt: Runtime) -> Iterable[Any]:
    from .profiling import ProfileWindow

    for hook in rt.steps.hooks:
        window = getattr(hook, "__self__", None)
        if isinstance(window, ProfileWindow):
            yield window


def _window_in(rt: Runtime, first: int, last: int) -> Any:
    """A profile window that records now, or waits for a step in ``first``–``last``; else None."""
    from .profiling import WindowState

    for w in _windows(rt):
        if w.state in (WindowState.RECORDING, WindowState.WRITING):
            return w
        if w.state == WindowState.WAITING and w.first <= last and w.last >= first:
            return w
    return None


def _profiler_running() -> bool:
    """Whether a profiler (torch.profiler, the autograd profiler) records on the calling thread."""
    torch = sys.modules.get("torch")
    return torch is not None and profiler_enabled_here(torch)


def _describe(window: Any) -> str:
    where = f" to {window.output}" if window.output else ""
    return f"steps {window.first}-{window.last}{where} ({window.state.value})"


def _window_info(window: Any, reason: str) -> dict[str, Any]:
    path = window.path if window.path is not None else window.output
    return {"reason": reason, "first_step": window.first, "last_step": window.last,
            "path": None if path is None else str(path), "state": window.state.value, "error": window.error}


# -- the HTTP endpoint --------------------------------------------------------------------------------

def _is_loopback(addr: str) -> bool:
    import ipaddress

    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def respond(rt: Runtime, method: str, query: str, *, loopback: bool, confirmed: bool = False,
            ) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
    """Answer one request to :data:`PATH`: ``(status, JSON body, extra headers)``.

    Args:
        rt: the runtime whose steps are captured.
        method: the HTTP method (only POST captures).
        query: the query string (``steps=N``; N defaults to ``profile_on_demand_steps``).
        loopback: whether the server binds a loopback address (``profile_endpoint=auto`` answers only then).
        confirmed: whether the request carries :data:`HEADER` (a capture needs it: 403 without).
    """
    from urllib.parse import parse_qs

    cfg = rt.settings
    mode = cfg.profile_endpoint
    if mode == "off" or (mode == "auto" and not loopback):
        why = ("GPUPROBE_PROFILE_ENDPOINT=off" if mode == "off" else
               "this server binds a non-loopback address; GPUPROBE_PROFILE_ENDPOINT=on opens it there")
        return 404, {"error": f"the profile endpoint is off: {why}"}, []
    if method != "POST":
        return 405, {"error": f"{method} is not allowed: POST {PATH}?steps=N captures the next N steps"}, [
            ("Allow", "POST")]
    if not confirmed:
        return 403, {"error": f"a capture request needs the header {HEADER} (any value), which a web page of another "
                              f"site cannot send: curl -X POST -H '{HEADER}: 1' 'http://HOST:PORT{PATH}?steps=N'"}, []
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        return 400, {"error": f"the query must look like steps=N, got {query!r}"}, []
    unknown = sorted(set(params) - {"steps"})
    if unknown:
        return 400, {"error": f"unknown parameter(s) {', '.join(unknown)}: the only one is steps=N"}, []
    most = cfg.profile_max_steps
    values = params.get("steps")
    if values is None:
        steps = cfg.profile_on_demand_steps
    else:
        text = values[-1].strip()
        # len() first: int() refuses strings of thousands of digits with an error of its own.
        if len(values) > 1 or not (text.isascii() and text.isdigit()) or len(text) > 9 or not 1 <= int(text) <= most:
            shown = values if len(values) > 1 else values[0]
            return 400, {"error": f"steps must be an integer between 1 and {most} (GPUPROBE_PROFILE_MAX_STEPS), "
                                  f"got {shown!r}"}, []
        steps = int(text)
    capture = on_demand(rt)
    try:
        window = capture.start(steps, "request")
    except CaptureBusy as exc:
        running = _window_in(rt, 0, sys.maxsize)
        body: dict[str, Any] = {"error": str(exc)}
        if running is not None:
            reason = next((r for r, w in list(capture.recent) if w is running), "profile()")
            body["running"] = _window_info(running, reason)
        return 409, body, []
    except GpuprobeError as exc:
        return 503, {"error": str(exc)}, []
    return 202, {"path": window.output, "first_step": window.first, "last_step": window.last, "steps": steps,
                 "reason": "request", "keep": rt.settings.profile_keep, "removes": capture.replaced()}, []


_REASONS = {202: "Accepted", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 503: "Service Unavailable"}


_ENVIRON_HEADER = "HTTP_" + HEADER.upper().replace("-", "_")


def wrap_wsgi(app: Callable[..., Any], rt: Runtime, addr: str) -> Callable[..., Any]:
    """``app`` (the /metrics WSGI app) with :data:`PATH` answered by :func:`respond`; every other path
    goes to ``app`` unchanged."""
    loopback = _is_loopback(addr)

    def gpuprobe_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO", "").rstrip("/") != PATH:
            return app(environ, start_response)
        status, body, headers = respond(rt, environ.get("REQUEST_METHOD", "GET"), environ.get("QUERY_STRING", ""),
                                        loopback=loopback, confirmed=_ENVIRON_HEADER in environ)
        data = json.dumps(body).encode()
        start_response(f"{status} {_REASONS[status]}", [("Content-Type", "application/json"),
                                                        ("Content-Length", str(len(data))), *headers])
        return [data]

    return gpuprobe_app


# -- the signal ----------------------------------------------------------------------------------------

# One worker per process takes requests from signal handlers: a handler runs on the main thread between
# two bytecodes, possibly while that thread holds one of gpuprobe's locks, so it only puts the request
# on a queue. SimpleQueue.put is reentrant (documented as safe to call from a signal handler).
_requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_worker_lock = threading.Lock()
_installed: SignalTrigger | None = None  # the trigger whose handler is installed, if any


def _ensure_worker() -> None:
    global _worker
    with _worker_lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, args=(_requests,), name="gpuprobe-signal", daemon=True)
            _worker.start()


def _work(requests: queue.SimpleQueue[Any]) -> None:
    while True:
        trigger = requests.get()
        if trigger is None:
            return
        trigger.capture()


class SignalTrigger:
    """Capture the next ``profile_on_demand_steps`` steps when the process receives ``name``.

    :meth:`install` runs only on the main thread (Python's rule for signal handlers) and never replaces
    a handler the program installed: it then warns and does nothing. :meth:`close` puts the previous
    handler back (at reset and exit), unless the program replaced gpuprobe's meanwhile.
    """

    def __init__(self, rt: Runtime, name: str) -> None:
        self._rt = rt
        self.name = name
        self.signum = getattr(signal, name)
        self.installed = False
        self.problem: str | None = None  # why it is not installed
        self._previous: Any = signal.SIG_DFL

    def install(self) -> bool:
        """Install the handler; False (with a warning) when it cannot or must not."""
        global _installed
        rt = self._rt
        if threading.current_thread() is not threading.main_thread():
            self.problem = (f"gpuprobe started on thread {threading.current_thread().name!r}; Python installs "
                            f"signal handlers from the main thread only")
            rt.warn_once(f"signal:{self.name}", f"gpuprobe: {self.name} does not capture steps: {self.problem}. "
                         f"Call gpuprobe.configure() once from the main thread, or set GPUPROBE_PROFILE_SIGNAL=off.")
            return False
        current = signal.getsignal(self.signum)
        earlier = getattr(current, "__self__", None)
        if isinstance(earlier, SignalTrigger):
            current = earlier._previous  # gpuprobe's own, from a setup never closed: take its place
            earlier.installed = False
        elif current is not signal.SIG_DFL:
            shown = "a handler installed outside Python" if current is None else repr(current)
            self.problem = f"the program handles {self.name} itself ({shown})"
            rt.warn_once(f"signal:{self.name}", f"gpuprobe: {self.name} does not capture steps: {self.problem}, and "
                         f"gpuprobe never replaces a program's handler. Choose another signal with "
                         f"GPUPROBE_PROFILE_SIGNAL (SIGUSR1, SIGUSR2) or set it to off.")
            return False
        try:
            signal.signal(self.signum, self._handle)
        except (ValueError, OSError) as exc:  # e.g. the main thread of a subinterpreter
            self.problem = f"it cannot be installed here ({exc})"
            rt.warn_once(f"signal:{self.name}", f"gpuprobe: {self.name} does not capture steps: {self.problem}")
            return False
        _ensure_worker()
        self._previous = current
        self.installed = True
        _installed = self
        return True

    def _handle(self, signum: int, frame: Any) -> None:
        _requests.put(self)

    def capture(self) -> None:
        """On the worker thread: start the capture the signal asked for."""
        if not self.installed:
            return
        try:
            on_demand(self._rt).start(self._rt.settings.profile_on_demand_steps, "signal")
        except GpuprobeError as exc:
            _log.warning("gpuprobe: %s: no capture: %s", self.name, exc)

    def close(self) -> None:
        """Put the previous handler back (if gpuprobe's is still the one installed)."""
        global _installed
        if not self.installed:
            return
        self.installed = False
        if _installed is self:
            _installed = None
        capture = _instances.get(self._rt)
        if capture is not None and capture.signal is self:
            capture.signal = None
        try:
            if signal.getsignal(self.signum) == self._handle:
                signal.signal(self.signum, self._previous)
        except ValueError:
            # Not on the main thread: the handler stays, and does nothing (installed is False).
            self._rt.warn_once(f"signal-restore:{self.name}",
                               f"gpuprobe: {self.name}'s previous handler could not be restored off the main thread")

    def __repr__(self) -> str:
        state = "installed" if self.installed else f"not installed: {self.problem}"
        return f"<gpuprobe profile capture on {self.name} ({state})>"


def _after_fork_in_child() -> None:
    """In a forked child nothing of the parent's runs (no worker thread): put the handler back."""
    global _worker, _worker_lock, _requests, _installed
    _worker, _worker_lock, _requests = None, threading.Lock(), queue.SimpleQueue()
    trigger, _installed = _installed, None
    if trigger is not None:
        trigger.installed = False
        try:
            if signal.getsignal(trigger.signum) == trigger._handle:
                signal.signal(trigger.signum, trigger._previous)
        except (ValueError, OSError):
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- slow steps ----------------------------------------------------------------------------------------

_NEVER = 1 << 62  # a threshold no step reaches (ns)


class SlowSteps:
    """Capture the next ``steps`` steps when a decode step takes longer than ``seconds``.

    A step hook measures each step on the thread that runs it, from its start to the next step's start;
    the first step of each ``generate()`` call (the prefill, whose time follows the prompt's length) and
    the last (which ends with the call, not at a step start) are not judged. A step judged slow starts a
    capture with the step that follows it, at most once per ``interval`` seconds, and not while a
    profile window records.

    Args:
        rt: the runtime.
        seconds: the threshold (``profile_slow_step`` as a time).
        interval: seconds between two captures at least.
        steps: steps a capture records.
    """

    def __init__(self, rt: Runtime, seconds: float, interval: float, steps: int) -> None:
        self._rt = rt
        self.rule = f"{seconds:g}s"
        # Decided once: each step compares one integer with this (see on_step).
        self.threshold_ns = round(seconds * 1e9)
        self.interval_ns = round(interval * 1e9)
        self.steps = steps
        self.captures = 0
        self._tls = threading.local()
        self._next_ns = 0  # monotonic time before which no capture starts
        self._lock = threading.Lock()

    def attach(self) -> SlowSteps:
        """Start judging steps (settings-owned: closed by the next ``configure()``)."""
        rt = self._rt
        rt.add_step_hook(self.on_step)
        rt.add_steps_done_hook(self.on_steps_done)
        rt.add_closeable(self, owner="settings")
        return self

    def on_step(self, index: int) -> None:
        """Step hook: judge the step this thread ran before (its end is this step's start)."""
        # Why so little: this runs at every step start. A clock read, a thread-local start time (its
        # sign says whether that step is judged; negative: a call's first) and one comparison with a
        # threshold decided beforehand: +0.23 us a step (+0.30 with a percentile), test CPU,
        # benchmarks/RESULTS-slow-step.md.
        now = perf_counter_ns()
        tls = self._tls
        last = getattr(tls, "t", 0)
        tls.t = now if last else -now
        if last > 0 and now - last > self.threshold_ns:
            self._slow(index, now - last)

    def on_steps_done(self) -> None:
        """This thread's call ended: its next step is a call's first again."""
        self._tls.t = 0

    def _slow(self, index: int, duration_ns: int) -> None:
        """A slow step: capture the next steps, unless too soon, or a capture distorted this step."""
        now = monotonic_ns()
        if now < self._next_ns or not self._lock.acquire(blocking=False):
            return
        try:
            if now < self._next_ns:
                return
            capture = on_demand(self._rt)
            # Steps next to a capture's are slow because of it (the profiler's start, its trace writing).
            if index <= capture.quiet_until or _window_in(self._rt, index - 1, index) is not None:
                return
            self._next_ns = now + self.interval_ns
            # Start with the step starting now, unless a profiler already records it on this thread
            # (a kernel sample): then with the next one, which the sampler leaves to the window.
            at = None if _profiler_running() else index
            try:
                capture.start(self.steps, "slow_step", at=at)
            except CaptureBusy:
                self._next_ns = 0  # another capture runs: the next slow step tries again
                return
            except GpuprobeError as exc:
                self._rt.warn_once("slow_step", f"gpuprobe: slow-step capture failed: {exc}")
                return
            self.captures += 1
            _log.info("gpuprobe: a step took %.1f ms (threshold %s): capturing the next %d", duration_ns / 1e6,
                      self.rule, self.steps)
        finally:
            self._lock.release()

    def threshold_seconds(self) -> float | None:
        """The threshold in force (None while a percentile has too few steps)."""
        return None if self.threshold_ns >= _NEVER else self.threshold_ns / 1e9

    def close(self) -> None:
        """Stop judging steps."""
        self._rt.remove_step_hook(self.on_step)
        self._rt.remove_steps_done_hook(self.on_steps_done)
        self._rt.remove(self)
        capture = _instances.get(self._rt)
        if capture is not None and capture.slow is self:
            capture.slow = None

    def __repr__(self) -> str:
        return f"<gpuprobe slow-step capture above {self.rule}>"


class SlowStepsPercentile(SlowSteps):
    """:class:`SlowSteps` with the threshold at percentile ``q`` of the last :data:`RECENT_STEPS` decode
    steps, recomputed on the background thread (every ``collect_interval``), never on a step."""

    def __init__(self, rt: Runtime, q: float, interval: float, steps: int) -> None:
        super().__init__(rt, 1.0, interval, steps)
        self.rule = f"p{q:g}"
        self.q = q
        self.threshold_ns = _NEVER  # until enough steps are in
        # Enough steps for the percentile to leave some above it: 100 for p99, 1000 for p99.9.
        self.min_steps = min(RECENT_STEPS, max(100, math.ceil(100 / (100 - q))))
        self._recent: deque[int] = deque(maxlen=RECENT_STEPS)
        self._append = self._recent.append

    def attach(self) -> SlowSteps:
        rt = self._rt
        rt.add_step_hook(self.on_step)
        rt.add_steps_done_hook(self.on_steps_done)
        rt.add_exporter(self, owner="settings")  # tick(): the threshold, on the background thread
        return self

    def on_step(self, index: int) -> None:
        """Step hook: keep the step's time for the percentile, and judge it."""
        now = perf_counter_ns()
        tls = self._tls
        last = getattr(tls, "t", 0)
        tls.t = now if last else -now
        if last > 0:
            duration = now - last
            self._append(duration)  # a bounded deque: one C call, no lock
            if duration > self.threshold_ns:
                self._slow(index, duration)

    def tick(self) -> None:
        """Recompute the threshold from the recent steps."""
        # Why every tick, unconditionally: this takes ~31 us (1,000 steps, test CPU,
        # benchmarks/RESULTS-slow-step.md), <0.01 % of one core at the default 0.5 s interval; counting
        # new steps to skip it would cost every step instead.
        recent = sorted(self._recent.copy())  # deque.copy runs in C: no step appends halfway through
        n = len(recent)
        if n >= self.min_steps:
            self.threshold_ns = recent[max(0, math.ceil(self.q / 100 * n) - 1)]

    def __repr__(self) -> str:
        now = self.threshold_seconds()
        shown = "waiting for steps" if now is None else f"now {now * 1e3:.3g} ms"
        return f"<gpuprobe slow-step capture above {self.rule} ({shown})>"


# -- from the settings --------------------------------------------------------------------------------

def start_from_settings(rt: Runtime) -> None:
    """Install the signal trigger and the slow-step trigger the settings ask for (settings-owned)."""
    if DISABLED_AT_IMPORT:
        return
    cfg = rt.settings
    # The default (SIGUSR2) does not exist on every platform; a setting naming it was checked then.
    with_signal = cfg.profile_signal != "off" and hasattr(signal, cfg.profile_signal)
    if not (with_signal or cfg.profile_slow_step):
        return
    capture = on_demand(rt)
    if with_signal:
        trigger = SignalTrigger(rt, cfg.profile_signal)
        trigger.install()
        capture.signal = trigger
        rt.add_closeable(trigger, owner="settings")
    rule = cfg.profile_slow_step
    if rule:
        if rule.startswith("p"):
            slow: SlowSteps = SlowStepsPercentile(rt, float(rule[1:]), cfg.profile_slow_step_interval,
                                                  cfg.profile_slow_step_steps)
        else:
            slow = SlowSteps(rt, float(rule[:-1]), cfg.profile_slow_step_interval, cfg.profile_slow_step_steps)
        capture.slow = slow.attach()


def status(rt: Runtime) -> dict[str, Any]:
    """What ``gpuprobe.info()["profile"]`` shows: the triggers in force and the last captures."""
    capture = _instances.get(rt)
    cfg = rt.settings
    trigger = capture.signal if capture is not None else None
    slow = capture.slow if capture is not None else None
    return {
        "endpoint": cfg.profile_endpoint,
        "signal": cfg.profile_signal if trigger is None or trigger.installed else
        f"{cfg.profile_signal} (not installed: {trigger.problem})",
        "slow_step": None if slow is None else {
            "rule": slow.rule, "threshold_s": slow.threshold_seconds(),
            "interval_s": slow.interval_ns / 1e9, "steps": slow.steps, "captures": slow.captures},
        "captures": capture.captures() if capture is not None else [],
    }
