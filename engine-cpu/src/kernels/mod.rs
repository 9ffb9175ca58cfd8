//! CPU compute kernels: quantized matmul, paged GQA attention, and the thread pool they run on.
//!
//! Every kernel has a portable scalar version that is the reference for tests. SIMD versions
//! (AVX-512 VNNI, else an AVX2 packed GEMM, on x86_64; NEON on aarch64) are chosen once per
//! process by [`dispatch`], a table of function pointers; each entry is one
//! `#[target_feature]` function holding a whole hot loop. `EDGE_KERNELS_ISA=scalar|avx2|
//! avx512-vnni|neon` forces a path (for debugging and benchmarks); an unknown or unsupported
//! choice falls back to detection.

pub mod activation;
pub mod attention;
pub mod delta_rule;
pub mod floatmm;
pub mod fp4;
pub mod fp8;
pub mod gdn;
pub mod kquant;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod threadpool;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_attention;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_wide512;

pub use attention::{AttnParams, attention, write_kv, write_kv_scaled};
pub use matmul::{PackedMatrix, QMatrix, matmul, matmul_packed, matmul_packed_many, matmul_packed_q8};
pub use quant::{GgmlType, Q8Acts, dequantize_row};
pub use threadpool::ThreadPool;

use std::ops::Range;
use std::sync::OnceLock;

/// One ISA's kernels.
pub(crate) struct Dispatch {
    pub name: &'static str,
    /// Quantizes one block of 32 values to i8; returns `(d, d * sum(q))`.
    pub quantize_q8: fn(&[f32], &mut [i8]) -> (f32, f32),
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    /// Packed-tile GEMM over tile groups `g` (rows 16g..), all activation rows.
    pub packed_gemm: unsafe fn(&matmul::PackedMatrix, &Q8Acts, Range<usize>, matmul::OutPtr),
    /// Online-softmax attention over one chunk of <= 16 contiguous keys (see attention.rs).
    pub attn_chunk: unsafe fn(&attention::Chunk, &mut attention::State),
    /// Many stacked query rows over a key range (prefill, verification); `None`: use `attn_chunk`.
    /// Must give every row exactly the bits `attn_chunk` gives it (attention's exactness contract).
    pub attn_wide: Option<attention::WideFn>,
}

pub(crate) static SCALAR: Dispatch = Dispatch {
    name: "scalar",
    quantize_q8: quant::quantize_block_q8_scalar,
    dot_f32: matmul::dot_f32_scalar,
    packed_gemm: matmul::packed_gemm_scalar,
    attn_chunk: attention::chunk_scalar,
    attn_wide: None,
};

/// Every kernel set this CPU can run, best first (the scalar reference last).
pub(crate) fn available() -> Vec<&'static Dispatch> {
    let mut v: Vec<&'static Dispatch> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    v.extend(x86::available());
    #[cfg(target_arch = "aarch64")]
    v.extend(neon::available());
    v.push(&SCALAR);
    v
}

/// Asks the CPU to fetch the cache line holding `p` into L1 (a hint: it never faults, and it
/// is a no-op on other architectures). Scattered KV pages defeat the stream prefetchers.
#[inline(always)]
pub(crate) fn prefetch_l1(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// `EDGE_KERNELS_ISA`, when set.
pub(crate) fn forced_isa() -> Option<&'static str> {
    static FORCED: OnceLock<Option<String>> = OnceLock::new();
    FORCED.get_or_init(|| std::env::var("EDGE_KERNELS_ISA").ok().filter(|v| !v.is_empty())).as_deref()
}

/// The kernel set used by this process, chosen on first use.
pub(crate) fn dispatch() -> &'static Dispatch {
    static CHOSEN: OnceLock<&'static Dispatch> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let all = available();
        let forced = forced_isa();
        let pick = forced.and_then(|want| all.iter().copied().find(|d| d.name == want)).unwrap_or(all[0]);
        if let Some(want) = forced.filter(|want| *want != pick.name) {
            let sets: Vec<&str> = all.iter().map(|d| d.name).collect();
            tracing::warn!(forced = want, available = ?sets, "EDGE_KERNELS_ISA names no kernel set of this CPU");
        }
        tracing::info!(isa = pick.name, "cpu kernels selected");
        pick
    })
}

/// The widest SIMD the kernels outside [`dispatch`]'s table (f32/bf16 GEMM, FP8 decoders) may
/// use. Forcing `EDGE_KERNELS_ISA=scalar` or `=avx2` caps them too, so a forced run tests the
/// code a CPU of that class executes, not a mix (the ISA test matrix relies on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SimdCeiling {
    Scalar,
    Avx2,
    /// Whatever the CPU has.
    Detected,
}

pub(crate) fn simd_ceiling() -> SimdCeiling {
    match forced_isa() {
        Some("scalar") => SimdCeiling::Scalar,
        Some("avx2") => SimdCeiling::Avx2,
        _ => SimdCeiling::Detected,
    }
}

/// Names of the kernel sets this CPU can run, best first (`scalar` last): the values
/// `EDGE_KERNELS_ISA` accepts here (`engine-service --kernel-sets` prints them).
pub fn kernel_sets() -> Vec<&'static str> {
    available().iter().map(|d| d.name).collect()
}

/// Name of the kernel set in use ("avx512-vnni", "avx2", "neon", "scalar").
pub fn isa_name() -> &'static str {
    dispatch().name
}
