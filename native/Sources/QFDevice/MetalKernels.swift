/// The Metal Shading Language source of the Metal backend, compiled from source at start-up
/// (`MTLDevice.makeLibrary(source:options:)`).  One source for every dtype and
/// representation: function constants choose them when a pipeline is specialised, so the
/// compiler removes the other branches (no copied variants).
///
/// Accumulation (Metal has no 64-bit floats and limited 64-bit integers):
/// - integer data with int32 weights: exact, two 32-bit words with carry (`u32x2`); the
///   32 x 32 -> 64-bit signed product from `mulhi`; pattern sums also two words;
/// - float32 data or real weights: float32, each term with a zero weight skipped (no
///   `0 * NaN`); stated bound `(K + 2) u sum|x w|`, `u = 2**-24` (the conformance suite's).
///
/// Compiled on Apple platforms only (`#if canImport(Metal)`); see native/README.md.
enum MetalKernels {
  /// Function constant indices (kept in step with the source below).
  enum Constant: Int {
    case dtype = 0  // 0 uint8, 1 uint16, 2 uint32, 3 float32
    case representation = 1  // 0 dense, 1 paired, 2 packed
    case exact = 2  // bool: two-word integer sums
    case indexBytes = 3  // paired: 2 or 4
    case countBytes = 4  // paired: 1, 2 or 4
  }

  /// Threads of a threadgroup that reduces one frame (a power of two).
  static let groupThreads = 256

  static let source = """
    #include <metal_stdlib>
    using namespace metal;

    constant uint DTYPE [[function_constant(0)]];
    constant uint REP [[function_constant(1)]];
    constant bool EXACT [[function_constant(2)]];
    constant uint INDEX_BYTES [[function_constant(3)]];
    constant uint COUNT_BYTES [[function_constant(4)]];

    // The same layout as MetalParams in MetalBackend.swift: 12 uints.
    struct Params {
      uint n_frames;          // frames of this dispatch
      uint k;                 // pixels of a frame
      uint m;                 // weight rows
      uint row0;              // first weight row of this dispatch
      uint frame0;            // first frame of this dispatch in its input buffer
      uint block_values;      // packed
      uint blocks_per_frame;  // packed
      uint n_indices;         // gather
      uint n_pairs;           // paired
      uint out_frame0;        // row of per_frame where this dispatch's first frame goes
      uint pad0;
      uint pad1;
    };

    struct w2 { uint lo; uint hi; };

    inline w2 add2(w2 a, w2 b) {
      w2 r;
      r.lo = a.lo + b.lo;
      r.hi = a.hi + b.hi + (r.lo < a.lo ? 1u : 0u);
      return r;
    }

    // x * w as a two's complement 64-bit value (x < 2**32, |w| < 2**31).
    inline w2 mul2(uint x, int w) {
      uint aw = uint(w < 0 ? -w : w);
      w2 p;
      p.lo = x * aw;
      p.hi = mulhi(x, aw);
      if (w < 0) {
        p.lo = ~p.lo;
        p.hi = ~p.hi;
        p.lo += 1u;
        if (p.lo == 0u) { p.hi += 1u; }
      }
      return p;
    }

    inline uint load_u(device const uchar* base, uint i) {
      if (DTYPE == 0) { return uint(base[i]); }
      if (DTYPE == 1) { return uint(((device const ushort*)base)[i]); }
      return ((device const uint*)base)[i];
    }

    inline float load_f(device const uchar* base, uint i) {
      if (DTYPE == 3) { return ((device const float*)base)[i]; }
      return float(load_u(base, i));
    }

    inline uint pair_index(device const uchar* indices, uint q) {
      if (INDEX_BYTES == 2) { return uint(((device const ushort*)indices)[q]); }
      return ((device const uint*)indices)[q];
    }

    inline uint pair_count(device const uchar* counts, uint q) {
      if (COUNT_BYTES == 1) { return uint(counts[q]); }
      if (COUNT_BYTES == 2) { return uint(((device const ushort*)counts)[q]); }
      return ((device const uint*)counts)[q];
    }

    // Reduce one value per thread to thread 0 (tcount a power of two, <= 256).
    inline w2 reduce2(threadgroup uint* lo, threadgroup uint* hi, w2 v, uint tid, uint tcount) {
      lo[tid] = v.lo;
      hi[tid] = v.hi;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (uint s = tcount / 2; s > 0; s >>= 1) {
        if (tid < s) {
          w2 a; a.lo = lo[tid]; a.hi = hi[tid];
          w2 b; b.lo = lo[tid + s]; b.hi = hi[tid + s];
          w2 r = add2(a, b);
          lo[tid] = r.lo;
          hi[tid] = r.hi;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      w2 out; out.lo = lo[0]; out.hi = hi[0];
      threadgroup_barrier(mem_flags::mem_threadgroup);
      return out;
    }

    inline float reducef(threadgroup float* s, float v, uint tid, uint tcount) {
      s[tid] = v;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (uint h = tcount / 2; h > 0; h >>= 1) {
        if (tid < h) { s[tid] = s[tid] + s[tid + h]; }
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      float out = s[0];
      threadgroup_barrier(mem_flags::mem_threadgroup);
      return out;
    }

    inline uint reduceu(threadgroup uint* s, uint v, uint tid, uint tcount) {
      s[tid] = v;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (uint h = tcount / 2; h > 0; h >>= 1) {
        if (tid < h) { s[tid] = s[tid] + s[tid + h]; }
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      uint out = s[0];
      threadgroup_barrier(mem_flags::mem_threadgroup);
      return out;
    }

    // One threadgroup per frame: per_frame[frame, j] = sum_p x[p] * w[j, p] over w != 0.
    // EXACT: out holds two uints per value (low, high word); else one float.
    kernel void frame_dot(device const uchar* frames [[buffer(0)]],
                          device const float* wf [[buffer(1)]],
                          device const int* wi [[buffer(2)]],
                          device uint* out [[buffer(3)]],
                          constant Params& P [[buffer(4)]],
                          uint tid [[thread_index_in_threadgroup]],
                          uint group [[threadgroup_position_in_grid]],
                          uint tcount [[threads_per_threadgroup]]) {
      threadgroup uint slo[256];
      threadgroup uint shi[256];
      threadgroup float sf[256];
      uint f = group;
      uint base = (P.frame0 + f) * P.k;  // frame0: the first frame in the frames buffer
      uint row_out = (P.out_frame0 + f) * P.m;
      for (uint j = 0; j < P.m; ++j) {
        if (EXACT) {
          w2 acc; acc.lo = 0u; acc.hi = 0u;
          for (uint p = tid; p < P.k; p += tcount) {
            int w = wi[j * P.k + p];
            if (w != 0) { acc = add2(acc, mul2(load_u(frames, base + p), w)); }
          }
          w2 total = reduce2(slo, shi, acc, tid, tcount);
          if (tid == 0) {
            out[2 * (row_out + j)] = total.lo;
            out[2 * (row_out + j) + 1] = total.hi;
          }
        } else {
          float acc = 0.0f;
          for (uint p = tid; p < P.k; p += tcount) {
            float w = wf[j * P.k + p];
            if (w != 0.0f) { acc += load_f(frames, base + p) * w; }
          }
          float total = reducef(sf, acc, tid, tcount);
          if (tid == 0) { ((device float*)out)[row_out + j] = total; }
        }
      }
    }

    // One thread per pixel, frames in order: sum and max patterns, accumulated over
    // dispatches (packed groups).  Integers: two-word sums, uint max.  Floats: float32
    // sums, NaN-propagating max (as numpy.max), stored as float bits.
    kernel void pattern(device const uchar* frames [[buffer(0)]],
                        device uint* sums [[buffer(1)]],
                        device uint* maxes [[buffer(2)]],
                        constant Params& P [[buffer(4)]],
                        uint p [[thread_position_in_grid]]) {
      if (p >= P.k) { return; }
      if (DTYPE == 3) {
        float s = ((device float*)sums)[p];
        float mx = as_type<float>(maxes[p]);
        for (uint f = P.frame0; f < P.frame0 + P.n_frames; ++f) {
          float x = load_f(frames, f * P.k + p);
          s += x;
          mx = (isnan(x) || isnan(mx)) ? NAN : max(mx, x);
        }
        ((device float*)sums)[p] = s;
        maxes[p] = as_type<uint>(mx);
      } else {
        w2 s; s.lo = sums[2 * p]; s.hi = sums[2 * p + 1];
        uint mx = maxes[p];
        for (uint f = P.frame0; f < P.frame0 + P.n_frames; ++f) {
          uint x = load_u(frames, f * P.k + p);
          w2 t; t.lo = x; t.hi = 0u;
          s = add2(s, t);
          mx = max(mx, x);
        }
        sums[2 * p] = s.lo;
        sums[2 * p + 1] = s.hi;
        maxes[p] = mx;
      }
    }

    // One threadgroup per frame over its events.  A non-finite weight at a pixel the frame
    // misses meets a 0 there, and 0 * inf is NaN, as in a dense pass (float path only).
    kernel void paired_dot(device const uint* indptr [[buffer(0)]],
                           device const uchar* indices [[buffer(1)]],
                           device const uchar* counts [[buffer(2)]],
                           device const float* wf [[buffer(3)]],
                           device const int* wi [[buffer(5)]],
                           device const uint* bad [[buffer(6)]],
                           device uint* out [[buffer(7)]],
                           constant Params& P [[buffer(4)]],
                           uint tid [[thread_index_in_threadgroup]],
                           uint group [[threadgroup_position_in_grid]],
                           uint tcount [[threads_per_threadgroup]]) {
      threadgroup uint slo[256];
      threadgroup uint shi[256];
      threadgroup float sf[256];
      uint f = P.frame0 + group;
      uint a = indptr[f];
      uint e = indptr[f + 1];
      for (uint j = 0; j < P.m; ++j) {
        if (EXACT) {
          w2 acc; acc.lo = 0u; acc.hi = 0u;
          for (uint q = a + tid; q < e; q += tcount) {
            acc = add2(acc, mul2(pair_count(counts, q), wi[j * P.k + pair_index(indices, q)]));
          }
          w2 total = reduce2(slo, shi, acc, tid, tcount);
          if (tid == 0) {
            out[2 * (f * P.m + j)] = total.lo;
            out[2 * (f * P.m + j) + 1] = total.hi;
          }
        } else {
          float acc = 0.0f;
          uint hits = 0u;
          for (uint q = a + tid; q < e; q += tcount) {
            float w = wf[j * P.k + pair_index(indices, q)];
            acc += float(pair_count(counts, q)) * w;
            hits += isfinite(w) ? 0u : 1u;
          }
          float total = reducef(sf, acc, tid, tcount);
          uint all_hits = reduceu(slo, hits, tid, tcount);
          if (tid == 0) {
            ((device float*)out)[f * P.m + j] = all_hits < bad[j] ? NAN : total;
          }
        }
      }
    }

    // One thread per event: two-word sums by a 32-bit atomic add carrying into the high
    // word, atomic max.
    kernel void paired_pattern(device const uchar* indices [[buffer(1)]],
                               device const uchar* counts [[buffer(2)]],
                               device atomic_uint* sums [[buffer(5)]],
                               device atomic_uint* maxes [[buffer(6)]],
                               constant Params& P [[buffer(4)]],
                               uint q [[thread_position_in_grid]]) {
      if (q >= P.n_pairs) { return; }
      uint p = pair_index(indices, q);
      uint c = pair_count(counts, q);
      uint old = atomic_fetch_add_explicit(&sums[2 * p], c, memory_order_relaxed);
      if (old + c < old) { atomic_fetch_add_explicit(&sums[2 * p + 1], 1u, memory_order_relaxed); }
      atomic_fetch_max_explicit(&maxes[p], c, memory_order_relaxed);
    }

    inline uint packed_value(device const uchar* widths, device const uint* offsets,
                             device const uint* data, uint f, uint p, uint bv, uint nb) {
      uint i = f * nb + p / bv;
      uint w = uint(widths[i]);
      if (w == 0u) { return 0u; }
      uint q = (p % bv) * w;
      uint o = offsets[i] + (q >> 5);
      uint s = q & 31u;
      uint lo = data[o];
      uint hi = data[o + 1];
      uint v = s == 0u ? lo : ((lo >> s) | (hi << (32u - s)));
      return v & ((1u << w) - 1u);
    }

    // One thread per value of a group of frames, decoded into a uint32 scratch that
    // frame_dot and pattern then read (DTYPE 2).
    kernel void packed_decode(device const uchar* widths [[buffer(0)]],
                              device const uint* offsets [[buffer(1)]],
                              device const uint* data [[buffer(2)]],
                              device uint* scratch [[buffer(3)]],
                              constant Params& P [[buffer(4)]],
                              uint gid [[thread_position_in_grid]]) {
      if (gid >= P.n_frames * P.k) { return; }
      uint f = P.frame0 + gid / P.k;
      scratch[gid] = packed_value(widths, offsets, data, f, gid % P.k, P.block_values,
                                  P.blocks_per_frame);
    }

    // One thread per (frame, index): the value as uint32 bits (the host narrows).
    kernel void gather(device const uchar* a [[buffer(0)]],
                       device const uchar* b [[buffer(1)]],
                       device const uchar* c [[buffer(2)]],
                       device const uint* idx [[buffer(3)]],
                       device uint* out [[buffer(5)]],
                       constant Params& P [[buffer(4)]],
                       uint gid [[thread_position_in_grid]]) {
      if (gid >= P.n_frames * P.n_indices) { return; }
      uint f = gid / P.n_indices;
      uint p = idx[gid % P.n_indices];
      if (REP == 0) {
        out[gid] = DTYPE == 3 ? ((device const uint*)a)[f * P.k + p] : load_u(a, f * P.k + p);
      } else if (REP == 1) {
        device const uint* indptr = (device const uint*)a;
        uint lo = indptr[f];
        uint hi = indptr[f + 1];
        uint v = 0u;
        while (lo < hi) {
          uint mid = (lo + hi) / 2;
          uint at = pair_index(b, mid);
          if (at == p) { v = pair_count(c, mid); break; }
          if (at < p) { lo = mid + 1; } else { hi = mid; }
        }
        out[gid] = v;
      } else {
        out[gid] = packed_value(a, (device const uint*)b, (device const uint*)c, f, p,
                                P.block_values, P.blocks_per_frame);
      }
    }
    """
}
