"""The page of ``Estimates.save_html`` is self-contained: headless Chromium opens it from a file with every network
request sent to a closed port, every figure loads, nothing is fetched, and the console shows no error. A copy of the
page with one remote image proves that the check sees a fetch and a failed image."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import icos_agent
from tests.support.digits import digits
from tests.support.requirements import require

#: Run first in the page: every console error and uncaught error recorded.
HOOKS = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e.type)); }, true);
var __consoleError = console.error;
console.error = function () { window.__errors.push(Array.prototype.join.call(arguments, ' ')); };
</script>"""

#: Run at load: the images, the resources fetched and the errors, as JSON in the DOM.
CHECK = """<script>
window.addEventListener('load', function () {
  var images = Array.prototype.map.call(document.images, function (img) {
    return {loaded: img.complete && img.naturalWidth > 0, width: img.naturalWidth, height: img.naturalHeight};
  });
  var fetched = performance.getEntriesByType('resource').map(function (r) { return r.name; });
  var pre = document.createElement('pre');
  pre.id = 'page-check';
  pre.textContent = JSON.stringify({images: images, fetched: fetched, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>"""


def _open(page: Path, profile: Path) -> dict[str, Any]:
    """Chromium's view of the page: images, resources fetched, console errors (and the stderr lines of any)."""
    cmd = [
        require("chromium"),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--proxy-server=http://127.0.0.1:9",  # no network: every request goes to a closed port
        "--proxy-bypass-list=<-loopback>",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # noqa: S603
    m = re.search(r'<pre id="page-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"no check result in the DOM (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    out: dict[str, Any] = json.loads(html.unescape(m.group(1)))
    out["console"] = [line for line in proc.stderr.splitlines() if "CONSOLE" in line and "error" in line.lower()]
    return out


@pytest.mark.timeout(600)
def test_the_page_opens_offline_with_every_figure_and_no_error(digits_logreg: dict[str, Path], tmp_path: Path) -> None:
    x, y = digits()
    frame = pd.DataFrame(x[1400:1797], columns=[f"px{i}" for i in range(64)]).assign(label=y[1400:1797])
    frame["ts"] = pd.Timestamp("2026-02-01", tz="UTC") + pd.to_timedelta(np.arange(len(frame)) * 60, unit="s")
    bundle = icos_agent.load(digits_logreg["bundle"], model=digits_logreg["model"])
    est = bundle.estimate(frame, timestamp="ts", window="1h", labels="label", progress=False)
    page = est.save_html(tmp_path / "report.html").read_text(encoding="utf-8")
    checked = page.replace("<head>", f"<head>{HOOKS}", 1).replace("</body>", f"{CHECK}</body>")
    (tmp_path / "check.html").write_text(checked, encoding="utf-8")
    seen = _open(tmp_path / "check.html", tmp_path / "profile")
    assert seen["fetched"] == [] and seen["errors"] == [] and seen["console"] == [], seen
    assert len(seen["images"]) == 2
    for img in seen["images"]:
        assert img["loaded"] and img["width"] >= 600 and img["height"] >= 300, img
    # the check can fail: a remote image is fetched (through the closed port) and does not load
    remote = checked.replace("</body>", '<img src="http://example.invalid/x.png" alt="remote"></body>', 1)
    (tmp_path / "remote.html").write_text(remote, encoding="utf-8")
    seen = _open(tmp_path / "remote.html", tmp_path / "profile-remote")
    assert seen["fetched"] == ["http://example.invalid/x.png"]
    assert [img["loaded"] for img in seen["images"]] == [True, True, False]
