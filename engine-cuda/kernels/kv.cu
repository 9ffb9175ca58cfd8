// KV pages: the page layout of engine_ops::kv::KvLayout (per layer a K block then a V block,
// each [n_kv_heads][page_tokens][head_dim] of f16 or FP8 E4M3). A launch gets the device
// address of each of the sequence's pages (`pages[i]` holds positions i*page_tokens..), so
// the kernels never see page ids: the host resolved them (the arena registered with the
// driver on unified memory, or a device page pool).

struct KvGeometry {
    u32 n_kv_heads;
    u32 head_dim;
    u32 page_tokens;
    u32 layer;
};

// Element offset of (part, kv_head, slot) within a page.
__device__ __forceinline__ u64 kv_offset(const KvGeometry& g, u32 part, u32 kv_head, u32 slot) {
    return ((u64)((g.layer * 2 + part) * g.n_kv_heads + kv_head) * g.page_tokens + slot) * g.head_dim;
}

// Rows of k and v (n_kv_heads * head_dim wide) into positions start_pos..; grid.x = row.
extern "C" __global__ void write_kv_f16(const float* k, const float* v, const u64* pages, u32 start_pos, KvGeometry g) {
    const u32 pos = start_pos + blockIdx.x, width = g.n_kv_heads * g.head_dim;
    u16* page = (u16*)pages[pos / g.page_tokens];
    const u32 slot = pos % g.page_tokens;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
        const u32 h = c / g.head_dim, d = c % g.head_dim;
        page[kv_offset(g, 0, h, slot) + d] = f32_to_f16(k[(u64)blockIdx.x * width + c]);
        page[kv_offset(g, 1, h, slot) + d] = f32_to_f16(v[(u64)blockIdx.x * width + c]);
    }
}

// FP8 pages store E4M3(x / scale) with the model's per-tensor scales.
extern "C" __global__ void write_kv_fp8(const float* k, const float* v, const u64* pages, u32 start_pos, KvGeometry g, float k_scale, float v_scale) {
    const u32 pos = start_pos + blockIdx.x, width = g.n_kv_heads * g.head_dim;
    u8* page = (u8*)pages[pos / g.page_tokens];
    const u32 slot = pos % g.page_tokens;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
        const u32 h = c / g.head_dim, d = c % g.head_dim;
        page[kv_offset(g, 0, h, slot) + d] = f32_to_e4m3(k[(u64)blockIdx.x * width + c] / k_scale);
        page[kv_offset(g, 1, h, slot) + d] = f32_to_e4m3(v[(u64)blockIdx.x * width + c] / v_scale);
    }
}

// Copies the K and V rows of every layer and KV head from position `from` to `to` (a draft
// tree's accepted node into place). grid.x = (layer * 2 + part) * n_kv_heads + kv_head;
// `row_bytes` = head_dim * bytes per value; `g.layer` is unused.
extern "C" __global__ void move_kv(const u64* pages, u32 from, u32 to, KvGeometry g, u32 row_bytes) {
    const u32 block = blockIdx.x;
    const u64 block_bytes = (u64)g.page_tokens * row_bytes;
    const u8* src = (const u8*)pages[from / g.page_tokens] + block * block_bytes + (u64)(from % g.page_tokens) * row_bytes;
    u8* dst = (u8*)pages[to / g.page_tokens] + block * block_bytes + (u64)(to % g.page_tokens) * row_bytes;
    for (u32 i = threadIdx.x; i < row_bytes; i += blockDim.x) dst[i] = src[i];
}
