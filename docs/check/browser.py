"""A headless Chromium driven over the DevTools protocol on a pipe: no driver, no port, stdlib only.

``--remote-debugging-pipe`` makes Chromium read protocol messages from file descriptor 3 and
write its answers to descriptor 4, each a JSON object ended by a NUL byte. That is all a page
check needs (navigate, wait for the load event, evaluate a script), so nothing is installed from
pip and no TCP port is opened; Selenium would need chromium-driver and a second process.

    with Browser.start(find_chromium(), width=1280) as browser:
        browser.open("http://127.0.0.1:8000/")
        print(browser.evaluate("document.title"))
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = ("apt-get", "install", "-y", "chromium")


class BrowserError(RuntimeError):
    """The browser could not be found, started or driven; the message says what to do."""


def find_chromium(*, install: bool = True) -> str:
    """The path of a Chromium on PATH; when absent, install Debian's package if we are root with apt.

    CI runs as root on Debian bookworm, where ``apt-get install -y chromium`` takes a minute or
    two; elsewhere the error names the command to run.
    """
    for name in NAMES:
        if found := shutil.which(name):
            return found
    can_install = install and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0
    if not can_install:
        raise BrowserError(
            "no Chromium on PATH (looked for "
            + ", ".join(NAMES)
            + "); install it, e.g. `sudo apt-get install -y chromium`"
        )
    print(
        f"site check: no Chromium on PATH; installing Debian's package: apt-get update && {' '.join(INSTALL)}",
        flush=True,
    )
    start = time.perf_counter()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (("apt-get", "update", "-q"), INSTALL):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BrowserError(f"`{' '.join(command)}` failed ({tail[0]}); install Chromium by hand and rerun")
    found = shutil.which("chromium")
    if not found:
        raise BrowserError("apt-get installed chromium but it is not on PATH; check /usr/bin/chromium")
    print(f"site check: installed {found} in {time.perf_counter() - start:.0f} s", flush=True)
    return found


class Browser:
    """One headless page at a fixed window size, talked to over the DevTools pipe."""

    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self._process = process
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = os.fdopen(from_browser, "rb", buffering=0)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._session = ""
        self.requests: list[str] = []  # every URL the page asked for, to catch CDN loads

    @classmethod
    @contextmanager
    def start(cls, chromium: str, *, width: int = 1280, height: int = 900) -> Iterator[Browser]:
        child_reads, we_write = os.pipe()
        we_read, child_writes = os.pipe()

        def wire_pipes() -> None:  # runs in the child, before exec: the pipe is fds 3 and 4
            # Copies first: the pipe's own fds may be 3 or 4, and dup2 onto itself keeps close-on-exec.
            reads, writes = os.dup(child_reads), os.dup(child_writes)
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        with tempfile.TemporaryDirectory(prefix="site-check-profile-") as profile:
            command = [
                chromium,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--disable-dev-shm-usage",  # containers give /dev/shm 64 MB
                "--no-first-run",
                "--no-default-browser-check",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ]
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=wire_pipes,
                close_fds=False,  # fds 3 and 4 must survive exec; our other fds are non-inheritable
            )
            os.close(child_reads)
            os.close(child_writes)
            browser = cls(process, we_write, we_read)
            try:
                browser._attach(width, height)
                yield browser
            finally:
                browser._close()

    def _attach(self, width: int, height: int) -> None:
        target = self._call("Target.createTarget", url="about:blank", session=False)["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True, session=False)["sessionId"]
        self._call("Page.enable")
        self._call("Network.enable")
        self._call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def open(self, url: str, *, timeout: float = 30.0) -> None:
        """Load ``url`` and return once its load event fired (scripts run, styles applied)."""
        self._events.clear()
        answer = self._call("Page.navigate", url=url)
        if answer.get("errorText"):
            raise BrowserError(f"cannot load {url}: {answer['errorText']}")
        self._wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only)."""
        answer = self._call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise BrowserError(f"script failed in the page: {answer['exceptionDetails'].get('text')}")
        return answer["result"].get("value")

    def _call(self, method: str, *, session: bool = True, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        try:
            self._out.write(json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise BrowserError(f"Chromium exited (code {self._process.poll()}) before {method}") from None
        while True:
            reply = self._read(timeout=60.0)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method} failed: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._note(reply)

    def _wait_event(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(event.get("method") == method for event in self._events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserError(f"no {method} within {timeout:.0f} s")
            self._note(self._read(timeout=remaining))

    def _note(self, message: dict[str, Any]) -> None:
        if message.get("method") == "Network.requestWillBeSent":
            self.requests.append(message["params"]["request"]["url"])
        elif "method" in message:
            self._events.append(message)

    def _read(self, *, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._in], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise BrowserError(f"Chromium sent nothing for {timeout:.0f} s")
            chunk = os.read(self._in.fileno(), 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self._process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _close(self) -> None:
        with suppress(BrowserError):  # the browser may exit before it answers
            self._call("Browser.close", session=False)
        for stream in (self._out, self._in):
            stream.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


if __name__ == "__main__":  # smoke test: python docs/check/browser.py
    with Browser.start(find_chromium()) as page:
        page.open("data:text/html,<title>ok</title><p>hello")
        print(page.evaluate("document.title + ' at ' + window.innerWidth + ' px'"))
