//! engine-cuda: the CUDA backend's device side. Today: finding a GPU without ever panicking
//! ([`probe`]), the kernels as `.cu` sources ([`kernels`]), compiled by NVRTC to cubins for the
//! device's exact architecture ([`nvrtc`], with ptxas's local-memory report checked) and kept
//! on disk ([`cubin_cache`]); [`device`] loads them on a GPU. Next: the op seam (`CudaOps`)
//! over these kernels, KV pages in the arena, CUDA graphs.
//!
//! Without the `cuda` feature the crate builds with no CUDA code at all and every entry point
//! answers [`CudaError::NotBuilt`]; with it, libraries are opened at run time (cudarc's dynamic
//! loading), so the same binary starts on machines without CUDA and reports why.

pub mod arch;
pub mod cubin_cache;
mod error;
pub mod kernels;
pub mod launch;
pub mod probe;
pub mod ptxas;
pub mod space;
pub mod toolchain;

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod pages;

pub use arch::SmArch;
pub use error::CudaError;
pub use probe::{GpuInfo, pick, probe};

/// Whether this build has CUDA code (the `cuda` feature).
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");
