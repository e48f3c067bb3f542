#version 450
#extension GL_GOOGLE_include_directive : require
#include "acc.glsl"
// Per-frame dot products of paired (CSR) frames: one workgroup per frame, the
// threads walk the frame's pairs and read each weight row at the pair's pixel.
// Real variants count the pairs that hit each row's non-finite weights: a
// frame that misses one has 0 * (inf or nan) = nan there, as the dense pass.
// pc: n_frames, K, m, row0, rows, aux0 = index bytes, aux1 = count bytes,
//     flags & 4 = check non-finite weights.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Indptr { uint indptr[]; };
layout(std430, binding = 1) readonly buffer Indices { uint indices[]; };
layout(std430, binding = 2) readonly buffer Counts { uint counts[]; };
layout(std430, binding = 3) readonly buffer Weights { W_T wts[]; };
#if ACC_INT
layout(std430, binding = 4) buffer Out { uint outw[]; };
#else
layout(std430, binding = 4) buffer Out { ACC_T outv[]; };
#endif
layout(std430, binding = 5) readonly buffer Bad { uint nonfinite[]; };
shared ACC_T red[WG];
shared uint hits[ROWS];

uint ld(uint i, uint nb, bool is_idx) {
  uint w = is_idx ? indices[i * nb >> 2] : counts[i * nb >> 2];
  if (nb == 4u) return w;
  if (nb == 2u) return (w >> ((i & 1u) * 16u)) & 0xFFFFu;
  return (w >> ((i & 3u) * 8u)) & 0xFFu;
}

void main() {
  uint lid = gl_LocalInvocationID.x;
  bool check = (pc.flags & 4u) != 0u;
  for (uint f = gl_WorkGroupID.x; f < pc.n_frames; f += gl_NumWorkGroups.x) {
    ACC_T acc[ROWS];
    for (uint r = 0u; r < ROWS; ++r) acc[r] = acc_zero();
    if (lid < ROWS) hits[lid] = 0u;
    barrier();
    uint a = indptr[f];
    uint b = indptr[f + 1u];
    for (uint q = a + lid; q < b; q += WG) {
      uint px = ld(q, pc.aux0, true);
      uint c = ld(q, pc.aux1, false);
      for (uint r = 0u; r < ROWS; ++r) {
        if (r < pc.rows) {
          W_T w = wts[(pc.row0 + r) * pc.K + px];
          acc[r] = acc_fma(acc[r], c, w);
#if !ACC_INT
          if (check && (isnan(w) || isinf(w))) atomicAdd(hits[r], 1u);
#endif
        }
      }
    }
    for (uint r = 0u; r < pc.rows; ++r) {
      red[lid] = acc[r];
      barrier();
      for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = acc_add(red[lid], red[lid + s]);
        barrier();
      }
      if (lid == 0u) {
        uint o = (pc.frame_offset + f) * pc.m + pc.row0 + r;
#if ACC_INT
        uvec2 w = acc_words(red[0]);
        outw[2u * o] = w.x;
        outw[2u * o + 1u] = w.y;
#else
        ACC_T v = red[0];
        if (check && hits[r] < nonfinite[pc.row0 + r]) v = ACC_T(0.0) / ACC_T(0.0);
        outv[o] = v;
#endif
      }
      barrier();
    }
  }
}
