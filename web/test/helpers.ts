// Test helpers: a pipe client for dist/node-worker.js, and a CPU reference of every kernel.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { StreamDecoder, encodeFrame, type Header, type Message } from "../src/protocol.js";

import { existsSync } from "node:fs";

function findWeb(): string {
  let d = path.dirname(fileURLToPath(import.meta.url));
  while (!existsSync(path.join(d, "build.mjs")) && d !== path.dirname(d)) d = path.dirname(d);
  return d;
}
export const WEB = findWeb();

export class PipeWorker {
  proc: ChildProcessWithoutNullStreams;
  private dec = new StreamDecoder();
  private waiting: ((m: Message) => void)[] = [];
  private got: Message[] = [];
  stderr = "";
  exit: Promise<number | null>;
  private nextId = 1;

  constructor(args: string[] = []) {
    this.proc = spawn(process.execPath, [path.join(WEB, "dist/node-worker.js"), ...args], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.proc.stdout.on("data", (c: Buffer) => {
      for (const ev of this.dec.push(new Uint8Array(c))) {
        if (ev.kind !== "message") throw ev.error;
        const w = this.waiting.shift();
        if (w) w(ev.message);
        else this.got.push(ev.message);
      }
    });
    this.proc.stderr.on("data", (c: Buffer) => (this.stderr += c.toString()));
    this.exit = new Promise((res) => this.proc.on("exit", (code) => res(code)));
  }

  next(): Promise<Message> {
    const m = this.got.shift();
    if (m) return Promise.resolve(m);
    return new Promise((res, rej) => {
      this.waiting.push(res);
      void this.exit.then((c) =>
        rej(new Error(`worker exited (${c}) before replying: ${this.stderr}`)),
      );
    });
  }

  sendRaw(bytes: Uint8Array): void {
    this.proc.stdin.write(bytes);
  }

  async request(header: Header, buffers: Uint8Array[] = []): Promise<Message> {
    const h = { id: this.nextId++, ...header };
    this.sendRaw(encodeFrame(h, buffers));
    const r = await this.next();
    if (r.header.id !== h.id) throw new Error(`reply id ${String(r.header.id)} != ${h.id}`);
    return r;
  }
}

export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}
