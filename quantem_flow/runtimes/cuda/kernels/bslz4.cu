// Decode bitshuffle+LZ4 chunks (the HDF5 filter 32008 framing: a 12-byte
// header, then per block a big-endian uint32 compressed size and an LZ4
// block of the bit-shuffled block, then the last n % 8 elements raw) on the
// device.  The host parses the framing into a table of blocks; then
//   qf_lz4_blocks     one thread per block: sequential LZ4 block decode into
//                     a scratch buffer, status 0 = ok, 1 = corrupt stream,
//                     2 = wrong decoded size;
//   qf_bitunshuffle   one thread per output byte: gathers the byte's 8 bits
//                     from the block's bit rows (row j * 8 + k holds bit k of
//                     byte j of every element, element i at bit i % 8 of byte
//                     i / 8 of the row);
//   qf_copy_ranges    copies the raw leftover bytes.
// The layout was checked against the bitshuffle library by a host reference
// decoder (tests/test_cuda_sources.py) that follows these kernels step by step.
#include "common.cuh"

extern "C" __global__ void qf_lz4_blocks(
    const qf_u8* __restrict__ src, const qf_i64* __restrict__ src_off,
    const qf_i32* __restrict__ src_len, const qf_i64* __restrict__ dst_off,
    const qf_i32* __restrict__ dst_len, qf_u8* __restrict__ scratch,
    qf_i32* __restrict__ status, qf_i64 n_blocks)
{
    const qf_i64 b = (qf_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const qf_u8* in = src + src_off[b];
    const qf_i64 in_end = src_len[b];
    qf_u8* out = scratch + dst_off[b];
    const qf_i64 out_end = dst_len[b];
    qf_i64 i = 0, o = 0;
    qf_i32 state = 0;
    while (i < in_end) {
        const qf_u32 token = in[i++];
        qf_i64 lit = token >> 4;
        if (lit == 15) {
            qf_u32 extra;
            do {
                if (i >= in_end) { state = 1; break; }
                extra = in[i++];
                lit += extra;
            } while (extra == 255);
            if (state) break;
        }
        if (i + lit > in_end || o + lit > out_end) { state = 1; break; }
        for (qf_i64 t = 0; t < lit; ++t) out[o + t] = in[i + t];
        i += lit;
        o += lit;
        if (i >= in_end) break;  // the last sequence holds literals only
        if (i + 2 > in_end) { state = 1; break; }
        const qf_i64 offset = (qf_i64)in[i] | ((qf_i64)in[i + 1] << 8);
        i += 2;
        qf_i64 match = token & 15;
        if (match == 15) {
            qf_u32 extra;
            do {
                if (i >= in_end) { state = 1; break; }
                extra = in[i++];
                match += extra;
            } while (extra == 255);
            if (state) break;
        }
        match += 4;
        if (offset == 0 || offset > o || o + match > out_end) { state = 1; break; }
        for (qf_i64 t = 0; t < match; ++t) out[o + t] = out[o - offset + t];  // may overlap
        o += match;
    }
    if (state == 0 && o != out_end) state = 2;
    status[b] = state;
}

extern "C" __global__ void qf_bitunshuffle(
    const qf_u8* __restrict__ scratch, const qf_i64* __restrict__ scratch_off,
    const qf_i32* __restrict__ n_elem, const qf_i64* __restrict__ out_off,
    qf_u8* __restrict__ out, int elem_size, qf_i64 n_blocks)
{
    for (qf_i64 b = blockIdx.y; b < n_blocks; b += gridDim.y) {
        const qf_i64 n = n_elem[b];
        const qf_i64 row_bytes = n / 8;
        const qf_u8* rows = scratch + scratch_off[b];
        qf_u8* dst = out + out_off[b];
        const qf_i64 total = n * elem_size;
        for (qf_i64 x = (qf_i64)blockIdx.x * blockDim.x + threadIdx.x; x < total;
             x += (qf_i64)gridDim.x * blockDim.x) {
            const qf_i64 e = x / elem_size;       // element
            const qf_i64 j = x - e * elem_size;   // byte of the element
            const qf_u8* base = rows + (j * 8) * row_bytes + (e >> 3);
            const int shift = (int)(e & 7);
            qf_u32 v = 0;
#pragma unroll
            for (int k = 0; k < 8; ++k) v |= (qf_u32)((base[k * row_bytes] >> shift) & 1u) << k;
            dst[x] = (qf_u8)v;
        }
    }
}

extern "C" __global__ void qf_copy_ranges(
    const qf_u8* __restrict__ src, const qf_i64* __restrict__ src_off,
    const qf_i64* __restrict__ dst_off, const qf_i32* __restrict__ length,
    qf_u8* __restrict__ out, qf_i64 n_ranges)
{
    const qf_i64 r = (qf_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_ranges) return;
    for (qf_i32 t = 0; t < length[r]; ++t) out[dst_off[r] + t] = src[src_off[r] + t];
}
