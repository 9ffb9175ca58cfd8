//! The CUDA backend's errors. Absence of CUDA is an error value, never a panic: the engine
//! turns it into "serving on the CPU" (`--device auto`) or a start-up error (`--device cuda`).

use engine_ops::EngineError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// This build has no CUDA code (the `cuda` feature is off).
    #[error("this build has no CUDA support (rebuild with `--features cuda`)")]
    NotBuilt,
    /// The driver library (libcuda) is not on this machine, or it reports no device.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// The device is older than the kernels need.
    #[error("unsupported GPU {name} (compute capability {major}.{minor}): the kernels need 8.9 or newer")]
    UnsupportedArch { name: String, major: u32, minor: u32 },
    /// NVRTC (libnvrtc) could not be found or loaded.
    #[error("no NVRTC: {0}")]
    NoNvrtc(String),
    /// A kernel source did not compile; carries NVRTC's log.
    #[error("kernel {kernel} does not compile for {arch}:\n{log}")]
    Compile { kernel: String, arch: String, log: String },
    /// A kernel compiled but ptxas reports spills or local memory (a slow kernel is a bug).
    #[error("kernel {kernel} for {arch} uses local memory: {problems}")]
    LocalMemory { kernel: String, arch: String, problems: String },
    /// An op this backend does not run yet.
    #[error("the CUDA backend does not run {0} yet")]
    Unsupported(&'static str),
    /// A page id the backend has no memory for.
    #[error("KV page {0} is not mapped on the GPU")]
    UnmappedPage(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// The cubin cache directory could not be used.
    #[error("cubin cache {path}: {problem}")]
    Cache { path: String, problem: String },
}

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> EngineError {
        match e {
            CudaError::NotBuilt
            | CudaError::NoDriver(_)
            | CudaError::NoDevice(_)
            | CudaError::UnsupportedArch { .. }
            | CudaError::NoNvrtc(_) => EngineError::Unavailable(e.to_string()),
            _ => EngineError::Internal(e.to_string()),
        }
    }
}
