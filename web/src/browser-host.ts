// Page host: qf-worker/1 over a WebSocket back to the bridge that served this page.
// URL: http://127.0.0.1:PORT/?token=T[&budget=BYTES]; the socket is
// ws(s)://<location.host>/qf-worker?token=T, one frame per binary message.

import { ProtocolError, decodeFrame, encodeFrame, type Message } from "./protocol.js";
import { setupDevice } from "./setup.js";
import { DEFAULT_BUDGET, VERSION, Worker, errorMessage } from "./worker.js";

const statusEl = document.getElementById("status") as HTMLElement;
const state = { connection: "not connected", device: "none", worker: null as Worker | null };

function show(extra = "", error = false): void {
  const w = state.worker;
  statusEl.className = error ? "error" : "";
  statusEl.textContent =
    `connection: ${state.connection}\ndevice: ${state.device}\n` +
    (w
      ? `handles: ${w.handles}\nresident bytes: ${w.residentBytes} of ${w.opts.budgetBytes}\n`
      : "") +
    extra;
}

async function main(): Promise<void> {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const budgetParam = params.get("budget");
  const budget = budgetParam === null ? DEFAULT_BUDGET : Number(budgetParam);
  if (!token) return show("no ?token= in the page URL: open the URL the worker printed", true);
  if (!Number.isSafeInteger(budget) || budget < 0) return show(`bad ?budget=${budgetParam}`, true);
  if (!("gpu" in navigator) || !navigator.gpu) {
    return show(
      "WebGPU is not available in this browser (navigator.gpu is missing). Use a browser with WebGPU " +
        "enabled (Chrome/Edge 113+, or chromium --enable-unsafe-webgpu) over http://127.0.0.1.",
      true,
    );
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    return show("navigator.gpu has no adapter: WebGPU is disabled or no GPU is usable here.", true);
  }
  const setup = await setupDevice(adapter, "browser");
  state.device = `${setup.device.name} (${setup.device.type})`;
  const worker = new Worker(setup.engine, {
    budgetBytes: budget,
    implementation: `quantem-flow-web ${VERSION} (browser, ${navigator.userAgent})`,
    device: setup.device,
  });
  state.worker = worker;
  show();
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(
    `${proto}//${location.host}/qf-worker?token=${encodeURIComponent(token)}`,
  );
  ws.binaryType = "arraybuffer";
  state.connection = "connecting";
  show();
  let chain = Promise.resolve();
  const send = (m: Message) => ws.send(encodeFrame(m.header, m.buffers));
  ws.onopen = () => {
    state.connection = "connected";
    show();
  };
  ws.onclose = (ev) => {
    state.connection = `closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`;
    worker.freeAll();
    show();
  };
  ws.onerror = () => show("WebSocket error: is the worker process still running?", true);
  ws.onmessage = (ev: MessageEvent) => {
    chain = chain.then(async () => {
      if (!(ev.data instanceof ArrayBuffer)) {
        send(
          errorMessage(new ProtocolError("frame", "expected a binary message (one frame)"), null),
        );
        return ws.close(1003, "text message");
      }
      let msg: Message;
      try {
        msg = decodeFrame(new Uint8Array(ev.data), worker.maxMessageBytes);
      } catch (e) {
        send(errorMessage(e, null));
        if (e instanceof ProtocolError && e.code === "too_large") return;
        return ws.close(1002, "bad frame");
      }
      const r = await worker.handle(msg);
      send(r.message);
      show();
      if (r.close) {
        worker.freeAll();
        ws.close(1000, "bye");
      }
    });
  };
}

main().catch((e: unknown) => show(`failed: ${e instanceof Error ? e.message : String(e)}`, true));
