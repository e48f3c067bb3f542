// WGSL sources. Every workgroup has 128 invocations (WebGPU compatibility mode's cap).
// WGSL has no f64 and no 64-bit integers: exact integer sums use u32 words with carry.

export const WG = 128;
/** Pixels per invocation in the fused dense/packed pass (a workgroup covers WG*P pixels). */
export const P = 4;
/** Weight rows per pipeline: rows are read in groups of RMAX with ONE read of each frame. */
export const RMAX = 16;

export type Layout = "dense8" | "dense16" | "dense32" | "packed";
export type Arith = "int" | "float"; // integer data (exact) or float32 data

/** Words per per-frame partial: int = positive and negative 96-bit sums; float = (s, c). */
export function partialWords(exact: boolean): number {
  return exact ? 6 : 2;
}

const COMMON = /* wgsl */ `
struct Params {
  n: u32,      // frames in this dispatch
  fbase: u32,  // first frame (segment-local) of this dispatch
  K: u32,      // pixels per frame
  G: u32,      // tiles (workgroups along x) of the fused pass
  rcount: u32, // weight rows in this group
  nwx: u32,    // workgroups along x (2-D grids)
  bv: u32,     // packed: values per block
  nb: u32,     // packed: blocks per frame
  L: u32,      // gather: number of indices
  pad0: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<uniform> prm: Params;

fn add96(a: vec3<u32>, b: vec3<u32>) -> vec3<u32> {
  let lo = a.x + b.x;
  let c0 = select(0u, 1u, lo < a.x);
  let m1 = a.y + b.y;
  let c1 = select(0u, 1u, m1 < a.y);
  let m2 = m1 + c0;
  let c2 = select(0u, 1u, m2 < m1);
  return vec3<u32>(lo, m2, a.z + b.z + c1 + c2);
}

// Exact 32 x 32 -> 64-bit product as (lo, hi).
fn mul64(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u;
  let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = p01 + p10;
  let midc = select(0u, 1u, mid < p01);
  let lo = p00 + (mid << 16u);
  let c = select(0u, 1u, lo < p00);
  return vec2<u32>(lo, p11 + (mid >> 16u) + (midc << 16u) + c);
}

// Error-free sum of two (s, c) pairs (TwoSum on the leading parts).
// A non-finite sum carries no error term: TwoSum's inf - inf would turn +-inf into NaN
// (SwiftShader computes it as written; Mesa's GLSL compiler happened to fold it away).
fn twosum(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
  let s = a.x + b.x;
  if ((bitcast<u32>(s) & 0x7f800000u) == 0x7f800000u) { return vec2<f32>(s, 0.0); }
  let bb = s - a.x;
  let err = (a.x - (s - bb)) + (b.x - bb);
  return vec2<f32>(s, a.y + b.y + err);
}

fn f32nan(b: u32) -> bool { return (b & 0x7fffffffu) > 0x7f800000u; }
`;

function loadFn(layout: Layout): { decl: string; fn: string } {
  if (layout === "packed") {
    return {
      decl: `
@group(0) @binding(1) var<storage, read> widths: array<u32>;
@group(0) @binding(2) var<storage, read> offsets: array<u32>;
@group(0) @binding(3) var<storage, read> words: array<u32>;`,
      fn: `
fn load(f: u32, p: u32) -> u32 {
  let j = p / prm.bv;
  let t = p - j * prm.bv;
  let i = f * prm.nb + j;
  let w = (widths[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
  if (w == 0u) { return 0u; }
  let q = t * w;
  let o = offsets[i] + (q >> 5u);
  let s = q & 31u;
  var v = words[o] >> s;
  if (s > 0u) { v = v | (words[o + 1u] << (32u - s)); }
  return v & ((1u << w) - 1u);
}`,
    };
  }
  const decl = `@group(0) @binding(1) var<storage, read> frames: array<u32>;`;
  if (layout === "dense8") {
    return {
      decl,
      fn: `fn load(f: u32, p: u32) -> u32 { let e = f * prm.K + p; return (frames[e >> 2u] >> ((e & 3u) * 8u)) & 0xffu; }`,
    };
  }
  if (layout === "dense16") {
    return {
      decl,
      fn: `fn load(f: u32, p: u32) -> u32 { let e = f * prm.K + p; return (frames[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu; }`,
    };
  }
  return { decl, fn: `fn load(f: u32, p: u32) -> u32 { return frames[f * prm.K + p]; }` };
}

/**
 * The fused frame pass over dense or packed frames. Workgroup g owns pixels
 * [g*WG*P, (g+1)*WG*P) of every frame; it walks the dispatch's frames, reads each of
 * its pixels ONCE per frame and uses the value for every weight row of the group
 * (dot products), the sum pattern and the max pattern. Per frame and row it writes a
 * per-tile partial; `reduceSource` adds the tiles.
 *
 * exact: integer data and integer (i32) weights: |x*w| as 64-bit products summed in
 * 96-bit positive and negative accumulators (never overflows for K < 2**32).
 * Otherwise float32 products summed with (s, c) compensated pairs. On float data a
 * zero weight skips its pixel (select, no branch): a NaN or infinite pixel outside a
 * row's support leaves the row finite (no 0 * NaN); inside, the row is NaN or +-inf
 * as IEEE says. The sum and max patterns are per pixel (NaN wins the max, like numpy).
 */
export function fusedSource(
  layout: Layout,
  arith: Arith,
  exact: boolean,
  intWeights: boolean,
  R: number,
  wantSum: boolean,
  wantMax: boolean,
): string {
  const { decl, fn } = loadFn(layout);
  const W = partialWords(exact);
  const rows = R > 0;
  // Reset explicitly each frame: SwiftShader (Chromium) was measured to keep a loop-body
  // var's value across iterations instead of zero-initialising it.
  const acc = exact
    ? `var apos: array<vec3<u32>, ${R}>; var aneg: array<vec3<u32>, ${R}>;
    for (var r = 0u; r < ${R}u; r = r + 1u) { apos[r] = vec3<u32>(0u); aneg[r] = vec3<u32>(0u); }`
    : `var af: array<vec2<f32>, ${R}>;
    for (var r = 0u; r < ${R}u; r = r + 1u) { af[r] = vec2<f32>(0.0); }`;
  const xf = arith === "float" ? "bitcast<f32>(xb)" : "f32(xb)";
  const wf = intWeights ? "f32(bitcast<i32>(wb))" : "bitcast<f32>(wb)";
  const accumulate = exact
    ? `let wi = bitcast<i32>(wb);
          let mag = mul64(xb, u32(abs(wi)));
          if (wi >= 0) { apos[r] = add96(apos[r], vec3<u32>(mag, 0u)); }
          else { aneg[r] = add96(aneg[r], vec3<u32>(mag, 0u)); }`
    : arith === "float"
      ? `let wv = ${wf};
          let prod = select(0.0, xv * wv, wv != 0.0);
          af[r] = twosum(af[r], vec2<f32>(prod, 0.0));`
      : `let prod = xv * ${wf};
          af[r] = twosum(af[r], vec2<f32>(prod, 0.0));`;
  const reduce = exact
    ? `redp[t] = apos[r]; redn[t] = aneg[r];
      workgroupBarrier();
      for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
        if (t < s) { redp[t] = add96(redp[t], redp[t + s]); redn[t] = add96(redn[t], redn[t + s]); }
        workgroupBarrier();
      }
      if (t == 0u) {
        let o = ((f * prm.G + g) * prm.rcount + r) * ${W}u;
        part[o] = redp[0].x; part[o + 1u] = redp[0].y; part[o + 2u] = redp[0].z;
        part[o + 3u] = redn[0].x; part[o + 4u] = redn[0].y; part[o + 5u] = redn[0].z;
      }
      workgroupBarrier();`
    : `redf[t] = af[r];
      workgroupBarrier();
      for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
        if (t < s) { redf[t] = twosum(redf[t], redf[t + s]); }
        workgroupBarrier();
      }
      if (t == 0u) {
        let o = ((f * prm.G + g) * prm.rcount + r) * ${W}u;
        part[o] = bitcast<u32>(redf[0].x); part[o + 1u] = bitcast<u32>(redf[0].y);
      }
      workgroupBarrier();`;
  const sumInit =
    arith === "float"
      ? `var ss: array<vec2<f32>, ${P}>;`
      : `var sl: array<u32, ${P}>; var sh: array<u32, ${P}>;`;
  const sumLoad =
    arith === "float"
      ? `ss[j] = vec2<f32>(bitcast<f32>(psum[2u * p]), bitcast<f32>(psum[2u * p + 1u]));`
      : `sl[j] = psum[2u * p]; sh[j] = psum[2u * p + 1u];`;
  const sumAdd =
    arith === "float"
      ? `ss[j] = twosum(ss[j], vec2<f32>(bitcast<f32>(xb), 0.0));`
      : `let nl = sl[j] + xb; sh[j] = sh[j] + select(0u, 1u, nl < xb); sl[j] = nl;`;
  const sumStore =
    arith === "float"
      ? `psum[2u * p] = bitcast<u32>(ss[j].x); psum[2u * p + 1u] = bitcast<u32>(ss[j].y);`
      : `psum[2u * p] = sl[j]; psum[2u * p + 1u] = sh[j];`;
  const maxUpd =
    arith === "float"
      ? `if (!f32nan(mx[j])) { if (f32nan(xb) || bitcast<f32>(xb) > bitcast<f32>(mx[j])) { mx[j] = xb; } }`
      : `mx[j] = max(mx[j], xb);`;
  return `${COMMON}
${decl}
@group(0) @binding(4) var<storage, read> wts: array<u32>;
@group(0) @binding(5) var<storage, read_write> part: array<u32>;
@group(0) @binding(6) var<storage, read_write> psum: array<u32>;
@group(0) @binding(7) var<storage, read_write> pmax: array<u32>;
${exact ? `var<workgroup> redp: array<vec3<u32>, ${WG}>; var<workgroup> redn: array<vec3<u32>, ${WG}>;` : `var<workgroup> redf: array<vec2<f32>, ${WG}>;`}
${fn}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = lid.x;
  let g = wid.x;
  if (prm.pad0 == 0xffffffffu) { part[0] = wts[0] + psum[0] + pmax[0]; } // keep every binding in the layout
  let base = g * ${WG * P}u + t;
  ${sumInit}
  var mx: array<u32, ${P}>;
  for (var j = 0u; j < ${P}u; j = j + 1u) {
    let p = base + j * ${WG}u;
    if (p < prm.K) {
      ${wantSum ? sumLoad : ""}
      ${wantMax ? "mx[j] = pmax[p];" : ""}
    }
  }
  for (var f = 0u; f < prm.n; f = f + 1u) {
    let fl = prm.fbase + f;
    ${rows ? acc : ""}
    for (var j = 0u; j < ${P}u; j = j + 1u) {
      let p = base + j * ${WG}u;
      if (p < prm.K) {
        let xb = load(fl, p);
        ${wantSum ? sumAdd : ""}
        ${wantMax ? maxUpd : ""}
        ${rows ? `let xv = ${xf};` : ""}
        ${
          rows
            ? `for (var r = 0u; r < ${R}u; r = r + 1u) {
          let wb = wts[r * prm.K + p];
          ${accumulate}
        }`
            : ""
        }
      }
    }
    ${rows ? `for (var r = 0u; r < ${R}u; r = r + 1u) { ${reduce} }` : ""}
  }
  for (var j = 0u; j < ${P}u; j = j + 1u) {
    let p = base + j * ${WG}u;
    if (p < prm.K) {
      ${wantSum ? sumStore : ""}
      ${wantMax ? "pmax[p] = mx[j];" : ""}
    }
  }
}
`;
}

/** Adds the G tile partials of each (frame, row): one invocation per (frame, row). */
export function reduceSource(exact: boolean): string {
  const W = partialWords(exact);
  const body = exact
    ? `var pp = vec3<u32>(0u); var nn = vec3<u32>(0u);
    for (var g = 0u; g < prm.G; g = g + 1u) {
      let o = ((f * prm.G + g) * prm.rcount + r) * ${W}u;
      pp = add96(pp, vec3<u32>(part[o], part[o + 1u], part[o + 2u]));
      nn = add96(nn, vec3<u32>(part[o + 3u], part[o + 4u], part[o + 5u]));
    }
    let q = (f * prm.rcount + r) * ${W}u;
    res[q] = pp.x; res[q + 1u] = pp.y; res[q + 2u] = pp.z;
    res[q + 3u] = nn.x; res[q + 4u] = nn.y; res[q + 5u] = nn.z;`
    : `var a = vec2<f32>(0.0);
    for (var g = 0u; g < prm.G; g = g + 1u) {
      let o = ((f * prm.G + g) * prm.rcount + r) * ${W}u;
      a = twosum(a, vec2<f32>(bitcast<f32>(part[o]), 0.0));
      a = twosum(a, vec2<f32>(bitcast<f32>(part[o + 1u]), 0.0));
    }
    let q = (f * prm.rcount + r) * ${W}u;
    res[q] = bitcast<u32>(a.x); res[q + 1u] = bitcast<u32>(a.y);`;
  return `${COMMON}
@group(0) @binding(1) var<storage, read> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> res: array<u32>;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * prm.nwx + wid.x) * ${WG}u + lid.x;
  if (i >= prm.n * prm.rcount) { return; }
  let f = i / prm.rcount;
  let r = i - f * prm.rcount;
  ${body}
}
`;
}

function rawLoad(name: string, bytes: 1 | 2 | 4): string {
  if (bytes === 1)
    return `fn ld_${name}(e: u32) -> u32 { return (${name}[e >> 2u] >> ((e & 3u) * 8u)) & 0xffu; }`;
  if (bytes === 2)
    return `fn ld_${name}(e: u32) -> u32 { return (${name}[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu; }`;
  return `fn ld_${name}(e: u32) -> u32 { return ${name}[e]; }`;
}

/**
 * Paired (CSR events) frame pass, O(events): one workgroup per frame walks the frame's
 * events; dot products reduce in the workgroup; sum and max patterns by atomics
 * (sum exact as two u32 words: the carry of the low word's atomicAdd goes to the high).
 */
export function pairedSource(
  idxBytes: 2 | 4,
  cntBytes: 1 | 2 | 4,
  exact: boolean,
  intWeights: boolean,
  R: number,
  wantSum: boolean,
  wantMax: boolean,
): string {
  const W = partialWords(exact);
  const rows = R > 0;
  const wf = intWeights ? "f32(bitcast<i32>(wb))" : "bitcast<f32>(wb)";
  const accumulate = exact
    ? `let wi = bitcast<i32>(wb);
        let mag = mul64(x, u32(abs(wi)));
        if (wi >= 0) { apos[r] = add96(apos[r], vec3<u32>(mag, 0u)); }
        else { aneg[r] = add96(aneg[r], vec3<u32>(mag, 0u)); }`
    : `af[r] = twosum(af[r], vec2<f32>(f32(x) * ${wf}, 0.0));`;
  const reduce = exact
    ? `redp[t] = apos[r]; redn[t] = aneg[r];
    workgroupBarrier();
    for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
      if (t < s) { redp[t] = add96(redp[t], redp[t + s]); redn[t] = add96(redn[t], redn[t + s]); }
      workgroupBarrier();
    }
    if (t == 0u) {
      let o = (f * prm.rcount + r) * ${W}u;
      res[o] = redp[0].x; res[o + 1u] = redp[0].y; res[o + 2u] = redp[0].z;
      res[o + 3u] = redn[0].x; res[o + 4u] = redn[0].y; res[o + 5u] = redn[0].z;
    }
    workgroupBarrier();`
    : `redf[t] = af[r];
    workgroupBarrier();
    for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
      if (t < s) { redf[t] = twosum(redf[t], redf[t + s]); }
      workgroupBarrier();
    }
    if (t == 0u) {
      let o = (f * prm.rcount + r) * ${W}u;
      res[o] = bitcast<u32>(redf[0].x); res[o + 1u] = bitcast<u32>(redf[0].y);
    }
    workgroupBarrier();`;
  return `${COMMON}
@group(0) @binding(1) var<storage, read> indptr: array<u32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> cnt: array<u32>;
@group(0) @binding(4) var<storage, read> wts: array<u32>;
@group(0) @binding(5) var<storage, read_write> res: array<u32>;
@group(0) @binding(6) var<storage, read_write> psum: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> pmax: array<atomic<u32>>;
${exact ? `var<workgroup> redp: array<vec3<u32>, ${WG}>; var<workgroup> redn: array<vec3<u32>, ${WG}>;` : `var<workgroup> redf: array<vec2<f32>, ${WG}>;`}
${rawLoad("idx", idxBytes)}
${rawLoad("cnt", cntBytes)}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = lid.x;
  let f = wid.y * prm.nwx + wid.x;
  if (prm.pad0 == 0xffffffffu) { res[0] = wts[0] + atomicLoad(&psum[0]) + atomicLoad(&pmax[0]); } // keep every binding in the layout
  if (f >= prm.n) { return; }
  let fl = prm.fbase + f;
  ${rows ? (exact ? `var apos: array<vec3<u32>, ${R}>; var aneg: array<vec3<u32>, ${R}>;` : `var af: array<vec2<f32>, ${R}>;`) : ""}
  let a = indptr[fl];
  let b = indptr[fl + 1u];
  for (var e = a + t; e < b; e = e + ${WG}u) {
    let p = ld_idx(e);
    let x = ld_cnt(e);
    ${wantSum ? `let old = atomicAdd(&psum[2u * p], x); if (old + x < old) { atomicAdd(&psum[2u * p + 1u], 1u); }` : ""}
    ${wantMax ? `atomicMax(&pmax[p], x);` : ""}
    ${
      rows
        ? `for (var r = 0u; r < ${R}u; r = r + 1u) {
        let wb = wts[r * prm.K + p];
        ${accumulate}
      }`
        : ""
    }
  }
  ${rows ? `for (var r = 0u; r < ${R}u; r = r + 1u) { ${reduce} }` : ""}
}
`;
}

/** Gather from dense or packed frames: one invocation per (frame, index). */
export function gatherSource(layout: Layout): string {
  const { decl, fn } = loadFn(layout);
  return `${COMMON}
${decl}
@group(0) @binding(4) var<storage, read> gidx: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
${fn}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * prm.nwx + wid.x) * ${WG}u + lid.x;
  if (i >= prm.n * prm.L) { return; }
  let f = i / prm.L;
  let c = i - f * prm.L;
  out[i] = load(prm.fbase + f, gidx[c]);
}
`;
}

/** Gather from paired frames: binary search of each index in the frame's sorted events. */
export function pairedGatherSource(idxBytes: 2 | 4, cntBytes: 1 | 2 | 4): string {
  return `${COMMON}
@group(0) @binding(1) var<storage, read> indptr: array<u32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> cnt: array<u32>;
@group(0) @binding(4) var<storage, read> gidx: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
${rawLoad("idx", idxBytes)}
${rawLoad("cnt", cntBytes)}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * prm.nwx + wid.x) * ${WG}u + lid.x;
  if (i >= prm.n * prm.L) { return; }
  let f = i / prm.L;
  let c = i - f * prm.L;
  let want = gidx[c];
  var lo = indptr[prm.fbase + f];
  var hi = indptr[prm.fbase + f + 1u];
  var v = 0u;
  while (lo < hi) {
    let mid = lo + (hi - lo) / 2u;
    let p = ld_idx(mid);
    if (p == want) { v = ld_cnt(mid); break; }
    if (p < want) { lo = mid + 1u; } else { hi = mid; }
  }
  out[i] = v;
}
`;
}
