// Weight GEMV / skinny GEMM for decode and tree verification: out[r][o] = x[r] . W[o] for
// the x rows of the launch, W in its GGML block format as the file stores it (32 weights per
// block). One warp per output row (blockDim = 128: 4 rows per block); each lane walks the
// row's blocks lane, lane + 32, ... and keeps one accumulator per x row for up to ROWS rows
// at a time, so a verify step of 8 tokens reads the weights once. Row r's sum is the same
// fma chain and the same butterfly whatever the other rows are (the bitwise contracts).
// Requires cols % 32 == 0, and % 256 for the K-quants (checked on the host when the matrix
// is made).

#define ROWS 8

// The 32 weights of block `b` of a row.
template <int FMT>
__device__ __forceinline__ void decode_block(const u8* row, u32 b, float w[32]);

// Q8_0: f16 d, 32 x i8.
template <>
__device__ __forceinline__ void decode_block<0>(const u8* row, u32 b, float w[32]) {
    const u16* blk = (const u16*)(row + (u64)b * 34);
    const float d = f16_to_f32(blk[0]);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const u16 q = blk[1 + j];
        w[2 * j] = d * (float)(i8)(q & 0xff);
        w[2 * j + 1] = d * (float)(i8)(q >> 8);
    }
}

// Q4_0: f16 d, 16 bytes of nibbles (low nibbles are weights 0..15, high 16..31), offset 8.
template <>
__device__ __forceinline__ void decode_block<1>(const u8* row, u32 b, float w[32]) {
    const u16* blk = (const u16*)(row + (u64)b * 18);
    const float d = f16_to_f32(blk[0]);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const u16 q = blk[1 + j];
        w[2 * j] = d * (float)((int)(q & 0xf) - 8);
        w[2 * j + 1] = d * (float)((int)((q >> 8) & 0xf) - 8);
        w[16 + 2 * j] = d * (float)((int)((q >> 4) & 0xf) - 8);
        w[16 + 2 * j + 1] = d * (float)((int)(q >> 12) - 8);
    }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles: w = d * q + m.
template <>
__device__ __forceinline__ void decode_block<2>(const u8* row, u32 b, float w[32]) {
    const u32* blk = (const u32*)(row + (u64)b * 20);
    const u32 dm = blk[0];
    const float d = f16_to_f32((u16)(dm & 0xffff)), m = f16_to_f32((u16)(dm >> 16));
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const u32 q = blk[1 + j];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 byte = (q >> (8 * k)) & 0xff;
            // Rounded as the CPU's reference decoder rounds (product, then sum).
            w[4 * j + k] = __fmul_rn(d, (float)(byte & 0xf)) + m;
            w[16 + 4 * j + k] = __fmul_rn(d, (float)(byte >> 4)) + m;
        }
    }
}

// F16.
template <>
__device__ __forceinline__ void decode_block<3>(const u8* row, u32 b, float w[32]) {
    const uint4* blk = (const uint4*)(row + (u64)b * 64);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 v = blk[j];
        const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[8 * j + 2 * k] = f16_to_f32((u16)(p[k] & 0xffff));
            w[8 * j + 2 * k + 1] = f16_to_f32((u16)(p[k] >> 16));
        }
    }
}

// BF16.
template <>
__device__ __forceinline__ void decode_block<4>(const u8* row, u32 b, float w[32]) {
    const uint4* blk = (const uint4*)(row + (u64)b * 64);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 v = blk[j];
        const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[8 * j + 2 * k] = __uint_as_float(p[k] << 16);
            w[8 * j + 2 * k + 1] = __uint_as_float(p[k] & 0xffff0000u);
        }
    }
}

// F32.
template <>
__device__ __forceinline__ void decode_block<5>(const u8* row, u32 b, float w[32]) {
    const float4* blk = (const float4*)(row + (u64)b * 128);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float4 v = blk[j];
        w[4 * j] = v.x;
        w[4 * j + 1] = v.y;
        w[4 * j + 2] = v.z;
        w[4 * j + 3] = v.w;
    }
}

// K-quants: 256-value super-blocks of eight 32-value sub-blocks; block `b` of a row is
// sub-block b % 8 of super-block b / 8 (cols % 256 == 0). Value for value the decoders of
// engine_ops::kquant (llama.cpp's dequantize_row_q*_K), products rounded before the sums.

// The 6-bit (scale, min) pair j of a Q4_K/Q5_K super-block's 12 packed bytes.
__device__ __forceinline__ void kquant_scale_min(const u8* q, int j, float& sc, float& mn) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        mn = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q4_K (144 bytes): d, dmin, scales[12], qs[128].
template <>
__device__ __forceinline__ void decode_block<6>(const u8* row, u32 b, float w[32]) {
    const u8* blk = row + (u64)(b >> 3) * 144;
    const int j = b & 7, g = j >> 1, hi = j & 1;
    const float d = f16_to_f32(*(const u16*)blk), dmin = f16_to_f32(*(const u16*)(blk + 2));
    float sc, mn;
    kquant_scale_min(blk + 4, j, sc, mn);
    const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, mn);
    const u32* qs = (const u32*)(blk + 16 + 32 * g);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const u32 q = hi ? (qs[i] >> 4) & 0x0f0f0f0fu : qs[i] & 0x0f0f0f0fu;
#pragma unroll
        for (int k = 0; k < 4; k++) w[4 * i + k] = __fmul_rn(d1, (float)((q >> (8 * k)) & 0xff)) - m1;
    }
}

// Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]; the fifth bit of value l of
// sub-block j is bit j of qh[l].
template <>
__device__ __forceinline__ void decode_block<7>(const u8* row, u32 b, float w[32]) {
    const u8* blk = row + (u64)(b >> 3) * 176;
    const int j = b & 7, g = j >> 1, hi = j & 1;
    const float d = f16_to_f32(*(const u16*)blk), dmin = f16_to_f32(*(const u16*)(blk + 2));
    float sc, mn;
    kquant_scale_min(blk + 4, j, sc, mn);
    const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, mn);
    const u8* qh = blk + 16;
    const u8* qs = blk + 48 + 32 * g;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const u32 q = (hi ? (qs[l] >> 4) : (qs[l] & 0xf)) + (((qh[l] >> j) & 1) << 4);
        w[l] = __fmul_rn(d1, (float)q) - m1;
    }
}

// Q6_K (210 bytes): ql[128], qh[64], scales[16] (i8), d. Sub-block j is quarter k = j % 4 of
// half n = j / 4.
template <>
__device__ __forceinline__ void decode_block<8>(const u8* row, u32 b, float w[32]) {
    const u8* blk = row + (u64)(b >> 3) * 210;
    const int j = b & 7, n = j >> 2, k = j & 3;
    const float d = f16_to_f32((u16)(blk[208] | (blk[209] << 8)));
    const u8* ql = blk + 64 * n + (k & 1) * 32;
    const u8* qh = blk + 128 + 32 * n;
    const i8* sc = (const i8*)(blk + 192 + 8 * n + 2 * k);
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int lo = (k & 2) ? (ql[l] >> 4) : (ql[l] & 0xf);
        const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        w[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16]), (float)q);
    }
}

template <int FMT>
__device__ __forceinline__ void gemv(const u8* weights, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    const u32 lane = threadIdx.x & 31;
    const u32 o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= out_rows) return;
    const u8* row = weights + (u64)o * row_bytes;
    const u32 blocks = cols / 32;
    for (u32 r0 = 0; r0 < x_rows; r0 += ROWS) {
        float acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
        for (u32 b = lane; b < blocks; b += 32) {
            float w[32];
            decode_block<FMT>(row, b, w);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (r0 + r < x_rows) {
                    const float4* xr = (const float4*)(x + (u64)(r0 + r) * cols + (u64)b * 32);
                    float s = acc[r];
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const float4 v = xr[j];
                        s = fmaf(w[4 * j], v.x, s);
                        s = fmaf(w[4 * j + 1], v.y, s);
                        s = fmaf(w[4 * j + 2], v.z, s);
                        s = fmaf(w[4 * j + 3], v.w, s);
                    }
                    acc[r] = s;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float total = warp_sum(acc[r]);
            if (lane == 0 && r0 + r < x_rows) out[(u64)(r0 + r) * out_rows + o] = total;
        }
    }
}

extern "C" __global__ void gemv_q8_0(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<0>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_q4_0(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<1>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_q4_1(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<2>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_f16(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<3>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_bf16(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<4>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_q4_k(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<6>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_q5_k(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<7>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_q6_k(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<8>(w, row_bytes, out_rows, cols, x, x_rows, out);
}
extern "C" __global__ void gemv_f32(const u8* w, u32 row_bytes, u32 out_rows, u32 cols, const float* x, u32 x_rows, float* out) {
    gemv<5>(w, row_bytes, out_rows, cols, x, x_rows, out);
}

// Embedding gather: out row i = row tokens[i] of the table, decoded to f32; grid.x = row,
// threads over the row's blocks. The host checked every token against the table's rows.
template <int FMT>
__device__ __forceinline__ void embed(const u8* table, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    const u8* row = table + (u64)tokens[blockIdx.x] * row_bytes;
    float* o = out + (u64)blockIdx.x * cols;
    for (u32 b = threadIdx.x; b < cols / 32; b += blockDim.x) {
        float w[32];
        decode_block<FMT>(row, b, w);
#pragma unroll
        for (int j = 0; j < 32; j++) o[b * 32 + j] = w[j];
    }
}

extern "C" __global__ void embed_q8_0(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<0>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_q4_0(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<1>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_q4_1(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<2>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_f16(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<3>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_bf16(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<4>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_f32(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<5>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_q4_k(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<6>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_q5_k(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<7>(t, row_bytes, cols, tokens, out);
}
extern "C" __global__ void embed_q6_k(const u8* t, u32 row_bytes, u32 cols, const u32* tokens, float* out) {
    embed<8>(t, row_bytes, cols, tokens, out);
}
