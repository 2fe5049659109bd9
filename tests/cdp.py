"""A tiny Chrome DevTools Protocol client over a pipe, for looking at pages in real Chromium.

Why this and not ``--dump-dom``: console messages then have to be fished out of
Chromium's log format, which changes between versions; the protocol reports them as
events (``Runtime.consoleAPICalled``, ``Runtime.exceptionThrown``, ``Log.entryAdded``).
Why a pipe: ``--remote-debugging-pipe`` needs no port and no websocket library; Chromium
reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.

Chromium is Debian's (/usr/bin/chromium), started headless with the flags this machine
needs (no sandbox as root; no background networking, since the network is closed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium_path() -> str | None:
    """Debian's chromium, if installed."""
    return CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")


def _above_9(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium with one page; ``with Browser() as b: b.open(url)``."""

    def __init__(self, timeout_s: float = 60.0, window: tuple[int, int] = (1200, 900)) -> None:
        self.timeout_s = timeout_s
        self.window = window
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self._buf = b""

    def __enter__(self) -> Browser:
        path = chromium_path()
        assert path is not None, "chromium is not installed"
        self._profile = tempfile.mkdtemp(prefix="batchinfer-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium's ends move to fds 3 and 4 in the child; from above 9 the shell's
        # redirections can never overwrite one end with the other.
        to_chrome_r, from_chrome_w = (_above_9(fd) for fd in (to_chrome_r, from_chrome_w))
        args = [
            path,
            *FLAGS,
            f"--user-data-dir={self._profile}",
            f"--window-size={self.window[0]},{self.window[1]}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # bash (dash takes no fd above 9) puts our ends at fds 3 and 4, where Chromium
        # expects them.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', "bash", *args],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            self.session = attached["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.send(f"{domain}.enable", session=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(OSError, EOFError, TimeoutError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self._profile, ignore_errors=True)

    # ------------------------------------------------------------------ protocol
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise EOFError("chromium closed the pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        """Send a command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The first event ``method`` (already received or the next ones)."""
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + self.timeout_s
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    # ------------------------------------------------------------------ page
    def open(self, url: str) -> None:
        """Navigate and wait for the page's load event."""
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and browser log errors so far."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "warning",
                "assert",
            ):
                args = " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                out.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                out.append(f"log {params['entry']['level']}: {params['entry']['text']}")
        return out
