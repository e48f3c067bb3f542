#version 450
#extension GL_GOOGLE_include_directive : require
#include "acc.glsl"
// Sum and max patterns of dense frames: one thread per pixel walks the frames
// in order and adds into the running pattern (so group dispatches accumulate).
// Integer variants: integer data, sum as 64-bit words; real variants: float32
// data, sum in ACC_T; max as raw 32-bit words (NaN propagates like numpy.max).
// pc: n_frames, K, elem_bytes, is_float, flags (1 = sum, 2 = max), frame_offset (the
// first frame of the buffer this dispatch reads: the host splits long runs, see session.cpp).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Frames { uint frames[]; };
#if ACC_INT
layout(std430, binding = 1) buffer Sum { uint sumw[]; };
#else
layout(std430, binding = 1) buffer Sum { ACC_T sumv[]; };
#endif
layout(std430, binding = 2) buffer Max { uint maxw[]; };

uint elem(uint i) {
  if (pc.elem_bytes == 4u) return frames[i];
  if (pc.elem_bytes == 2u) return (frames[i >> 1] >> ((i & 1u) * 16u)) & 0xFFFFu;
  return (frames[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu;
}

void main() {
  uint stride = gl_NumWorkGroups.x * WG;
  bool want_sum = (pc.flags & 1u) != 0u;
  bool want_max = (pc.flags & 2u) != 0u;
  for (uint p = gl_GlobalInvocationID.x; p < pc.K; p += stride) {
#if ACC_INT
    uvec2 s = want_sum ? uvec2(sumw[2u * p], sumw[2u * p + 1u]) : uvec2(0u);
#else
    ACC_T s = want_sum ? sumv[p] : acc_zero();
#endif
    uint mx = want_max ? maxw[p] : 0u;
    for (uint f = 0u; f < pc.n_frames; ++f) {
      uint bits = elem((pc.frame_offset + f) * pc.K + p);
#if ACC_INT
      s = add64(s, uvec2(bits, 0u));
      mx = max(mx, bits);
#else
      float v = uintBitsToFloat(bits);
      s += ACC_T(v);
      float cur = uintBitsToFloat(mx);
      if (!isnan(cur) && (isnan(v) || v > cur)) mx = bits;
#endif
    }
    if (want_sum) {
#if ACC_INT
      sumw[2u * p] = s.x;
      sumw[2u * p + 1u] = s.y;
#else
      sumv[p] = s;
#endif
    }
    if (want_max) maxw[p] = mx;
  }
}
