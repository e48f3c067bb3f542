#version 450
#extension GL_GOOGLE_include_directive : require
#define ACC_U32X2 1
#include "acc.glsl"
// Gather detector pixels of every frame: out[f * n + j] = value(f, idx[j])
// as 32-bit words.  One thread per output value.
// pc: n_frames, K, elem_bytes (dense), aux0 = mode (0 dense, 1 paired,
//     2 packed), aux1 = n indices, aux2 = index bytes (paired) or block_values
//     (packed), aux3 = count bytes (paired) or blocks per frame (packed).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer B0 { uint b0[]; };
layout(std430, binding = 1) readonly buffer B1 { uint b1[]; };
layout(std430, binding = 2) readonly buffer B2 { uint b2[]; };
layout(std430, binding = 3) readonly buffer Idx { uint idx[]; };
layout(std430, binding = 4) writeonly buffer Out { uint outv[]; };

uint sub(uint w, uint i, uint nb) {
  if (nb == 4u) return w;
  if (nb == 2u) return (w >> ((i & 1u) * 16u)) & 0xFFFFu;
  return (w >> ((i & 3u) * 8u)) & 0xFFu;
}

void main() {
  uint total = pc.n_frames * pc.aux1;
  uint stride = gl_NumWorkGroups.x * WG;
  for (uint g = gl_GlobalInvocationID.x; g < total; g += stride) {
    uint f = g / pc.aux1;
    uint px = idx[g % pc.aux1];
    uint v = 0u;
    if (pc.aux0 == 0u) {
      uint e = f * pc.K + px;
      v = sub(b0[e * pc.elem_bytes >> 2], e, pc.elem_bytes);
    } else if (pc.aux0 == 1u) {
      uint lo = b0[f];
      uint hi = b0[f + 1u];
      while (lo < hi) {  // first pair with index >= px
        uint mid = (lo + hi) >> 1;
        uint x = sub(b1[mid * pc.aux2 >> 2], mid, pc.aux2);
        if (x < px) lo = mid + 1u; else hi = mid;
      }
      if (lo < b0[f + 1u] && sub(b1[lo * pc.aux2 >> 2], lo, pc.aux2) == px)
        v = sub(b2[lo * pc.aux3 >> 2], lo, pc.aux3);
    } else {
      uint i = f * pc.aux3 + px / pc.aux2;
      uint t = px % pc.aux2;
      uint w = (b0[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu;
      if (w != 0u) {
        uint q = t * w;
        uint o = b1[i] + (q >> 5);
        uint s = q & 31u;
        uint x = s == 0u ? b2[o] : ((b2[o] >> s) | (b2[o + 1u] << (32u - s)));
        v = x & ((1u << w) - 1u);
      }
    }
    outv[g] = v;
  }
}
