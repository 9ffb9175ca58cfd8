// Causal paged attention for decode, prefill chunks and draft trees, f16 or FP8 KV, grouped
// query heads, split over the context (flash-decoding) so a single long sequence still fills
// the GPU. Row i sees the logical positions 0..=last(i): a chain row at start_pos + i sees up
// to itself; tree node i sees the prefix 0..=start_pos and its ancestors, logical position
// start_pos + e being slot start_pos + tree_anc[i * tree_stride + e] (engine_ops::TreeKeys).
//
// Two launches. attention_split_*: grid = (row, head, split), blockDim = 128 (4 warps); split
// s of a row covers positions [s * split_len, (s + 1) * split_len) of what it sees; warp w
// takes positions w, w + 4, ... of the split with an online softmax, and the four merge in a
// fixed order into the split's (max, sum, unnormalised output). attention_merge: grid =
// (row, head); combines the row's splits in order. How a row is split depends only on how
// many positions it sees, so a tree node's output equals the chain's at its position, and a
// row's never depends on the rest of the launch. Each lane owns dims lane, lane + 32, ...
// (head_dim a multiple of 32, at most 256).

#define ATTN_WARPS 4
#define MAX_DIMS 8

struct AttnParams {
    u32 n_heads;
    u32 n_kv_heads;
    u32 head_dim;
    u32 page_tokens;
    u32 layer;
    u32 start_pos;
    u32 tree_stride; // 0 for a chain
    u32 split_len;   // positions per split
    u32 max_splits;  // the launch's grid.z: partials are [row][head][max_splits]
    float scale;
    float k_scale; // FP8 pages' per-tensor scales (1 for f16)
    float v_scale;
};

// Positions row `row` sees.
__device__ __forceinline__ u32 visible(const AttnParams& p, const u32* tree_depth, u32 row) {
    return (p.tree_stride > 0 ? p.start_pos + tree_depth[row] : p.start_pos + row) + 1;
}

// Floats of one split's partial result: max, sum, then head_dim values.
__device__ __forceinline__ float* partial(float* partials, const AttnParams& p, u32 row, u32 head, u32 split) {
    return partials + ((u64)(row * p.n_heads + head) * p.max_splits + split) * (2 + p.head_dim);
}

template <bool FP8>
__device__ __forceinline__ float kv_value(const u64* pages, const AttnParams& p, u32 part, u32 kv_head, u32 slot, u32 d) {
    const u64 off = ((u64)((p.layer * 2 + part) * p.n_kv_heads + kv_head) * p.page_tokens + slot % p.page_tokens) * p.head_dim + d;
    if (FP8) return e4m3_to_f32(((const u8*)pages[slot / p.page_tokens])[off]);
    return f16_to_f32(((const u16*)pages[slot / p.page_tokens])[off]);
}

template <bool FP8>
__device__ __forceinline__ void attention_split(const float* q, const u64* pages, const u32* tree_anc, const u32* tree_depth, AttnParams p, float* partials) {
    __shared__ float part_m[ATTN_WARPS], part_l[ATTN_WARPS];
    __shared__ float part_acc[ATTN_WARPS][MAX_DIMS * 32];
    const u32 row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    const u32 seen = visible(p, tree_depth, row);
    const u32 begin = split * p.split_len;
    if (begin >= seen) return; // this row has fewer splits than the launch
    const u32 end = min(seen, begin + p.split_len);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 kv_head = head / (p.n_heads / p.n_kv_heads);
    const u32 dims = p.head_dim / 32;
    const u32 width = p.n_heads * p.head_dim;
    const bool tree = p.tree_stride > 0;

    float qv[MAX_DIMS], acc[MAX_DIMS];
#pragma unroll
    for (int k = 0; k < MAX_DIMS; k++) {
        qv[k] = k < dims ? q[(u64)row * width + head * p.head_dim + lane + 32 * k] : 0.0f;
        acc[k] = 0.0f;
    }
    const float score_scale = p.scale * p.k_scale;
    float m = -INFINITY, l = 0.0f;
    for (u32 x = begin + warp; x < end; x += ATTN_WARPS) {
        const u32 slot = (tree && x > p.start_pos) ? p.start_pos + tree_anc[row * p.tree_stride + (x - p.start_pos)] : x;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < MAX_DIMS; k++)
            if (k < dims) dot = fmaf(qv[k], kv_value<FP8>(pages, p, 0, kv_head, slot, lane + 32 * k), dot);
        const float s = warp_sum(dot) * score_scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), w = expf(s - m_new);
        l = l * corr + w;
#pragma unroll
        for (int k = 0; k < MAX_DIMS; k++)
            if (k < dims) acc[k] = acc[k] * corr + w * (kv_value<FP8>(pages, p, 1, kv_head, slot, lane + 32 * k) * p.v_scale);
        m = m_new;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < MAX_DIMS; k++)
        if (k < dims) part_acc[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    if (warp != 0) return;
    float big = part_m[0];
    for (int w = 1; w < ATTN_WARPS; w++) big = fmaxf(big, part_m[w]);
    float total = 0.0f, f[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        // A warp that saw no position (a short split) has m = -inf and weighs nothing.
        f[w] = part_l[w] > 0.0f ? expf(part_m[w] - big) : 0.0f;
        total += part_l[w] * f[w];
    }
    float* out = partial(partials, p, row, head, split);
    if (lane == 0) {
        out[0] = big;
        out[1] = total;
    }
#pragma unroll
    for (int k = 0; k < MAX_DIMS; k++) {
        if (k < dims) {
            float o = 0.0f;
            for (int w = 0; w < ATTN_WARPS; w++) o += part_acc[w][lane + 32 * k] * f[w];
            out[2 + lane + 32 * k] = o;
        }
    }
}

extern "C" __global__ void attention_split_f16(const float* q, const u64* pages, const u32* tree_anc, const u32* tree_depth, AttnParams p, float* partials) {
    attention_split<false>(q, pages, tree_anc, tree_depth, p, partials);
}

extern "C" __global__ void attention_split_fp8(const float* q, const u64* pages, const u32* tree_anc, const u32* tree_depth, AttnParams p, float* partials) {
    attention_split<true>(q, pages, tree_anc, tree_depth, p, partials);
}

// out = the row's splits combined in order; grid = (row, head), threads over head_dim.
extern "C" __global__ void attention_merge(const float* partials, const u32* tree_depth, AttnParams p, float* out) {
    const u32 row = blockIdx.x, head = blockIdx.y;
    const u32 splits = (visible(p, tree_depth, row) + p.split_len - 1) / p.split_len;
    float big = -INFINITY;
    for (u32 s = 0; s < splits; s++) big = fmaxf(big, partial((float*)partials, p, row, head, s)[0]);
    float total = 0.0f;
    for (u32 s = 0; s < splits; s++) {
        const float* part = partial((float*)partials, p, row, head, s);
        total += part[1] * expf(part[0] - big);
    }
    const u32 width = p.n_heads * p.head_dim;
    for (u32 d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (u32 s = 0; s < splits; s++) {
            const float* part = partial((float*)partials, p, row, head, s);
            o += part[2 + d] * expf(part[0] - big);
        }
        out[(u64)row * width + head * p.head_dim + d] = o / total;
    }
}
