// Kernel correctness through the Node host over real pipes, against a plain CPU reference.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { PipeWorker, bytesOf } from "./helpers.js";
import type { Message } from "../src/protocol.js";

let seed = 12345;
const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;

const w = new PipeWorker(["--budget-bytes", String(64 * 1024 * 1024)]);
after(async () => {
  await w.request({ type: "bye" });
  assert.equal(await w.exit, 0);
});

const CTOR: Record<
  string,
  { new (n: number): ArrayLike<number> & ArrayBufferView & { [k: number]: number } }
> = {
  uint8: Uint8Array,
  uint16: Uint16Array,
  uint32: Uint32Array,
  int8: Int8Array,
  int16: Int16Array,
  int32: Int32Array,
  float32: Float32Array,
};

function ok(m: Message): Message {
  assert.notEqual(m.header.type, "error", JSON.stringify(m.header));
  return m;
}

let nextHandle = 100;

interface Case {
  rep: "dense" | "paired" | "packed";
  dtype: string;
  rows: number;
  cols: number;
  kr: number;
  kc: number;
  maxv: number;
  density: number;
}

function makeFrames(c: Case): number[][] {
  const n = c.rows * c.cols;
  const K = c.kr * c.kc;
  const out: number[][] = [];
  for (let f = 0; f < n; f++) {
    const row: number[] = [];
    for (let p = 0; p < K; p++) {
      if (rnd() > c.density) row.push(0);
      else if (c.dtype === "float32") row.push(Math.fround((rnd() - 0.3) * c.maxv));
      else row.push(Math.floor(rnd() * (c.maxv + 1)));
    }
    out.push(row);
  }
  return out;
}

function putPayload(c: Case, frames: number[][], handle: number, blockValues = 64) {
  const K = c.kr * c.kc;
  const base = {
    type: "put",
    handle,
    representation: c.rep,
    dtype: c.dtype,
    shape: [c.rows, c.cols, c.kr, c.kc],
    scan_slice: [
      [0, c.rows],
      [2, 2 + c.cols],
    ],
  };
  if (c.rep === "dense") {
    const a = new CTOR[c.dtype](frames.length * K);
    frames.forEach((r, f) => r.forEach((v, p) => (a[f * K + p] = v)));
    return w.request({ ...base, storage_schema: "dense-v1" }, [bytesOf(a)]);
  }
  if (c.rep === "paired") {
    const idx: number[] = [];
    const cnt: number[] = [];
    const indptr = new BigInt64Array(frames.length + 1);
    frames.forEach((r, f) => {
      r.forEach((v, p) => {
        if (v > 0) {
          idx.push(p);
          cnt.push(v);
        }
      });
      indptr[f + 1] = BigInt(idx.length);
    });
    const idt = K <= 65536 ? "uint16" : "uint32";
    const mx = Math.max(0, ...cnt);
    const cdt = mx < 256 ? "uint8" : mx < 65536 ? "uint16" : "uint32";
    return w.request(
      { ...base, storage_schema: "paired-csr-v1", index_dtype: idt, count_dtype: cdt },
      [
        bytesOf(indptr),
        bytesOf(idt === "uint16" ? Uint16Array.from(idx) : Uint32Array.from(idx)),
        bytesOf(
          new CTOR[cdt](cnt.length).constructor === Uint8Array
            ? Uint8Array.from(cnt)
            : cdt === "uint16"
              ? Uint16Array.from(cnt)
              : Uint32Array.from(cnt),
        ),
      ],
    );
  }
  // packed-blockwidth-v1, as quantem_flow/representations/packed.py lays it out
  const B = blockValues;
  const nb = Math.ceil(K / B);
  const widths: number[] = [];
  const offsets: bigint[] = [];
  const words: number[] = [];
  for (const r of frames) {
    for (let j = 0; j < nb; j++) {
      const blk = r.slice(j * B, Math.min(K, (j + 1) * B));
      const mx = Math.max(...blk);
      const wd = mx === 0 ? 0 : Math.floor(Math.log2(mx)) + 1;
      widths.push(wd);
      offsets.push(BigInt(words.length));
      let acc = 0n;
      let nbits = 0;
      for (const v of blk) {
        acc |= BigInt(v) << BigInt(nbits);
        nbits += wd;
        while (nbits >= 32) {
          words.push(Number(acc & 0xffffffffn));
          acc >>= 32n;
          nbits -= 32;
        }
      }
      if (nbits > 0) words.push(Number(acc & 0xffffffffn));
    }
  }
  words.push(0);
  return w.request({ ...base, storage_schema: "packed-blockwidth-v1", block_values: B }, [
    Uint8Array.from(widths),
    bytesOf(BigInt64Array.from(offsets)),
    bytesOf(Uint32Array.from(words)),
  ]);
}

function weightsFor(m: number, K: number, kind: "mask" | "int" | "real"): Float64Array {
  const a = new Float64Array(m * K);
  for (let k = 0; k < a.length; k++) {
    if (kind === "mask") a[k] = rnd() < 0.5 ? 1 : 0;
    else if (kind === "int") a[k] = Math.floor(rnd() * 2001) - 1000;
    else a[k] = (rnd() - 0.5) * 3.7;
  }
  return a;
}

async function check(c: Case, m: number, kind: "mask" | "int" | "real", blockValues = 64) {
  const frames = makeFrames(c);
  const K = c.kr * c.kc;
  const n = frames.length;
  const ch = nextHandle++;
  const put = ok(await putPayload(c, frames, ch, blockValues));
  assert.equal(put.header.handle, ch);
  const wh = nextHandle++;
  const wts = weightsFor(m, K, kind);
  const pw = ok(
    await w.request({ type: "put_weights", handle: wh, shape: [m, K], dtype: "float64" }, [
      bytesOf(wts),
    ]),
  );
  assert.equal(pw.header.integer_weights, kind !== "real" || m === 0);
  const r = ok(
    await w.request({
      type: "run",
      operation: "frame_pass",
      chunk: ch,
      weights: wh,
      options: { want_sum: true, want_max: true },
    }),
  );
  const exact = c.dtype !== "float32" && (kind !== "real" || m === 0);
  assert.equal(r.header.accumulation, exact ? "u32x2" : "float32");
  const per = new Float64Array(r.buffers[0].slice().buffer);
  assert.equal(per.length, n * m);
  const label = `${c.rep} ${c.dtype} ${c.rows}x${c.cols} frames ${c.kr}x${c.kc} m=${m} ${kind}`;
  for (let f = 0; f < n; f++) {
    for (let j = 0; j < m; j++) {
      let s = 0n;
      let sa = 0;
      let sf = 0;
      for (let p = 0; p < K; p++) {
        const x = frames[f][p];
        const wv = wts[j * K + p];
        if (exact) s += BigInt(x) * BigInt(wv);
        sf += x * wv;
        sa += Math.abs(x * wv);
      }
      if (exact) assert.equal(per[f * m + j], Number(s), `${label} frame ${f} row ${j}`);
      else {
        const tol = (K / 128 + 16) * 2 ** -24 * sa + 1e-30;
        assert.ok(
          Math.abs(per[f * m + j] - sf) <= tol,
          `${label}: |${per[f * m + j]} - ${sf}| > ${tol}`,
        );
      }
    }
  }
  // pattern sum
  const sumBuf = r.buffers[1].slice().buffer;
  if (c.dtype === "float32") {
    const ps = new Float64Array(sumBuf);
    for (let p = 0; p < K; p++) {
      let s = 0;
      let sa = 0;
      for (let f = 0; f < n; f++) {
        s += frames[f][p];
        sa += Math.abs(frames[f][p]);
      }
      assert.ok(Math.abs(ps[p] - s) <= (n + 2) * 2 ** -24 * sa, `${label} sum pixel ${p}`);
    }
  } else {
    const ps = new BigInt64Array(sumBuf);
    for (let p = 0; p < K; p++) {
      let s = 0n;
      for (let f = 0; f < n; f++) s += BigInt(frames[f][p]);
      assert.equal(ps[p], s, `${label} sum pixel ${p}`);
    }
  }
  const pm = new CTOR[c.dtype](K);
  bytesOf(pm).set(r.buffers[2]);
  for (let p = 0; p < K; p++) {
    let mx =
      n === 0
        ? c.dtype === "float32"
          ? -Infinity
          : c.dtype.startsWith("u")
            ? 0
            : -(2 ** ((8 * pm.byteLength) / K - 1))
        : -Infinity;
    for (let f = 0; f < n; f++) mx = Math.max(mx, frames[f][p]);
    assert.equal(pm[p], mx, `${label} max pixel ${p}`);
  }
  // gather, with a repeated index
  const gi = [0, K - 1, Math.floor(K / 2), 0];
  const g = ok(
    await w.request({ type: "run", operation: "gather", chunk: ch }, [
      bytesOf(BigInt64Array.from(gi.map(BigInt))),
    ]),
  );
  const gv = new CTOR[c.dtype](n * gi.length);
  bytesOf(gv).set(g.buffers[0]);
  for (let f = 0; f < n; f++)
    gi.forEach((p, k) => assert.equal(gv[f * gi.length + k], frames[f][p], `${label} gather`));
  const rel = ok(await w.request({ type: "release", handles: [ch, wh, 99999] }));
  assert.deepEqual(rel.header.released, [ch, wh]);
}

const shapes: [number, number, number, number][] = [
  [1, 3, 5, 7], // odd frames, rectangular 5x7
  [2, 1, 16, 33],
  [3, 3, 24, 40],
];
for (const rep of ["dense", "paired", "packed"] as const) {
  const dtypes =
    rep === "dense"
      ? ["uint8", "uint16", "uint32", "float32"]
      : ["uint8", "uint16", "uint32", "int16", "int32"];
  for (const dtype of dtypes) {
    test(`frame_pass + gather: ${rep} ${dtype}`, async () => {
      const maxv =
        rep === "packed"
          ? dtype === "uint8"
            ? 255
            : 65535
          : dtype === "uint8"
            ? 255
            : dtype === "uint16" || dtype === "int16"
              ? 65535
              : dtype === "float32"
                ? 100
                : 4e9;
      for (const [ri, [rows, cols, kr, kc]] of shapes.entries()) {
        const mv =
          dtype === "int16" ? 32767 : dtype === "int32" && rep !== "packed" ? 2 ** 31 - 1 : maxv;
        const c: Case = {
          rep,
          dtype,
          rows,
          cols,
          kr,
          kc,
          maxv: mv,
          density: rep === "dense" ? 0.9 : 0.3,
        };
        const m = [0, 1, 2, 5][ri + 1 - (ri === 2 ? 0 : 0)] ?? 5;
        for (const kind of ["mask", "int", "real"] as const)
          await check(c, ri === 0 ? [0, 1][seed & 1] : m, kind);
      }
      await check(
        { rep, dtype, rows: 1, cols: 2, kr: 4, kc: 8, maxv: 200, density: 0.5 },
        0,
        "mask",
      );
      await check(
        { rep, dtype, rows: 2, cols: 2, kr: 9, kc: 9, maxv: 200, density: 0.5 },
        18,
        "int",
      );
    });
  }
}

test("uint32 sums beyond 2**32 stay exact (per frame and pattern)", async () => {
  const K = 300;
  const frames = Array.from({ length: 5 }, () =>
    Array.from({ length: K }, () => 4294967295 - Math.floor(rnd() * 10)),
  );
  await check(
    {
      rep: "dense",
      dtype: "uint32",
      rows: 1,
      cols: 5,
      kr: 10,
      kc: 30,
      maxv: 4294967295,
      density: 1,
    },
    2,
    "int",
  );
  const ch = nextHandle++;
  ok(
    await putPayload(
      { rep: "dense", dtype: "uint32", rows: 5, cols: 1, kr: 10, kc: 30, maxv: 0, density: 1 },
      frames,
      ch,
    ),
  );
  const wh = nextHandle++;
  const wts = new Float64Array(2 * K);
  wts.fill(1, 0, K);
  wts.fill(-2147483647, K);
  ok(
    await w.request({ type: "put_weights", handle: wh, shape: [2, K], dtype: "float64" }, [
      bytesOf(wts),
    ]),
  );
  const r = ok(
    await w.request({
      type: "run",
      operation: "frame_pass",
      chunk: ch,
      weights: wh,
      options: { want_sum: true },
    }),
  );
  const per = new Float64Array(r.buffers[0].slice().buffer);
  const ps = new BigInt64Array(r.buffers[1].slice().buffer);
  for (let f = 0; f < 5; f++) {
    const s = frames[f].reduce((a, x) => a + BigInt(x), 0n);
    assert.equal(per[2 * f], Number(s));
    assert.equal(per[2 * f + 1], Number(s * -2147483647n));
  }
  for (let p = 0; p < K; p++)
    assert.equal(
      ps[p],
      frames.reduce((a, fr) => a + BigInt(fr[p]), 0n),
    );
  assert.ok(ps[0] > 2n ** 32n);
});

test("float32 max: NaN propagates, inf and -inf handled bitwise", async () => {
  const vals = [
    [1, NaN, -Infinity, 5, -0, 3],
    [2, 0, -Infinity, Infinity, 0, NaN],
    [0, 7, -Infinity, 1, -1, 4],
  ];
  const ch = nextHandle++;
  ok(
    await putPayload(
      { rep: "dense", dtype: "float32", rows: 3, cols: 1, kr: 2, kc: 3, maxv: 0, density: 1 },
      vals,
      ch,
    ),
  );
  const r = ok(
    await w.request({
      type: "run",
      operation: "frame_pass",
      chunk: ch,
      options: { want_max: true },
    }),
  );
  const mx = new Float32Array(r.buffers[1].slice().buffer);
  // -0 then 0: the first stays (strict >, like the CPU runtime's kernel)
  assert.deepEqual(Array.from(mx), [2, NaN, -Infinity, Infinity, -0, NaN]);
});

test("float32 per frame: a NaN or inf pixel outside a weight row's support leaves it finite", async () => {
  // pixel 1 NaN in frame 0, pixel 2 +inf in frame 1, pixel 2 -inf and pixel 3 +inf in frame 2
  const vals = [
    [1, NaN, 2, 3, 4, 5],
    [1, 2, Infinity, 3, 4, 5],
    [1, 2, -Infinity, Infinity, 4, 5],
  ];
  const K = 6;
  const ch = nextHandle++;
  ok(
    await putPayload(
      { rep: "dense", dtype: "float32", rows: 3, cols: 1, kr: 2, kc: 3, maxv: 0, density: 1 },
      vals,
      ch,
    ),
  );
  const rowsW = [
    [1, 0, 0, 0, 1, 1], // away from every bad pixel
    [0, 1, 0, 0, 0, 0], // the NaN pixel only
    [0, 0, -2, 0, 0, 0.5], // the infinities of pixel 2, negative weight
    [0, 0, 1, 1, 0, 0], // +inf and -inf together in frame 2
  ];
  const wts = new Float64Array(rowsW.flat());
  const wh = nextHandle++;
  ok(
    await w.request({ type: "put_weights", handle: wh, shape: [4, K], dtype: "float64" }, [
      bytesOf(wts),
    ]),
  );
  const r = ok(
    await w.request({ type: "run", operation: "frame_pass", chunk: ch, weights: wh, options: {} }),
  );
  const per = Array.from(new Float64Array(r.buffers[0].slice().buffer));
  assert.deepEqual(per, [10, NaN, -1.5, 5, 10, 2, -Infinity, Infinity, 10, 2, Infinity, NaN]);
});
