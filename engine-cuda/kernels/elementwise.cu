// Elementwise ops and row moves over f32 activations; grid-stride loops, any launch size.

extern "C" __global__ void silu_mul(float* gate, const float* up, u32 len) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x)
        gate[i] = silu(gate[i]) * up[i];
}

extern "C" __global__ void add_assign(float* x, const float* y, u32 len) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" __global__ void sigmoid_mul(float* x, const float* gate, u32 len) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x)
        x[i] *= sigmoid(gate[i]);
}

extern "C" __global__ void scale(float* x, float s, u32 len) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x)
        x[i] *= s;
}

// out row i = src row rows[i]; grid.y = output row.
extern "C" __global__ void gather_rows(const float* src, u32 width, const u32* rows, float* out) {
    const u32 i = blockIdx.y;
    const float* from = src + (u64)rows[i] * width;
    float* to = out + (u64)i * width;
    for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) to[c] = from[c];
}

// out row i = [a row i (wa) | b row i (wb)]; grid.y = row.
extern "C" __global__ void concat_cols(const float* a, u32 wa, const float* b, u32 wb, float* out) {
    const u32 i = blockIdx.y, w = wa + wb;
    for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < w; c += gridDim.x * blockDim.x)
        out[(u64)i * w + c] = c < wa ? a[(u64)i * wa + c] : b[(u64)i * wb + (c - wa)];
}

// Rows of n_heads blocks [first_h | second_h] (head_dim each) into first and second;
// grid.y = row.
extern "C" __global__ void deinterleave_heads(const float* x, u32 n_heads, u32 head_dim, float* first, float* second) {
    const u32 i = blockIdx.y, w = n_heads * head_dim;
    for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < w; c += gridDim.x * blockDim.x) {
        const u32 h = c / head_dim, d = c % head_dim;
        const float* head = x + (u64)i * 2 * w + (u64)h * 2 * head_dim;
        first[(u64)i * w + c] = head[d];
        second[(u64)i * w + c] = head[head_dim + d];
    }
}
