// Decode packed-blockwidth-v1 payloads on the device (see
// quantem_flow/representations/packed.py for the layout), a group of frames
// at a time, into a dense buffer the fused frame pass then reads.
//
// One thread per value of the group: value t of block i (frame f = i / nb,
// block j = i % nb) with width w starts at stream bit q = t * w of the
// block, read from the 64-bit window of words (o + q / 32, o + q / 32 + 1);
// the payload carries one trailing zero word so the second word exists.
#include "common.cuh"

template <typename T>
__device__ void qf_unpack(
    const qf_u32* __restrict__ data, const qf_u8* __restrict__ widths,
    const qf_i64* __restrict__ offsets, long long f0, long long n_frames, long long K,
    int B, T* __restrict__ out)
{
    const long long nb = (K + B - 1) / B;
    const long long total = n_frames * K;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (long long)gridDim.x * blockDim.x) {
        const long long fl = g / K;            // frame within the group
        const long long p = g - fl * K;         // pixel within the frame
        const long long j = p / B;              // block within the frame
        const long long t = p - j * B;          // value within the block
        const long long i = (f0 + fl) * nb + j; // block number in the payload
        const int w = (int)widths[i];
        qf_u32 v = 0;
        if (w > 0) {
            const long long q = t * (long long)w;
            const long long word = offsets[i] + (q >> 5);
            const qf_u64 window = (qf_u64)data[word] | ((qf_u64)data[word + 1] << 32);
            v = (qf_u32)((window >> (q & 31)) & ((1ull << w) - 1ull));
        }
        out[g] = (T)v;
    }
}

#define QF_UNPACK_ENTRY(NAME, T)                                                            \
    extern "C" __global__ void NAME(                                                        \
        const qf_u32* data, const qf_u8* widths, const qf_i64* offsets, long long f0,      \
        long long n_frames, long long K, int B, T* out) {                                  \
        qf_unpack<T>(data, widths, offsets, f0, n_frames, K, B, out);                      \
    }

QF_UNPACK_ENTRY(qf_unpack_u8, qf_u8)
QF_UNPACK_ENTRY(qf_unpack_u16, qf_u16)
QF_UNPACK_ENTRY(qf_unpack_u32, qf_u32)
QF_UNPACK_ENTRY(qf_unpack_i16, qf_i16)
QF_UNPACK_ENTRY(qf_unpack_i32, qf_i32)
