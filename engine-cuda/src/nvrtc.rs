//! Compiling a kernel source to a cubin for one architecture with NVRTC, and reading ptxas's
//! report. Cubins, not PTX: the driver loads them without its JIT (which would refuse PTX from
//! an NVRTC newer than itself), and they are compiled for the exact chip.

use std::ffi::CString;

use cudarc::nvrtc::{result, sys};

use crate::arch::SmArch;
use crate::kernels::KernelSource;
use crate::ptxas::{self, FunctionReport};
use crate::{CudaError, toolchain};

/// A compiled kernel source.
#[derive(Clone, Debug)]
pub struct Cubin {
    pub image: Vec<u8>,
    /// NVRTC's log (ptxas's report included).
    pub log: String,
    pub report: Vec<FunctionReport>,
}

/// The NVRTC options every kernel is compiled with.
pub fn options(arch: SmArch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.target()),
        "--std=c++17".into(),
        "--ptxas-options=--verbose".into(),
        // Contracted multiply-adds are fine (the kernels spell out their fmaf chains where the
        // order matters); denormals and division stay IEEE, as on the CPU.
        "--fmad=true".into(),
    ]
}

/// Compiles `kernel` for `arch`. Fails with the compiler's log on an error, and when ptxas
/// reports local memory (a stack frame or spills) in any function.
pub fn compile(kernel: &KernelSource, arch: SmArch) -> Result<Cubin, CudaError> {
    compile_source(kernel.name, &kernel.full_source(), arch)
}

/// [`compile`] for any source (the check's own negative tests use it).
pub fn compile_source(name: &str, source: &str, arch: SmArch) -> Result<Cubin, CudaError> {
    toolchain::nvrtc()?;
    let failed = |what: &str, e: result::NvrtcError| CudaError::Compile {
        kernel: name.to_string(),
        arch: arch.target(),
        log: format!("{what}: {e:?}"),
    };
    let src = CString::new(source).map_err(|_| CudaError::Compile {
        kernel: name.into(),
        arch: arch.target(),
        log: "source has a NUL byte".into(),
    })?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| CudaError::Compile {
        kernel: name.into(),
        arch: arch.target(),
        log: "kernel name has a NUL byte".into(),
    })?;
    let prog = result::create_program(&src, Some(&file)).map_err(|e| failed("nvrtcCreateProgram", e))?;
    // SAFETY: `prog` is live until destroyed at the end; `src`/`file` outlive it.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options(arch));
        let log = result::get_program_log(prog).map(|l| c_chars(&l)).unwrap_or_default();
        let image =
            compiled.map_err(|_| CudaError::Compile { kernel: name.into(), arch: arch.target(), log: log.clone() });
        let image = image.and_then(|()| cubin(prog).map_err(|e| failed("nvrtcGetCUBIN", e)));
        let _ = result::destroy_program(prog);
        image.map(|image| (image, log))
    };
    let (image, log) = out?;
    let report = ptxas::parse(&log);
    let problems = ptxas::local_memory_problems(&report);
    if !problems.is_empty() {
        return Err(CudaError::LocalMemory { kernel: name.into(), arch: arch.target(), problems: problems.join("; ") });
    }
    Ok(Cubin { image, log, report })
}

/// # Safety
/// `prog` must be a live, compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: per the function's contract; `size` and the buffer are valid for the calls.
    unsafe {
        sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
        let mut image = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()).result()?;
        Ok(image)
    }
}

fn c_chars(log: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
