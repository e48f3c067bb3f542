#version 450
#extension GL_GOOGLE_include_directive : require
#define ACC_U32X2 1
#include "acc.glsl"
// Sum and max patterns of paired frames: one thread per pair (strided), exact
// 64-bit sums by a 32-bit atomic add whose carry goes into the high word, and
// an atomic max (absent pixels are 0 and counts are >= 1, so 0 starts it).
// pc: aux0 = index bytes, aux1 = count bytes, aux2 = pairs, flags 1 sum 2 max.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Indices { uint indices[]; };
layout(std430, binding = 1) readonly buffer Counts { uint counts[]; };
layout(std430, binding = 2) buffer Sum { uint sumw[]; };
layout(std430, binding = 3) buffer Max { uint maxw[]; };

uint ld(uint i, uint nb, bool is_idx) {
  uint w = is_idx ? indices[i * nb >> 2] : counts[i * nb >> 2];
  if (nb == 4u) return w;
  if (nb == 2u) return (w >> ((i & 1u) * 16u)) & 0xFFFFu;
  return (w >> ((i & 3u) * 8u)) & 0xFFu;
}

void main() {
  uint stride = gl_NumWorkGroups.x * WG;
  for (uint q = gl_GlobalInvocationID.x; q < pc.aux2; q += stride) {
    uint px = ld(q, pc.aux0, true);
    uint c = ld(q, pc.aux1, false);
    if ((pc.flags & 1u) != 0u) {
      uint old = atomicAdd(sumw[2u * px], c);
      if (old + c < old) atomicAdd(sumw[2u * px + 1u], 1u);
    }
    if ((pc.flags & 2u) != 0u) atomicMax(maxw[px], c);
  }
}
