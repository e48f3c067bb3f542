// Node host: qf-worker/1 over pipes (stdin -> requests, stdout -> replies), Dawn via the
// `webgpu` package on its OpenGL ES backend in compatibility mode. Logs go to stderr only.
//
//   node dist/node-worker.js [--budget-bytes N] [--adapter INDEX|NAME] [--list-adapters]
//
// Dawn's GLES backend needs EGL_PLATFORM=surfaceless on a headless machine; when it is
// not set this host re-executes itself with it set (the bridge may also set it).

import { spawn } from "node:child_process";
import { StreamDecoder, encodeFrame, type DecodeEvent, type Message } from "./protocol.js";
import { setupDevice } from "./setup.js";
import { DEFAULT_BUDGET, VERSION, Worker, errorMessage } from "./worker.js";

const log = (s: string) => process.stderr.write(`[qf-webgpu] ${s}\n`);

function usage(): never {
  log(
    "usage: node-worker.js [--budget-bytes N] [--adapter INDEX|NAME-SUBSTRING] [--list-adapters]",
  );
  process.exit(2);
}

function parseArgs(argv: string[]): { budget: number; adapter: string | null; list: boolean } {
  let budget = DEFAULT_BUDGET;
  let adapter: string | null = null;
  let list = false;
  for (let k = 0; k < argv.length; k++) {
    const a = argv[k];
    const val = (): string => {
      const eq = a.indexOf("=");
      if (eq >= 0) return a.slice(eq + 1);
      const v = argv[++k];
      if (v === undefined) usage();
      return v;
    };
    if (a === "--list-adapters") list = true;
    else if (a.startsWith("--budget-bytes")) {
      const v = Number(val());
      if (!Number.isSafeInteger(v) || v < 0) {
        log(`--budget-bytes must be a non-negative integer`);
        process.exit(2);
      }
      budget = v;
    } else if (a.startsWith("--adapter")) adapter = val();
    else usage();
  }
  return { budget, adapter, list };
}

async function main(): Promise<void> {
  if (!process.env.EGL_PLATFORM) {
    const child = spawn(process.execPath, process.argv.slice(1), {
      stdio: "inherit",
      env: { ...process.env, EGL_PLATFORM: "surfaceless" },
    });
    child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
    return;
  }
  const args = parseArgs(process.argv.slice(2));
  const { create, globals } = (await import("webgpu")) as unknown as {
    create: (flags: string[]) => GPU;
    globals: Record<string, unknown>;
  };
  Object.assign(globalThis, globals);
  const candidates: { flags: string[]; options: GPURequestAdapterOptions; backend: string }[] = [
    {
      flags: ["backend=opengles"],
      options: { featureLevel: "compatibility" },
      backend: "dawn-opengles",
    },
  ];
  const keep: GPU[] = [];
  (globalThis as Record<string, unknown>).__qfGpuInstances = keep;
  const adapters: { adapter: GPUAdapter; backend: string; name: string }[] = [];
  for (const c of candidates) {
    try {
      const gpu = create(c.flags);
      keep.push(gpu); // the GPU instance must outlive its adapters and devices
      const a = await gpu.requestAdapter(c.options);
      if (a)
        adapters.push({
          adapter: a,
          backend: c.backend,
          name: `${a.info.description || a.info.device} [${c.backend}]`,
        });
    } catch (e) {
      log(`adapter probe ${c.backend} failed: ${String(e)}`);
    }
  }
  if (args.list) {
    adapters.forEach((a, k) => process.stderr.write(`${k}: ${a.name}\n`));
    process.stdout.write(adapters.map((a, k) => `${k}: ${a.name}`).join("\n") + "\n");
    process.exit(0);
  }
  let chosen = adapters[0];
  if (args.adapter !== null) {
    const sel = args.adapter;
    chosen = /^\d+$/.test(sel)
      ? adapters[Number(sel)]
      : adapters.find((a) => a.name.toLowerCase().includes(sel.toLowerCase()))!;
  }
  if (!chosen) {
    log(
      `no WebGPU adapter${args.adapter !== null ? ` matching ${JSON.stringify(args.adapter)}` : ""}; ` +
        `found: ${JSON.stringify(adapters.map((a) => a.name))}. Is Mesa's EGL/GLES installed?`,
    );
    process.exit(3);
  }
  const setup = await setupDevice(chosen.adapter, chosen.backend);
  const worker = new Worker(setup.engine, {
    budgetBytes: args.budget,
    implementation: `quantem-flow-web ${VERSION} (node ${process.versions.node}, dawn ${chosen.backend})`,
    device: setup.device,
    log,
  });
  log(`ready: ${chosen.name}, budget ${args.budget} bytes`);
  const decoder = new StreamDecoder(worker.maxMessageBytes);
  type Item = { msg: Message } | { err: Message; fatal: boolean };
  const queue: Item[] = [];
  let ending = false;
  let busy = false;
  let closed = false;
  const write = (m: Message) => {
    process.stdout.write(encodeFrame(m.header, m.buffers));
  };
  const finish = (code: number) => {
    if (closed) return;
    closed = true;
    worker.freeAll();
    process.stdout.end(() => process.exit(code));
  };
  const pump = async () => {
    if (busy) return;
    busy = true;
    while (queue.length > 0 && !closed) {
      const it = queue.shift()!;
      // Errors found by the decoder go out in order, after the replies queued before them.
      const r = "msg" in it ? await worker.handle(it.msg) : { message: it.err, close: it.fatal };
      write(r.message);
      if (r.close) {
        finish(0);
        return;
      }
    }
    busy = false;
    if (ending && !closed) finish(0);
  };
  const onEvents = (events: DecodeEvent[]) => {
    for (const ev of events) {
      if (ev.kind === "message") queue.push({ msg: ev.message });
      else queue.push({ err: errorMessage(ev.error, ev.id), fatal: ev.fatal });
    }
  };
  process.stdin.on("data", (chunk: Buffer) => {
    onEvents(decoder.push(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength)));
    void pump();
  });
  process.stdin.on("end", () => {
    const ev = decoder.end();
    if (ev) onEvents([ev]);
    ending = true;
    void pump();
  });
  process.on("uncaughtException", (e) => {
    log(`uncaught: ${e.stack ?? String(e)}`);
  });
}

main().catch((e: unknown) => {
  log(`fatal: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
  process.exit(1);
});
