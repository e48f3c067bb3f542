#version 450
#extension GL_GOOGLE_include_directive : require
#define ACC_U32X2 1
#include "acc.glsl"
// Decode frames f0 .. f0 + n_frames of a packed-blockwidth-v1 payload into
// 32-bit values (one thread per value): the 64-bit window of words (o + q/32,
// o + q/32 + 1) shifted by q % 32, masked to the block's width.
// pc: n_frames, K, f0, aux0 = block_values, aux1 = blocks per frame.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Widths { uint widths[]; };
layout(std430, binding = 1) readonly buffer Offsets { uint offsets[]; };
layout(std430, binding = 2) readonly buffer Data { uint data[]; };
layout(std430, binding = 3) writeonly buffer Out { uint outv[]; };

void main() {
  uint total = pc.n_frames * pc.K;
  uint stride = gl_NumWorkGroups.x * WG;
  for (uint g = gl_GlobalInvocationID.x; g < total; g += stride) {
    uint f = pc.f0 + g / pc.K;
    uint p = g % pc.K;
    uint i = f * pc.aux1 + p / pc.aux0;
    uint t = p % pc.aux0;
    uint w = (widths[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu;
    uint v = 0u;
    if (w != 0u) {
      uint q = t * w;
      uint o = offsets[i] + (q >> 5);
      uint s = q & 31u;
      uint lo = data[o];
      uint hi = data[o + 1u];
      v = s == 0u ? lo : ((lo >> s) | (hi << (32u - s)));
      v &= w == 32u ? 0xFFFFFFFFu : ((1u << w) - 1u);
    }
    outv[g] = v;
  }
}
