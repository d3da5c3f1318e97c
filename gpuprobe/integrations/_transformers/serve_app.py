"""``transformers serve``'s HTTP app: a ``Server-Timing`` header on each whole response, and request ids.

transformers builds its FastAPI app in ``build_server()`` (``transformers.cli.serving.server``); its own
middleware takes the client's ``x-request-id`` (or makes a uuid4), hands it to the generation managers
(under continuous batching it becomes the scheduler's request id) and echoes it on the response. Two
seams join gpuprobe's records to those requests:

- ``build_server`` (:data:`SEAM_APP`): the app it returns gets :class:`RequestTiming`, an ASGI
  middleware outside transformers' own. Per HTTP request it picks the request's id (the client's
  ``x-request-id`` as :func:`~gpuprobe._requests.clean_request_id` keeps it, or a new uuid4 it puts in
  the request's headers, so transformers uses that same id), makes the requests of the exchange take
  it (:func:`~gpuprobe._requests.catch_requests`), and when a whole response starts (it declares its
  length and is no event stream) adds ``Server-Timing`` from that request's record
  (:meth:`~gpuprobe._requests.RequestRecord.server_timing`). A well-formed id reaches transformers as
  the client sent it; one longer than 128 characters or with characters outside printable ASCII
  reaches it cleaned, so neither transformers' echo nor its response body carries it raw.
- ``InferenceThread.submit`` / ``async_submit`` (:data:`SEAM_SUBMIT`, :data:`SEAM_ASYNC_SUBMIT`):
  plain ``generate()`` runs on transformers' one persistent inference thread, fed through a queue, so
  the request's context (its context variables: the id) does not reach it as it would through
  ``asyncio.to_thread`` (which copies the context; ``loop.run_in_executor`` does not). While a request
  of the middleware is being served, the callable it submits runs in a copy of the submitting context.

While traces are on (docs/tracing.md), a request's W3C ``traceparent`` (and ``tracestate``) header
joins the caller's trace: the request's span is a child of the caller's span (read by OpenTelemetry's
own ``TraceContextTextMapPropagator``), and a whole response names the request's span in a
``traceresponse`` header (W3C Trace Context level 2: ``00-TRACE_ID-SPAN_ID-01``).

A streaming response carries the request's id (``x-request-id``) and no ``Server-Timing``: its
headers go out before its first token, when no figure of the request is known yet. Its record is read
by that id (``gpuprobe.requests()``). Its body is left as transformers writes it: HTTP trailers reach
neither browsers nor most clients, and a closing event-stream comment would change the bytes every
client parses for figures that may only be known after its last chunk has gone.

The record is the exchange's own where its context reached it (``generate()``); a continuous-batching
request's record is made when its output is delivered, before the response: it is found by id
(the newest record with that id that ended after the request arrived; if none yet, the runtime is
drained once and it is looked up again). The header's value is built from the record only: nothing of
the client's is echoed by gpuprobe.

All three seams share one switch: a failure of gpuprobe's own work in any of them (the middleware
included) turns them all to pass-through for the process. Under ``gpuprobe run`` (and
``instrument_all()``) :func:`instrument_server` installs them, on the modules as they are imported.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.machinery
import inspect
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from types import ModuleType
from typing import Any

from ... import _seams, is_enabled
from ..._requests import RequestRecord, catch_requests, clean_request_id, current_request_id, remember_parent, take_parent
from ...runtime import runtime
from .compat import SERVE_SERVER_MODULE, add_app_middleware, serve_inference_thread, serve_server_module

__all__ = ["GROUP", "SEAM_APP", "SEAM_SUBMIT", "SEAM_ASYNC_SUBMIT", "RequestTiming", "instrument_server",
           "uninstrument_server", "REQUEST_ID_HEADER", "SERVER_TIMING_HEADER"]

GROUP = "transformers.serving"
"""The switch of the serving app's seams: the ids they hand on are only of use together."""

SEAM_APP = _seams.declare(
    "transformers.serving.app", library="transformers", attribute="build_server", group=GROUP,
    scenario="serve", target="build_server() of transformers serve (the FastAPI app factory): gpuprobe's ASGI "
                             "middleware (Server-Timing, request ids) added to the app it returns")
SEAM_SUBMIT = _seams.declare(
    "transformers.serving.submit", library="transformers", attribute="submit", reads=("fn",), group=GROUP,
    scenario="serve", target="InferenceThread.submit of transformers serve (the class): a request's callable "
                             "runs in a copy of the request's context on the inference thread")
SEAM_ASYNC_SUBMIT = _seams.declare(
    "transformers.serving.async_submit", library="transformers", attribute="async_submit", reads=("fn",),
    group=GROUP, scenario="serve", target="InferenceThread.async_submit of transformers serve (the class): a "
                                          "request's callable runs in a copy of the request's context")

REQUEST_ID_HEADER = b"x-request-id"
"""The request-id header transformers serve reads and echoes (ASGI header names are lower case)."""
SERVER_TIMING_HEADER = b"server-timing"
TRACE_RESPONSE_HEADER = b"traceresponse"

_SWITCH = SEAM_APP.switch
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- the middleware ------------------------------------------------------------------------------------

class Exchange:
    """One HTTP request through :class:`RequestTiming`: its id, the scope transformers gets, what it caught.

    Attributes:
        request_id: the client's ``x-request-id`` as gpuprobe keeps it, else a new uuid4.
        scope: the ASGI scope passed on (the original, or a copy whose ``x-request-id`` is ``request_id``).
        arrived: wall-clock time of its arrival (a record that ended before it is another request's).
        posted: whether it is a POST (transformers' generation routes are all POSTs: only those have a
            record to wait for).
        caught: the records of the requests its own context made (:func:`~gpuprobe._requests.catch_requests`).
    """

    __slots__ = ("request_id", "scope", "arrived", "posted", "caught", "traced")

    def __init__(self, scope: Scope) -> None:
        self.caught: Any = None
        self.arrived = time.time()
        self.posted = scope.get("method") == "POST"
        headers: Sequence[tuple[bytes, bytes]] = scope.get("headers") or ()
        raw = next((value for name, value in headers if name.lower() == REQUEST_ID_HEADER), None)
        cleaned = clean_request_id(raw)
        self.scope = scope
        self.traced = False
        if cleaned is None:  # none, or empty: transformers' own choice (a uuid4), made here so both use it
            self.request_id = str(uuid.uuid4())
        else:
            self.request_id = cleaned
            if raw is not None and raw.decode("latin-1") == cleaned:
                return  # a well-formed id: transformers reads the client's header as it came
        kept = [(name, value) for name, value in headers if name.lower() != REQUEST_ID_HEADER]
        self.scope = {**scope, "headers": [*kept, (REQUEST_ID_HEADER, self.request_id.encode("ascii"))]}

    def join_trace(self) -> None:
        """Traces are on: the caller's ``traceparent`` (and ``tracestate``) is the parent of this request's
        span (remembered by its id for a request made on another thread)."""
        carrier = {}
        for name, value in self.scope.get("headers") or ():
            low = name.lower()
            if low in (b"traceparent", b"tracestate"):
                carrier[low.decode("ascii")] = value.decode("latin-1")
        if "traceparent" not in carrier:
            return
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
        if parent.is_valid:
            remember_parent(self.request_id, parent)
            self.traced = True

    def done(self) -> None:
        """The exchange ended: a parent no request took is forgotten."""
        if self.traced:
            take_parent(self.request_id)

    def record(self) -> RequestRecord | None:
        """This request's record: the one its own context caught, else the newest with its id that ended
        after it arrived (the runtime drained once when there is none yet)."""
        caught = self.caught
        if caught:
            return caught[-1]  # type: ignore[no-any-return]
        rt = runtime()
        found = self._found(rt)
        if found is None and self.posted:
            rt.drain()
            found = self._found(rt)
        return found

    def _found(self, rt: Any) -> RequestRecord | None:
        record = rt.requests.find(self.request_id)
        return record if record is not None and record.ended_at >= self.arrived else None

    def started(self, message: Message) -> Message:
        """The ``http.response.start`` message to send: with ``Server-Timing`` for a whole response whose
        record is known, with ``x-request-id`` where transformers set none."""
        headers = list(message.get("headers") or ())
        names = {name.lower() for name, _ in headers}
        extra: list[tuple[bytes, bytes]] = []
        if REQUEST_ID_HEADER not in names:
            extra.append((REQUEST_ID_HEADER, self.request_id.encode("ascii")))
        if _whole(headers):
            record = self.record()
            timing = record.server_timing() if record is not None else ""
            if timing:
                extra.append((SERVER_TIMING_HEADER, timing.encode("ascii")))
            if record is not None and record.trace_id and record.span_id:
                extra.append((TRACE_RESPONSE_HEADER, f"00-{record.trace_id}-{record.span_id}-01".encode("ascii")))
        if not extra:
            return message
        return {**message, "headers": [*headers, *extra]}


def _whole(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a response is whole when it starts: it declares its length and is no event stream."""
    length = stream = False
    for name, value in headers:
        low = name.lower()
        if low == b"content-length":
            length = True
        elif low == b"content-type" and value.lower().startswith(b"text/event-stream"):
            stream = True
    return length and not stream


class RequestTiming:
    """ASGI middleware of gpuprobe in transformers serve's app: request ids and ``Server-Timing``.

    Everything it does is guarded: its own failure turns the serving seams off (``info()["seams"]``)
    and the request goes on as if it were not there; the app's own exceptions and messages pass through
    as they are.

    Args:
        app: the ASGI app it wraps (what follows it in the app's middleware stack).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not _SWITCH.on or not _installed or not is_enabled():
            await self.app(scope, receive, send)
            return
        try:
            exchange = Exchange(scope)
            if runtime().requests.wants_parents:
                exchange.join_trace()
            catching = catch_requests(request_id=exchange.request_id)
            exchange.caught = catching.__enter__()
        except Exception as exc:
            SEAM_APP.fail(exc)
            await self.app(scope, receive, send)
            return

        async def timed_send(message: Message) -> None:
            if message.get("type") == "http.response.start" and _SWITCH.on:
                try:
                    message = exchange.started(message)
                except Exception as exc:
                    SEAM_APP.fail(exc)
            await send(message)

        try:
            await self.app(exchange.scope, receive, timed_send)
        finally:
            try:
                catching.__exit__(None, None, None)
                exchange.done()
            except Exception as exc:
                SEAM_APP.fail(exc)


# -- the inference thread -------------------------------------------------------------------------------

def in_request_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` to run in a copy of the caller's context, when the caller is serving a request (its id is
    set); else ``fn`` itself."""
    if current_request_id() is None:
        return fn
    return functools.partial(contextvars.copy_context().run, fn)


def _submit_in_context(seam: _seams.Seam, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``InferenceThread.submit`` or ``async_submit``: ``(self, fn, *args, **kwargs)``)
    whose ``fn`` runs in the submitting request's context.

    Its guard is written out instead of the seam template's: the template passes the arguments on
    untouched, and this seam's work is to hand the thread ``fn`` wrapped (as ``asyncio.to_thread``
    does). ``fn`` is read by name (a keyword) or at the position the signature gives it.
    """
    params = [p.name for p in inspect.signature(original).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    at = params.index("fn") - 1 if "fn" in params else -1  # in args, which come without self
    switch = seam.switch

    def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        if switch.on:
            try:
                if "fn" in kwargs:
                    kwargs = {**kwargs, "fn": in_request_context(kwargs["fn"])}
                elif 0 <= at < len(args):
                    args = (*args[:at], in_request_context(args[at]), *args[at + 1:])
            except Exception as exc:
                seam.fail(exc)
        return original(self, *args, **kwargs)

    functools.update_wrapper(replacement, original)
    replacement._gpuprobe_seam = seam  # type: ignore[attr-defined]
    replacement._gpuprobe_class_wrapper = True  # type: ignore[attr-defined]
    seam.replacements.add(replacement)
    return replacement


# -- installing ------------------------------------------------------------------------------------------

_lock = threading.RLock()
_patches: list[_seams.Patch] = []
_installed = False


def _add_middleware(token: Any, app: Any, error: BaseException | None) -> None:
    if error is None and app is not None and _installed:
        add_app_middleware(app, RequestTiming)


def _install_now() -> None:
    """Put the seams on the modules of transformers serve imported so far (each once)."""
    patched = {(id(p.owner()), p.seam.name) for p in _patches}
    module = serve_server_module()
    if module is not None and (id(module), SEAM_APP.name) not in patched and SEAM_APP.check(module) is None:
        original = module.__dict__.get(SEAM_APP.attribute)
        if callable(original) and not _seams.is_replacement(original):
            _patches.append(SEAM_APP.patch(module, _seams.wrap(SEAM_APP, original, after=_add_middleware)))
    cls = serve_inference_thread()
    if cls is None:
        return
    for seam in (SEAM_SUBMIT, SEAM_ASYNC_SUBMIT):
        if (id(cls), seam.name) in patched or seam.check(cls) is not None:
            continue
        original = _seams.unwrapped(cls, seam.attribute)  # type: ignore[arg-type]
        _patches.append(seam.patch(cls, _submit_in_context(seam, original), on_class=True))


class _AfterImport:
    """A meta path finder that installs the seams once transformers serve's server module has been
    imported (a post-import hook; the module's own loader runs first and untouched)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != SERVE_SERVER_MODULE:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
        return spec


class _Loader:
    """Runs the real loader, then installs the seams (never raising: a failure is the seam's)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            _drop_hook()
            if _installed:
                try:
                    _install_now()
                except Exception as exc:
                    SEAM_APP.fail(exc)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


_hook = _AfterImport()


def _drop_hook() -> None:
    try:
        sys.meta_path.remove(_hook)
    except ValueError:
        pass


def instrument_server() -> None:
    """Install the serving seams on transformers serve: now where its modules are imported, else when
    its server module is. Idempotent; undone by :func:`uninstrument_server`.

    Example:
        >>> from gpuprobe.integrations._transformers.serve_app import instrument_server, uninstrument_server
        >>> instrument_server()
        >>> uninstrument_server()
    """
    global _installed
    with _lock:
        _installed = True
        try:
            if SERVE_SERVER_MODULE in sys.modules:
                _install_now()
            elif _hook not in sys.meta_path:
                sys.meta_path.insert(0, _hook)
        except Exception as exc:  # never into the program: the seams stay off, and info() says why
            SEAM_APP.fail(exc)


def uninstrument_server() -> None:
    """Take the serving seams away; an app built meanwhile keeps the middleware, which from then on
    passes every request through untouched."""
    global _installed
    with _lock:
        _installed = False
        _drop_hook()
        while _patches:
            _patches.pop().undo()
