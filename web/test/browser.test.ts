// The page host in headless Debian Chromium (SwiftShader WebGPU), driven by playwright-core.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { mkdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { WebSocketServer, type WebSocket } from "ws";
import { chromium } from "playwright-core";
import { decodeFrame, encodeFrame, type Header, type Message } from "../src/protocol.js";
import { WEB, bytesOf } from "./helpers.js";

function chromiumPath(): string | null {
  try {
    return execFileSync("sh", ["-c", "command -v chromium"]).toString().trim() || null;
  } catch {
    return null;
  }
}
const exe = chromiumPath();

test(
  "browser host: hello and a frame_pass through the page",
  { skip: exe ? false : "no `chromium` on PATH (apt install chromium)", timeout: 180000 },
  async () => {
    const token = "t0k3n";
    const dist = path.join(WEB, "dist/browser");
    const server = createServer((req, res) => {
      const url = new URL(req.url ?? "/", "http://x");
      if (url.pathname === "/" && url.searchParams.get("token") === token) {
        res
          .writeHead(200, { "content-type": "text/html" })
          .end(readFileSync(path.join(dist, "index.html")));
      } else if (url.pathname === "/worker.js") {
        res
          .writeHead(200, { "content-type": "text/javascript" })
          .end(readFileSync(path.join(dist, "worker.js")));
      } else res.writeHead(403).end();
    });
    const wss = new WebSocketServer({ noServer: true });
    server.on("upgrade", (req, sock, head) => {
      const url = new URL(req.url ?? "/", "http://x");
      if (url.pathname !== "/qf-worker" || url.searchParams.get("token") !== token)
        return sock.destroy();
      wss.handleUpgrade(req, sock, head, (ws) => wss.emit("connection", ws));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const conn = new Promise<WebSocket>((r) => wss.on("connection", r));
    const browser = await chromium.launch({
      executablePath: exe as string,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-unsafe-webgpu",
      ],
    });
    try {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${port}/?token=${token}&budget=1000000`);
      const ws = await conn;
      const replies: Message[] = [];
      const waiters: ((m: Message) => void)[] = [];
      ws.on("message", (d: Buffer) => {
        const m = decodeFrame(new Uint8Array(d));
        const f = waiters.shift();
        if (f) f(m);
        else replies.push(m);
      });
      let id = 0;
      const req = (h: Header, b: Uint8Array[] = []) => {
        ws.send(encodeFrame({ id: id++, ...h }, b));
        return new Promise<Message>((r) =>
          replies.length ? r(replies.shift()!) : waiters.push(r),
        );
      };
      const hello = await req({ type: "hello", protocol: "qf-worker/1", client: "test" });
      assert.equal(hello.header.runtime, "webgpu");
      assert.equal(hello.header.memory_budget_bytes, 1000000);
      const frames = Uint16Array.from({ length: 3 * 12 }, (_, k) => (k * 37) % 1000);
      assert.equal(
        (
          await req(
            {
              type: "put",
              handle: 1,
              representation: "dense",
              storage_schema: "dense-v1",
              dtype: "uint16",
              shape: [1, 3, 3, 4],
            },
            [bytesOf(frames)],
          )
        ).header.type,
        "result",
      );
      const wts = Float64Array.from({ length: 12 }, (_, k) => (k % 3) - 1);
      await req({ type: "put_weights", handle: 2, shape: [1, 12], dtype: "float64" }, [
        bytesOf(wts),
      ]);
      const r = await req({
        type: "run",
        operation: "frame_pass",
        chunk: 1,
        weights: 2,
        options: { want_sum: true, want_max: false },
      });
      assert.equal(r.header.accumulation, "u32x2");
      const per = new Float64Array(r.buffers[0].slice().buffer);
      const want = [0, 1, 2].map((f) => {
        let s = 0;
        for (let p = 0; p < 12; p++) s += frames[f * 12 + p] * wts[p];
        return s;
      });
      const sums = new BigInt64Array(r.buffers[1].slice().buffer);
      assert.deepEqual(Array.from(per), want);
      assert.equal(sums[5], BigInt(frames[5] + frames[17] + frames[29]));
      await page.waitForFunction(() =>
        document.getElementById("status")?.textContent?.includes("handles: 2"),
      );
      const status = await page.textContent("#status");
      assert.match(status ?? "", /connection: connected/);
      mkdirSync(path.join(WEB, "test-output"), { recursive: true });
      await page.screenshot({ path: path.join(WEB, "test-output/browser-host.png") });
      const bye = await req({ type: "bye" });
      assert.equal(bye.header.type, "bye");
    } finally {
      await browser.close();
      server.close();
    }
  },
);
