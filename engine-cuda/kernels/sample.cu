// Token choice on the device, so a greedy step copies back one u32 per row, not the logits.

// Index of the largest logit of each row (the lowest index among equals; NaN never wins), in
// a fixed order. grid.x = row, blockDim.x a multiple of 32 (at most 1024).
extern "C" __global__ void argmax_rows(const float* logits, u32 vocab, u32* out) {
    __shared__ float best_v[32];
    __shared__ u32 best_i[32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float v = -INFINITY;
    u32 idx = 0xffffffffu;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x > v || (idx == 0xffffffffu && !(x != x))) {
            v = x;
            idx = i;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, offset);
        const u32 oi = __shfl_xor_sync(FULL_MASK, idx, offset);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = v;
        best_i[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 w = 1; w < (blockDim.x >> 5); w++) {
            if (best_v[w] > v || (best_v[w] == v && best_i[w] < idx)) {
                v = best_v[w];
                idx = best_i[w];
            }
        }
        out[blockIdx.x] = idx == 0xffffffffu ? 0u : idx;
    }
}
