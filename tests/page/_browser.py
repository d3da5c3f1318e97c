"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol through a pipe
(``--remote-debugging-pipe``: JSON messages ending in a NUL byte on file descriptors 3 and 4), standard
library only. Started and stopped by PID, with a fresh profile folder removed afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio")


def ensure_chromium() -> None:
    """Install Debian's ``chromium`` package if missing; skip only without apt."""
    if os.access(CHROMIUM, os.X_OK):
        return
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip(f"apt-get is not available here, so Debian's chromium package cannot be installed ({CHROMIUM} "
                    "is missing)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"`{' '.join(cmd)}` failed ({done.returncode}); Debian's chromium package is needed for these "
                        f"tests:\n{(done.stdout + done.stderr)[-3000:]}")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the chromium package is installed but {CHROMIUM} is missing")


class DevToolsError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


class Browser:
    """One headless Chromium and one page (a target attached in flat mode).

    Events arrive in :attr:`events` (``(method, params)``) for the caller to read.
    """

    def __init__(self, width: int = 1440, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="gpuprobe-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the protocol's descriptors: 3 the browser reads, 4 it writes
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.log_path = os.path.join(self.profile, "chromium.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=fds, pass_fds=(3, 4),
            start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next = 0
        self._lock = threading.Lock()
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="devtools-reader", daemon=True)
        self._reader.start()
        self.session = ""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        waiter = self._waiting.pop(msg["id"], None)
                    if waiter is not None:
                        waiter.put(msg)
                else:
                    self.events.put((msg.get("method", ""), msg.get("params", {})))

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
             timeout: float = 60) -> dict[str, Any]:
        """Send a command (to the page unless ``session=False``) and return its result."""
        with self._lock:
            self._next += 1
            ident = self._next
            waiter: queue.Queue[dict[str, Any]] = queue.Queue()
            self._waiting[ident] = waiter
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        try:
            answer = waiter.get(timeout=timeout)
        except queue.Empty:
            raise DevToolsError(f"{method}: no answer in {timeout:g} s; chromium's log:\n{self.log_tail()}") from None
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str, width: int, height: int) -> None:
        """A PNG of the page's top ``width`` × ``height`` CSS pixels."""
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})
        time.sleep(1.5)  # a resize redraws the charts on the next frames
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def body(self, request_id: str) -> str:
        """The body of a response the page received."""
        got = self.send("Network.getResponseBody", {"requestId": request_id})
        return base64.b64decode(got["body"]).decode() if got.get("base64Encoded") else str(got["body"])

    def log_tail(self) -> str:
        """The end of chromium's own output (for error messages)."""
        return Path(self.log_path).read_bytes()[-3000:].decode(errors="replace") if os.path.exists(self.log_path) else ""

    def close(self) -> None:
        """Stop the browser (its process group) and remove its profile."""
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):  # the renderer and helpers too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@contextlib.contextmanager
def browser(width: int = 1440, height: int = 1000) -> Iterator[Browser]:
    """A :class:`Browser`, closed afterwards (also on failure)."""
    ensure_chromium()
    b = Browser(width, height)
    try:
        yield b
    finally:
        b.close()
