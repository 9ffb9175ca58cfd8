// Row norms: one block per row (blockDim.x a multiple of 32), fixed reduction order.

// out = x / rms(x) * w over rows of `width`.
extern "C" __global__ void rms_norm(const float* x, const float* w, float eps, u32 width, float* out) {
    __shared__ float scratch[32];
    const float* row = x + (u64)blockIdx.x * width;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) ss += row[c] * row[c];
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)width + eps);
    float* o = out + (u64)blockIdx.x * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) o[c] = row[c] * inv * w[c];
}

// x = x / rms(x) * w * silu(z), in place, over rows of `width`.
extern "C" __global__ void gated_rms_norm(float* x, const float* z, const float* w, float eps, u32 width) {
    __shared__ float scratch[32];
    float* row = x + (u64)blockIdx.x * width;
    const float* zr = z + (u64)blockIdx.x * width;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) ss += row[c] * row[c];
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)width + eps);
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) row[c] = row[c] * inv * w[c] * silu(zr[c]);
}
