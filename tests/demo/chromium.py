"""Open a local HTML file in headless Chromium over the DevTools protocol (the `websockets` client):
console errors, uncaught exceptions, every <img>'s decoded size, the page size and a screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from websockets.sync.client import connect

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, "
             "w: i.naturalWidth, h: i.naturalHeight})))")
SIZE_JS = "JSON.stringify({w: document.documentElement.scrollWidth, h: document.documentElement.scrollHeight})"


def chromium_binary() -> str:
    for name in CHROMIUM:
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("no Chromium on PATH; scripts/test.sh installs Debian's package "
                            "(apt-get install -y chromium)")


class Page:
    """One tab, driven through a flattened session on the browser's websocket."""

    def __init__(self, ws):
        self.ws, self.ids, self.events, self.session = ws, itertools.count(1), [], None

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        i = next(self.ids)
        msg = {"id": i, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            rep = json.loads(self.ws.recv(timeout=max(end - time.monotonic(), 0.01)))
            if rep.get("id") == i:
                if "error" in rep:
                    raise RuntimeError(f"{method}: {rep['error']}")
                return rep["result"]
            self.events.append(rep)
        raise TimeoutError(method)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        end = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while time.monotonic() < end:
            ev = json.loads(self.ws.recv(timeout=max(end - time.monotonic(), 0.01)))
            self.events.append(ev)
            if ev.get("method") == method:
                return ev
        raise TimeoutError(method)

    def evaluate(self, js: str):
        return json.loads(self.call("Runtime.evaluate", expression=js, returnByValue=True)["result"]["value"])

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (failed loads) seen so far."""
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append("log: " + p["entry"]["text"])
        return out


def inspect(html: Path, screenshot: Path | None = None, width: int = 1200, height: int = 900) -> dict:
    """Load ``html`` and report {"errors", "images", "size", "bytes"}; write a PNG screenshot if asked."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    proc = subprocess.Popen([chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        end = time.monotonic() + 60
        while url is None and time.monotonic() < end:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"chromium exited with status {proc.returncode} before DevTools started")
            if m := re.search(r"DevTools listening on (ws://\S+)", line):
                url = m.group(1)
        if url is None:
            raise TimeoutError("chromium did not print its DevTools address within 60 s")
        with connect(url, max_size=None, open_timeout=30) as ws:
            page = Page(ws)
            tid = page.call("Target.createTarget", url="about:blank")["targetId"]
            page.session = page.call("Target.attachToTarget", targetId=tid, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                page.call(f"{domain}.enable")
            page.call("Page.navigate", url=Path(html).resolve().as_uri())
            page.wait_event("Page.loadEventFired", timeout=60)
            out = dict(images=page.evaluate(IMAGES_JS), size=page.evaluate(SIZE_JS), bytes=Path(html).stat().st_size)
            if screenshot is not None:
                shot = page.call("Page.captureScreenshot", format="png", timeout=60)
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            out["errors"] = page.errors()
            return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
