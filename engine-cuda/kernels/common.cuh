// Prepended to every kernel source by engine-cuda (src/kernels.rs). NVRTC 13.0 ships no
// headers, so nothing here or in a kernel includes one: f16/bf16/FP8 values travel as their
// bits and convert through PTX instructions (native on every target, sm_89 and newer).
//
// Conventions: activations are f32; every kernel computes a row the same way whatever else is
// in the launch (fixed summation order per row), so chunked == one pass and tree node ==
// chain hold on the GPU as they do on the CPU. Entry points are `extern "C"` (no name
// mangling to look up).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as the CPU's `half::f16::from_f32`.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Two FP8 E4M3 bytes (low byte first) to f32; exact.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(u16 pair) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    return make_float2(f16_to_f32((u16)(h2 & 0xffffu)), f16_to_f32((u16)(h2 >> 16)));
}

__device__ __forceinline__ float e4m3_to_f32(u8 b) {
    return e4m3x2_to_f32x2((u16)b).x;
}

// Nearest E4M3 (ties to even), saturating finite values to +-448, as engine_ops::fp8.
__device__ __forceinline__ u8 f32_to_e4m3(float x) {
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    return (u8)(pair & 0xffu);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order; every
// thread gets the total. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float silu(float x) {
    return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
