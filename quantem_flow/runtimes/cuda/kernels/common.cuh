// Shared helpers of quantem-flow's CUDA kernels (compiled by NVRTC through
// CuPy at run time, and by `nvcc -arch=sm_90 -cubin` in CI).
#pragma once

#define QF_MAX_WEIGHTS 16
#define QF_FRAMES_PER_BLOCK 32

typedef unsigned char qf_u8;
typedef unsigned short qf_u16;
typedef unsigned int qf_u32;
typedef unsigned long long qf_u64;
typedef short qf_i16;
typedef int qf_i32;
typedef long long qf_i64;

__device__ __forceinline__ double qf_warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// One term x * w of a per-frame dot product of frames of type T.  Integer
// data are never non-finite: the plain product, no test.  Real data: a zero
// weight skips its pixel, so a NaN or infinite pixel outside a weight row's
// support leaves that row finite (IEEE would give 0 * NaN = 0 * inf = NaN).
template <typename T> struct qf_is_real { static constexpr bool value = false; };
template <> struct qf_is_real<float> { static constexpr bool value = true; };
template <> struct qf_is_real<double> { static constexpr bool value = true; };

template <typename T>
__device__ __forceinline__ double qf_term(double x, double w) {
    if (qf_is_real<T>::value) return w != 0.0 ? x * w : 0.0;
    return x * w;
}

// Maximum that propagates NaN like numpy.max: once NaN, stays NaN.
__device__ __forceinline__ double qf_nanmax(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
}

// atomic max for doubles through compare-and-swap (NaN wins and sticks).
__device__ __forceinline__ void qf_atomic_max_double(double* addr, double value) {
    unsigned long long* p = reinterpret_cast<unsigned long long*>(addr);
    unsigned long long old = *p, assumed;
    do {
        assumed = old;
        double current = __longlong_as_double(assumed);
        double next = qf_nanmax(current, value);
        if (next == current || (current != current)) break;
        old = atomicCAS(p, assumed, __double_as_longlong(next));
    } while (assumed != old);
}
