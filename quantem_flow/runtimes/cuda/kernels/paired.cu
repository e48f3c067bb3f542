// Frame pass on electron-counted pairs (CSR per frame), O(events):
//   per_frame[f, j] = sum_{e in frame f} counts[e] * weights[j, indices[e]]
//   psum[indices[e]] += counts[e]                   (uint64)
//   pmax[indices[e]]  = max(pmax, counts[e])         (uint32; pixels without events stay 0)
// One warp per frame; 8 frames per 256-thread block.  per_frame, psum and
// pmax are zero-initialised by the caller.
#include "common.cuh"

template <typename I, typename C>
__device__ void qf_paired_pass(
    const qf_i64* __restrict__ indptr, const I* __restrict__ indices,
    const C* __restrict__ counts, long long n, long long K,
    const double* __restrict__ weights, int M,
    double* __restrict__ per_frame, qf_u64* __restrict__ psum, qf_u32* __restrict__ pmax,
    int do_sum, int do_max)
{
    const int lane = threadIdx.x & 31;
    const long long f = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x / 32);
    if (f >= n) return;
    const qf_i64 e0 = indptr[f], e1 = indptr[f + 1];
    double acc[QF_MAX_WEIGHTS];
#pragma unroll
    for (int j = 0; j < QF_MAX_WEIGHTS; ++j) acc[j] = 0.0;
    for (qf_i64 e = e0 + lane; e < e1; e += 32) {
        const long long p = (long long)indices[e];
        const C c = counts[e];
        const double cv = (double)c;
#pragma unroll
        for (int j = 0; j < QF_MAX_WEIGHTS; ++j) {
            if (j < M) acc[j] += cv * weights[(long long)j * K + p];
        }
        if (do_sum) atomicAdd(&psum[p], (qf_u64)c);
        if (do_max) atomicMax(&pmax[p], (qf_u32)c);
    }
#pragma unroll
    for (int j = 0; j < QF_MAX_WEIGHTS; ++j) {
        if (j < M) {
            const double total = qf_warp_sum(acc[j]);
            if (lane == 0) per_frame[f * M + j] = total;
        }
    }
}

#define QF_PAIRED_ENTRY(NAME, I, C)                                                        \
    extern "C" __global__ void NAME(                                                        \
        const qf_i64* indptr, const I* indices, const C* counts, long long n, long long K,  \
        const double* weights, int M, double* per_frame, qf_u64* psum, qf_u32* pmax,        \
        int do_sum, int do_max) {                                                           \
        qf_paired_pass<I, C>(indptr, indices, counts, n, K, weights, M, per_frame, psum,   \
                             pmax, do_sum, do_max);                                         \
    }

QF_PAIRED_ENTRY(qf_paired_pass_i16_c8, qf_u16, qf_u8)
QF_PAIRED_ENTRY(qf_paired_pass_i16_c16, qf_u16, qf_u16)
QF_PAIRED_ENTRY(qf_paired_pass_i16_c32, qf_u16, qf_u32)
QF_PAIRED_ENTRY(qf_paired_pass_i32_c8, qf_u32, qf_u8)
QF_PAIRED_ENTRY(qf_paired_pass_i32_c16, qf_u32, qf_u16)
QF_PAIRED_ENTRY(qf_paired_pass_i32_c32, qf_u32, qf_u32)
