// Fused frame pass on dense frames, one read of every frame:
//   per_frame[f, j] = sum_p frames[f, p] * weights[j, p]      (float64;
//                     real data skip zero weights: see qf_term)
//   psum[p]         = sum_f frames[f, p]                        (int64 / float64)
//   pmax[p]         = max_f frames[f, p]                        (as float64, cast on the host)
//
// Grid: x over tiles of QF_FRAMES_PER_BLOCK frames, y over tiles of
// blockDim.x * 4 pixels.  Each thread owns 4 pixels of the tile (strided by
// blockDim.x, so loads coalesce) and keeps their running sum and max in
// registers across the block's frames; per-frame dot products are reduced
// in the warp, then in shared memory, then added to global memory once per
// block with a double atomic (sm_60+).  per_frame, psum and pmax must be
// initialised by the caller (zeros, and -inf or the dtype minimum for max).
#include "common.cuh"

#define QF_PIX_PER_THREAD 4

template <typename T, typename S>
__device__ void qf_frame_pass(
    const T* __restrict__ frames, long long n, long long K,
    const double* __restrict__ weights, int M,
    double* __restrict__ per_frame, S* __restrict__ psum, double* __restrict__ pmax,
    int do_sum, int do_max)
{
    __shared__ double partial[QF_FRAMES_PER_BLOCK * QF_MAX_WEIGHTS];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    for (int i = tid; i < QF_FRAMES_PER_BLOCK * QF_MAX_WEIGHTS; i += blockDim.x) partial[i] = 0.0;
    __syncthreads();

    const long long f0 = (long long)blockIdx.x * QF_FRAMES_PER_BLOCK;
    const long long f1 = (f0 + QF_FRAMES_PER_BLOCK < n) ? f0 + QF_FRAMES_PER_BLOCK : n;
    const long long tile = (long long)blockIdx.y * blockDim.x * QF_PIX_PER_THREAD;

    long long pix[QF_PIX_PER_THREAD];
    bool valid[QF_PIX_PER_THREAD];
    S sums[QF_PIX_PER_THREAD];
    double maxs[QF_PIX_PER_THREAD];
#pragma unroll
    for (int q = 0; q < QF_PIX_PER_THREAD; ++q) {
        pix[q] = tile + tid + (long long)q * blockDim.x;
        valid[q] = pix[q] < K;
        sums[q] = (S)0;
        maxs[q] = -1.0 / 0.0;  // -inf
    }

    for (long long f = f0; f < f1; ++f) {
        const T* row = frames + f * K;
        double v[QF_PIX_PER_THREAD];
#pragma unroll
        for (int q = 0; q < QF_PIX_PER_THREAD; ++q) {
            T raw = valid[q] ? row[pix[q]] : (T)0;
            v[q] = (double)raw;
            if (valid[q]) {
                if (do_sum) sums[q] += (S)raw;
                if (do_max) maxs[q] = qf_nanmax(maxs[q], v[q]);
            }
        }
        for (int j = 0; j < M; ++j) {
            const double* w = weights + (long long)j * K;
            double acc = 0.0;
#pragma unroll
            for (int q = 0; q < QF_PIX_PER_THREAD; ++q) {
                if (valid[q]) acc += qf_term<T>(v[q], w[pix[q]]);
            }
            acc = qf_warp_sum(acc);
            if (lane == 0) atomicAdd(&partial[(f - f0) * QF_MAX_WEIGHTS + j], acc);
        }
    }
    __syncthreads();
    const int nf = (int)(f1 - f0);
    for (int i = tid; i < nf * M; i += blockDim.x) {
        const int fl = i / M, j = i % M;
        atomicAdd(&per_frame[(f0 + fl) * M + j], partial[fl * QF_MAX_WEIGHTS + j]);
    }
#pragma unroll
    for (int q = 0; q < QF_PIX_PER_THREAD; ++q) {
        if (!valid[q] || f1 <= f0) continue;
        if (do_sum) atomicAdd(&psum[pix[q]], sums[q]);
        if (do_max) qf_atomic_max_double(&pmax[pix[q]], maxs[q]);
    }
}

// One entry point per input dtype; integer sums accumulate in 64-bit
// unsigned (two's complement wraps back to the right signed value on the
// host for signed data), real sums in float64.
#define QF_FRAME_PASS_ENTRY(NAME, T, S)                                                    \
    extern "C" __global__ void NAME(                                                        \
        const T* frames, long long n, long long K, const double* weights, int M,           \
        double* per_frame, S* psum, double* pmax, int do_sum, int do_max) {                \
        qf_frame_pass<T, S>(frames, n, K, weights, M, per_frame, psum, pmax, do_sum,       \
                            do_max);                                                        \
    }

QF_FRAME_PASS_ENTRY(qf_frame_pass_u8, qf_u8, qf_u64)
QF_FRAME_PASS_ENTRY(qf_frame_pass_u16, qf_u16, qf_u64)
QF_FRAME_PASS_ENTRY(qf_frame_pass_u32, qf_u32, qf_u64)
QF_FRAME_PASS_ENTRY(qf_frame_pass_i16, qf_i16, qf_u64)
QF_FRAME_PASS_ENTRY(qf_frame_pass_i32, qf_i32, qf_u64)
QF_FRAME_PASS_ENTRY(qf_frame_pass_f32, float, double)
QF_FRAME_PASS_ENTRY(qf_frame_pass_f64, double, double)
