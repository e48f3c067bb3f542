#version 450
#extension GL_GOOGLE_include_directive : require
#include "acc.glsl"
// Fused per-frame dot products of dense frames with up to ROWS weight rows in
// one read of each frame.  One workgroup per frame (strided over frames).
// pc: n_frames, K, m, elem_bytes, is_float, frame_offset, row0, rows.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Frames { uint frames[]; };
layout(std430, binding = 1) readonly buffer Weights { W_T wts[]; };
#if ACC_INT
layout(std430, binding = 2) buffer Out { uint outw[]; };
#else
layout(std430, binding = 2) buffer Out { ACC_T outv[]; };
#endif
shared ACC_T red[WG];

uint elem(uint i) {
  if (pc.elem_bytes == 4u) return frames[i];
  if (pc.elem_bytes == 2u) return (frames[i >> 1] >> ((i & 1u) * 16u)) & 0xFFFFu;
  return (frames[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu;
}

void main() {
  uint lid = gl_LocalInvocationID.x;
  for (uint f = gl_WorkGroupID.x; f < pc.n_frames; f += gl_NumWorkGroups.x) {
    ACC_T acc[ROWS];
    for (uint r = 0u; r < ROWS; ++r) acc[r] = acc_zero();
    uint base = f * pc.K;
    for (uint p = lid; p < pc.K; p += WG) {
      uint bits = elem(base + p);
      for (uint r = 0u; r < ROWS; ++r) {
        if (r < pc.rows) acc[r] = acc_fma(acc[r], bits, wts[(pc.row0 + r) * pc.K + p]);
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
        outv[o] = red[0];
#endif
      }
      barrier();
    }
  }
}
