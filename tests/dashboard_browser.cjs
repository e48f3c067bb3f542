// Load a quantem-flow dashboard page in headless Chromium (playwright-core from web/),
// wait until its Bokeh document has data, screenshot it and print what it found as JSON.
// usage: node tests/dashboard_browser.cjs URL SCREENSHOT.png
"use strict";
const path = require("path");
const { chromium } = require(path.join(__dirname, "..", "web", "node_modules", "playwright-core"));

async function main() {
  const [url, shot] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.QF_CHROMIUM || "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const errors = [];
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    page.on("console", (m) => {
      if (m.type() === "error") errors.push("console: " + m.text());
    });
    page.on("pageerror", (e) => errors.push("page error: " + String(e)));
    page.on("requestfailed", (r) => errors.push("request failed: " + r.url()));
    page.on("response", (r) => {
      if (r.status() >= 400) errors.push(`HTTP ${r.status()}: ${r.url()}`);
    });
    const resp = await page.goto(url, { waitUntil: "load", timeout: 30000 });
    const column = (name, col) => {
      const d = window.Bokeh && window.Bokeh.documents && window.Bokeh.documents[0];
      const m = d && d.get_model_by_name(name);
      if (!m) return -1;
      const v = m.data instanceof Map ? m.data.get(col) : m.data[col];
      return v ? v.length : -1;
    };
    try {
      await page.waitForFunction(
        (fn) => new Function("return " + fn)()("qf-scan-map", "chunk") > 0,
        column.toString(),
        { timeout: 30000 },
      );
    } catch (e) {
      errors.push("the scan map never had data: " + String(e).split("\n")[0]);
    }
    await page.waitForTimeout(2000); // a few refreshes; let the canvases paint
    const info = await page.evaluate((fn) => {
      const n = new Function("return " + fn)();
      return {
        title: document.title,
        throughput: n("qf-throughput", "xs"),
        map: n("qf-scan-map", "chunk"),
        resident: n("qf-resident", "y"),
        progress: n("qf-progress", "y"),
        log: n("qf-log", "event"),
        lost: n("qf-lost", "worker"),
        navbar: Array.from(document.querySelectorAll(".navbar a")).map((a) => a.getAttribute("href")),
        text: document.body.innerText.slice(0, 3000),
        bokeh: typeof window.Bokeh,
        documents: window.Bokeh && window.Bokeh.documents ? window.Bokeh.documents.length : -1,
      };
    }, column.toString());
    await page.screenshot({ path: shot, fullPage: true });
    console.log(JSON.stringify({ status: resp.status(), errors, ...info }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
