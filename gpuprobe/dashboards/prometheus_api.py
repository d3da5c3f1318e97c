"""A minimal client of the Prometheus HTTP API (standard library only): queries, alerts, label values."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from ..errors import GpuprobeError

__all__ = ["Prometheus", "PrometheusError", "PrometheusUnreachableError"]


class PrometheusError(GpuprobeError):
    """Prometheus answered with an error (a bad query, a bad request)."""


class PrometheusUnreachableError(PrometheusError):
    """Prometheus could not be reached at the URL given; the message names it."""


class Prometheus:
    """A client of one Prometheus server's HTTP API.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:9090``.
        timeout: seconds per request.

    Example:
        >>> Prometheus("http://127.0.0.1:9090/").url
        'http://127.0.0.1:9090'
    """

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(list(params))}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout) as resp:
                body = json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read().decode()).get("error", "")
            except Exception:
                detail = ""
            raise PrometheusError(f"Prometheus at {self.url} refused {path} ({exc.code}): {detail or exc.reason}; "
                                  f"parameters {dict(params)}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnreachableError(
                f"Prometheus at {self.url} is unreachable ({reason}); is it running, and is the URL right?"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url} answered {path} with {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now; the ``result`` list (vector samples ``{"metric": ..., "value": [t, v]}``)."""
        data = self._get("/api/v1/query", [("query", expr)])
        return list(data.get("result", []))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; the ``result`` list of ``{"metric": ..., "values": [[t, v], ...]}``."""
        data = self._get("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"),
                                                 ("end", f"{end:.3f}"), ("step", f"{step:g}")])
        return list(data.get("result", []))

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (``/api/v1/alerts``)."""
        return list(self._get("/api/v1/alerts", []).get("alerts", []))

    def label_values(self, name: str, match: str | None = None) -> list[str]:
        """Values of a label (optionally among the series a selector matches)."""
        return list(self._get(f"/api/v1/label/{urllib.parse.quote(name)}/values",
                              [("match[]", match)] if match else []))
