"""Take the README's screenshot of the explorer (docs/images/explore.png).

Writes the ``medium`` synthetic demo dataset (a 128 x 128 scan of 96 x 96
patterns of a weak phase object, wave optics, calibrated) to a temporary folder, runs ``quantem-flow
explore`` on it, places an ADF annulus, taps a scan position, shows the 3 x 3
region's sum, and screenshots the page in Debian's Chromium.

    python scripts/screenshot_explore.py [--out docs/images/explore.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Write the screenshot."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "explore.png")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    import quantem_flow as qf
    from quantem_flow.cli import DEMO_SIZES

    with tempfile.TemporaryDirectory() as tmp:
        path = qf.write_synthetic(Path(tmp) / "demo.h5", **DEMO_SIZES["medium"])
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantem_flow", "explore", str(path), "--dataset-path",
             "/data", "--scheduler",
             "synchronous", "--export-dir", str(Path(tmp) / "export"), "--timeout", "600"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            url = ""
            while not url:
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit("quantem-flow explore exited before printing its URL")
                if "explore: http" in line:
                    url = line.split("explore: ", 1)[1].strip()
            chromium = os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 760})
                page.goto(url)
                page.wait_for_selector("#qf-status", timeout=60_000)
                page.locator("select").first.select_option("annulus")
                time.sleep(1.0)
                xy = page.evaluate(
                    """() => {
                      const m = Bokeh.documents[0].get_model_by_name('scan_image');
                      const v = Bokeh.index.find_one(m);
                      const r = v.canvas_view.el.getBoundingClientRect();
                      const b = v.frame.bbox;  // a point 30 % across, 55 % down the image
                      return [r.left + b.left + 0.3 * b.width, r.top + b.top + 0.55 * b.height];
                    }"""
                )
                page.mouse.click(*xy)
                page.locator("select").nth(3).select_option("3 x 3 sum")
                time.sleep(1.5)
                a.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(a.out))
                browser.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    print(a.out)


if __name__ == "__main__":
    main()
