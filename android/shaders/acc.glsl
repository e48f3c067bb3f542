// Accumulator variants, chosen at build time by one of ACC_I64, ACC_U32X2,
// ACC_F64, ACC_F32 (glslc -D...).  Integer variants hold exact signed 64-bit
// sums (int64_t, or two 32-bit words with carry); real variants hold float64
// (needs shaderFloat64) or float32.  In the real variants a zero weight skips
// its pixel (a select, no 0 * NaN): a NaN or infinite pixel outside a weight
// row's support leaves that row finite; inside, the row is NaN or +-inf (IEEE).
#if defined(ACC_I64)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#define ACC_T int64_t
#define W_T int
#define ACC_INT 1
#elif defined(ACC_U32X2)
#define ACC_T uvec2
#define W_T int
#define ACC_INT 1
#elif defined(ACC_F64)
#define ACC_T double
#define W_T double
#define ACC_INT 0
#elif defined(ACC_F32)
#define ACC_T float
#define W_T float
#define ACC_INT 0
#else
#error "define one of ACC_I64 ACC_U32X2 ACC_F64 ACC_F32"
#endif

// Push constants shared by every kernel (64 bytes); each kernel documents
// the members it reads.
layout(push_constant) uniform PC {
  uint n_frames;     // frames in this dispatch
  uint K;            // values per frame
  uint m;            // weight rows in total (output row stride)
  uint elem_bytes;   // 1, 2 or 4 bytes per stored element
  uint is_float;     // elements are float32 bits
  uint frame_offset; // first output frame of this dispatch
  uint row0;         // first weight row of this dispatch
  uint rows;         // weight rows in this dispatch (<= ROWS)
  uint aux0;
  uint aux1;
  uint aux2;
  uint aux3;
  uint flags;
  uint f0;
  uint pad0;
  uint pad1;
}
pc;

uvec2 add64(uvec2 a, uvec2 b) {
  uint c;
  uint lo = uaddCarry(a.x, b.x, c);
  return uvec2(lo, a.y + b.y + c);
}

// 32 x 32 -> 64-bit signed product of an unsigned value and a signed weight.
uvec2 mul_u32_i32(uint v, int w) {
  uint hi;
  uint lo;
  umulExtended(v, uint(abs(w)), hi, lo);
  uvec2 r = uvec2(lo, hi);
  if (w < 0) {
    r = add64(~r, uvec2(1u, 0u));
  }
  return r;
}

#if defined(ACC_I64)
ACC_T acc_zero() { return int64_t(0); }
ACC_T acc_add(ACC_T a, ACC_T b) { return a + b; }
ACC_T acc_fma(ACC_T a, uint bits, W_T w) { return a + int64_t(uint64_t(bits)) * int64_t(w); }
uvec2 acc_words(ACC_T a) { return uvec2(uint(uint64_t(a) & 0xFFFFFFFFul), uint(uint64_t(a) >> 32)); }
#elif defined(ACC_U32X2)
ACC_T acc_zero() { return uvec2(0u, 0u); }
ACC_T acc_add(ACC_T a, ACC_T b) { return add64(a, b); }
ACC_T acc_fma(ACC_T a, uint bits, W_T w) { return add64(a, mul_u32_i32(bits, w)); }
uvec2 acc_words(ACC_T a) { return a; }
#elif defined(ACC_F64)
ACC_T acc_zero() { return 0.0lf; }
ACC_T acc_add(ACC_T a, ACC_T b) { return a + b; }
ACC_T acc_fma(ACC_T a, uint bits, W_T w) {
  double v = pc.is_float != 0u ? double(uintBitsToFloat(bits)) : double(bits);
  return a + (w != 0.0lf ? v * w : 0.0lf);  // a zero weight skips its pixel: no 0 * NaN
}
#else
ACC_T acc_zero() { return 0.0; }
ACC_T acc_add(ACC_T a, ACC_T b) { return a + b; }
ACC_T acc_fma(ACC_T a, uint bits, W_T w) {
  float v = pc.is_float != 0u ? uintBitsToFloat(bits) : float(bits);
  return a + (w != 0.0 ? v * w : 0.0);  // a zero weight skips its pixel: no 0 * NaN
}
#endif

#define ROWS 8u
#define WG 64u
