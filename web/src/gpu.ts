// The device side: resident chunks as GPU buffers (split into segments of whole frames
// that each fit one storage binding), weights, pipelines and dispatches, readback.

import {
  fusedSource,
  gatherSource,
  pairedGatherSource,
  pairedSource,
  partialWords,
  reduceSource,
  RMAX,
  WG,
  P,
  type Layout,
} from "./kernels.js";

/**
 * Frames one dense/packed dispatch may walk.  Mesa's gallivm (llvmpipe and lavapipe, which
 * run Dawn's OpenGL ES backend here) silently ends a shader after 65535 loop iterations
 * (LP_MAX_TGSI_LOOP_ITERATIONS), and it counts the iterations of nested loops together:
 * measured, the fused kernel with 2 weight rows stopped after 3121 frames (21 iterations a
 * frame).  So the frames of one dispatch are bounded by a conservative count of the loop
 * iterations one frame takes, and longer runs are split into dispatches that accumulate.
 */
export function loopFrames(rows: number): number {
  const perFrame = (P + 1) * (rows + 2) + 8 * (rows + 1) + 16; // incl. the 7-step reductions
  return Math.max(1, Math.floor(60000 / perFrame));
}

export type Representation = "dense" | "paired" | "packed";

/** One storage binding's worth of whole frames. */
export interface Segment {
  f0: number; // first frame of the chunk in this segment
  n: number; // frames
  buffers: GPUBuffer[]; // dense: [frames]; paired: [indptr, idx, cnt]; packed: [widths, offsets, words]
}

export interface ChunkGpu {
  representation: Representation;
  dtype: string;
  nFrames: number;
  K: number;
  layout: Layout | null; // dense/packed
  idxBytes: 2 | 4;
  cntBytes: 1 | 2 | 4;
  bv: number;
  nb: number;
  float: boolean;
  segments: Segment[];
  bytes: number;
}

export interface WeightsGpu {
  m: number;
  K: number;
  integer: boolean; // stored as i32 (exact path) rather than f32
  groups: GPUBuffer[]; // RMAX rows each (the last may hold fewer)
  bytes: number;
}

export interface FramePassRaw {
  exact: boolean;
  perFrame: Float64Array; // (n, m)
  sumWords: Uint32Array | null; // 2 words per pixel: int (lo, hi) or float (s, c) bits
  maxWords: Uint32Array | null; // 1 word per pixel
}

export function pad4(n: number): number {
  return Math.ceil(n / 4) * 4;
}

const TWO32 = 4294967296n;

export class Engine {
  private pipelines = new Map<string, GPUComputePipeline>();
  readonly bindingLimit: number;

  constructor(
    readonly device: GPUDevice,
    readonly info: { name: string; type: string; backend: string; vendor: string },
  ) {
    this.bindingLimit = Math.min(
      device.limits.maxStorageBufferBindingSize,
      device.limits.maxBufferSize,
    );
  }

  /** Largest frame (pixels) a weight group of RMAX rows can bind. */
  get maxFramePixels(): number {
    return Math.floor(this.bindingLimit / (4 * RMAX));
  }

  // ------------------------------------------------------------------------ buffers

  upload(bytes: Uint8Array, usage = GPUBufferUsage.STORAGE): GPUBuffer {
    const size = Math.max(4, pad4(bytes.byteLength));
    const buf = this.device.createBuffer({ size, usage, mappedAtCreation: true });
    new Uint8Array(buf.getMappedRange()).set(bytes);
    buf.unmap();
    return buf;
  }

  zeros(size: number, usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC): GPUBuffer {
    return this.device.createBuffer({ size: Math.max(4, pad4(size)), usage });
  }

  filled(words: number, value: number): GPUBuffer {
    const buf = this.device.createBuffer({
      size: Math.max(4, words * 4),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
      mappedAtCreation: true,
    });
    new Uint32Array(buf.getMappedRange()).fill(value >>> 0);
    buf.unmap();
    return buf;
  }

  private uniform(vals: number[]): GPUBuffer {
    const a = new Uint32Array(12);
    vals.forEach((v, k) => (a[k] = v >>> 0));
    return this.upload(new Uint8Array(a.buffer), GPUBufferUsage.UNIFORM);
  }

  private pipeline(key: string, code: string): GPUComputePipeline {
    let p = this.pipelines.get(key);
    if (!p) {
      const module = this.device.createShaderModule({ code });
      p = this.device.createComputePipeline({
        layout: "auto",
        compute: { module, entryPoint: "main" },
      });
      this.pipelines.set(key, p);
    }
    return p;
  }

  private bind(pipe: GPUComputePipeline, entries: [number, GPUBuffer][]): GPUBindGroup {
    return this.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: entries.map(([binding, buffer]) => ({ binding, resource: { buffer } })),
    });
  }

  private grid(groups: number): [number, number] {
    const max = this.device.limits.maxComputeWorkgroupsPerDimension;
    if (groups <= max) return [Math.max(1, groups), 1];
    return [max, Math.ceil(groups / max)];
  }

  async readback(
    buffers: { buf: GPUBuffer; size: number }[],
    enc: GPUCommandEncoder,
  ): Promise<Uint32Array[]> {
    const staging = buffers.map(({ buf, size }) => {
      const s = this.device.createBuffer({
        size: Math.max(4, pad4(size)),
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      });
      if (size > 0) enc.copyBufferToBuffer(buf, 0, s, 0, pad4(size));
      return s;
    });
    this.device.queue.submit([enc.finish()]);
    const out: Uint32Array[] = [];
    for (const s of staging) {
      await s.mapAsync(GPUMapMode.READ);
      out.push(new Uint32Array(s.getMappedRange().slice(0)));
      s.unmap();
      s.destroy();
    }
    return out;
  }

  // ------------------------------------------------------------------------ frame pass

  async framePass(
    c: ChunkGpu,
    w: WeightsGpu | null,
    wantSum: boolean,
    wantMax: boolean,
  ): Promise<FramePassRaw> {
    const m = w ? w.m : 0;
    const exact = !c.float && (w === null || w.integer);
    const W = partialWords(exact);
    const perFrame = new Float64Array(c.nFrames * m);
    const temps: GPUBuffer[] = [];
    const sumBuf = wantSum ? this.zeros(8 * c.K) : null;
    const maxInit = c.float ? 0xff800000 : 0;
    const maxBuf = wantMax ? this.filled(c.K, maxInit) : null;
    const dWts = this.zeros(4);
    const dSum = this.zeros(8);
    const dMax = this.zeros(4);
    temps.push(dWts, dSum, dMax);
    const groups = w ? w.groups : [];
    const passes: { buf: GPUBuffer | null; r0: number; R: number }[] = groups.map((buf, gi) => ({
      buf,
      r0: gi * RMAX,
      R: Math.min(RMAX, m - gi * RMAX),
    }));
    if (passes.length === 0 && (wantSum || wantMax)) passes.push({ buf: null, r0: 0, R: 0 });
    const G = Math.ceil(c.K / (WG * P));
    const intW = w ? w.integer : true;
    const reads: { buf: GPUBuffer; size: number; f0: number; n: number; r0: number; R: number }[] =
      [];
    const enc = this.device.createCommandEncoder();
    passes.forEach((pass, pi) => {
      const doSum = wantSum && pi === 0;
      const doMax = wantMax && pi === 0;
      const R = pass.R;
      let pipe: GPUComputePipeline;
      if (c.representation === "paired") {
        pipe = this.pipeline(
          `paired/${c.idxBytes}/${c.cntBytes}/${exact}/${intW}/${R}/${doSum}/${doMax}`,
          pairedSource(c.idxBytes, c.cntBytes, exact, intW, R, doSum, doMax),
        );
      } else {
        pipe = this.pipeline(
          `fused/${c.layout}/${c.float}/${exact}/${intW}/${R}/${doSum}/${doMax}`,
          fusedSource(c.layout as Layout, c.float ? "float" : "int", exact, intW, R, doSum, doMax),
        );
      }
      const red =
        R > 0 && c.representation !== "paired"
          ? this.pipeline(`reduce/${exact}`, reduceSource(exact))
          : null;
      for (const seg of c.segments) {
        // Frames per dispatch: keep the partial buffer within the binding limit (and 32 MiB).
        const perFrameBytes = c.representation === "paired" ? R * W * 4 : G * R * W * 4;
        const cap = Math.min(this.bindingLimit, 32 * 1024 * 1024);
        // ... and the frame loop of one dispatch below MAX_LOOP_FRAMES (see its note).
        const fit = perFrameBytes > 0 ? Math.max(1, Math.floor(cap / perFrameBytes)) : seg.n;
        const step = Math.max(1, Math.min(fit, loopFrames(R)));
        for (let a = 0; a < seg.n; a += step) {
          const n = Math.min(step, seg.n - a);
          const part = this.zeros(Math.max(4, n * perFrameBytes));
          temps.push(part);
          const [gx, gy] = c.representation === "paired" ? this.grid(n) : [G, 1];
          const uni = this.uniform([n, a, c.K, G, R, gx, c.bv, c.nb, 0]);
          temps.push(uni);
          const entries: [number, GPUBuffer][] = [
            [0, uni],
            [4, pass.buf ?? dWts],
            [5, part],
            [6, sumBuf ?? dSum],
            [7, maxBuf ?? dMax],
          ];
          seg.buffers.forEach((b, k) => entries.push([1 + k, b]));
          const cp = enc.beginComputePass();
          cp.setPipeline(pipe);
          cp.setBindGroup(0, this.bind(pipe, entries));
          cp.dispatchWorkgroups(gx, gy);
          cp.end();
          if (R === 0) continue;
          let res = part;
          if (red) {
            res = this.zeros(n * R * W * 4);
            temps.push(res);
            const [rx, ry] = this.grid(Math.ceil((n * R) / WG));
            const u2 = this.uniform([n, 0, c.K, G, R, rx, 0, 0, 0]);
            temps.push(u2);
            const cp2 = enc.beginComputePass();
            cp2.setPipeline(red);
            cp2.setBindGroup(
              0,
              this.bind(red, [
                [0, u2],
                [1, part],
                [2, res],
              ]),
            );
            cp2.dispatchWorkgroups(rx, ry);
            cp2.end();
          }
          reads.push({ buf: res, size: n * R * W * 4, f0: seg.f0 + a, n, r0: pass.r0, R });
        }
      }
    });
    const extra: { buf: GPUBuffer; size: number }[] = [];
    if (sumBuf) extra.push({ buf: sumBuf, size: 8 * c.K });
    if (maxBuf) extra.push({ buf: maxBuf, size: 4 * c.K });
    const data = await this.readback([...reads, ...extra], enc);
    reads.forEach((rd, k) => {
      const words = data[k];
      for (let f = 0; f < rd.n; f++) {
        for (let r = 0; r < rd.R; r++) {
          const o = (f * rd.R + r) * W;
          let v: number;
          if (exact) {
            const pos =
              BigInt(words[o]) + (BigInt(words[o + 1]) << 32n) + (BigInt(words[o + 2]) << 64n);
            const neg =
              BigInt(words[o + 3]) + (BigInt(words[o + 4]) << 32n) + (BigInt(words[o + 5]) << 64n);
            v = Number(pos - neg);
          } else {
            v = f32(words[o]) + f32(words[o + 1]);
          }
          perFrame[(rd.f0 + f) * m + rd.r0 + r] = v;
        }
      }
    });
    let k = reads.length;
    const sumWords = sumBuf ? data[k++] : null;
    const maxWords = maxBuf ? data[k++] : null;
    for (const t of temps) t.destroy();
    sumBuf?.destroy();
    maxBuf?.destroy();
    return { exact, perFrame, sumWords, maxWords };
  }

  // ------------------------------------------------------------------------ gather

  async gather(c: ChunkGpu, indices: Uint32Array): Promise<Uint32Array> {
    const L = indices.length;
    const out = new Uint32Array(c.nFrames * L);
    if (L === 0 || c.nFrames === 0) return out;
    const pipe =
      c.representation === "paired"
        ? this.pipeline(
            `pgather/${c.idxBytes}/${c.cntBytes}`,
            pairedGatherSource(c.idxBytes, c.cntBytes),
          )
        : this.pipeline(`gather/${c.layout}`, gatherSource(c.layout as Layout));
    const idxBuf = this.upload(
      new Uint8Array(indices.buffer, indices.byteOffset, indices.byteLength),
    );
    const temps: GPUBuffer[] = [idxBuf];
    const enc = this.device.createCommandEncoder();
    const reads: { buf: GPUBuffer; size: number; f0: number; n: number }[] = [];
    const cap = Math.min(this.bindingLimit, 32 * 1024 * 1024);
    const step = Math.max(1, Math.floor(cap / (4 * L)));
    for (const seg of c.segments) {
      for (let a = 0; a < seg.n; a += step) {
        const n = Math.min(step, seg.n - a);
        const res = this.zeros(n * L * 4);
        temps.push(res);
        const [gx, gy] = this.grid(Math.ceil((n * L) / WG));
        const uni = this.uniform([n, a, c.K, 0, 0, gx, c.bv, c.nb, L]);
        temps.push(uni);
        const entries: [number, GPUBuffer][] = [
          [0, uni],
          [4, idxBuf],
          [5, res],
        ];
        seg.buffers.forEach((b, k) => entries.push([1 + k, b]));
        const cp = enc.beginComputePass();
        cp.setPipeline(pipe);
        cp.setBindGroup(0, this.bind(pipe, entries));
        cp.dispatchWorkgroups(gx, gy);
        cp.end();
        reads.push({ buf: res, size: n * L * 4, f0: seg.f0 + a, n });
      }
    }
    const data = await this.readback(reads, enc);
    reads.forEach((rd, k) => out.set(data[k].subarray(0, rd.n * L), rd.f0 * L));
    for (const t of temps) t.destroy();
    return out;
  }
}

const f32buf = new Float32Array(1);
const u32view = new Uint32Array(f32buf.buffer);
export function f32(bits: number): number {
  u32view[0] = bits;
  return f32buf[0];
}

export function u64(lo: number, hi: number): bigint {
  return BigInt(lo >>> 0) + BigInt(hi >>> 0) * TWO32;
}
