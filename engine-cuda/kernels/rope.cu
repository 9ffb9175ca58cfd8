// Rotary embedding with a per-row table of (cos, sin) for each rotated pair, made on the host
// exactly as the CPU makes it (f64 angles) and uploaded, so the angles are the CPU's bits.
// grid.x = row; threads over (head, pair).

// Adjacent pairs (x[2i], x[2i+1]) of every head (GGUF llama).
extern "C" __global__ void rope_adjacent(float* x, u32 width, u32 head_dim, const float2* table) {
    const u32 pairs = head_dim / 2, n = (width / head_dim) * pairs;
    float* row = x + (u64)blockIdx.x * width;
    const float2* cs = table + (u64)blockIdx.x * pairs;
    for (u32 t = threadIdx.x; t < n; t += blockDim.x) {
        const u32 h = t / pairs, i = t % pairs;
        float* p = row + h * head_dim + 2 * i;
        const float a = p[0], b = p[1], c = cs[i].x, s = cs[i].y;
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

// Rotate-half (NeoX) on the first `rotated` values of every head; the rest pass through.
extern "C" __global__ void rope_half_split(float* x, u32 width, u32 head_dim, u32 rotated, const float2* table) {
    const u32 pairs = rotated / 2, n = (width / head_dim) * pairs;
    float* row = x + (u64)blockIdx.x * width;
    const float2* cs = table + (u64)blockIdx.x * pairs;
    for (u32 t = threadIdx.x; t < n; t += blockDim.x) {
        const u32 h = t / pairs, i = t % pairs;
        float* p = row + h * head_dim;
        const float a = p[i], b = p[i + pairs], c = cs[i].x, s = cs[i].y;
        p[i] = a * c - b * s;
        p[i + pairs] = b * c + a * s;
    }
}
