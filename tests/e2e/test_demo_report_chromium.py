"""The demo report renders in a real browser: headless Chromium loads ``index.html`` from a local
HTTP server and every plot loads (``naturalWidth > 0``). Skips when Chromium is not installed."""

from __future__ import annotations

import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.demo import DEMO_TIMEOUT_SECONDS
from tests.support.requirements import require

#: The first test here runs the demo (a few minutes on two loaded cores; bounded by its own timeout).
pytestmark = pytest.mark.timeout(DEMO_TIMEOUT_SECONDS + 300)

SENTINEL = "missing-on-purpose.png"

CHECK_SCRIPT = """
<script>
window.addEventListener('load', function () {
  var result = Array.prototype.map.call(document.images, function (img) {
    return {src: img.getAttribute('src'), loaded: img.complete && img.naturalWidth > 0,
            width: img.naturalWidth, height: img.naturalHeight};
  });
  var pre = document.createElement('pre');
  pre.id = 'img-check';
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str:
    path: str = require("chromium")
    return path


@pytest.fixture
def served_report(demo_run: Any, tmp_path: Path) -> Iterator[str]:
    """The demo's report dir copied with a check page, served on a free loopback port."""
    assert demo_run.returncode == 0, demo_run.stderr[-2000:]
    site = tmp_path / "site"
    shutil.copytree(demo_run.report_dir, site)
    page = (site / "index.html").read_text(encoding="utf-8")
    # the check page: the report plus one image that must fail (proves the check can fail)
    check = page.replace("</body>", f'<img src="{SENTINEL}" alt="sentinel">{CHECK_SCRIPT}</body>')
    (site / "check.html").write_text(check, encoding="utf-8")
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _chromium_cmd(binary: str, profile: Path) -> list[str]:
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]


def test_every_plot_loads_in_chromium(served_report: str, tmp_path: Path) -> None:
    binary = _chromium()
    cmd = [*_chromium_cmd(binary, tmp_path / "profile"), "--virtual-time-budget=10000", "--dump-dom"]
    proc = subprocess.run([*cmd, f"{served_report}/check.html"], capture_output=True, text=True, timeout=120)  # noqa: S603
    m = re.search(r'<pre id="img-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"no check result in the DOM (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    images = {i["src"]: i for i in json.loads(html.unescape(m.group(1)))}
    assert images.pop(SENTINEL)["loaded"] is False
    assert len(images) == 5, images
    for src, img in images.items():
        assert img["loaded"], f"{src} did not load"
        assert img["width"] >= 300 and img["height"] >= 150, img


def test_report_screenshot(served_report: str, tmp_path: Path) -> None:
    binary = _chromium()
    shot = tmp_path / "report.png"
    cmd = [*_chromium_cmd(binary, tmp_path / "profile"), "--window-size=1280,3000", f"--screenshot={shot}"]
    proc = subprocess.run([*cmd, f"{served_report}/index.html"], capture_output=True, text=True, timeout=120)  # noqa: S603
    assert shot.exists(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
