//! The CI compile check: every kernel compiles with NVRTC to a cubin for H100/H200 (sm_90a)
//! and Jetson Thor (sm_110a) with no local memory (no stack frame, no spills), on a machine
//! without a GPU. NVRTC comes from the PyPI wheel (deploy/cuda-toolchain.sh installs it;
//! deploy/test.sh points EDGE_CUDA_NVRTC_DIR at it). Also checks that the check itself fails
//! on a compile error and on local memory.
#![cfg(feature = "cuda")]

use engine_cuda::kernels::{self, PRELUDE};
use engine_cuda::{CudaError, SmArch, nvrtc, toolchain};

/// Whether NVRTC is here; without it the tests fail, unless EDGE_ALLOW_SKIP=1 (then they say
/// they were skipped).
fn nvrtc_present(test: &str) -> bool {
    match toolchain::nvrtc() {
        Ok(n) => {
            assert_eq!(
                n.version.0, 13,
                "the compile check pins NVRTC 13.0 (the driver 580 line), found {:?}",
                n.version
            );
            true
        }
        Err(e) if std::env::var("EDGE_ALLOW_SKIP").as_deref() == Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            false
        }
        Err(e) => panic!("{test}: {e}\n(deploy/cuda-toolchain.sh installs NVRTC; EDGE_ALLOW_SKIP=1 skips)"),
    }
}

#[test]
fn every_kernel_compiles_for_hopper_and_thor_without_local_memory() {
    if !nvrtc_present("every_kernel_compiles_for_hopper_and_thor_without_local_memory") {
        return;
    }
    let mut failures = Vec::new();
    for arch in SmArch::TARGETS {
        for k in kernels::ALL {
            match nvrtc::compile(k, arch) {
                Ok(cubin) => {
                    assert_eq!(&cubin.image[..4], b"\x7fELF", "{} for {}: not a cubin", k.name, arch.target());
                    for entry in k.entries {
                        let f = cubin.report.iter().find(|f| f.name == *entry && f.entry);
                        let Some(f) = f else {
                            failures.push(format!("{} {}: ptxas reports no kernel {entry}", arch.target(), k.name));
                            continue;
                        };
                        eprintln!("{:8} {:20} {:3} registers", arch.target(), entry, f.registers);
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "kernel compile check failed:\n{}", failures.join("\n"));
}

#[test]
fn a_compile_error_fails_with_the_compilers_message() {
    if !nvrtc_present("a_compile_error_fails_with_the_compilers_message") {
        return;
    }
    let src = format!("{PRELUDE}\nextern \"C\" __global__ void broken(float* x) {{ x[0] = not_declared; }}\n");
    match nvrtc::compile_source("broken", &src, SmArch::HOPPER) {
        Err(CudaError::Compile { log, arch, .. }) => {
            assert_eq!(arch, "sm_90a");
            assert!(log.contains("not_declared") && log.contains("undefined"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn local_memory_fails_the_check() {
    if !nvrtc_present("local_memory_fails_the_check") {
        return;
    }
    // An array indexed at run time lives in local memory (a stack frame).
    let src = format!(
        "{PRELUDE}\nextern \"C\" __global__ void spills(float* x, int n, int j) {{\n\
         float a[64];\n\
         for (int i = 0; i < 64; i++) a[i] = x[i * n + threadIdx.x];\n\
         float s = 0.0f;\n\
         for (int k = 0; k < n; k++) s += a[(k * j + threadIdx.x) & 63];\n\
         x[threadIdx.x] = s;\n}}\n"
    );
    for arch in SmArch::TARGETS {
        match nvrtc::compile_source("spills", &src, arch) {
            Err(CudaError::LocalMemory { problems, .. }) => assert!(problems.contains("stack frame"), "{problems}"),
            other => panic!("expected a local-memory failure for {}, got {other:?}", arch.target()),
        }
    }
}
