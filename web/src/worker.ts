// The transport-independent qf-worker/1 worker: a handle table of resident payloads
// (GPU buffers) and weights, a memory budget, and one reply per request.

import { Engine, pad4, type ChunkGpu, type Segment, type WeightsGpu } from "./gpu.js";
import { RMAX } from "./kernels.js";
import { PROTOCOL, ProtocolError, type Header, type Json, type Message } from "./protocol.js";

export const VERSION = "0.1.0";
/** Default memory budget when neither --budget-bytes nor ?budget= is given: 1 GiB. */
export const DEFAULT_BUDGET = 1024 * 1024 * 1024;
export const MAX_WEIGHT_ROWS = 4096;

const ITEMSIZE: Record<string, number> = {
  uint8: 1,
  uint16: 2,
  uint32: 4,
  uint64: 8,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  float32: 4,
  float64: 8,
};
const DENSE_DTYPES = ["uint8", "uint16", "uint32", "float32"];
/** Paired and packed values are non-negative integers (< 2**32 paired, < 2**16 packed). */
const INT_DTYPES = ["uint8", "uint16", "uint32", "int8", "int16", "int32"];
export const SCHEMAS: Record<string, string> = {
  "dense-v1": "dense",
  "paired-csr-v1": "paired",
  "packed-blockwidth-v1": "packed",
};
const REP_SCHEMA: Record<string, string> = {
  dense: "dense-v1",
  paired: "paired-csr-v1",
  packed: "packed-blockwidth-v1",
};

export function kernelTriples(): [string, string, string][] {
  const out: [string, string, string][] = [];
  for (const op of ["frame_pass", "gather"]) {
    for (const d of DENSE_DTYPES) out.push([op, "dense", d]);
    for (const rep of ["paired", "packed"]) for (const d of INT_DTYPES) out.push([op, rep, d]);
  }
  return out;
}

export interface WorkerOptions {
  budgetBytes: number;
  implementation: string;
  device: { [k: string]: string | number };
  maxMessageBytes?: number;
  log?: (s: string) => void;
}

type ChunkEntry = { kind: "chunk"; gpu: ChunkGpu; shape: number[] };
type WeightsEntry = { kind: "weights"; gpu: WeightsGpu; integerWeights: boolean };
type Entry = ChunkEntry | WeightsEntry;

export interface Reply {
  message: Message;
  close: boolean;
}

function bad(msg: string, handle: number | null = null): ProtocolError {
  return new ProtocolError("bad_request", msg, handle);
}

function isInt(v: Json | undefined): v is number {
  return typeof v === "number" && Number.isSafeInteger(v);
}

function intList(v: Json | undefined, what: string, len?: number): number[] {
  if (
    !Array.isArray(v) ||
    !v.every((x) => isInt(x) && x >= 0) ||
    (len !== undefined && v.length !== len)
  ) {
    throw bad(
      `${what} must be a list of ${len ?? "some"} non-negative integers, got ${JSON.stringify(v ?? null)}`,
    );
  }
  return v as number[];
}

function view<T>(
  ctor: new (b: ArrayBuffer, o: number, n: number) => T,
  b: Uint8Array,
  size: number,
): T {
  // Buffers from the decoder are fresh copies (byteOffset 0), so views are aligned.
  const copy = b.byteOffset % 8 === 0 ? b : b.slice();
  return new ctor(copy.buffer as ArrayBuffer, copy.byteOffset, copy.byteLength / size);
}

export class Worker {
  readonly maxMessageBytes: number;
  private table = new Map<number, Entry>();
  private resident = { dense: 0, paired: 0, packed: 0, weights: 0 };
  private lost: string | null = null;

  constructor(
    readonly engine: Engine,
    readonly opts: WorkerOptions,
  ) {
    const lim = engine.device.limits;
    this.maxMessageBytes = opts.maxMessageBytes ?? Math.min(1024 * 1024 * 1024, lim.maxBufferSize);
    void engine.device.lost.then((info) => {
      this.lost = `${info.reason}: ${info.message}`;
    });
  }

  get residentBytes(): number {
    const r = this.resident;
    return r.dense + r.paired + r.packed + r.weights;
  }

  get handles(): number {
    return this.table.size;
  }

  private log(s: string): void {
    this.opts.log?.(s);
  }

  /** Answer one request. Never throws: every failure becomes an `error` reply. */
  async handle(msg: Message): Promise<Reply> {
    const h = msg.header;
    const id = isInt(h.id) ? h.id : null;
    try {
      if (!isInt(h.id)) {
        throw bad(
          `member "id" must be an integer chosen by the bridge, got ${JSON.stringify(h.id ?? null)}`,
        );
      }
      if (this.lost && h.type !== "bye" && h.type !== "ping") {
        throw new ProtocolError(
          "device",
          `the GPU device was lost (${this.lost}); restart the worker`,
        );
      }
      switch (h.type) {
        case "hello":
          return this.hello(h);
        case "put":
          return this.reply(await this.put(h, msg.buffers));
        case "put_weights":
          return this.reply(await this.putWeights(h, msg.buffers));
        case "run":
          return this.reply(await this.run(h, msg.buffers));
        case "release":
          return this.reply(this.release(h));
        case "stats":
          return this.reply({
            header: {
              type: "stats",
              id: h.id,
              handles: this.table.size,
              resident_bytes: { ...this.resident },
              memory_budget_bytes: this.opts.budgetBytes,
            },
            buffers: [],
          });
        case "ping":
          return this.reply({ header: { type: "ping", id: h.id }, buffers: [] });
        case "bye":
          this.freeAll();
          return { message: { header: { type: "bye", id: h.id }, buffers: [] }, close: true };
        default:
          throw new ProtocolError(
            "unsupported",
            `message type ${JSON.stringify(h.type)} is not offered; qf-worker/1 requests are hello, put, ` +
              "put_weights, run, release, stats, ping, bye",
          );
      }
    } catch (e) {
      return { message: errorMessage(e, id, h), close: false };
    }
  }

  private reply(message: Message): Reply {
    return { message, close: false };
  }

  private hello(h: Header): Reply {
    if (h.protocol !== PROTOCOL) {
      const err = new ProtocolError(
        "version",
        `protocol ${JSON.stringify(h.protocol ?? null)} is not spoken; this worker speaks ["${PROTOCOL}"]`,
      );
      return { message: errorMessage(err, h.id as number, h), close: true };
    }
    const lim = this.engine.device.limits;
    return this.reply({
      header: {
        type: "hello",
        id: h.id as number,
        protocol: PROTOCOL,
        runtime: "webgpu",
        implementation: this.opts.implementation,
        device: this.opts.device,
        limits: {
          max_message_bytes: this.maxMessageBytes,
          max_buffer_bytes: Math.min(this.maxMessageBytes, lim.maxBufferSize),
          max_weights: MAX_WEIGHT_ROWS,
          max_frame_pixels: this.engine.maxFramePixels,
          max_storage_buffer_binding_size: lim.maxStorageBufferBindingSize,
          max_compute_invocations_per_workgroup: lim.maxComputeInvocationsPerWorkgroup,
        },
        memory_budget_bytes: this.opts.budgetBytes,
        kernels: kernelTriples(),
        storage_schemas: Object.keys(SCHEMAS),
        accumulation: { integer: "u32x2", real: "float32" },
      },
      buffers: [],
    });
  }

  private newHandle(h: Header): number {
    if (!isInt(h.handle) || h.handle < 0) {
      throw bad(
        `member "handle" must be a non-negative integer, got ${JSON.stringify(h.handle ?? null)}`,
      );
    }
    if (this.table.has(h.handle)) {
      throw bad(
        `handle ${h.handle} is already in use; choose a new handle or release ${h.handle} first`,
        h.handle,
      );
    }
    return h.handle;
  }

  private checkBudget(bytes: number, handle: number): void {
    const left = this.opts.budgetBytes - this.residentBytes;
    if (bytes > left) {
      throw new ProtocolError(
        "budget",
        `handle ${handle} needs ${bytes} bytes on the device but only ${left} of the ` +
          `${this.opts.budgetBytes}-byte budget remain; release handles or place the chunk elsewhere ` +
          "(nothing was allocated)",
        handle,
      );
    }
  }

  private async guarded<T>(
    what: string,
    fn: () => T | Promise<T>,
    handle: number | null,
  ): Promise<T> {
    const dev = this.engine.device;
    dev.pushErrorScope("out-of-memory");
    dev.pushErrorScope("validation");
    let value: T;
    try {
      value = await fn();
    } finally {
      const v = await dev.popErrorScope();
      const o = await dev.popErrorScope();
      if (v || o) {
        // eslint-disable-next-line no-unsafe-finally
        throw new ProtocolError(
          "device",
          `the device refused ${what}: ${(o ?? v)?.message ?? "unknown"}; ` +
            (o ? "lower the memory budget" : "report this as a worker bug"),
          handle,
        );
      }
    }
    return value;
  }

  // ------------------------------------------------------------------------ put

  private async put(h: Header, bufs: Uint8Array[]): Promise<Message> {
    const handle = this.newHandle(h);
    const schema = h.storage_schema;
    if (typeof schema !== "string" || !(schema in SCHEMAS)) {
      throw new ProtocolError(
        "unsupported",
        `storage_schema ${JSON.stringify(schema ?? null)} is not offered; offered: ${Object.keys(SCHEMAS).join(", ")}`,
        handle,
      );
    }
    const rep = SCHEMAS[schema];
    if (h.representation !== undefined && h.representation !== rep) {
      throw bad(
        `representation ${JSON.stringify(h.representation)} does not match storage_schema ${schema} (expected "${rep}")`,
        handle,
      );
    }
    const dtype = h.dtype;
    const offered = rep === "dense" ? DENSE_DTYPES : INT_DTYPES;
    if (typeof dtype !== "string" || !(dtype in ITEMSIZE)) {
      throw bad(`dtype must be a NumPy dtype name, got ${JSON.stringify(dtype ?? null)}`, handle);
    }
    if (!offered.includes(dtype)) {
      throw new ProtocolError(
        "unsupported",
        `dtype ${dtype} is not offered for ${rep}; offered: ${offered.join(", ")}`,
        handle,
      );
    }
    const shape = intList(h.shape, "shape", 4);
    const [rows, cols, kr, kc] = shape;
    const n = rows * cols;
    const K = kr * kc;
    if (h.scan_slice !== undefined) {
      const s = h.scan_slice;
      const ok =
        Array.isArray(s) &&
        s.length === 2 &&
        s.every((p) => Array.isArray(p) && p.length === 2 && p.every((x) => isInt(x) && x >= 0));
      if (!ok)
        throw bad(`scan_slice must be [[r0, r1], [c0, c1]], got ${JSON.stringify(s)}`, handle);
      const ss = s as number[][];
      if (ss[0][1] - ss[0][0] !== rows || ss[1][1] - ss[1][0] !== cols) {
        throw bad(
          `scan_slice ${JSON.stringify(s)} spans ${ss[0][1] - ss[0][0]} x ${ss[1][1] - ss[1][0]} positions but shape holds ${rows} x ${cols}`,
          handle,
        );
      }
    }
    if (K < 1)
      throw bad(`frames must hold at least one pixel, got shape ${JSON.stringify(shape)}`, handle);
    if (K > this.engine.maxFramePixels) {
      throw new ProtocolError(
        "unsupported",
        `frames of ${K} pixels exceed this device's max_frame_pixels ${this.engine.maxFramePixels}; bin the detector`,
        handle,
      );
    }
    if (n > 2 ** 31) throw bad(`at most 2**31 frames per chunk, got ${n}`, handle);
    const limit = this.engine.bindingLimit;
    const base = {
      representation: rep as ChunkGpu["representation"],
      dtype,
      nFrames: n,
      K,
      layout: null as ChunkGpu["layout"],
      idxBytes: 4 as 2 | 4,
      cntBytes: 4 as 1 | 2 | 4,
      bv: 0,
      nb: 0,
      float: dtype === "float32",
    };
    // Plan segments (host slices) first, check the budget, then allocate.
    let plans: { f0: number; n: number; parts: Uint8Array[] }[] = [];
    if (rep === "dense") {
      const isz = ITEMSIZE[dtype];
      if (bufs.length !== 1 || bufs[0].byteLength !== n * K * isz) {
        throw bad(
          `dense-v1 takes one buffer of rows*cols*k_r*k_c*itemsize = ${n * K * isz} bytes, got ` +
            `${bufs.length} buffer(s) of ${JSON.stringify(bufs.map((b) => b.byteLength))}`,
          handle,
        );
      }
      base.layout = isz === 1 ? "dense8" : isz === 2 ? "dense16" : "dense32";
      const per = Math.max(1, Math.floor(limit / (K * isz)));
      for (let f0 = 0; f0 < n; f0 += per) {
        const m = Math.min(per, n - f0);
        plans.push({ f0, n: m, parts: [bufs[0].subarray(f0 * K * isz, (f0 + m) * K * isz)] });
      }
    } else if (rep === "paired") {
      plans = this.planPaired(h, bufs, n, K, handle, base);
    } else {
      plans = this.planPacked(h, bufs, n, K, handle, base);
    }
    const bytes = plans.reduce(
      (a, p) => a + p.parts.reduce((s, b) => s + Math.max(4, pad4(b.byteLength)), 0),
      0,
    );
    this.checkBudget(bytes, handle);
    const segments: Segment[] = [];
    await this.guarded(
      `the ${bytes}-byte upload of handle ${handle}`,
      () => {
        for (const p of plans)
          segments.push({ f0: p.f0, n: p.n, buffers: p.parts.map((b) => this.engine.upload(b)) });
      },
      handle,
    ).catch((e) => {
      for (const s of segments) for (const b of s.buffers) b.destroy();
      throw e;
    });
    const gpu: ChunkGpu = { ...base, segments, bytes };
    this.table.set(handle, { kind: "chunk", gpu, shape });
    this.resident[gpu.representation] += bytes;
    return {
      header: { type: "result", id: h.id as number, handle, resident_bytes: bytes },
      buffers: [],
    };
  }

  private planPaired(
    h: Header,
    bufs: Uint8Array[],
    n: number,
    K: number,
    handle: number,
    base: { idxBytes: 2 | 4; cntBytes: 1 | 2 | 4 },
  ): { f0: number; n: number; parts: Uint8Array[] }[] {
    const idt = h.index_dtype;
    const cdt = h.count_dtype;
    if (idt !== "uint16" && idt !== "uint32") {
      throw bad(
        `paired-csr-v1 index_dtype must be "uint16" or "uint32", got ${JSON.stringify(idt ?? null)}`,
        handle,
      );
    }
    if (cdt !== "uint8" && cdt !== "uint16" && cdt !== "uint32") {
      throw new ProtocolError(
        cdt === "uint64" ? "unsupported" : "bad_request",
        `paired-csr-v1 count_dtype must be uint8, uint16 or uint32 here, got ${JSON.stringify(cdt ?? null)}`,
        handle,
      );
    }
    const ib = ITEMSIZE[idt] as 2 | 4;
    const cb = ITEMSIZE[cdt] as 1 | 2 | 4;
    base.idxBytes = ib;
    base.cntBytes = cb;
    if (bufs.length !== 3)
      throw bad(
        `paired-csr-v1 takes 3 buffers (indptr, indices, counts), got ${bufs.length}`,
        handle,
      );
    const [bp, bi, bc] = bufs;
    if (bp.byteLength !== 8 * (n + 1)) {
      throw bad(
        `indptr must be int64 (rows*cols + 1,) = ${8 * (n + 1)} bytes, got ${bp.byteLength}`,
        handle,
      );
    }
    if (bi.byteLength % ib !== 0)
      throw bad(`indices bytes ${bi.byteLength} are not a multiple of ${ib}`, handle);
    const E = bi.byteLength / ib;
    if (bc.byteLength !== E * cb) {
      throw bad(
        `counts must hold ${E} ${cdt} values (${E * cb} bytes), got ${bc.byteLength}`,
        handle,
      );
    }
    const indptr = view(BigInt64Array, bp, 8);
    const idx = ib === 2 ? view(Uint16Array, bi, 2) : view(Uint32Array, bi, 4);
    if (indptr[0] !== 0n || indptr[n] !== BigInt(E)) {
      throw bad(`indptr must run from 0 to ${E} events, got ${indptr[0]} .. ${indptr[n]}`, handle);
    }
    const ptr = new Array<number>(n + 1);
    for (let f = 0; f <= n; f++) ptr[f] = Number(indptr[f]);
    for (let f = 0; f < n; f++) {
      if (ptr[f + 1] < ptr[f]) throw bad(`indptr decreases at frame ${f}`, handle);
      let prev = -1;
      for (let e = ptr[f]; e < ptr[f + 1]; e++) {
        const p = idx[e];
        if (p <= prev || p >= K) {
          throw bad(
            `frame ${f}: indices must be sorted, unique and below ${K} pixels; event ${e} holds ${p} after ${prev}`,
            handle,
          );
        }
        prev = p;
      }
    }
    const limit = this.engine.bindingLimit;
    const maxEvents = Math.floor(limit / 4);
    const plans: { f0: number; n: number; parts: Uint8Array[] }[] = [];
    let f0 = 0;
    while (f0 < n) {
      let f1 = f0 + 1;
      while (f1 < n && ptr[f1 + 1] - ptr[f0] <= maxEvents && (f1 + 1 - f0 + 1) * 4 <= limit) f1++;
      const local = new Uint32Array(f1 - f0 + 1);
      for (let f = f0; f <= f1; f++) local[f - f0] = ptr[f] - ptr[f0];
      plans.push({
        f0,
        n: f1 - f0,
        parts: [
          new Uint8Array(local.buffer),
          bi.subarray(ptr[f0] * ib, ptr[f1] * ib),
          bc.subarray(ptr[f0] * cb, ptr[f1] * cb),
        ],
      });
      f0 = f1;
    }
    return plans;
  }

  private planPacked(
    h: Header,
    bufs: Uint8Array[],
    n: number,
    K: number,
    handle: number,
    base: { bv: number; nb: number; layout: ChunkGpu["layout"] },
  ): { f0: number; n: number; parts: Uint8Array[] }[] {
    const B = h.block_values;
    if (!isInt(B) || B <= 0 || B % 32 !== 0) {
      throw bad(
        `packed-blockwidth-v1 block_values must be a positive multiple of 32, got ${JSON.stringify(B ?? null)}`,
        handle,
      );
    }
    const nb = Math.ceil(K / B);
    base.bv = B;
    base.nb = nb;
    base.layout = "packed";
    const nblk = n * nb;
    if (bufs.length !== 3)
      throw bad(
        `packed-blockwidth-v1 takes 3 buffers (widths, offsets, data), got ${bufs.length}`,
        handle,
      );
    const [bw, bo, bd] = bufs;
    if (bw.byteLength !== nblk)
      throw bad(`widths must be uint8 (${nblk} blocks), got ${bw.byteLength} bytes`, handle);
    if (bo.byteLength !== 8 * nblk)
      throw bad(
        `offsets must be int64 (${nblk} blocks) = ${8 * nblk} bytes, got ${bo.byteLength}`,
        handle,
      );
    if (bd.byteLength % 4 !== 0)
      throw bad(`data must be uint32 words, got ${bd.byteLength} bytes`, handle);
    const offs = view(BigInt64Array, bo, 8);
    const last = K - (nb - 1) * B;
    const start = new Array<number>(nblk + 1);
    let o = 0;
    for (let i = 0; i < nblk; i++) {
      const w = bw[i];
      if (w > 16) throw bad(`block ${i} has width ${w}; widths are 0..16`, handle);
      if (offs[i] !== BigInt(o))
        throw bad(`offsets[${i}] must be ${o} for the widths given, got ${offs[i]}`, handle);
      start[i] = o;
      const cnt = i % nb === nb - 1 ? last : B;
      o += Math.ceil((cnt * w) / 32);
    }
    start[nblk] = o;
    if (bd.byteLength / 4 !== o + 1) {
      throw bad(
        `data must hold ${o} words plus the trailing zero word (${4 * (o + 1)} bytes), got ${bd.byteLength}`,
        handle,
      );
    }
    const limit = this.engine.bindingLimit;
    const plans: { f0: number; n: number; parts: Uint8Array[] }[] = [];
    let f0 = 0;
    while (f0 < n) {
      let f1 = f0 + 1;
      while (
        f1 < n &&
        (start[(f1 + 1) * nb] - start[f0 * nb] + 1) * 4 <= limit &&
        (f1 + 1 - f0) * nb * 4 <= limit
      )
        f1++;
      const a = f0 * nb;
      const b = f1 * nb;
      const local = new Uint32Array(b - a);
      for (let i = a; i < b; i++) local[i - a] = start[i] - start[a];
      plans.push({
        f0,
        n: f1 - f0,
        parts: [
          bw.subarray(a, b),
          new Uint8Array(local.buffer),
          bd.subarray(4 * start[a], 4 * (start[b] + 1)),
        ],
      });
      f0 = f1;
    }
    return plans;
  }

  // ------------------------------------------------------------------------ weights

  private async putWeights(h: Header, bufs: Uint8Array[]): Promise<Message> {
    const handle = this.newHandle(h);
    if (h.dtype !== "float64") {
      throw bad(
        `put_weights dtype must be "float64", got ${JSON.stringify(h.dtype ?? null)}`,
        handle,
      );
    }
    const [m, K] = intList(h.shape, "put_weights shape", 2);
    if (m > MAX_WEIGHT_ROWS)
      throw bad(`at most ${MAX_WEIGHT_ROWS} weight rows (max_weights), got ${m}`, handle);
    if (K > this.engine.maxFramePixels) {
      throw new ProtocolError(
        "unsupported",
        `weights of ${K} pixels exceed max_frame_pixels ${this.engine.maxFramePixels}`,
        handle,
      );
    }
    if (bufs.length !== 1 || bufs[0].byteLength !== 8 * m * K) {
      throw bad(
        `put_weights takes one float64 buffer of 8*m*K = ${8 * m * K} bytes, got ${JSON.stringify(bufs.map((b) => b.byteLength))}`,
        handle,
      );
    }
    const w = view(Float64Array, bufs[0], 8);
    let integerWeights = true;
    let fitsI32 = true;
    for (let k = 0; k < w.length; k++) {
      const v = w[k];
      if (!Number.isInteger(v)) {
        integerWeights = false;
        break;
      }
      if (v > 2147483647 || v < -2147483647) fitsI32 = false;
    }
    const integer = integerWeights && fitsI32;
    const bytes = 4 * m * K;
    this.checkBudget(bytes, handle);
    const groups: GPUBuffer[] = [];
    await this.guarded(
      `the weights of handle ${handle}`,
      () => {
        for (let r0 = 0; r0 < m; r0 += RMAX) {
          const rows = w.subarray(r0 * K, Math.min(m, r0 + RMAX) * K);
          const arr = integer ? Int32Array.from(rows) : Float32Array.from(rows);
          groups.push(this.engine.upload(new Uint8Array(arr.buffer)));
        }
      },
      handle,
    );
    const gpu: WeightsGpu = { m, K, integer, groups, bytes };
    this.table.set(handle, { kind: "weights", gpu, integerWeights });
    this.resident.weights += bytes;
    return {
      header: {
        type: "result",
        id: h.id as number,
        handle,
        resident_bytes: bytes,
        integer_weights: integerWeights,
      },
      buffers: [],
    };
  }

  // ------------------------------------------------------------------------ run

  private lookup(v: Json | undefined, what: string): Entry & { handle: number } {
    if (!isInt(v))
      throw bad(`member "${what}" must be an integer handle, got ${JSON.stringify(v ?? null)}`);
    const e = this.table.get(v);
    if (!e) {
      throw new ProtocolError(
        "unknown_handle",
        `no payload or weights under handle ${v} (member "${what}"); put it first (released handles are gone)`,
        v,
      );
    }
    return { ...e, handle: v };
  }

  private async run(h: Header, bufs: Uint8Array[]): Promise<Message> {
    const op = h.operation;
    if (op !== "frame_pass" && op !== "gather") {
      throw new ProtocolError(
        "unsupported",
        `operation ${JSON.stringify(op ?? null)} is not offered; offered: frame_pass, gather`,
        isInt(h.chunk) ? h.chunk : null,
      );
    }
    const ce = this.lookup(h.chunk, "chunk");
    if (ce.kind !== "chunk") throw bad(`handle ${ce.handle} holds weights, not a chunk`, ce.handle);
    const c = ce.gpu;
    const triple = kernelTriples().some(
      ([o, r, d]) => o === op && r === c.representation && d === c.dtype,
    );
    if (!triple) {
      throw new ProtocolError(
        "unsupported",
        `no ${op} kernel for ${c.representation} ${c.dtype}`,
        ce.handle,
      );
    }
    const id = h.id as number;
    if (op === "gather") {
      if (bufs.length !== 1 || bufs[0].byteLength % 8 !== 0) {
        throw bad(
          `gather takes one int64 buffer of flat pixel indices, got ${JSON.stringify(bufs.map((b) => b.byteLength))}`,
          ce.handle,
        );
      }
      const idx64 = view(BigInt64Array, bufs[0], 8);
      const idx = new Uint32Array(idx64.length);
      for (let k = 0; k < idx64.length; k++) {
        const v = idx64[k];
        if (v < 0n || v >= BigInt(c.K)) {
          throw bad(`gather index ${v} at position ${k} is outside [0, ${c.K}) pixels`, ce.handle);
        }
        idx[k] = Number(v);
      }
      const words = await this.guarded("gather", () => this.engine.gather(c, idx), ce.handle);
      const values = fromWords(words, c.dtype);
      return {
        header: {
          type: "result",
          id,
          outputs: [{ name: "values", dtype: c.dtype, shape: [c.nFrames, idx.length] }],
        },
        buffers: [values],
      };
    }
    const opts = h.options ?? {};
    if (typeof opts !== "object" || opts === null || Array.isArray(opts)) {
      throw bad(`options must be an object, got ${JSON.stringify(opts)}`, ce.handle);
    }
    const wantSum = opts.want_sum ?? false;
    const wantMax = opts.want_max ?? false;
    if (typeof wantSum !== "boolean" || typeof wantMax !== "boolean") {
      throw bad(`options.want_sum and options.want_max must be booleans`, ce.handle);
    }
    let w: WeightsGpu | null = null;
    if (h.weights !== undefined && h.weights !== null) {
      const we = this.lookup(h.weights, "weights");
      if (we.kind !== "weights")
        throw bad(`handle ${we.handle} holds a chunk, not weights`, we.handle);
      if (we.gpu.K !== c.K) {
        throw bad(
          `weights ${we.handle} have ${we.gpu.K} pixels a row but chunk ${ce.handle} frames have ${c.K}`,
          we.handle,
        );
      }
      w = we.gpu;
    }
    const m = w ? w.m : 0;
    const raw = await this.guarded(
      "frame_pass",
      () => this.engine.framePass(c, w, wantSum, wantMax),
      ce.handle,
    );
    const outputs: Json[] = [{ name: "per_frame", dtype: "float64", shape: [c.nFrames, m] }];
    const buffers: Uint8Array[] = [new Uint8Array(raw.perFrame.buffer)];
    if (wantSum) {
      const s = raw.sumWords as Uint32Array;
      if (c.float) {
        const out = new Float64Array(c.K);
        const f = new Float32Array(s.buffer, s.byteOffset, 2 * c.K);
        for (let p = 0; p < c.K; p++) out[p] = f[2 * p] + f[2 * p + 1];
        outputs.push({ name: "pattern_sum", dtype: "float64", shape: [c.K] });
        buffers.push(new Uint8Array(out.buffer));
      } else {
        const out = new BigInt64Array(c.K);
        for (let p = 0; p < c.K; p++) out[p] = BigInt(s[2 * p]) + (BigInt(s[2 * p + 1]) << 32n);
        outputs.push({ name: "pattern_sum", dtype: "int64", shape: [c.K] });
        buffers.push(new Uint8Array(out.buffer));
      }
    }
    if (wantMax) {
      const words = raw.maxWords as Uint32Array;
      const out = fromWords(words.subarray(0, c.K), c.dtype);
      if (c.nFrames === 0) fillMin(out, c.dtype);
      outputs.push({ name: "pattern_max", dtype: c.dtype, shape: [c.K] });
      buffers.push(out);
    }
    return {
      header: { type: "result", id, outputs, accumulation: raw.exact ? "u32x2" : "float32" },
      buffers,
    };
  }

  // ------------------------------------------------------------------------ release

  private release(h: Header): Message {
    const hs = h.handles;
    if (!Array.isArray(hs) || !hs.every((x) => isInt(x))) {
      throw bad(`release takes "handles": a list of integers, got ${JSON.stringify(hs ?? null)}`);
    }
    const released: number[] = [];
    for (const x of hs as number[]) if (this.free(x)) released.push(x);
    return {
      header: { type: "result", id: h.id as number, released, resident_bytes: this.residentBytes },
      buffers: [],
    };
  }

  private free(handle: number): boolean {
    const e = this.table.get(handle);
    if (!e) return false;
    this.table.delete(handle);
    if (e.kind === "chunk") {
      for (const s of e.gpu.segments) for (const b of s.buffers) b.destroy();
      this.resident[e.gpu.representation] -= e.gpu.bytes;
    } else {
      for (const b of e.gpu.groups) b.destroy();
      this.resident.weights -= e.gpu.bytes;
    }
    return true;
  }

  freeAll(): void {
    for (const k of [...this.table.keys()]) this.free(k);
  }

  /** A one-line status for the page host. */
  status(): string {
    return `handles ${this.table.size}, resident ${this.residentBytes} of ${this.opts.budgetBytes} bytes`;
  }

  static repSchema(rep: string): string {
    return REP_SCHEMA[rep];
  }
}

function fromWords(words: Uint32Array, dtype: string): Uint8Array {
  let arr: ArrayBufferView;
  switch (dtype) {
    case "uint8":
      arr = Uint8Array.from(words);
      break;
    case "int8":
      arr = Int8Array.from(words);
      break;
    case "uint16":
      arr = Uint16Array.from(words);
      break;
    case "int16":
      arr = Int16Array.from(words);
      break;
    case "int32":
      arr = Int32Array.from(words, (x) => x | 0);
      break;
    default: // uint32, float32: the bits as they are
      arr = Uint32Array.from(words);
  }
  return new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength);
}

function fillMin(out: Uint8Array, dtype: string): void {
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const isz = ITEMSIZE[dtype];
  for (let k = 0; k < out.byteLength / isz; k++) {
    if (dtype === "int8") dv.setInt8(k, -128);
    else if (dtype === "int16") dv.setInt16(2 * k, -32768, true);
    else if (dtype === "int32") dv.setInt32(4 * k, -2147483648, true);
    else if (dtype === "float32") dv.setUint32(4 * k, 0xff800000, true);
    else dv.setUint8(k * isz, 0); // unsigned: 0 already
  }
}

export function errorMessage(e: unknown, id: number | null, h?: Header): Message {
  let err: ProtocolError;
  if (e instanceof ProtocolError) err = e;
  else {
    const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    err = new ProtocolError(
      "internal",
      `unexpected failure handling ${JSON.stringify(h?.type ?? null)}: ${what}; the worker is still running`,
    );
  }
  const header: Header = {
    type: "error",
    id,
    code: err.code,
    message: err.message,
    handle: err.handle,
  };
  return { header, buffers: [] };
}
