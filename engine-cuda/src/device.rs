//! One GPU with the kernels loaded: a context (event tracking off: we order work on one
//! stream ourselves, and per-buffer events would break graph capture), its stream, and every
//! kernel of [`crate::kernels::ALL`] as a cubin compiled for the device's architecture, taken
//! from the disk cache when it is there.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::cubin_cache::{self, CubinCache};
use crate::probe::{GpuInfo, pick};
use crate::{CudaError, kernels, nvrtc, toolchain};

pub struct GpuDevice {
    pub info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

fn driver(e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

impl GpuDevice {
    /// Opens device `ordinal` and loads every kernel (compiling what `cache` lacks; `None`
    /// compiles everything).
    pub fn open(ordinal: usize, cache: Option<&CubinCache>) -> Result<GpuDevice, CudaError> {
        let info = pick(ordinal)?;
        let nvrtc_version = toolchain::nvrtc()?.version;
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        // SAFETY: called before this context allocates anything.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let mut functions = HashMap::new();
        let started = std::time::Instant::now();
        let (mut compiled, mut cached) = (0, 0);
        for k in kernels::ALL {
            let name = cubin_cache::file_name(
                k.name,
                &info.arch.target(),
                &k.full_source(),
                &nvrtc::options(info.arch),
                nvrtc_version,
            );
            let image = match cache.and_then(|c| c.get(&name)) {
                Some(image) => {
                    cached += 1;
                    image
                }
                None => {
                    let image = nvrtc::compile(k, info.arch)?.image;
                    compiled += 1;
                    if let Some(c) = cache
                        && let Err(e) = c.put(&name, &image)
                    {
                        tracing::warn!(error = %e, "cannot keep the compiled kernel; it is compiled again next start");
                    }
                    image
                }
            };
            let module = ctx.load_module(Ptx::from_binary(image)).map_err(driver)?;
            for entry in k.entries {
                functions.insert(*entry, module.load_function(entry).map_err(driver)?);
            }
        }
        tracing::info!(
            device = %info,
            target = %info.arch.target(),
            compiled,
            cached,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "CUDA kernels loaded"
        );
        Ok(GpuDevice { info, ctx, stream, functions })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A kernel by its entry name (every name of [`crate::kernels::ALL`] is loaded).
    pub fn function(&self, entry: &str) -> &CudaFunction {
        self.functions.get(entry).unwrap_or_else(|| panic!("kernel {entry} is not in kernels::ALL"))
    }
}
