//! What GPUs this machine has, asked without ever letting cudarc panic: the driver library is
//! probed by name first (cudarc panics on first use when a library is missing).

use crate::CudaError;
use crate::arch::SmArch;

/// One CUDA device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub arch: SmArch,
    pub memory_bytes: usize,
    /// Shares memory with the CPU (Jetson Thor, DGX Spark): the KV arena is used in place.
    pub integrated: bool,
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CUDA device {} ({}, compute capability {}, {} MiB{})",
            self.ordinal,
            self.name,
            self.arch,
            self.memory_bytes >> 20,
            if self.integrated { ", unified memory" } else { "" }
        )
    }
}

/// Every CUDA device, or why there is none.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<Vec<GpuInfo>, CudaError> {
    Err(CudaError::NotBuilt)
}

/// Every CUDA device, or why there is none.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<Vec<GpuInfo>, CudaError> {
    use cudarc::driver::{result, sys};
    // SAFETY: opens and closes the library by name; calls nothing in it.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver("libcuda.so is not on this machine (no NVIDIA driver)".into()));
    }
    let driver = |e: result::DriverError| CudaError::NoDriver(format!("{e:?}"));
    result::init().map_err(driver)?;
    let count = result::device::get_count().map_err(driver)?;
    if count <= 0 {
        return Err(CudaError::NoDevice("the driver reports no device".into()));
    }
    let mut out = Vec::new();
    for ordinal in 0..count {
        let dev = result::device::get(ordinal).map_err(driver)?;
        let attr = |a| {
            // SAFETY: `dev` came from cuDeviceGet.
            unsafe { result::device::get_attribute(dev, a) }.map_err(driver)
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let integrated = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
        // SAFETY: as above.
        let memory_bytes = unsafe { result::device::total_mem(dev) }.map_err(driver)?;
        out.push(GpuInfo {
            ordinal: ordinal as usize,
            name: result::device::get_name(dev).map_err(driver)?,
            arch: SmArch::new(major as u32, minor as u32),
            memory_bytes,
            integrated,
        });
    }
    Ok(out)
}

/// Device `ordinal`, if it exists and the kernels support it.
pub fn pick(ordinal: usize) -> Result<GpuInfo, CudaError> {
    let gpus = probe()?;
    let n = gpus.len();
    let gpu = gpus
        .into_iter()
        .find(|g| g.ordinal == ordinal)
        .ok_or_else(|| CudaError::NoDevice(format!("no device {ordinal} (the driver reports {n})")))?;
    if !gpu.arch.supported() {
        return Err(CudaError::UnsupportedArch { name: gpu.name, major: gpu.arch.major, minor: gpu.arch.minor });
    }
    Ok(gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_every_entry_says_not_built() {
        assert!(matches!(probe(), Err(CudaError::NotBuilt)));
        assert!(matches!(pick(0), Err(CudaError::NotBuilt)));
    }

    #[test]
    fn describes_a_device() {
        let g = GpuInfo {
            ordinal: 0,
            name: "NVIDIA Thor".into(),
            arch: SmArch::THOR,
            memory_bytes: 128 << 30,
            integrated: true,
        };
        assert_eq!(g.to_string(), "CUDA device 0 (NVIDIA Thor, compute capability 11.0, 131072 MiB, unified memory)");
    }
}
