//! engine-cpu: the CPU backend's arithmetic. [`kernels`] holds the SIMD kernels (the only
//! engine code with `unsafe` SIMD), [`ops::CpuOps`] implements the op seam with them, and
//! [`pages`] keeps KV pages in host memory. It knows no model: `engine-models` writes the
//! architectures against `engine-ops`, and the engine composes the two.

pub mod kernels;
pub mod ops;
pub mod pages;

pub use ops::CpuOps;
