"""A minimal client of the Prometheus HTTP API (standard library only): queries, alerts, label values.

What answers at the URL is read with care, since it may be anything: at most :data:`MAX_ANSWER_BYTES`
of one answer are read (the rest is never read), and an answer that is not one of the Prometheus API
(too large, not JSON, nested too deeply, JSON of another shape) raises :class:`PrometheusAnswerError`
naming the URL and what was wrong, apart from a server that cannot be reached at all
(:class:`PrometheusUnreachableError`) and one that refuses a query (:class:`PrometheusError`).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from ..errors import GpuprobeError

__all__ = ["MAX_ANSWER_BYTES", "Prometheus", "PrometheusError", "PrometheusUnreachableError",
           "PrometheusAnswerError"]

MAX_ANSWER_BYTES = 8 * 1024 * 1024
"""The most of one answer the client reads: 8 MiB, tens of thousands of series of an instant query, far
more than a panel of gpuprobe's asks for. Past it the answer is not read further and the request raises
:class:`PrometheusAnswerError`; ``Prometheus(max_answer_bytes=...)`` changes it."""

_MAX_ERROR_BYTES = 64 * 1024  # of an HTTP error's body: the error message of a refused query
_SHOWN = 120  # characters of an answer or an error message quoted in a message


class PrometheusError(GpuprobeError):
    """Prometheus answered with an error (a bad query, a bad request)."""


class PrometheusUnreachableError(PrometheusError):
    """Prometheus could not be reached at the URL given; the message names it."""


class PrometheusAnswerError(PrometheusError):
    """What answered at the URL is not a Prometheus API answer (too large, not JSON, nested too deeply,
    or JSON of another shape); the message names the URL and what was wrong."""


def _shown(text: str) -> str:
    """``text`` quoted on one line, cut to a few words."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


class _NotAnAnswer(Exception):
    """Raised inside the client: what is wrong with an answer, in words (made a PrometheusAnswerError)."""


class Prometheus:
    """A client of one Prometheus server's HTTP API.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:9090``.
        timeout: seconds per request (to connect, and for each read of the answer).
        max_answer_bytes: the most of one answer read (:data:`MAX_ANSWER_BYTES` by default).

    Example:
        >>> Prometheus("http://127.0.0.1:9090/").url
        'http://127.0.0.1:9090'
    """

    def __init__(self, url: str, timeout: float = 5.0, max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes

    def _get(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(list(params))}"
        try:
            try:
                resp = urllib.request.urlopen(full, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                try:
                    raise self._refused(exc, path, params) from None
                finally:
                    exc.close()
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise self._unreachable(exc) from None
            except http.client.HTTPException as exc:  # something answered, not in HTTP
                raise _NotAnAnswer(f"not an HTTP answer ({type(exc).__name__})") from None
            with resp:
                body = _parse(_read(resp, self.max_answer_bytes), resp.headers.get("Content-Type", ""))
            if not isinstance(body, dict) or "status" not in body:
                raise _NotAnAnswer(f"JSON of another shape: {_kind(body)}, not an object with a status")
            if body["status"] == "error":
                raise PrometheusError(f"Prometheus at {self.url} answered {path} with an error: "
                                      f"{_shown(str(body.get('error', '')))}")
            if body["status"] != "success" or "data" not in body:
                raise _NotAnAnswer(f"JSON of another shape: status {_shown(str(body['status']))}"
                                   + ("" if "data" in body else " and no data"))
        except OSError as exc:  # the connection failed while the answer was read
            raise self._unreachable(exc) from None
        except _NotAnAnswer as exc:
            raise self._not_an_answer(path, str(exc)) from None
        return body["data"]

    def _not_an_answer(self, path: str, what: str) -> PrometheusAnswerError:
        return PrometheusAnswerError(f"{self.url}{path} did not answer as the Prometheus API does: {what}; "
                                     f"is {self.url} a Prometheus server?")

    def _unreachable(self, exc: BaseException) -> PrometheusUnreachableError:
        reason = getattr(exc, "reason", exc)
        return PrometheusUnreachableError(
            f"Prometheus at {self.url} is unreachable ({reason}); is it running, and is the URL right?")

    def _refused(self, exc: urllib.error.HTTPError, path: str, params: Sequence[tuple[str, str]]) -> Exception:
        """What an HTTP error answer is: Prometheus refusing the request (its JSON error), or not Prometheus."""
        status = f"HTTP {exc.code} {exc.reason}"
        try:
            body = _parse(_read(exc, _MAX_ERROR_BYTES), exc.headers.get("Content-Type", "") if exc.headers else "")
        except _NotAnAnswer as bad:
            return _NotAnAnswer(f"{status}, and {bad}")
        except (OSError, http.client.HTTPException):
            body = None
        if not isinstance(body, dict) or body.get("status") != "error":
            return _NotAnAnswer(f"{status} without a Prometheus error")
        detail = str(body.get("error", "")) or str(exc.reason)
        return PrometheusError(f"Prometheus at {self.url} refused {path} ({exc.code}): {_shown(detail)}; "
                               f"parameters {dict(params)}")

    def _data(self, path: str, params: Sequence[tuple[str, str]], key: str) -> list[Any]:
        """The list ``data[key]`` of an answer (``result``, ``alerts``)."""
        data = self._get(path, params)
        found = data.get(key) if isinstance(data, dict) else None
        if not isinstance(found, list):
            raise self._not_an_answer(path, f"JSON of another shape: data is {_kind(data)} without a list "
                                            f"{key!r}")
        return found

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now; the ``result`` list (vector samples ``{"metric": ..., "value": [t, v]}``)."""
        return self._data("/api/v1/query", [("query", expr)], "result")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; the ``result`` list of ``{"metric": ..., "values": [[t, v], ...]}``."""
        return self._data("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"),
                                                  ("end", f"{end:.3f}"), ("step", f"{step:g}")], "result")

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (``/api/v1/alerts``)."""
        return self._data("/api/v1/alerts", [], "alerts")

    def label_values(self, name: str, match: str | None = None) -> list[str]:
        """Values of a label (optionally among the series a selector matches)."""
        path = f"/api/v1/label/{urllib.parse.quote(name)}/values"
        data = self._get(path, [("match[]", match)] if match else [])
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise self._not_an_answer(path, f"JSON of another shape: data is {_kind(data)}, not a list of strings")
        return data


def _read(resp: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of an answer; a larger one is an error, found without reading the rest."""
    length = (resp.headers.get("Content-Length", "") if resp.headers else "").strip()
    if length.isdigit() and int(length) > limit:
        raise _NotAnAnswer(f"an answer of {int(length)} bytes, more than the {limit} read")
    try:
        body = resp.read(limit + 1)  # one byte past the limit tells a larger answer; the rest stays unread
    except http.client.HTTPException as exc:  # a chunked answer cut off or malformed
        raise _NotAnAnswer(f"an answer broken off or malformed ({type(exc).__name__})") from None
    if len(body) > limit:
        raise _NotAnAnswer(f"an answer of more than {limit} bytes, the most read")
    return bytes(body)


def _parse(raw: bytes, content_type: str) -> Any:
    """The JSON of an answer; anything else raises :class:`_NotAnAnswer` saying what it is."""
    sent = f" (Content-Type {content_type})" if content_type else ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _NotAnAnswer(f"an answer that is not UTF-8 text{sent}") from None
    try:
        return json.loads(text)
    except RecursionError:  # the C scanner stops at the interpreter's recursion limit (~1000 levels)
        raise _NotAnAnswer("JSON nested too deeply to read") from None
    except ValueError:
        begins = f", beginning {_shown(text.lstrip()[:40])}" if text.strip() else ": an empty answer"
        raise _NotAnAnswer(f"not JSON{sent}{begins}") from None
